"""Distributed training on CPU with gloo, verified against one process.

Real `oreline train` runs of the debug preset on the prose token shards (tests/train/conftest.py),
20 steps, seq_len 64, global batch 8 sequences:

- 1 rank, micro 2 × accum 4 (the reference); 4-rank HSDP (2 × 2 mesh, micro 2 × accum 1); 2-rank DDP (`oreline train --nproc 2`) and 2-rank
  FSDP2 (`torchrun -m oreline train`), both with activation checkpointing, micro 2 × accum 2:
  the same loss at every step (relative difference ≤ 1e-5), the same parameters on both ranks
  (train.debug.param_digest), final weights close to the reference's. Step 7's loss is made NaN
  (train.debug.inject_nan_at_step) in every run: both ranks skip it, as the single process does.
- the 2-rank checkpoint of step 10 resumed on 1 rank (FSDP shards → one process) and on 2 ranks
  continues with the uninterrupted run's losses; resuming with a different global batch refuses.
- a 2-rank run whose rank 1 is SIGKILLed ends within a bounded time, torchrun naming the dead rank;
  the same command then resumes from the last checkpoint and ends with the uninterrupted losses.
- global_batch_tokens designed for 1 rank, launched on 2: refuses with the arithmetic.
- DDP + activation checkpointing and unused parameters (tests/train/dist_helpers.py).

Every run uses OMP_NUM_THREADS=1: 2 ranks on the 2 shared cores would oversubscribe them, and a
matmul's float result depends on how it is split over threads, so the 1-rank reference uses one
thread too. The independent runs start together (module fixture) to keep the file's wall time low,
the ones that other runs start from or the first test compares at a higher priority (`runs`).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from oreline.train.checkpoint.load import load_model_state

from .conftest import kill_resume_module, write_config

STEPS, EVERY, TOL = 20, 10, 1e-5
pytestmark = pytest.mark.slow  # every test here runs real multi-process training (tens of seconds)


NAN_STEP = 7  # every run makes step 7's loss NaN: all ranks must skip it together
HELPER = Path(__file__).with_name("dist_helpers.py")
ALLOW = [
    "--allow-config-change",
    "run",
    "--allow-config-change",
    "train.grad_accum",
    "--allow-config-change",
    "train.parallel",
    "--allow-config-change",
    "train.activation_checkpointing",
]


SETTINGS = {
    "run.name": "r",
    "train.micro_batch": 2,
    "train.steps": STEPS,
    "train.log_every": 1,
    "train.eval_every": STEPS,
    "train.eval_sequences": 8,
    "train.optim.warmup_steps": 4,
    "train.debug.param_digest": True,
    "train.debug.inject_nan_at_step": NAN_STEP,
    "checkpoint.every": EVERY,
    "eval.max_new_tokens": 4,
    "eval.prompts": ["Emma"],
}


# a spike on every step from 13 (issue 35): after the NaN of step 7 is skipped, 3 spikes skipped in a
# row roll back to the checkpoint of step 12 with lr × 0.8; the replayed steps 13-15 were injected
# once already, then 16-18 are skipped again, and past max_retries = 1 the run stops with the cause
STORM = {
    "checkpoint.every": 4,
    "train.optim.lr": 1e-3,
    "train.stability.min_history": 4,
    "train.stability.max_consecutive_skips": 3,
    "train.stability.max_retries": 1,
    "train.debug.inject_spike_at_step": 13,
    "train.debug.spike_steps": 100,
}


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "250"}


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def oreline(*args: str) -> list[str]:
    return [sys.executable, "-m", "oreline", *args]


class Job:
    def __init__(self, cmd: list[str], log: Path, later: bool = False):
        """`later`: at nice 10, so that on the 2 shared cores the runs other runs wait for go first."""
        self.log = log
        cmd = ["nice", "-n", "10", *cmd] if later else cmd  # (nice execs the command: the pid is the run's)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env(), stdout=out, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 400) -> int:
        return self.proc.wait(timeout=timeout)

    def text(self) -> str:
        return " ".join(self.log.read_text(errors="replace").split())  # rich wraps long lines

    def ok(self) -> None:
        assert self.wait() == 0, self.log.read_text(errors="replace")[-4000:]


# metrics.jsonl's records (a line a kill cut short left out), read incrementally: the killer thread
# polls the killed run's file every 10 ms, and a full parse each time took CPU from the runs
records = kill_resume_module().records


def losses(run: Path) -> dict[int, float]:
    recs = [r for r in records(run) if r["type"] == "train"]
    steps = [r["step"] for r in recs]
    assert steps == sorted(set(steps)), f"metrics.jsonl repeats steps (more than rank 0 logging?): {steps}"
    return {r["step"]: math.nan if r["loss"] is None else r["loss"] for r in recs}  # NaN is logged as null


def assert_same_losses(ref: dict[int, float], got: dict[int, float], steps: range) -> None:
    assert list(got) == list(steps), list(got)
    nan = [s for s in steps if math.isnan(got[s]) or math.isnan(ref[s])]
    assert all(math.isnan(got[s]) and math.isnan(ref[s]) for s in nan), [(s, ref[s], got[s]) for s in nan]
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in steps if s not in nan)
    assert worst <= TOL, [(s, ref[s], got[s]) for s in steps]


def worker_pid(agent: int, rank: int) -> int | None:
    """The pid of torchrun agent `agent`'s worker with RANK=rank (from /proc)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == agent and f"RANK={rank}".encode() in (d / "environ").read_bytes().split(b"\0"):
                return int(d.name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def kill_rank_after_checkpoint(
    job: Job, run: Path, rank: int, step: int, result: dict, relaunch: Any
) -> None:
    """Background: once checkpoint `step` is logged, SIGKILL worker `rank`, record how long the rest
    took to exit, and relaunch the same command (`relaunch()` → Job) at once."""
    end = time.monotonic() + 400
    while time.monotonic() < end and job.proc.poll() is None:
        if any(r.get("type") == "checkpoint" and r.get("step") == step for r in records(run)):
            pid = worker_pid(job.proc.pid, rank)
            if pid is None:
                result["error"] = "rank worker not found"
                return
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            try:
                result["rc"] = job.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                result["rc"] = None
            result["exit_s"] = time.monotonic() - t0
            result["killed_after_step"] = max(losses(run), default=0)
            result["again"] = relaunch()
            return
        time.sleep(0.01)
    result["error"] = f"the run ended (rc {job.proc.poll()}) before its checkpoint of step {step}"


@pytest.fixture(scope="module")
def runs(prose_tokens, tmp_path_factory):
    """Start every independent run at once; tests wait for the ones they check.

    All of them are CPU-bound on the 2 cores, so the order they finish in is the order the tests can
    check them in. The runs that the first test compares (ref, ddp, fsdp) and the ones that later
    runs start from (ddp, fsdp: the resumes; kill: its relaunch) run at normal priority; those no
    other run waits for (hsdp, wrongworld, helper, storm1, storm2) at nice 10, using what the first
    ones leave of the cores. The dependent runs then start while those still run, not after them."""
    root = tmp_path_factory.mktemp("dist")
    c = {}
    for name, changes in (
        ("ref", {"train.grad_accum": 4}),
        ("ddp", {"train.grad_accum": 2, "train.activation_checkpointing": True}),
        # the FSDP ranks with the allocator meant for them (oreline.train.performance.lean_cpu_allocator)
        (
            "fsdp",
            {
                "train.grad_accum": 2,
                "train.parallel": "fsdp",
                "train.activation_checkpointing": True,
                "train.cpu_allocator": "lean",
            },
        ),
        (
            "hsdp",
            {"train.grad_accum": 1, "train.parallel": "hsdp", "train.hsdp_shard_size": 2},
        ),
        ("kill", {"train.grad_accum": 2, "train.parallel": "ddp", "train.debug.sleep_per_step_s": 0.15}),
        ("wrongworld", {"train.grad_accum": 4, "train.parallel": "ddp", "train.global_batch_tokens": 512}),
        ("storm1", {"train.grad_accum": 4} | STORM),
        ("storm2", {"train.grad_accum": 2, "train.parallel": "ddp"} | STORM),
    ):
        c[name] = write_config(root / f"{name}.toml", root / name, prose_tokens, SETTINGS | changes)
    jobs = {
        "ref": Job(oreline("train", "-c", str(c["ref"])), root / "ref.log"),
        "ddp": Job(oreline("train", "-c", str(c["ddp"]), "--nproc", "2"), root / "ddp.log"),
        "fsdp": Job(torchrun(2, "-m", "oreline", "train", "-c", str(c["fsdp"])), root / "fsdp.log"),
        "hsdp": Job(
            torchrun(4, "-m", "oreline", "train", "-c", str(c["hsdp"])), root / "hsdp.log", later=True
        ),
        "kill": Job(torchrun(2, "-m", "oreline", "train", "-c", str(c["kill"])), root / "kill.log"),
        "wrongworld": Job(
            torchrun(2, "-m", "oreline", "train", "-c", str(c["wrongworld"])),
            root / "wrongworld.log",
            later=True,
        ),
        "helper": Job(torchrun(2, str(HELPER), str(prose_tokens["tokens"])), root / "helper.log", later=True),
        "storm1": Job(oreline("train", "-c", str(c["storm1"])), root / "storm1.log", later=True),
        "storm2": Job(
            torchrun(2, "-m", "oreline", "train", "-c", str(c["storm2"])), root / "storm2.log", later=True
        ),
    }
    kill_result: dict = {}
    relaunch = lambda: Job(torchrun(2, "-m", "oreline", "train", "-c", str(c["kill"])), root / "kill2.log")  # noqa: E731
    killer = threading.Thread(
        target=kill_rank_after_checkpoint,
        args=(jobs["kill"], root / "kill" / "r", 1, EVERY, kill_result, relaunch),
        daemon=True,
    )
    resumes = threading.Thread(target=start_resumes, args=(jobs, root, c), daemon=True)
    killer.start()
    resumes.start()
    yield {
        "root": root,
        "configs": c,
        "jobs": jobs,
        "killer": killer,
        "kill_result": kill_result,
        "resumes": resumes,
        "run": {k: root / k / "r" for k in c},
    }
    killer.join(timeout=60)
    resumes.join(timeout=60)
    for job in [*jobs.values(), *([kill_result["again"]] if "again" in kill_result else [])]:
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()


def test_ddp_and_fsdp_equal_one_process(runs):
    for name in ("ref", "ddp", "fsdp"):
        runs["jobs"][name].ok()
    run = runs["run"]
    ref = losses(run["ref"])
    assert list(ref) == list(range(1, STEPS + 1))
    for name in ("ddp", "fsdp"):
        assert_same_losses(ref, losses(run[name]), range(1, STEPS + 1))
        recs = records(run[name])
        start = next(r for r in recs if r["type"] == "start")
        assert start["world_size"] == 2 and start["global_batch"]["world"] == 2
        assert start["global_batch"]["tokens"] == 8 * 64 == records(run["ref"])[0]["global_batch"]["tokens"]
        train = [r for r in recs if r["type"] == "train"]
        assert all(r["comm_ms"] > 0 and 0 < r["comm_frac"] < 1 for r in train), [
            (r["comm_ms"], r["comm_frac"]) for r in train
        ]
        assert all(r["tokens_in_step"] == 8 * 64 for r in train)
        skips = [r for r in recs if r["type"] == "event" and r["action"] == "skip"]
        assert [(r["step"], r["kind"]) for r in skips] == [(NAN_STEP, "nonfinite")], skips
        digests = [(run[name] / "debug" / f"params-rank{r:05d}.sha256").read_text() for r in (0, 1)]
        assert digests[0] == digests[1], f"{name}: ranks ended with different parameters"
        # the final weights: same training, only the float reduction order differs
        sd_ref, _, _ = load_model_state(run["ref"])
        sd, _, meta = load_model_state(run[name])
        assert meta["world_size"] == 2 and sd.keys() == sd_ref.keys()
        for k in sd:
            assert torch.allclose(sd[k], sd_ref[k], rtol=1e-4, atol=1e-5), (
                f"{name}: {k} differs from the 1-rank run"
            )
    # the same validation set on 1 and 2 ranks (train.eval_sequences, issue 36): the same loss
    ref_eval = [r for r in records(run["ref"]) if r["type"] == "eval"]
    for name in ("ddp", "fsdp"):
        got = [r for r in records(run[name]) if r["type"] == "eval"]
        assert [(r["step"], r["val_sequences"], r["val_targets"]) for r in got] == [
            (r["step"], r["val_sequences"], r["val_targets"]) for r in ref_eval
        ]
        for a, b in zip(got, ref_eval, strict=True):
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=TOL), (
                name,
                a["val_loss"],
                b["val_loss"],
            )
    # FSDP2 warned on every run that the loss, a view, could get wrong gradients (issue 36)
    assert "returned a view tensor" not in runs["jobs"]["fsdp"].text()
    # the lean allocator, set, changed nothing
    assert "M_MMAP_THRESHOLD=64 KiB" in runs["jobs"]["fsdp"].text()
    # `oreline train --nproc 2` chose DDP: the start record says so, the recorded config is as given
    assert next(r for r in records(run["ddp"]) if r["type"] == "start")["parallel"] == "ddp"
    assert 'parallel = "none"' in (run["ddp"] / "config.toml").read_text()


