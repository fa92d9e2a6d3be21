"""The training loop on real prose: loss normalisation, batch arithmetic, metrics files, NaN, resume."""

from __future__ import annotations

import contextlib
import json
import math
import shutil

import pytest
import torch
from rich.console import Console

from oreline.errors import CheckpointError, TrainingError
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.tokens.loader import TokenLoader
from oreline.train.batch import global_batch, to_device
from oreline.train.dist import DistInfo
from oreline.train.loop import train
from oreline.train.optim import lr_at
from oreline.train.performance import enable_activation_checkpointing
from oreline.train.step import forward_backward

CPU1 = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None, is_main=True)
TRAIN_KEYS = {
    "step",
    "tokens_seen",
    "tokens_in_step",
    "loss",
    "loss_token",
    "loss_eos",
    "loss_bos",
    "lr",
    "grad_norm",
    "clipped",
    "tokens_per_s",
    "mfu",
    "step_ms",
    "cpu_ms",
    "data_ms",
    "data_wait_frac",
    "rss_mb",
    "cuda_alloc_mb",
    "cuda_reserved_mb",
    "cuda_peak_mb",
    "comm_ms",
}
EVAL_KEYS = {
    "step",
    "val_loss",
    "val_ppl",
    "val_bpb",
    "val_loss_token",
    "val_loss_eos",
    "val_loss_bos",
    "train_loss",
}


def read_metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _model(seed: int = 0) -> Llama:
    from oreline.config import ModelConfig

    torch.manual_seed(seed)
    return Llama(resolve_model_args(ModelConfig(preset="debug"), 512))


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _uneven_batch(prose_tokens):
    """8 real sequences whose micro-batches of 2 hold very different numbers of targets."""
    loader = TokenLoader(prose_tokens["tokens"], seq_len=64, micro_batch=8, seed=3)
    b = to_device(loader.next_batch(), torch.device("cpu"))
    b.labels[0:2, :50] = -100  # micro-batch 0: 28 targets at most
    b.labels[4:6, 5:] = -100  # micro-batch 2: 10 targets at most
    return b, loader.bos_id, loader.eos_id


def _split(b, size: int):
    return [
        type(b)(b.input_ids[i : i + size], b.labels[i : i + size], None)
        for i in range(0, b.input_ids.shape[0], size)
    ]


def test_accumulation_equals_one_big_batch_even_with_uneven_targets(prose_tokens, one_thread):
    batch, bos, eos = _uneven_batch(prose_tokens)
    n_targets = float((batch.labels != -100).sum())
    big, acc, naive = _model(), _model(), _model()
    forward_backward(big, [batch], n_targets, CPU1, contextlib.nullcontext, bos, eos)
    sums = forward_backward(acc, _split(batch, 2), n_targets, CPU1, contextlib.nullcontext, bos, eos)
    g_big, g_acc = _grads(big), _grads(acc)
    for name in g_big:
        torch.testing.assert_close(g_acc[name], g_big[name], rtol=1e-5, atol=1e-7, msg=name)
    assert float(sums[1] + sums[3] + sums[5]) == n_targets  # the breakdown counts every target once
    # the naive mean of per-micro-batch means weights the 10-target micro-batch like a full one: different
    for micro in _split(batch, 2):
        forward_backward(
            naive, [micro], float((micro.labels != -100).sum()) * 4, CPU1, contextlib.nullcontext, bos, eos
        )
    g_naive = _grads(naive)
    assert max(float((g_naive[n] - g_big[n]).abs().max()) for n in g_big) > 1e-4


