"""Recovery through the real loop: skipped NaN steps, rollbacks after spikes, bounded retries,
corrupted checkpoints passed over for the previous valid one, config changes refused unless named.

Runs are in-process `train(cfg)` calls on the debug preset and the prose token fixture
(tests/train/conftest.py), one thread, a few seconds each.
"""

from __future__ import annotations

import io
import json
import math

import pytest
import torch
from rich.console import Console

from oreline.errors import CheckpointError, TrainingError
from oreline.train.checkpoint.format import CheckpointCorrupted, read_meta, step_name
from oreline.train.checkpoint.load import load_checkpoint, load_model_state
from oreline.train.checkpoint.resume import find_resumable
from oreline.train.checkpoint.save import save_checkpoint
from oreline.train.checkpoint.verify import forget_verified
from oreline.train.loop import train


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def weights(path) -> dict[str, torch.Tensor]:
    return load_model_state(path)[0]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def quiet() -> Console:
    return Console(record=True, width=200, file=io.StringIO())


def test_skipped_nan_step_leaves_weights_and_optimizer_untouched(tmp_path, train_config, one_thread):
    cfg = train_config(
        train__steps=6,
        train__log_every=1,
        train__eval_every=0,
        train__grad_accum=1,
        train__debug__inject_nan_at_step=4,
        checkpoint__every=1,
        checkpoint__keep_last=1000,
        eval__prompts=[],
    )
    summary = train(cfg, resume="none", console=quiet())
    root = tmp_path / "t" / "checkpoints"
    before, at, after = (weights(root / step_name(s)) for s in (3, 4, 5))
    assert same(before, at)  # the NaN step changed nothing
    assert not same(at, after)  # the next step trains again
    meta3, meta4 = read_meta(root / "step-00000003"), read_meta(root / "step-00000004")
    assert meta4["skipped_steps"] == 1 and meta4["stability"]["counters"]["skipped"] == 1
    assert meta4["stability"]["counters"]["by_kind"] == {"nonfinite": 1}
    # the optimizer's own step count (Adam bias correction) did not advance on the skipped step
    steps = {}
    for s in (3, 4):
        model, opt = _fresh_model_and_optimizer(cfg)
        load_checkpoint(root / step_name(s), model, opt, restore_rng=False)
        steps[s] = opt.state_dict()["state"][0]["step"].item()
    assert steps[3] == steps[4] == 3.0
    assert meta3["tokens_seen"] < meta4["tokens_seen"]  # the batch was consumed, not replayed
    assert summary["skipped_steps"] == 1


def _fresh_model_and_optimizer(cfg):
    from oreline.model.llama import Llama
    from oreline.train.optim import build_optimizer

    args = load_model_state(cfg.run.runs_dir + "/t")[1]
    model = Llama(args)
    return model, build_optimizer(model, cfg.train.optim, torch.device("cpu"))


def test_rollback_after_a_spike_recovers_the_run(tmp_path, train_config, one_thread):
    # z 10: the injected spike scores ~1000σ; a grad-norm blip of the changed trajectory (~8σ over a
    # short window, seen once here) must not add a second rollback to the one under test
    common = dict(
        train__steps=24,
        train__log_every=1,
        train__eval_every=0,
        checkpoint__every=4,
        train__stability__min_history=8,
        train__stability__z_threshold=10.0,
        train__stability__action="rollback",
        eval__prompts=[],
    )
    ref = train(train_config(run__name="ref", **common), resume="none", console=quiet())
    got = train(train_config(train__debug__inject_spike_at_step=15, **common), resume="none", console=quiet())
    recs = metrics(tmp_path / "t")
    events = [(r["step"], r["kind"], r["action"]) for r in recs if r["type"] == "event"]
    assert events == [(15, "loss_spike", "rollback"), (12, "rollback", "rollback")], events
    rollback = next(r for r in recs if r["type"] == "event" and r["kind"] == "rollback")
    assert rollback["values"]["failed_step"] == 15 and rollback["values"]["to_step"] == 12
    assert rollback["values"]["lr_multiplier"] == pytest.approx(0.8)
    assert got["rollbacks"] == 1 and got["step"] == 24
    # the spike never reached the weights: the final loss is back on the uninjected run's track
    assert got["final_train_loss"] == pytest.approx(ref["final_train_loss"], rel=0.05)
    assert got["final_val_loss"] == pytest.approx(ref["final_val_loss"], rel=0.05)
    lrs = {r["step"]: r["lr"] for r in recs if r["type"] == "train"}
    ref_lrs = {r["step"]: r["lr"] for r in metrics(tmp_path / "ref") if r["type"] == "train"}
    assert lrs[20] == pytest.approx(0.8 * ref_lrs[20])  # lr × lr_factor after the rollback
    assert read_meta(tmp_path / "t" / "checkpoints" / "step-00000024")["lr_multiplier"] == pytest.approx(0.8)