def test_hsdp_on_a_two_by_two_mesh_equals_one_process(runs):
    """4 gloo ranks, train.parallel=hsdp with shards of 2 (replicated twice): micro 2 × accum 1 ×
    world 4 = the reference's 8 sequences; the same losses and final weights within the DDP/FSDP
    tolerances, the same parameters on every rank."""
    for name in ("ref", "hsdp"):
        runs["jobs"][name].ok()
    run = runs["run"]
    ref = losses(run["ref"])
    assert_same_losses(ref, losses(run["hsdp"]), range(1, STEPS + 1))
    recs = records(run["hsdp"])
    start = next(r for r in recs if r["type"] == "start")
    assert start["world_size"] == 4 and start["global_batch"]["tokens"] == 8 * 64
    skips = [r for r in recs if r["type"] == "event" and r["action"] == "skip"]
    assert [(r["step"], r["kind"]) for r in skips] == [(NAN_STEP, "nonfinite")], skips
    digests = {(run["hsdp"] / "debug" / f"params-rank{r:05d}.sha256").read_text() for r in range(4)}
    assert len(digests) == 1, "hsdp: ranks ended with different parameters"
    sd_ref, _, _ = load_model_state(run["ref"])
    sd, _, meta = load_model_state(run["hsdp"])
    assert meta["world_size"] == 4 and sd.keys() == sd_ref.keys()
    for k in sd:
        assert torch.allclose(sd[k], sd_ref[k], rtol=1e-4, atol=1e-5), (
            f"hsdp: {k} differs from the 1-rank run"
        )