def test_activation_checkpointing_keeps_the_gradients(prose_tokens, one_thread):
    batch, bos, eos = _uneven_batch(prose_tokens)
    plain, ckpt = _model(), _model()
    enable_activation_checkpointing(ckpt)
    assert [n for n, _ in ckpt.named_parameters()] == [n for n, _ in plain.named_parameters()]
    n = float((batch.labels != -100).sum())
    forward_backward(plain, [batch], n, CPU1, contextlib.nullcontext, bos, eos)
    forward_backward(ckpt, [batch], n, CPU1, contextlib.nullcontext, bos, eos)
    for name, g in _grads(plain).items():
        torch.testing.assert_close(_grads(ckpt)[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_global_batch_mismatch_stops_with_the_arithmetic(tmp_path, train_config):
    cfg = train_config(train__global_batch_tokens=1000)
    with pytest.raises(TrainingError) as err:
        train(cfg, resume="none")
    msg = str(err.value)
    assert "micro 4 × accum 2 × world 1 × seq_len 64 = 512 tokens" in msg and "1,000" in msg
    ok = train_config(train__global_batch_tokens=512)
    assert global_batch(ok, world=1)["tokens"] == 512
    assert global_batch(ok, world=1)["sequences"] == 8


def test_short_run_writes_every_metric_and_tensorboard(tmp_path, train_config, one_thread):
    cfg = train_config(train__steps=12, train__log_every=4, train__eval_every=6)
    console = Console(record=True, width=250)
    summary = train(cfg, resume="none", console=console)
    run = tmp_path / "t"
    # checkpoint.every = 0 and no model-only snapshots: said at the start and in the last line
    said = console.export_text()
    assert "this run keeps no weights when it ends" in said and "no weights kept" in said.splitlines()[-1]
    assert summary["checkpoint"] is None and not list((run / "checkpoints").glob("*step-*"))
    recs = read_metrics(run / "metrics.jsonl")
    kinds = [r["type"] for r in recs]
    assert kinds[0] == "start" and kinds[-1] == "end"
    start = recs[0]
    assert start["global_batch"] == {
        "micro": 4,
        "accum": 2,
        "world": 1,
        "seq_len": 64,
        "sequences": 8,
        "tokens": 512,
        "configured_tokens": None,
    }
    assert start["model"]["params"] > start["model"]["non_embedding_params"] > 0
    assert start["peak_flops"] > 0 and "measured" in start["peak_source"]
    assert start["schedule"][0][0] == 1 and start["schedule"][-1][0] == 12
    trains = [r for r in recs if r["type"] == "train"]
    assert [r["step"] for r in trains] == [1, 4, 8, 12]
    for r in trains:
        assert set(r) >= TRAIN_KEYS, TRAIN_KEYS - set(r)
        assert r["tokens_seen"] == 512 * r["step"] and r["tokens_in_step"] == 512
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["tokens_per_s"] > 0
        # a utilisation, or (cores loaded while the peak was timed) flagged as above the peak
        assert (0 < r["mfu"] < 1) if r["mfu"] is not None else r["mfu_above_peak"] > 1
        assert 0 <= r["data_wait_frac"] <= 1 and r["rss_mb"] > 0
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, cfg.train))
    evals = [r for r in recs if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [6, 12]
    for r in evals:
        assert set(r) >= EVAL_KEYS
        assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
        assert (
            0 < r["val_bpb"] < r["val_loss"]
        )  # ~3-4 bytes per token: bits per byte are well below nats per token
    gens = [r for r in recs if r["type"] == "generation"]
    assert sorted((g["step"], g["prompt"]) for g in gens) == [
        (s, p) for s in (6, 12) for p in sorted(cfg.eval.prompts)
    ]
    assert recs[-1]["tokens_seen"] == 12 * 512 and summary["final_val_loss"] == evals[-1]["val_loss"]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "config.toml").is_file()
    assert (run / "fingerprint.json").read_text().count(summary["config_fingerprint"]) == 1


def test_nan_step_is_skipped_and_never_reaches_the_weights(tmp_path, train_config, one_thread):
    from oreline.train.checkpoint.load import load_model_state

    cfg = train_config(
        train__steps=5,
        train__log_every=1,
        train__eval_every=0,
        train__debug__inject_nan_at_step=3,
        checkpoint__every=5,
        eval__prompts=[],
    )
    summary = train(cfg, resume="none")
    recs = read_metrics(tmp_path / "t" / "metrics.jsonl")
    events = [r for r in recs if r["type"] == "event"]
    assert [(e["step"], e["kind"], e["action"]) for e in events] == [(3, "nonfinite", "skip")]
    step3 = next(r for r in recs if r["type"] == "train" and r["step"] == 3)
    assert step3["loss"] is None  # NaN is written as null, the event says what it was
    assert summary["skipped_steps"] == 1 and math.isfinite(summary["final_val_loss"])
    state, _, meta = load_model_state(tmp_path / "t")
    assert meta["step"] == 5 and all(bool(torch.isfinite(t).all()) for t in state.values())


def test_resume_continues_exactly_and_metrics_read_as_one_run(tmp_path, train_config, one_thread):
    cfg = train_config(
        train__steps=8, train__log_every=1, train__eval_every=0, checkpoint__every=4, eval__prompts=[]
    )
    first = train(cfg, resume="none")
    run = tmp_path / "t"
    losses = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["type"] == "train"}
    shutil.rmtree(run / "checkpoints" / "step-00000008")  # as if killed after step 4's checkpoint
    second = train(cfg, resume="auto")
    assert second["resumed_from"].endswith("step-00000004")
    recs = read_metrics(run / "metrics.jsonl")
    trains = [r for r in recs if r["type"] == "train"]
    assert [r["step"] for r in trains] == list(range(1, 9))
    assert {r["step"]: r["loss"] for r in trains} == losses  # bit-exact on CPU
    assert second["final_val_loss"] == first["final_val_loss"]
    assert [r["kind"] for r in recs if r["type"] == "event"] == ["resume"]


