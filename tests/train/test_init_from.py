"""train.init_from: a fresh run from existing weights (issue 36, item 1), and eval of model-only snapshots.

The source is real: a debug-preset model trained 20 steps by `train` on the prose fixture, exported
to Hugging Face format by `oreline export` and imported back by `oreline import-hf`. From there:
import → init_from with 0 steps → eval → export gives back the imported tensors bit for bit;
init_from + a few steps starts at the source's loss, not at a random init's; each refusal (another
model shape, another tokenizer, a weights-only snapshot passed to --resume) says what to set; a
resumed run continues from its own checkpoint and never reads init_from again; DDP and FSDP2 ranks
all hold the source's weights.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from oreline.errors import CheckpointError, ConfigError, InputError
from oreline.eval.evaluate import evaluate_cli
from oreline.export.hf import export_hf, import_hf
from oreline.train.checkpoint.format import read_meta
from oreline.train.checkpoint.load import load_model_state
from oreline.train.loop import train

fixtures = import_module("oreline_test_train_fixtures")
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115


def records(run: Path) -> list[dict]:
    return fixtures.read_metrics(run / "metrics.jsonl")


@pytest.fixture(scope="module")
def source(prose_tokens, tmp_path_factory):
    """{"run", "hf", "imp"}: a 20-step run, its HF export, and that export imported."""
    root = tmp_path_factory.mktemp("init-src")
    cfg = fixtures.make_config(root, prose_tokens, run__name="src", checkpoint__model_only_every=20)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(cfg, resume="none", console=QUIET)
    finally:
        torch.set_num_threads(threads)
    export_hf(root / "src", root / "hf")
    import_hf(root / "hf", root / "imp")
    return {"run": root / "src", "hf": root / "hf", "imp": root / "imp", "final": records(root / "src")}


def test_import_init_from_zero_steps_eval_export_round_trip(source, train_config, tmp_path, one_thread):
    from oreline.train.init_from import weights_sha256

    imported = load_file(str(source["imp"] / "model.safetensors"))
    summary = train(train_config(train__init_from=str(source["imp"]), train__steps=0), console=QUIET)
    run = Path(summary["run_dir"])
    assert summary["step"] == 0
    start = next(r for r in records(run) if r["type"] == "start")
    lineage = start["init_from"]
    assert lineage["path"] == str(source["imp"].resolve()) and lineage["kind"] == "import-hf"
    assert lineage["weights_sha256"] == weights_sha256(imported)
    sd, _, meta = load_model_state(run)  # the run's step-0 model
    assert meta["step"] == 0 and meta["init_from"] == lineage
    assert sd.keys() == imported.keys() and all(torch.equal(sd[k], imported[k]) for k in sd)

    # eval of the run, and of the import itself (a model-only snapshot without a config)
    at_run = evaluate_cli(run, out=tmp_path / "run-eval.json", batches=2)
    at_imp = evaluate_cli(
        source["imp"], data=fixtures_tokens(source), out=tmp_path / "imp-eval.json", batches=2, seq_len=64
    )
    assert at_run["step"] == 0 and at_run["val_loss"] < 6.0  # a random 512-token model scores ~6.24
    # the import is the source run's step-20 model (its export says so), not a step-0 one
    assert at_imp["step"] == 20 and at_imp["val_loss"] < 6.0  # (the default config's batches: not the run's)

    export_hf(run, tmp_path / "exp")
    exported = load_file(str(tmp_path / "exp" / "model.safetensors"))
    original = load_file(str(source["hf"] / "model.safetensors"))
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[k], original[k]) for k in exported)


def fixtures_tokens(source) -> Path:
    return Path(read_meta(source["run"] / "checkpoints" / "model-step-00000020")["tokens_dir"])


def test_oreline_eval_cli_takes_an_import(source, oreline_cli, tmp_path):
    with pytest.raises(InputError, match="pass --data TOKENS"):  # what to pass, not "meta has no config"
        evaluate_cli(source["imp"])
    with pytest.raises(InputError, match="outside 1..64, the model's max_seq_len"):  # the trained context
        evaluate_cli(source["imp"], data=fixtures_tokens(source), seq_len=65)
    out, prompts = tmp_path / "e.json", tmp_path / "prompts.txt"
    prompts.write_text("Emma\n")
    code, text = oreline_cli(
        "eval", str(source["imp"]), "--data", str(fixtures_tokens(source)), "--batches", "1", "--out", str(out),
        "--prompts", str(prompts), "--tokenizer", str(source["imp"] / "tokenizer"),
    )  # fmt: skip
    assert code == 0, text
    result = json.loads(out.read_text())
    assert result["val_batches"] == 1 and result["step"] == 20 and len(result["generations"]) == 2


def test_init_from_trains_on_from_the_sources_weights(source, train_config, tmp_path, one_thread):
    """Started from the HF folder itself: the first step's loss is the source's last one (~5.4
    after its 20 steps), not a fresh init's (~6.24 = ln 512)."""
    src_last = [r["loss"] for r in source["final"] if r["type"] == "train"][-1]
    cfg = train_config(train__init_from=str(source["hf"]), train__steps=6, checkpoint__every=6)
    summary = train(cfg, console=QUIET)
    first = next(r for r in records(Path(summary["run_dir"])) if r["type"] == "train" and r["step"] == 1)
    assert first["loss"] < 5.8 and abs(first["loss"] - src_last) < 0.2, (first["loss"], src_last)
    meta = read_meta(Path(summary["checkpoint"]))
    assert meta["init_from"]["kind"] == "hf" and meta["init_from"]["step"] == 20
    assert meta["init_from"]["tokenizer_check"].startswith("tokenizer fingerprint")
    result = evaluate_cli(Path(summary["run_dir"]), out=tmp_path / "e.json", batches=2)
    assert result["step"] == 6 and result["val_loss"] < 5.8  # a random init: ~6.24