def start_resumes(jobs: dict, root: Path, c: dict) -> None:
    """Background: as soon as the 2-rank runs are done, resume their step-10 checkpoints.

    The FSDP shards of 2 ranks → 1 process (accum 4 keeps the global batch); DDP 2 ranks → 2 ranks;
    2 ranks → 1 rank without raising accum: the global batch would halve, so it must refuse.
    """
    if jobs["ddp"].wait() != 0 or jobs["fsdp"].wait() != 0:
        return
    fsdp_ckpt = root / "fsdp" / "r" / "checkpoints" / "step-00000010"
    ddp_ckpt = root / "ddp" / "r" / "checkpoints" / "step-00000010"
    jobs["one"] = Job(
        oreline("train", "-c", str(c["ref"]), "run.name=from-fsdp", "--resume", str(fsdp_ckpt), *ALLOW),
        root / "one.log",
    )
    jobs["two"] = Job(
        torchrun(
            2,
            "-m",
            "oreline",
            "train",
            "-c",
            str(c["ddp"]),
            "train.parallel=ddp",
            "run.name=from-ddp",
            "--resume",
            str(ddp_ckpt),
            *ALLOW,
        ),
        root / "two.log",
    )
    jobs["half"] = Job(
        oreline("train", "-c", str(c["ddp"]), "run.name=half", "--resume", str(ddp_ckpt), *ALLOW),
        root / "half.log",
    )