def test_retries_are_bounded_and_the_error_says_what_and_where(tmp_path, train_config, one_thread):
    # a negative threshold makes every judged step a "spike": rollbacks cannot help
    cfg = train_config(
        train__steps=20,
        train__log_every=1,
        train__eval_every=0,
        checkpoint__every=2,
        train__stability__min_history=4,
        train__stability__z_threshold=-1e9,
        train__stability__loss_spike_min_ratio=0.0,
        train__stability__action="rollback",
        train__stability__max_retries=2,
        eval__prompts=[],
    )
    with pytest.raises(TrainingError) as err:
        train(cfg, resume="none", console=quiet())
    msg = str(err.value)
    assert "loss_spike" in msg and "step " in msg and "step-0000000" in msg and "max_retries" in msg
    rollbacks = [
        r for r in metrics(tmp_path / "t") if r.get("type") == "event" and r.get("kind") == "rollback"
    ]
    assert len(rollbacks) == 2


@pytest.fixture
def eight_steps(tmp_path, train_config, one_thread):
    """A run of 8 steps with checkpoints at 4 and 8; returns a factory for its continuation config."""
    kw = dict(
        train__log_every=1,
        train__eval_every=0,
        checkpoint__every=4,
        checkpoint__keep_last=3,
        eval__prompts=[],
    )
    train(train_config(train__steps=8, **kw), resume="none", console=quiet())
    return lambda **more: train_config(**{**kw, "train__steps": 12, **more})


def corrupt(path, how: str) -> None:
    shard = next(path.glob("*.distcp"))
    if how == "delete":
        (path / ".metadata").unlink()
    elif how == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    else:
        with open(shard, "r+b") as fh:
            fh.truncate(shard.stat().st_size - 100)


@pytest.mark.parametrize("how", ["delete", "flip", "truncate"])
def test_corrupted_checkpoint_is_skipped_for_the_previous_one(tmp_path, how):
    from oreline.config import CheckpointConfig
    from oreline.model.llama import Llama

    root = tmp_path / "checkpoints"
    model = Llama(_debug_args())
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    opt.step()
    for step in (4, 8):
        save_checkpoint(
            root, step, model, opt, {"model_args": _debug_args().to_dict()}, cfg=CheckpointConfig(keep_last=3)
        )
    corrupt(root / "step-00000008", how)
    forget_verified()  # as a new process: this one trusts what it wrote
    console = Console(record=True, width=200)
    if how == "flip":
        # sizes and index intact: the search does not hash data files; the load hashes what it reads
        assert find_resumable(root, console=console) == root / "step-00000008"
        with pytest.raises(
            CheckpointCorrupted, match=r"step-00000008 is invalid: __0_0\.distcp checksum mismatch"
        ):
            load_checkpoint(root / "step-00000008", model, opt)
        return
    assert find_resumable(root, console=console) == root / "step-00000004"
    text = console.export_text()
    assert "skipping checkpoint step-00000008" in text
    assert {"delete": ".metadata is missing", "truncate": "truncated"}[how] in text
    with pytest.raises(CheckpointError, match="invalid"):
        load_checkpoint(root / "step-00000008", model, opt)


def _debug_args():
    from oreline.config import ModelConfig
    from oreline.model.presets import resolve_model_args

    return resolve_model_args(ModelConfig(preset="debug"))


def test_resume_passes_over_a_corrupted_checkpoint(tmp_path, eight_steps):
    corrupt(tmp_path / "t" / "checkpoints" / "step-00000008", "flip")
    console = Console(record=True, width=200)
    summary = train(eight_steps(), resume="auto", allow_config_change=["train.steps"], console=console)
    assert summary["resumed_from"].endswith("step-00000004") and summary["step"] == 12
    assert "skipping checkpoint step-00000008: __0_0.distcp checksum mismatch" in console.export_text()
    steps = [r["step"] for r in metrics(tmp_path / "t") if r["type"] == "train"]
    assert steps == list(range(1, 13))  # 5-8 redone once, the records of the first attempt dropped


def test_config_changes_are_refused_unless_named(tmp_path, eight_steps):
    with pytest.raises(CheckpointError, match="train.steps") as err:
        train(eight_steps(), resume="auto", console=quiet())
    assert "--allow-config-change train.steps" in str(err.value)
    with pytest.raises(CheckpointError, match="train.optim.lr"):
        train(
            eight_steps(train__optim__lr=1e-3),
            resume="auto",
            allow_config_change=["train.steps"],
            console=quiet(),
        )
    with pytest.raises(CheckpointError, match="model shape"):
        train(
            eight_steps(model__n_layers=3),
            resume="auto",
            allow_config_change=["train.steps", "model.n_layers"],
            console=quiet(),
        )
    summary = train(
        eight_steps(train__optim__lr=1e-3),
        resume="auto",
        allow_config_change=["train.steps", "train.optim.lr"],
        console=quiet(),
    )
    assert summary["resumed_from"].endswith("step-00000008") and summary["step"] == 12
    assert math.isfinite(summary["final_val_loss"])