def test_a_resumed_run_continues_from_its_own_checkpoint(source, train_config, tmp_path, one_thread):
    """init_from applies to a fresh start only: with the source gone, the resume still works and
    carries the lineage on into its checkpoints; a run started from that run nests it."""
    imp = tmp_path / "imp"
    shutil.copytree(source["imp"], imp)
    cfg = train_config(train__init_from=str(imp), train__steps=6, checkpoint__every=3)
    train(cfg, console=QUIET)
    lineage = read_meta(tmp_path / "t" / "checkpoints" / "step-00000006")["init_from"]
    shutil.rmtree(imp)
    cfg = train_config(train__init_from=str(imp), train__steps=8, checkpoint__every=3)
    summary = train(cfg, allow_config_change=["train.steps"], console=QUIET)
    assert summary["resumed_from"].endswith("step-00000006") and summary["step"] == 8
    assert read_meta(Path(summary["checkpoint"]))["init_from"] == lineage

    # that run's folder as a source: its latest full (DCP) checkpoint, with its own lineage nested
    summary = train(
        train_config(run__name="next", train__init_from=str(tmp_path / "t"), train__steps=0), console=QUIET
    )
    sd, _, meta = load_model_state(Path(summary["checkpoint"]))
    want, _, _ = load_model_state(tmp_path / "t")
    assert sd.keys() == want.keys() and all(torch.equal(sd[k], want[k]) for k in sd)
    assert meta["init_from"]["kind"] == "checkpoint" and meta["init_from"]["step"] == 8
    assert meta["init_from"]["source_init_from"] == lineage
    from oreline.train.checkpoint.commands import inspect_cli

    console = Console(record=True, width=400, file=open(os.devnull, "w"))  # noqa: SIM115
    assert inspect_cli(Path(summary["checkpoint"]), console) == 0
    line = next(x for x in console.export_text().splitlines() if x.strip().startswith("init_from"))
    assert f"{(tmp_path / 't').resolve()}/checkpoints/step-00000008 (checkpoint, step 8" in line
    assert lineage["imported_from"] == str(source["hf"].resolve())


def test_resume_from_a_weights_only_snapshot_points_to_init_from(source, train_config):
    with pytest.raises(CheckpointError, match="train.init_from") as err:
        train(train_config(), resume=str(source["imp"]), console=QUIET)
    assert "max_seq_len" not in str(err.value)


def test_another_model_shape_is_refused_naming_the_tensor_and_the_keys(source, train_config):
    with pytest.raises(
        ConfigError,
        match=r"tensor lm_head\.weight has shape \(512, 64\).*set model\.dim = 64, model\.ffn_dim = 192",
    ):
        train(train_config(train__init_from=str(source["imp"]), model__dim=128), console=QUIET)
    # the same tensor shapes, other heads (q: 64×64, k/v: 32×64 both ways): still another model
    with pytest.raises(ConfigError, match=r"n_heads=4.*set model\.n_heads = 4, model\.n_kv_heads = 2"):
        cfg = train_config(train__init_from=str(source["imp"]), model__n_heads=8, model__n_kv_heads=4)
        train(cfg, console=QUIET)