def test_resume_on_one_and_two_ranks(runs):
    for name in ("ddp", "fsdp"):
        runs["jobs"][name].ok()
    runs["resumes"].join(timeout=60)
    root, run = runs["root"], runs["run"]
    one, two, half = (runs["jobs"][k] for k in ("one", "two", "half"))
    one.ok()
    two.ok()
    assert half.wait() != 0
    got = half.text()
    assert "global batch = micro 2 × accum 2 × world 2 × seq_len 64 = 512 tokens" in got, got[-2000:]
    assert "micro 2 × accum 2 × world 1 × seq_len 64 = 256 tokens" in got and "train.grad_accum=4" in got, (
        got[-2000:]
    )
    rest = range(EVERY + 1, STEPS + 1)
    ref_runs = root / "ref" / "from-fsdp", root / "ddp" / "from-ddp"
    for resumed, original in zip(ref_runs, (run["fsdp"], run["ddp"]), strict=True):
        assert_same_losses(losses(original), losses(resumed), rest)
        ev = [r for r in records(resumed) if r["type"] == "event" and r["kind"] == "resume"]
        assert len(ev) == 1 and ev[0]["step"] == EVERY
    starts = [r for r in records(ref_runs[0]) if r["type"] == "start"]
    assert starts[0]["world_size"] == 1


