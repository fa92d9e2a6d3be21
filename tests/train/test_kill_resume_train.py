"""Bit-exact resume proven with real kills: SIGKILL `oreline train` mid-step, mid-save and mid-eval.

An uninterrupted run and a run killed three times (mid-step, mid-save, mid-eval) (resumed each time with the same command,
`--resume auto`) must log bit-identical losses, grad norms and learning rates at every step and
end with bit-identical weights. The runs are real subprocesses of `python -m oreline train` on a
debug-preset Llama with the prose tokenizer and token shards of tests/train/conftest.py.
benchmarks/resume_exactness.py does the same with 20 random kill points.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from importlib import import_module
from pathlib import Path

import pytest
import torch

from oreline.train.checkpoint.load import load_model_state

STEPS, EVERY, EVAL_EVERY = 16, 4, 6
SLEEP = 0.15  # train.debug.sleep_per_step_s: makes "during a step" a window the test can hit


# what every run of these tests (and of test_shutdown's and test_slurm_train's) sets
SETTINGS = {
    "run.name": "r",
    "train.micro_batch": 4,
    "train.grad_accum": 1,
    "train.steps": STEPS,
    "train.log_every": 1,
    "train.eval_every": EVAL_EVERY,
    "train.eval_sequences": 8,
    "train.optim.warmup_steps": 4,
    "train.debug.sleep_per_step_s": SLEEP,
    "checkpoint.every": EVERY,
    "checkpoint.keep_last": 2,
    "eval.max_new_tokens": 4,
    "eval.prompts": ["To be"],
}


def write_config(path: Path, runs: Path, corpus: dict[str, Path], **dotted) -> Path:
    """This module's run config as a TOML file (tests/train/conftest.py write_config), `dotted`
    (train__steps=400, ...) overriding SETTINGS."""
    return import_module("oreline_test_train_fixtures").write_config(path, runs, corpus, SETTINGS, **dotted)


def env() -> dict[str, str]:
    # one thread in every run: the float results of a matmul depend on how it is split over threads
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def launch(config: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "oreline", "train", "-c", str(config)],
            env=env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


# Reading a run's metrics while it is killed, and waiting on it, are the benchmark's own functions
# (benchmarks/resume_exactness.py runs the same kills at 20 random points): loaded by path, as the
# hostile-input tests load theirs, so the two cannot drift apart.
_spec = importlib.util.spec_from_file_location(
    "oreline_bench_resume_exactness",
    Path(__file__).resolve().parents[2] / "benchmarks" / "resume_exactness.py",
)
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
records = _bench.records  # metrics.jsonl's records; a line a kill cut short is left out
has = _bench.has  # whether a record of that type and step was written


def wait_for(proc: subprocess.Popen, cond, timeout: float = 120.0) -> bool:
    """Poll cond every millisecond; False if the process ended or time ran out first."""
    return _bench.wait_for(proc, cond, timeout)


def kill_at(
    proc: subprocess.Popen, run: Path, kind: str, step: int, rng: random.Random, launched: float
) -> str:
    """SIGKILL the run at `kind` ("step", "save", "eval") of `step`; returns what was hit."""
    ckpts = run / "checkpoints"
    if kind == "step":
        if not wait_for(proc, lambda: has(run, "train", step - 1)):
            return "finished"
        time.sleep(rng.uniform(0.0, SLEEP))
        hit = f"during step {step}"
    elif kind == "save":  # this launch's temporary folder, not one an earlier kill left behind
        tmp = ckpts / f".tmp-step-{step:08d}"
        if not wait_for(
            proc, lambda: (tmp.exists() and tmp.stat().st_ctime >= launched) or has(run, "checkpoint", step)
        ):
            return "finished"
        hit = (
            f"during the save of step {step}"
            if tmp.exists() and not has(run, "checkpoint", step)
            else f"after the save of step {step}"
        )
    else:
        if not wait_for(proc, lambda: has(run, "checkpoint", step)):
            return "finished"
        hit = f"during the eval of step {step}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if kind == "eval" and has(run, "eval", step):
        hit = f"after the eval of step {step}"
    return hit


def run_with_kills(
    config: Path, run: Path, plan: list[tuple[str, int]], seed: int = 0, log: Path | None = None
) -> list[str]:
    """Run to the end, killing per plan and resuming with the same command after each kill."""
    rng = random.Random(seed)
    log = log or run.parent / "kills.log"
    hits = []
    for kind, step in plan:
        launched = time.time()
        proc = launch(config, log)
        hit = kill_at(proc, run, kind, step, rng, launched)
        if hit == "finished":
            raise AssertionError(
                f"the run ended (rc {proc.returncode}) before the {kind} kill at {step}: "
                + log.read_text()[-3000:]
            )
        hits.append(hit)
    proc = launch(config, log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    return hits


def per_step(run: Path, key: str) -> dict[int, float]:
    recs = [r for r in records(run) if r.get("type") == "train"]
    steps = [r["step"] for r in recs]
    assert steps == sorted(set(steps)), f"metrics.jsonl repeats or reorders steps: {steps}"
    return {r["step"]: r[key] for r in recs}


def assert_identical(ref: Path, got: Path) -> None:
    for key in ("loss", "grad_norm", "lr", "tokens_seen"):
        a, b = per_step(ref, key), per_step(got, key)
        assert list(a) == list(range(1, STEPS + 1)) and a == b, f"{key} differs: " + str(
            [(s, a.get(s), b.get(s)) for s in a if a.get(s) != b.get(s)][:5]
        )
    sd_a, _, meta_a = load_model_state(ref)
    sd_b, _, meta_b = load_model_state(got)
    assert meta_a["step"] == meta_b["step"] == STEPS
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), f"final weight {k} differs"


@pytest.mark.slow
def test_killed_and_resumed_run_is_bit_identical(prose_tokens, uninterrupted_run, tmp_path):
    # the uninterrupted run (tests/train/conftest.py: one per session), alongside the killed one
    cfg = write_config(tmp_path / "killed.toml", tmp_path / "killed", prose_tokens)
    run = tmp_path / "killed" / "r"
    # step 3: before the first checkpoint (the relaunch starts afresh); the save of step 8 (resumes
    # from step 4 and replays 5-8); the eval after step 12's checkpoint (resumes from step 12)
    hits = run_with_kills(cfg, run, [("step", 3), ("save", 8), ("eval", 12)], log=tmp_path / "k.log")
    assert_identical(uninterrupted_run.finished(), run)
    events = [r for r in records(run) if r.get("type") == "event" and r.get("kind") == "resume"]
    assert len(events) == 2, hits  # the first kill came before any checkpoint: a fresh start
    assert "during the save of step 8" in hits, hits
    assert not list((run / "checkpoints").glob(".tmp-*"))