def test_another_tokenizer_is_refused(source, train_config, tmp_path):
    # an export that says it was trained with another tokenizer
    other = tmp_path / "other-fp"
    shutil.copytree(source["hf"], other)
    record = json.loads((other / "oreline_export.json").read_text())
    (other / "oreline_export.json").write_text(json.dumps(record | {"tokenizer_fingerprint": "ab" * 32}))
    with pytest.raises(ConfigError, match="tokenizer abababababab"):
        train(train_config(train__init_from=str(other)), console=QUIET)
    # an HF folder with no fingerprint: vocabulary size and special ids are compared
    bare = tmp_path / "bare"
    shutil.copytree(source["hf"], bare)
    (bare / "oreline_export.json").unlink()
    config = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps(config | {"eos_token_id": 7}))
    with pytest.raises(ConfigError, match="eos id is 7, this run's 2"):
        train(train_config(train__init_from=str(bare)), console=QUIET)
    (bare / "config.json").write_text(json.dumps(config))  # the same ids: accepted
    summary = train(train_config(train__init_from=str(bare), train__steps=0), console=QUIET)
    lineage = next(r for r in records(Path(summary["run_dir"])) if r["type"] == "start")["init_from"]
    assert lineage["tokenizer_fingerprint"] is None and "bos/eos/pad ids match" in lineage["tokenizer_check"]


@pytest.mark.hostile
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_source_with_non_finite_weights_is_refused_naming_the_tensor(source, train_config, tmp_path, value):
    """One NaN (or inf) in a source's weights: every step of the run would be non-finite and skipped,
    and the run would end with exit 0 and a checkpoint of the same weights. Refused on rank 0
    before anything is loaded, naming the tensor and where."""
    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    shutil.copytree(source["hf"], bad)
    tensors = load_file(bad / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] = value
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    says = r"tensor model\.layers\.1\.mlp\.down_proj\.weight .* 1 non-finite value\(s\) \((nan|inf) at index \[3, 5\]\)"
    with pytest.raises(ConfigError, match=says + r".*start from a checkpoint taken before"):
        train(train_config(train__init_from=str(bad), train__steps=6, checkpoint__every=6), console=QUIET)


def test_zero_steps_need_init_from(train_config):
    with pytest.raises(ConfigError, match="train.init_from"):
        train_config(train__steps=0)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_every_rank_holds_the_sources_weights(parallel, source, prose_tokens, tmp_path):
    """2 gloo ranks, 0 steps: each rank's parameter digest is the source's (DDP: each rank's copy;
    FSDP2: the gathered shards), and the step-0 model the run wrote is the import bit for bit."""
    from oreline.model.llama import Llama, ModelArgs
    from oreline.train.param_digest import param_digest

    settings = {
        "train.init_from": str(source["imp"]),
        "train.steps": 0,
        "train.parallel": parallel,
        "train.micro_batch": 2,
        "train.debug.param_digest": True,
        "eval.prompts": ["Emma"],
    }
    config = fixtures.write_config(tmp_path / "c.toml", tmp_path, prose_tokens, settings)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, "-m", "oreline", "train", "-c", str(config)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    imported = load_file(str(source["imp"] / "model.safetensors"))
    _, args, _ = load_model_state(source["imp"])
    with torch.device("meta"):
        model = Llama(ModelArgs.from_dict(args.to_dict() | {"max_seq_len": 256}))
    model.to_empty(device="cpu")
    model.load_state_dict(imported)
    want = param_digest(model)
    run = tmp_path / "t"
    digests = [(run / "debug" / f"params-rank{r:05d}.sha256").read_text().strip() for r in (0, 1)]
    assert digests == [want, want]
    sd, _, meta = load_model_state(run)
    assert meta["world_size"] == 2 and all(torch.equal(sd[k], imported[k]) for k in imported)


@pytest.mark.slow
def test_a_refusal_on_rank_0_ends_every_rank(source, prose_tokens, tmp_path):
    """Rank 0 alone reads and checks the source; its refusal reaches rank 1, which would otherwise
    wait in the weights' broadcast until the collective timeout."""
    bad = tmp_path / "bad"
    shutil.copytree(source["hf"], bad)
    (bad / "oreline_export.json").unlink()
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(config | {"bos_token_id": 9}))
    settings = {"train.init_from": str(bad), "train.parallel": "ddp", "train.micro_batch": 2}
    cfg = fixtures.write_config(tmp_path / "c.toml", tmp_path, prose_tokens, settings)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, "-m", "oreline", "train", "-c", str(cfg)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and text.count("its bos id is 9, this run's 1") == 1, text[-4000:]  # rank 0's
    assert "timed out" not in text.lower() and "oreline/train" not in text, text[
        -4000:
    ]  # no rank's traceback


def test_an_unreadable_source_is_an_oreline_error_on_every_rank(source, train_config, tmp_path):
    """A source that fails in a way oreline's own checks do not name (here a config with 0 heads: a
    ZeroDivisionError) still becomes the one verdict rank 0 broadcasts; a raw exception there left
    the other ranks waiting in the broadcast."""
    odd = tmp_path / "odd"
    shutil.copytree(source["hf"], odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps(config | {"num_attention_heads": 0}))
    with pytest.raises(CheckpointError, match="cannot read it .ZeroDivisionError") as e:
        train(train_config(train__init_from=str(odd)), console=QUIET)
    assert "complete and readable" in e.value.hint