def test_killed_rank_ends_the_run_and_relaunch_resumes(runs):
    runs["killer"].join(timeout=400)
    res = runs["kill_result"]
    job = runs["jobs"]["kill"]
    assert "error" not in res, res.get("error", "") + job.log.read_text(errors="replace")[-3000:]
    assert res["rc"] not in (0, None), res
    assert res["exit_s"] < 60, f"the surviving rank took {res['exit_s']:.1f} s to go"
    text = job.text()
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", text) and re.search(r"exitcode\s*:\s*-9", text), text[
        -3000:
    ]
    assert res["killed_after_step"] < STEPS
    run = runs["run"]["kill"]
    res["again"].ok()  # the same command, relaunched as soon as the first one ended
    ev = [r for r in records(run) if r["type"] == "event" and r["kind"] == "resume"]
    assert len(ev) == 1 and ev[0]["step"] == EVERY, ev
    runs["jobs"]["ddp"].ok()
    assert_same_losses(losses(runs["run"]["ddp"]), losses(run), range(1, STEPS + 1))


def test_global_batch_for_another_world_size_refuses(runs):
    job = runs["jobs"]["wrongworld"]
    assert job.wait() != 0
    text = job.text()
    assert (
        "global batch = micro 2 × accum 4 × world 2 × seq_len 64 = 1,024 tokens, but "
        "train.global_batch_tokens = 512"
    ) in text, text[-3000:]
    assert "set train.grad_accum=2" in text
    assert not (runs["run"]["wrongworld"] / "metrics.jsonl").exists()


def test_ddp_checkpointing_and_unused_parameters(runs):
    job = runs["jobs"]["helper"]
    job.ok()
    results = {}
    for line in job.log.read_text().splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT ") :])
            results[r["scenario"]] = r
    assert set(results) == {
        "unused_detected",
        "unused_allowed",
        "ours_checkpointing",
        "reentrant_no_unused",
        "reentrant_unused",
    }, results
    det = results["unused_detected"]
    assert det["error"] == "DistributedError" and "unused_head.weight, unused_head.bias" in det["message"]
    assert "train.find_unused_parameters=true" in det["message"]
    assert results["unused_allowed"]["ok"] and results["ours_checkpointing"]["ok"]
    # checkpointing recomputes the same forward: the same gradients as without it
    assert results["ours_checkpointing"]["q_grad_sum"] == pytest.approx(
        results["unused_allowed"]["q_grad_sum"], rel=1e-6
    )
    assert results["reentrant_no_unused"]["ok"]  # torch 2.13: reentrant is fine while every parameter is used
    bad = results["reentrant_unused"]
    assert not bad["ok"] and "mark a variable ready only once" in bad["message"], bad
    timeout = [
        json.loads(line[len("TIMEOUT ") :])
        for line in job.log.read_text().splitlines()
        if line.startswith("TIMEOUT ")
    ]
    assert timeout == [{"seconds": 321.0}]  # a dead peer fails a collective after train.dist_timeout_s
    # the stability decision's inputs are the same on every rank, whatever one rank saw
    agree = [
        json.loads(line[len("AGREE ") :])
        for line in job.log.read_text().splitlines()
        if line.startswith("AGREE ")
    ]
    assert sorted(r["rank"] for r in agree) == [0, 1], agree
    for r in agree:
        assert r["nan_on_one"] == ["2.5", "nan"] and r["differ"] == ["2.5", repr(1.0 + 1e-12)], agree
        assert r["stop"] == [True, False], agree


def test_a_spike_storm_escalates_the_same_on_one_and_two_ranks(runs):
    """An injected NaN and a single spike are skipped, a storm of skips rolls back, a storm after
    the rollback stops the run with the cause: the same steps on 1 rank and on 2 gloo ranks (every
    rank judges the same all-reduced values)."""
    expected = [
        (NAN_STEP, "nonfinite", "skip"),
        (13, "loss_spike", "skip"),
        (14, "loss_spike", "skip"),
        (15, "loss_spike", "skip"),
        (15, "loss_spike", "rollback"),
        (12, "rollback", "rollback"),
        (16, "loss_spike", "skip"),
        (17, "loss_spike", "skip"),
        (18, "loss_spike", "skip"),
    ]
    for name in ("storm1", "storm2"):
        job = runs["jobs"][name]
        # ends (no rank hangs in a collective: Job.wait's timeout) and fails
        assert job.wait() != 0, job.log.read_text(errors="replace")[-3000:]
        got = [
            (r["step"], r["kind"], r["action"]) for r in records(runs["run"][name]) if r["type"] == "event"
        ]
        assert got == expected, (name, got)
        text = job.text()
        assert "3 steps in a row were skipped" in text and "max_retries = 1" in text, text[-3000:]
