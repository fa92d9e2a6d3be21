"""precision=fp8 under FSDP2 on two gloo ranks (torchrun), emulated: the run all-gathers fp8 weights
(tensorwise) and recomputes their scales after every optimizer step (Setup.after_optimizer_step),
trains like the bf16 run, and its checkpoint resumes as a bf16 run with a warning."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from oreline_test_train_fixtures import write_config

pytest.importorskip("torchao.float8")

SETTINGS = {
    "train.micro_batch": 2,
    "train.steps": 4,
    "train.log_every": 1,
    "train.eval_every": 0,
    "train.optim.warmup_steps": 1,
    "train.parallel": "fsdp",
    "checkpoint.every": 4,
    "eval.prompts": [],
}


def _run(cfg, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "oreline", "train", "-c", str(cfg), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def _records(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_fsdp_fp8_all_gather_trains_like_bf16_and_resumes_as_bf16(tmp_path, prose_tokens):
    fp8 = {"train.precision": "fp8", "train.fp8_emulate": True, "train.fp8_filter": "all", "run.name": "fp8"}
    _run(write_config(tmp_path / "fp8.toml", tmp_path, prose_tokens, SETTINGS | fp8))
    _run(
        write_config(
            tmp_path / "bf16.toml",
            tmp_path,
            prose_tokens,
            SETTINGS | {"train.precision": "bf16", "run.name": "bf16"},
        )
    )
    losses = {
        name: [r["loss"] for r in _records(tmp_path / name) if r["type"] == "train"]
        for name in ("fp8", "bf16")
    }
    assert len(losses["fp8"]) == 4 and all(math.isfinite(v) for v in losses["fp8"])
    assert losses["fp8"] != losses["bf16"]
    assert all(abs(a - b) < 0.05 * b for a, b in zip(losses["fp8"], losses["bf16"], strict=True)), losses
    start = next(r for r in _records(tmp_path / "fp8") if r["type"] == "start")
    assert start["precision"] == "fp8" and start["world_size"] == 2
    # the fp8 run's checkpoint resumes as a bf16 run (the same tensors), with a warning event
    resumed = SETTINGS | fp8 | {"train.precision": "bf16", "train.steps": 6}
    _run(
        write_config(tmp_path / "resume.toml", tmp_path, prose_tokens, resumed),
        "--resume", "auto", "--allow-config-change", "train.steps",
    )  # fmt: skip
    recs = _records(tmp_path / "fp8")
    warned = [r for r in recs if r["type"] == "event" and r["kind"] == "compute_change"]
    assert len(warned) == 1 and "train.precision: fp8 → bf16" in warned[0]["message"]
    assert [r["step"] for r in recs if r["type"] == "train"][-2:] == [5, 6]
