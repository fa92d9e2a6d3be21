"""Training on a mixture of token sources (oreline.tokens.mixture): the loader, resume, phases, metrics.

Two real token folders of one tokenizer: Austen's *Emma* (prose_tokens) and *Macbeth*
(second_source, a tenth of its size, so it repeats), read by the real loader and trained on by
the real loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from oreline_test_train_fixtures import make_config, read_metrics

from oreline.errors import ConfigError, FingerprintMismatch, TrainingError
from oreline.tokens.loader import TokenLoader
from oreline.tokens.mixture import MixtureLoader, Source

T, B = 32, 4


def sources(prose_tokens, second_source, a=0.7, b=0.3, **extra) -> list[Source]:
    return [Source("emma", prose_tokens["tokens"], a), Source("macbeth", second_source, b, **extra)]


def batches(loader, n: int) -> list[torch.Tensor]:
    return [loader.next_batch().input_ids for _ in range(n)]


class _Phase:  # a [[train.phases]] table as the config gives it
    def __init__(self, start_step, weights, start_tokens=None):
        self.start_step, self.start_tokens, self.weights = start_step, start_tokens, weights


def test_one_source_mixture_reads_the_single_folder_order(prose_tokens):
    old = TokenLoader(prose_tokens["tokens"], seq_len=T, micro_batch=B, seed=3)
    new = MixtureLoader([Source("main", prose_tokens["tokens"], 1.0)], seq_len=T, micro_batch=B, seed=3)
    steps = old.num_sequences // B + 3  # into the second epoch
    assert all(torch.equal(a, b) for a, b in zip(batches(old, steps), batches(new, steps), strict=True))
    # a checkpoint of the single-folder loader (state version 2) continues as the one-source mixture
    resumed = MixtureLoader([Source("main", prose_tokens["tokens"], 1.0)], seq_len=T, micro_batch=B, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(old.state_dict())))
    assert all(torch.equal(a, b) for a, b in zip(batches(old, 5), batches(resumed, 5), strict=True))


def test_two_sources_shares_and_each_source_its_own_order(prose_tokens, second_source):
    loader = MixtureLoader(sources(prose_tokens, second_source), seq_len=T, micro_batch=B, seed=3)
    picks = loader.global_indices(0, 12000)
    names = [n for n, _ in picks]
    assert abs(names.count("emma") / 12000 - 0.7) < 0.001
    small = loader.loaders["macbeth"].num_sequences
    mac = [i for n, i in picks if n == "macbeth"]
    assert len(mac) > 2 * small  # the small source repeats, each epoch a permutation of its own
    assert sorted(mac[:small]) == list(range(small)) and sorted(mac[small : 2 * small]) == list(range(small))
    assert mac[:small] != mac[small : 2 * small]
    assert loader.source_epochs(12000)["macbeth"] == pytest.approx(len(mac) / small, abs=1e-3)


def test_ranks_share_the_global_mixture_order(prose_tokens, second_source):
    one = MixtureLoader(sources(prose_tokens, second_source), seq_len=T, micro_batch=2 * B, seed=3)
    two = [
        MixtureLoader(
            sources(prose_tokens, second_source), seq_len=T, micro_batch=B, seed=3, rank=r, world_size=2
        )
        for r in range(2)
    ]
    for _ in range(30):
        whole = one.next_batch().input_ids
        assert torch.equal(whole, torch.cat([ld.next_batch().input_ids for ld in two]))


@pytest.mark.parametrize("cut", [7, 25, 26, 61])
def test_resume_is_exact_within_and_across_phases(prose_tokens, second_source, cut):
    phases = [_Phase(25, {"emma": 0.2, "macbeth": 0.8})]  # global batch B: the phase starts at position 25·B

    def make():
        return MixtureLoader(sources(prose_tokens, second_source), phases, seq_len=T, micro_batch=B, seed=3)

    reference = batches(make(), 80)
    first = make()
    head = batches(first, cut)
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.new_phase is None  # the same mixture: no new phase
    assert all(torch.equal(a, b) for a, b in zip(head + batches(resumed, 80 - cut), reference, strict=True))


@pytest.mark.hostile
@pytest.mark.parametrize(
    "weight",
    [
        "1/" + "9" * 5000,  # int() refuses past 4,300 digits: a ValueError traceback at resume
        "1e99999",  # a 100,000-digit denominator, accepted and then computed with at every position
        "0.5",  # not the form str(Fraction) writes
        0.5,
        "1/0",
    ],
)
def test_a_forged_mixture_weight_in_the_loader_state_is_refused_before_any_arithmetic(prose_tokens, weight):
    """The loader state's weights are strings Fraction() would parse without bound ("1e999999999"
    hung a resume for more than 300 s: tests/test_hostile_bounds.py runs that one in a capped
    child); only the integers of str(Fraction) are read, within MAX_WEIGHT_DIGITS digits."""
    loader = MixtureLoader([Source("main", prose_tokens["tokens"], 1.0)], seq_len=T, micro_batch=B, seed=3)
    batches(loader, 2)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["phases"][0]["weights"] == [["main", "1"]]
    state["phases"][0]["weights"][0][1] = weight
    resumed = MixtureLoader([Source("main", prose_tokens["tokens"], 1.0)], seq_len=T, micro_batch=B, seed=3)
    with pytest.raises(
        ConfigError, match=r"mixture weight .* is not a fraction oreline writes.*--resume none"
    ):
        resumed.load_state_dict(state)


def test_mixture_changed_at_resume_is_a_new_phase_and_nothing_is_replayed(prose_tokens, second_source):
    before = MixtureLoader(sources(prose_tokens, second_source), seq_len=T, micro_batch=B, seed=3)
    read = before.global_indices(0, 40 * B)
    batches(before, 40)
    state = json.loads(json.dumps(before.state_dict()))
    after = MixtureLoader(sources(prose_tokens, second_source, 0.5, 0.5), seq_len=T, micro_batch=B, seed=3)
    after.load_state_dict(state)
    assert after.new_phase is not None and after.new_phase.start == 40 * B
    assert [p["start"] for p in after.state_dict()["phases"]] == [0, 40 * B]
    assert after.state_dict()["phases"][1]["why"] == "resume"
    counts = before.source_sequences()
    assert after.source_sequences() == counts
    # each source continues from its own count, in its own order: what the unchanged mixture would
    # have read next of that source, never a sequence it already gave
    unchanged = MixtureLoader(sources(prose_tokens, second_source), seq_len=T, micro_batch=B, seed=3)
    future = unchanged.global_indices(0, 400 * B)
    nxt = after.global_indices(40 * B, 100 * B)
    for name in ("emma", "macbeth"):
        got = [i for n, i in nxt if n == name]
        want = [i for n, i in future if n == name][counts[name] : counts[name] + len(got)]
        assert got == want, name
    assert abs([n for n, _ in nxt].count("emma") / len(nxt) - 0.5) < 0.01
    assert [n for n, _ in read].count("emma") == counts["emma"]
    # a second resume with the same (changed) config adds no further phase
    again = MixtureLoader(sources(prose_tokens, second_source, 0.5, 0.5), seq_len=T, micro_batch=B, seed=3)
    again.load_state_dict(json.loads(json.dumps(after.state_dict())))
    assert again.new_phase is None and len(again.state_dict()["phases"]) == 2


def test_a_source_past_max_epochs_stops_with_its_name(prose_tokens, second_source):
    loader = MixtureLoader(
        sources(prose_tokens, second_source, max_epochs=1.0), seq_len=T, micro_batch=B, seed=3
    )
    with pytest.raises(TrainingError, match="'macbeth'.*max_epochs") as err:
        loader.check_budget(10_000)
    assert "raise max_epochs" in err.value.hint
    small = loader.loaders["macbeth"].num_sequences
    with pytest.raises(TrainingError, match="macbeth"):
        for _ in range(10 * small):
            loader.next_batch()


def test_every_rank_stops_at_the_global_batch_that_passes_max_epochs(prose_tokens, second_source):
    """Each rank reads only its slice of the global batch; the one whose slice crosses a source's
    max_epochs must not stop alone while the others wait for it in the next collective."""
    ranks = [
        MixtureLoader(
            sources(prose_tokens, second_source, max_epochs=1.0),
            seq_len=T,
            micro_batch=B,
            seed=3,
            rank=r,
            world_size=2,
        )
        for r in range(2)
    ]
    stopped = []
    for _ in range(10 * ranks[0].loaders["macbeth"].num_sequences):
        outcome = []
        for loader in ranks:
            try:
                loader.next_batch()
                outcome.append(False)
            except TrainingError:
                outcome.append(True)
        if any(outcome):
            stopped = outcome
            break
    assert stopped == [True, True], f"one rank stopped alone: {stopped}"


def test_sources_of_another_tokenizer_or_changed_data_are_refused(prose_tokens, second_source, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(second_source, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer_fingerprint"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FingerprintMismatch):  # the shard headers name the real tokenizer: refused either way
        MixtureLoader(
            [Source("emma", prose_tokens["tokens"], 1), Source("x", other, 1)], seq_len=T, micro_batch=B
        )
    loader = MixtureLoader(sources(prose_tokens, second_source), seq_len=T, micro_batch=B, seed=3)
    state = loader.state_dict()
    state["sources"]["macbeth"]["data_fingerprint"] = "f" * 64
    with pytest.raises(FingerprintMismatch, match="macbeth"):
        MixtureLoader(sources(prose_tokens, second_source), seq_len=T, micro_batch=B, seed=3).load_state_dict(
            state
        )
    with pytest.raises(ConfigError, match="single token folder"):
        MixtureLoader(sources(prose_tokens, second_source), seq_len=T, micro_batch=B, seed=3).load_state_dict(
            TokenLoader(prose_tokens["tokens"], seq_len=T, micro_batch=B, seed=3).state_dict()
        )


# ---------------------------------------------------------------------------------------------
# training runs


def mixture_config(tmp_path: Path, prose_tokens, second_source, weights=(0.7, 0.3), **dotted):
    cfg = make_config(tmp_path / "runs", prose_tokens, train__tokens=None, **dotted)
    cfg.train.sources = [
        {"name": "emma", "tokens": str(prose_tokens["tokens"]), "weight": weights[0]},
        {"name": "macbeth", "tokens": str(second_source), "weight": weights[1]},
    ]
    return cfg


@pytest.mark.slow  # MLflow's sqlite store takes ~20 s to create
def test_two_source_run_logs_source_tokens_at_the_weights(prose_tokens, second_source, tmp_path, one_thread):
    from oreline.config import config_from_dict, to_dict
    from oreline.train.loop import train

    cfg = mixture_config(
        tmp_path,
        prose_tokens,
        second_source,
        train__steps=24,
        train__log_every=4,
        train__trackers=["tensorboard", "mlflow"],
    )
    cfg = config_from_dict(to_dict(cfg))
    train(cfg, resume="none")
    recs = read_metrics(Path(cfg.run.runs_dir) / "t" / "metrics.jsonl")
    rows = [r for r in recs if r["type"] == "train"]
    assert [r["step"] for r in rows] == [1, 4, 8, 12, 16, 20, 24]
    per_step = 4 * 2 * 64  # micro × accum × seq_len
    for r in rows:
        tokens = r["source_tokens"]
        assert sum(tokens.values()) == r["tokens_seen"] == r["step"] * per_step
        if r["step"] >= 8:
            assert abs(tokens["emma"] / r["tokens_seen"] - 0.7) < 0.01, r
    intervals = [r["source_tokens_interval"] for r in rows]
    assert [sum(i.values()) for i in intervals] == [per_step, 3 * per_step] + [4 * per_step] * 5
    assert rows[-1]["source_epochs"]["macbeth"] > 0 and rows[-1]["source_weights"] == {
        "emma": 0.7,
        "macbeth": 0.3,
    }
    evals = [r for r in recs if r["type"] == "eval"]
    assert evals and set(evals[-1]["val_loss_sources"]) == {"emma", "macbeth"}
    v = evals[-1]["val_loss_sources"]
    assert evals[-1]["val_loss"] == pytest.approx(0.7 * v["emma"] + 0.3 * v["macbeth"])
    # each source is its own curve in the trackers: TensorBoard and MLflow (sqlite, no server)
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = Path(cfg.run.runs_dir) / "t"
    tb = EventAccumulator(str(run / "tensorboard"))
    tb.Reload()
    for name in ("emma", "macbeth"):
        got = [(e.step, e.value) for e in tb.Scalars(f"train/source_tokens/{name}")]
        assert got == [(r["step"], r["source_tokens"][name]) for r in rows], name
        assert [e.step for e in tb.Scalars(f"eval/val_loss_sources/{name}")] == [r["step"] for r in evals]
    client = MlflowClient(f"sqlite:///{run / 'mlflow' / 'mlflow.db'}")
    (mrun,) = client.search_runs(client.search_experiments()[0].experiment_id)
    history = client.get_metric_history(mrun.info.run_id, "train/source_tokens/macbeth")
    assert [(m.step, m.value) for m in history] == [(r["step"], r["source_tokens"]["macbeth"]) for r in rows]
    # the report's mixture section: tokens stacked by source, validation loss per source, a table of both
    import re

    from oreline.report.html import write_report

    text = write_report(Path(cfg.run.runs_dir) / "t").read_text(encoding="utf-8")
    mixture = re.search(r'<section id="mixture">(.*?)</section>', text, re.S).group(1)
    assert "not available" not in mixture and mixture.count("<img") == 2
    assert "<td>emma</td>" in mixture and "<td>macbeth</td>" in mixture


def test_mixture_changed_at_resume_is_recorded_as_a_new_phase(
    prose_tokens, second_source, tmp_path, one_thread
):
    from oreline.config import config_from_dict, to_dict
    from oreline.train.checkpoint.format import read_meta
    from oreline.train.loop import train

    cfg = mixture_config(
        tmp_path, prose_tokens, second_source, train__steps=8, train__log_every=4, checkpoint__every=4
    )
    train(config_from_dict(to_dict(cfg)), resume="none")
    cfg = mixture_config(
        tmp_path,
        prose_tokens,
        second_source,
        (0.2, 0.8),
        train__steps=12,
        train__log_every=4,
        checkpoint__every=4,
    )
    train(config_from_dict(to_dict(cfg)), resume="auto", allow_config_change=["train.sources", "train.steps"])
    run = Path(cfg.run.runs_dir) / "t"
    recs = read_metrics(run / "metrics.jsonl")
    phase = [r for r in recs if r["type"] == "event" and r.get("kind") == "phase"]
    assert len(phase) == 1 and phase[0]["step"] == 8
    assert phase[0]["values"]["weights"] == {"emma": 0.2, "macbeth": 0.8}
    meta = read_meta(run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip())
    assert [(p["start"], p["why"]) for p in meta["loader"]["phases"]] == [(0, "config"), (8 * 8, "resume")]
    last = [r for r in recs if r["type"] == "train"][-1]
    assert last["source_weights"] == {"emma": 0.2, "macbeth": 0.8}
    assert last["source_tokens_interval"]["macbeth"] == pytest.approx(0.8 * 4 * 8 * 64, abs=64)


def _kill_resume_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "oreline_test_kill_resume_mixture", Path(__file__).parent / "test_kill_resume_train.py"
    )
    kr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kr)
    return kr


@pytest.mark.slow
def test_sigkill_resume_is_bit_exact_in_both_phases_of_a_two_phase_run(prose_tokens, second_source, tmp_path):
    kr = _kill_resume_module()
    mixture = {
        "train.tokens": None,
        "train.sources": [
            {"name": "emma", "tokens": str(prose_tokens["tokens"]), "weight": 0.7},
            {"name": "macbeth", "tokens": str(second_source), "weight": 0.3},
        ],
        # the annealing phase from step 8 on (checkpoints every 4 steps: a resume lands on its start)
        "train.phases": [{"start_step": 8, "weights": {"emma": 0.1, "macbeth": 0.9}}],
    }
    ref_cfg = kr.write_config(tmp_path / "ref.toml", tmp_path / "ref", prose_tokens, **_dunder(mixture))
    ref_proc = kr.launch(ref_cfg, tmp_path / "ref.log")
    cfg = kr.write_config(tmp_path / "killed.toml", tmp_path / "killed", prose_tokens, **_dunder(mixture))
    run = tmp_path / "killed" / "r"
    # mid-step 6 (phase 1: resumes from step 4), mid-save of step 12 (phase 2: resumes from step 8,
    # the phase's first position), mid-step 15 (resumes from step 12, inside phase 2)
    hits = kr.run_with_kills(cfg, run, [("step", 6), ("save", 12), ("step", 15)], log=tmp_path / "k.log")
    assert ref_proc.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    kr.assert_identical(tmp_path / "ref" / "r", run)
    for key in ("source_tokens", "source_weights"):
        assert kr.per_step(tmp_path / "ref" / "r", key) == kr.per_step(run, key), key
    weights = kr.per_step(run, "source_weights")
    assert weights[8] == {"emma": 0.7, "macbeth": 0.3} and weights[9] == {"emma": 0.1, "macbeth": 0.9}, hits
    resumes = [r for r in kr.records(run) if r.get("type") == "event" and r.get("kind") == "resume"]
    assert len(resumes) == 3 and not [r for r in kr.records(run) if r.get("kind") == "phase"]


def _dunder(settings: dict) -> dict:
    return {k.replace(".", "__"): v for k, v in settings.items()}


@pytest.mark.slow
def test_one_and_two_ranks_ddp_and_fsdp_train_on_the_same_global_mixture_batches(
    prose_tokens, second_source, tmp_path
):
    import math
    import os
    import subprocess
    import sys

    from oreline_test_train_fixtures import write_config

    base = {
        "run.name": "r",
        "train.tokens": None,
        "train.sources": [
            {"name": "emma", "tokens": str(prose_tokens["tokens"]), "weight": 0.7},
            {"name": "macbeth", "tokens": str(second_source), "weight": 0.3},
        ],
        "train.phases": [{"start_step": 3, "weights": {"emma": 0.3, "macbeth": 0.7}}],
        "train.micro_batch": 2,
        "train.steps": 6,
        "train.log_every": 1,
        "train.eval_every": 6,
        "train.eval_sequences": 2,
        "eval.max_new_tokens": 2,
        "eval.prompts": ["Emma"],
    }
    py, torchrun = (
        [sys.executable, "-m", "oreline"],
        [sys.executable, "-m", "torch.distributed.run", "--standalone"],
    )
    runs = {
        "one": ({"train.grad_accum": 4}, [*py, "train"]),
        "ddp": ({"train.grad_accum": 2}, [*py, "train", "--nproc", "2"]),
        "fsdp": (
            {"train.grad_accum": 2, "train.parallel": "fsdp"},
            [*torchrun, "--nproc_per_node=2", "-m", "oreline", "train"],
        ),
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs = {}
    for name, (changes, cmd) in runs.items():
        cfg = write_config(tmp_path / f"{name}.toml", tmp_path / name, prose_tokens, base | changes)
        with open(tmp_path / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(
                [*cmd, "-c", str(cfg)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
    rows = {
        n: [r for r in read_metrics(tmp_path / n / "r" / "metrics.jsonl") if r["type"] == "train"]
        for n in runs
    }
    ref = rows["one"]
    assert [r["step"] for r in ref] == list(range(1, 7))
    for name in ("ddp", "fsdp"):
        got = rows[name]
        assert [r["source_tokens"] for r in got] == [r["source_tokens"] for r in ref], name
        for a, b in zip(ref, got, strict=True):  # the same data: the same losses up to the reduction order
            assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5), (name, a["step"], a["loss"], b["loss"])
    assert ref[-1]["source_weights"] == {"emma": 0.3, "macbeth": 0.7}


def test_a_source_without_a_val_split_is_trained_on_and_not_validated(
    prose_tokens, tmp_path, one_thread, capsys
):
    from oreline.config import TokenizeConfig, config_from_dict, to_dict
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.train.loop import train

    folder = tmp_path / "no-val"
    tokenize_corpus(
        [prose_tokens["docs"]], prose_tokens["tokenizer"], folder, TokenizeConfig(val_fraction=0.0, workers=1)
    )
    cfg = mixture_config(tmp_path, prose_tokens, folder, (0.5, 0.5), train__steps=6, train__eval_every=6)
    train(config_from_dict(to_dict(cfg)), resume="none")
    evals = [r for r in read_metrics(Path(cfg.run.runs_dir) / "t" / "metrics.jsonl") if r["type"] == "eval"]
    assert list(evals[-1]["val_loss_sources"]) == ["emma"]
    assert evals[-1]["val_loss"] == evals[-1]["val_loss_sources"]["emma"]  # the validated sources' weights
    assert "'macbeth'" in capsys.readouterr().err.replace("\n", " ")


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (
            {
                "sources": [
                    {"name": "a", "tokens": "/a", "weight": 1},
                    {"name": "a", "tokens": "/b", "weight": 1},
                ]
            },
            "repeat",
        ),
        ({"sources": [{"name": "a", "tokens": "/a", "weight": 0}]}, "weight > 0"),
        ({"sources": [{"name": "a", "tokens": "/a", "weight": -1}]}, "greater than or equal"),
        (
            {
                "sources": [{"name": "a", "tokens": "/a", "weight": 1}],
                "phases": [{"start_step": 5, "weights": {"b": 1}}],
            },
            "not in train.sources",
        ),
        (
            {"sources": [{"name": "a", "tokens": "/a", "weight": 1}], "phases": [{"weights": {"a": 1}}]},
            "exactly one of start_step",
        ),
        ({"phases": [{"start_step": 1, "weights": {"a": 1}}]}, "needs"),
    ],
)
def test_mixture_config_mistakes_name_the_setting(tree, message):
    from oreline.config import config_from_dict

    with pytest.raises(ConfigError, match=message):
        config_from_dict({"train": tree})


def test_start_tokens_rounds_up_to_a_whole_step(prose_tokens, second_source):
    loader = MixtureLoader(
        sources(prose_tokens, second_source),
        [_Phase(None, {"emma": 1.0}, start_tokens=5 * B * T + 1)],
        seq_len=T,
        micro_batch=B,
        seed=3,
    )
    assert [p.start for p in loader.mixture.phases] == [0, 6 * B]
    assert {n for n, _ in loader.global_indices(6 * B, 50)} == {"emma"}


def test_a_source_added_at_resume_starts_at_zero_and_a_removed_one_stops(prose_tokens, second_source):
    emma = Source("emma", prose_tokens["tokens"], 1.0)
    alone = MixtureLoader([emma], seq_len=T, micro_batch=B, seed=3)
    batches(alone, 10)
    both = MixtureLoader(sources(prose_tokens, second_source, 0.5, 0.5), seq_len=T, micro_batch=B, seed=3)
    both.load_state_dict(json.loads(json.dumps(alone.state_dict())))
    assert both.new_phase is not None and both.source_sequences() == {"emma": 10 * B, "macbeth": 0}
    nxt = both.global_indices(10 * B, 40)
    fresh = MixtureLoader(sources(prose_tokens, second_source, 0.5, 0.5), seq_len=T, micro_batch=B, seed=3)
    assert [i for n, i in nxt if n == "macbeth"] == [
        i for n, i in fresh.global_indices(0, 40) if n == "macbeth"
    ]
    assert [i for n, i in nxt if n == "emma"] == [i for n, i in alone.global_indices(10 * B, 20)]
    batches(both, 10)
    counts = both.source_sequences()
    back = MixtureLoader([emma], seq_len=T, micro_batch=B, seed=3)  # macbeth left out again
    back.load_state_dict(json.loads(json.dumps(both.state_dict())))
    assert back.new_phase is not None and back.source_sequences() == counts
    assert {n for n, _ in back.global_indices(back.consumed, 40)} == {"emma"}
    assert back.source_tokens(back.consumed + 40)["macbeth"] == counts["macbeth"] * T  # stopped where it was


def test_sources_without_their_token_folders_name_them_and_the_way_out(tmp_path):
    """The default (demo) config names oreline run's per-set folders {run}/tokens-web and
    {run}/tokens-extra: a run tokenized by hand into <run>/tokens has neither, and is told what to do
    instead of meeting a bare missing-manifest error of one folder."""
    from oreline.config import load_config
    from oreline.errors import InputError
    from oreline.runs import RunDir
    from oreline.train.session import mixture_sources

    cfg = load_config(None, ["run.name=r", f"run.runs_dir={tmp_path}"])
    run = RunDir(tmp_path / "r")
    with pytest.raises(InputError) as e:
        mixture_sources(cfg, run)
    assert "web → " in str(e.value) and "prose → " in str(e.value) and "train.tokens=FOLDER" in e.value.hint
    # one folder named: the one-source mixture, no check of the sources
    cfg = load_config(None, ["run.name=r", f"run.runs_dir={tmp_path}", f"train.tokens={tmp_path / 'tok'}"])
    assert [s.name for s in mixture_sources(cfg, run)] == ["main"]


def test_a_source_with_a_validation_split_shorter_than_a_sequence_is_named_not_fatal(
    prose_tokens, tmp_path, one_thread, capsys
):
    """One short document drawn for validation (a small crawl's 2%) gave "fewer than seq_len + 1"
    and stopped the run: the source is trained on, and start-up and the report name it."""
    from oreline.config import TokenizeConfig, config_from_dict, to_dict
    from oreline.report.html import write_report
    from oreline.tokens.tokenize import id_hash, tokenize_corpus
    from oreline.train.loop import train

    rows = [json.loads(line) for line in prose_tokens["docs"].read_text().splitlines()[:60]]
    lowest = min(id_hash(r["id"]) for r in rows)
    short = next(f"short-{k}" for k in range(10**6) if id_hash(f"short-{k}") < lowest)
    docs = tmp_path / "small-crawl.jsonl"
    docs.write_text(
        "".join(json.dumps(r) + "\n" for r in [*rows, {"id": short, "text": "A short page."}]),
        encoding="utf-8",
    )
    folder = tmp_path / "short-val"
    fraction = (id_hash(short) + lowest) / 2 / 2**64  # the short document alone
    made = tokenize_corpus(
        [docs], prose_tokens["tokenizer"], folder, TokenizeConfig(val_fraction=fraction, workers=1)
    )
    assert made["splits"]["val"]["documents"] == 1 and made["splits"]["val"]["tokens"] < 65
    cfg = mixture_config(tmp_path, prose_tokens, folder, (0.5, 0.5), train__steps=6, train__eval_every=6)
    train(config_from_dict(to_dict(cfg)), resume="none")
    run_dir = Path(cfg.run.runs_dir) / "t"
    records = read_metrics(run_dir / "metrics.jsonl")
    assert list([r for r in records if r["type"] == "eval"][-1]["val_loss_sources"]) == ["emma"]
    start = next(r for r in records if r["type"] == "start")
    assert "fewer than seq_len + 1 = 65" in start["mixture"]["unvalidated"]["macbeth"]
    assert "source 'macbeth'" in capsys.readouterr().err.replace("\n", " ")
    html = write_report(run_dir).read_text(encoding="utf-8")
    assert "source macbeth has a validation split of" in html
