"""The whole chain in one command: crawl files + prose → data → tokenizer → tokens → train →
eval → export → report, then re-runs that redo exactly the stages whose inputs changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from oreline.config import load_config
from oreline.errors import InputError
from oreline.stages import run_all, stage_plan

pytestmark = pytest.mark.slow  # the whole pipeline, crawl to report, on the samples (tens of seconds)


MINI = """
[run]
name = "mini"
runs_dir = "{runs}"
[data]
inputs = ["{{samples}}/web-archives/dolma-wget-2024", "{{samples}}/web-archives/commoncrawl-samples"]
extra_inputs = ["{{samples}}/english-prose/tinyshakespeare.txt.gz"]
workers = 2
[data.langid]
languages = ["en", "es", "an"]
[tokenizer]
vocab_size = 1024
[tokenize]
val_fraction = 0.05
[model]
preset = "debug"
[train]
seq_len = 128
micro_batch = 4
steps = 24
log_every = 8
eval_every = 12
eval_sequences = 8
# a two-source mixture as the demo's: oreline run tokenizes each document set on its own
sources = [
    {{ name = "web", tokens = "{{run}}/tokens-web", weight = 0.3 }},
    {{ name = "prose", tokens = "{{run}}/tokens-extra", weight = 0.7 }},
]
[checkpoint]
every = 12
[eval]
batches = 2
max_new_tokens = 8
tasks = ["core"]
tasks_max_items = 8
"""


@pytest.fixture(scope="module")
def mini_run(tmp_path_factory, samples):
    root = tmp_path_factory.mktemp("e2e")
    path = root / "mini.toml"
    path.write_text(MINI.format(runs=root / "runs"))
    cfg = load_config(path)
    summary = run_all(cfg, console=Console(stderr=True, width=120))
    return path, root / "runs" / "mini", summary


def test_every_stage_leaves_its_artifacts(mini_run):
    _, run_dir, summary = mini_run
    for rel in (
        "data/stats.json",
        "extra/docs",
        "tokenizer/tokenizer.json",
        "tokens/manifest.json",
        "tokens-web/manifest.json",
        "tokens-extra/manifest.json",
        "checkpoints/latest",
        "metrics.jsonl",
        "eval/final.json",
        "eval/tasks-final.json",
        "export/config.json",
        "export/model.safetensors",
        "report.html",
        "lineage.json",
        "config.toml",
        "fingerprint.json",
    ):
        assert (run_dir / rel).exists(), rel
    assert [a for _, a in summary["plan"]] == ["run"] * 7
    assert summary["web_docs_kept"] > 0 and summary["train_tokens"] > 0
    assert summary["final_val_loss"] is not None and summary["final_val_loss"] < 7.0
    lineage = json.loads((run_dir / "lineage.json").read_text())
    assert all(lineage[s]["finished"] for s in lineage)
    # the final model on every shipped downstream task, shown in the report next to chance
    tasks = json.loads((run_dir / "eval" / "tasks-final.json").read_text())
    assert set(tasks["tasks"]) == {"arc_easy", "arc_challenge", "piqa", "copa", "winogrande", "lambada"}
    assert all(m["items"] == 8 for m in tasks["tasks"].values()) and tasks["core"] is not None
    downstream = (
        (run_dir / "report.html").read_text().split('<section id="downstream"')[1].split("</section>")[0]
    )
    assert "tasks-final.json" in downstream and "chance" in downstream
    # the run trained on both sources at their weights (the mixture's order: within one sequence
    # per source of weight × sequences at every step)
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in last if r.get("type") == "train"][-1]
    seqs = last["source_sequences"]
    assert set(seqs) == {"web", "prose"} and abs(seqs["web"] - 0.3 * sum(seqs.values())) <= 1, seqs


def test_rerun_skips_unchanged_and_redoes_exactly_what_changed(mini_run):
    path, run_dir, _ = mini_run
    plan = dict(stage_plan(load_config(path)))
    assert set(plan.values()) == {"skip"}

    # a filter threshold: data and everything after it
    plan = dict(stage_plan(load_config(path, ["data.langid.threshold=0.9"])))
    assert set(plan.values()) == {"run"}

    # the learning rate: training and after, and the real re-run does exactly that
    cfg = load_config(path, ["train.optim.lr=0.001"])
    summary = run_all(cfg, console=Console(stderr=True, width=120))
    assert summary["plan"] == [
        ("data", "skip"),
        ("tokenizer", "skip"),
        ("tokenize", "skip"),
        ("train", "run"),
        ("eval", "run"),
        ("export", "run"),
        ("report", "run"),
    ]
    assert (run_dir / "previous").is_dir()  # the old training run was moved aside, not mixed in

    # an eval setting: eval and the report; the export depends on the training alone (issue 52:
    # an eval-only change re-ran the export)
    plan = dict(stage_plan(load_config(path, ["train.optim.lr=0.001", "eval.batches=3"])))
    assert [s for s, action in plan.items() if action == "run"] == ["eval", "report"], plan

    # --from forces a stage and everything after it
    plan = stage_plan(cfg, from_stage="export")
    assert plan[-2:] == [("export", "run"), ("report", "run")] and plan[3] == ("train", "skip")


def test_a_training_setting_train_refuses_is_refused_before_the_first_stage(tmp_path):
    """warmup_steps not shorter than steps was found only at the train stage, after data,
    tokenizer and tokenize had run; nothing is written now, not even the run folder."""
    from oreline.errors import ConfigError

    cfg = load_config("demo", [f"run.runs_dir={json.dumps(str(tmp_path))}", "train.steps=10"])
    with pytest.raises(ConfigError, match=r"warmup_steps=40 is not shorter than train.steps=10"):
        run_all(cfg, console=Console(stderr=True))
    assert list(tmp_path.iterdir()) == []


def test_missing_samples_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("ORELINE_SAMPLES", str(tmp_path / "nowhere"))
    cfg = load_config(None, [f"run.runs_dir={json.dumps(str(tmp_path))}"])
    with pytest.raises(InputError) as err:
        run_all(cfg, console=Console(stderr=True))
    assert "ORELINE_SAMPLES" in str(err.value) and "data.inputs" in str(err.value)


def _short_demo(runs: Path) -> list[str]:
    """The demo config itself, with a short training: what `oreline run -c demo` does up to train."""
    return [
        f"run.runs_dir={json.dumps(str(runs))}",
        "train.steps=12",
        "train.optim.warmup_steps=4",
        "train.eval_every=12",
        "train.eval_tasks=[]",
        "checkpoint.every=12",
        "eval.tasks=[]",
        "eval.batches=2",
        "eval.max_new_tokens=4",
    ]


def _check_demo_sources(run_dir: Path, summary: dict) -> None:
    from oreline.tokens.tokenize import read_manifest

    for folder in ("tokens-web", "tokens-extra"):
        val = read_manifest(run_dir / folder)["splits"]["val"]
        # every mixture source validates: at least tokenize.val_sequences sequences of seq_len
        assert val["documents"] > 0 and val["tokens"] >= 16 * 256 + 1, (folder, val)
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r.get("type") == "eval"]
    assert set(evals[-1]["val_loss_sources"]) == {"web", "prose"}
    assert summary["final_val_loss"] is not None and (run_dir / "export" / "config.json").is_file()


def test_demo_on_the_embedded_samples_validates_every_source(tmp_path, monkeypatch, samples):
    """With the embedded samples, 2% of the web documents was none: no web validation, unsaid."""
    monkeypatch.delenv("ORELINE_SAMPLES", raising=False)
    cfg = load_config("demo", _short_demo(tmp_path / "runs"))
    summary = run_all(cfg, console=Console(stderr=True, width=120))
    _check_demo_sources(tmp_path / "runs" / "demo", summary)


@pytest.mark.extended("web-archives", "english-prose")
def test_demo_on_the_larger_sample_folder_runs_and_validates_every_source(
    tmp_path, monkeypatch, full_samples
):
    """The README's `ORELINE_SAMPLES=../shared/data oreline run -c demo`: 2% of its 80 web documents
    was one of 204 tokens, and training stopped at "fewer than seq_len + 1"."""
    monkeypatch.setenv("ORELINE_SAMPLES", str(full_samples))
    cfg = load_config("demo", _short_demo(tmp_path / "runs"))
    summary = run_all(cfg, console=Console(stderr=True, width=120))
    _check_demo_sources(tmp_path / "runs" / "demo", summary)