def test_resume_with_a_changed_debug_setting_continues_and_a_real_change_is_refused(
    tmp_path, train_config, one_thread
):
    """Issue 36: a train.debug.* setting blocked a resume as a config change; it does not count
    (the resume event records it), while a changed learning rate is still refused."""
    settings = {
        "train__steps": 6,
        "train__log_every": 1,
        "train__eval_every": 0,
        "checkpoint__every": 3,
        "eval__prompts": [],
    }
    first = train(train_config(**settings), resume="none")
    run = tmp_path / "t"
    losses = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["type"] == "train"}
    shutil.rmtree(run / "checkpoints" / "step-00000006")  # as if killed after step 3's checkpoint
    with pytest.raises(CheckpointError, match="train.optim.lr"):
        train(train_config(**settings, train__optim__lr=1e-3), resume="auto")
    debug = {"train__debug__param_digest": True, "train__debug__sleep_per_step_s": 0.01}
    second = train(train_config(**settings, **debug), resume="auto")
    assert second["resumed_from"].endswith("step-00000003")
    recs = read_metrics(run / "metrics.jsonl")
    assert {r["step"]: r["loss"] for r in recs if r["type"] == "train"} == losses
    assert second["final_val_loss"] == first["final_val_loss"]
    (event,) = [r for r in recs if r["type"] == "event" and r["kind"] == "resume"]
    assert "train.debug.param_digest" in json.dumps(event)
    assert (run / "debug" / "params-rank00000.sha256").is_file()  # the debug setting took effect


def test_rollback_reloads_this_runs_checkpoint_lowers_lr_and_moves_the_data_on(
    tmp_path, train_config, one_thread
):
    cfg = train_config(
        train__steps=8,
        train__log_every=1,
        train__eval_every=0,
        checkpoint__every=3,
        train__debug__inject_nan_at_step=5,
        train__stability__action="rollback",
        eval__prompts=[],
    )
    stale = (
        tmp_path / "t" / "checkpoints" / "step-00000030"
    )  # an earlier run's leftovers: never a rollback target
    stale.mkdir(parents=True)
    summary = train(cfg, resume="none")
    assert summary["rollbacks"] == 1 and summary["step"] == 8
    assert list((tmp_path / "t" / "previous").glob("*/checkpoints/step-00000030"))  # moved aside, not deleted
    recs = read_metrics(tmp_path / "t" / "metrics.jsonl")
    events = [(r["step"], r["kind"], r["action"]) for r in recs if r["type"] == "event"]
    assert events == [(5, "nonfinite", "rollback"), (3, "rollback", "rollback")]
    trains = [r for r in recs if r["type"] == "train"]
    assert [r["step"] for r in trains] == [1, 2, 3, 4, 4, 5, 6, 7, 8]  # step 4 before and after the rollback
    first4, again4 = trains[3], trains[4]
    assert again4["lr"] == pytest.approx(0.8 * lr_at(3, cfg.train))  # lr × lr_factor from now on
    assert again4["loss"] != first4["loss"]  # other batches: the data moved on past the failed step
    assert all(
        math.isfinite(r["loss"]) for r in trains
    )  # the NaN was injected once, not again after the rollback


def test_cli_train_with_dotted_overrides(tmp_path, prose_tokens, one_thread):
    from typer.testing import CliRunner

    from oreline.cli import app

    overrides = [
        f"run.runs_dir={json.dumps(str(tmp_path))}",
        'run.name="cli"',
        'model.preset="debug"',
        f"train.tokens={json.dumps(str(prose_tokens['tokens']))}",
        f"train.tokenizer={json.dumps(str(prose_tokens['tokenizer']))}",
        "train.seq_len=64",
        "train.micro_batch=2",
        "train.steps=3",
        "train.eval_sequences=2",
        "train.optim.warmup_steps=1",
        "checkpoint.every=0",
        "eval.prompts=[]",
    ]
    res = CliRunner().invoke(app, ["train", *overrides, "--resume", "none"])
    assert res.exit_code == 0, (res.output, res.exception)
    recs = read_metrics(tmp_path / "cli" / "metrics.jsonl")
    assert recs[-1]["type"] == "end" and recs[-1]["step"] == 3
    assert recs[0]["global_batch"]["tokens"] == 2 * 64
