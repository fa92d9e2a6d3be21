"""How a training run ends when told to (issue 20, items 1 and 2): with its launcher, on SIGTERM, and
what a relaunch completes after a kill that came after the last checkpoint.

- SIGKILL of `oreline train --nproc 2`'s process group (what a terminal, a CI runner or a
  scheduler sends): every rank is gone within seconds, checked by pid (ranks live in sessions of
  their own, so before the fix they trained on and wrote checkpoints into the folder a relaunch used).
- SIGTERM mid-run (1 rank; 2 ranks through the launcher): a checkpoint at the stop step, exit
  143 and the command that resumes; the resumed run equals an uninterrupted one bit for bit.
- a relaunch after a kill between the final checkpoint and the end record completes the final
  evaluation, the generations and the end record (it used to say "nothing to do").

The runs are real `python -m oreline train` subprocesses on the prose token shards of
tests/train/conftest.py, or the loop itself in this process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from oreline.train.loop import train
from oreline.train.torchrun import torchrun_command

_spec = importlib.util.spec_from_file_location(
    "oreline_test_kill_resume", Path(__file__).parent / "test_kill_resume_train.py"
)
kr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kr)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


# ---------------------------------------------------------------------------------------------
# processes


def _ppids() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            out[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return out


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in _ppids().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has stopped running: it counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def oreline(*args: str) -> list[str]:
    return [sys.executable, "-m", "oreline", *args]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, env=kr.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


# ---------------------------------------------------------------------------------------------
# item 1: ranks die with their launcher


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["oreline --nproc", "torchrun"])
def test_ranks_die_with_their_launcher(prose_tokens, tmp_path, launcher):
    kr.write_config(
        tmp_path / "c.toml", tmp_path / "runs", prose_tokens, train__steps=400, train__parallel="ddp"
    )
    run = tmp_path / "runs" / "r"
    cmd = (
        oreline("train", "-c", str(tmp_path / "c.toml"), "--nproc", "2")
        if launcher != "torchrun"
        else torchrun_command(2, ["train", "-c", str(tmp_path / "c.toml")])  # torchrun as a user types it
    )
    proc = start(cmd, tmp_path / "log")
    ranks: list[int] = []
    try:
        assert kr.wait_for(proc, lambda: kr.has(run, "train", 3), timeout=300), (
            tmp_path / "log"
        ).read_text()[-3000:]
        family = descendants(proc.pid)
        ranks = [
            p for p in family if "torch.distributed.run" not in cmdline(p) and "-m oreline" in cmdline(p)
        ]
        assert len(ranks) == 2, [(p, cmdline(p)) for p in family]
        t0 = time.monotonic()
        os.killpg(
            proc.pid, signal.SIGKILL
        )  # the launcher's process group: what a terminal or a CI runner kills
        proc.wait()
        while any(alive(p) for p in ranks) and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        gone_after = time.monotonic() - t0
        print(
            f"{launcher}: ranks {ranks} gone {gone_after:.2f} s after the SIGKILL of the launcher's process group"
        )
        assert not any(alive(p) for p in ranks), (
            f"ranks still alive {gone_after:.1f} s after the launcher died"
        )
        assert gone_after < 5.0
        last = max(r["step"] for r in kr.records(run) if r.get("type") == "train")
        time.sleep(1.0)
        assert max(r["step"] for r in kr.records(run) if r.get("type") == "train") == last  # nobody trains on
    finally:
        for p in ranks:  # on a broken build the orphans would train on after the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# item 1: SIGTERM stops at a step boundary with a checkpoint


def _stop(proc: subprocess.Popen, run: Path, after_step: int, sig: int = signal.SIGTERM) -> tuple[int, int]:
    """Signal the process once step `after_step` is logged; (exit code, step of the stop checkpoint)."""
    assert kr.wait_for(proc, lambda: kr.has(run, "train", after_step), timeout=300)
    proc.send_signal(sig)
    rc = proc.wait(timeout=300)
    stops = [r for r in kr.records(run) if r.get("type") == "event" and r.get("kind") == "stopped"]
    assert len(stops) == 1, kr.records(run)[-5:]
    return rc, stops[0]["step"]


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_and_the_resumed_run_is_bit_identical(
    prose_tokens, uninterrupted_run, tmp_path
):
    # the uninterrupted run (tests/train/conftest.py: one per session), alongside this one
    cfg = kr.write_config(tmp_path / "stop.toml", tmp_path / "stop", prose_tokens)
    run, log = tmp_path / "stop" / "r", tmp_path / "stop.log"
    proc = start(oreline("train", "-c", str(cfg)), log)
    rc, at = _stop(proc, run, 5)
    text = log.read_text()
    assert rc == 143, text[-3000:]
    assert at % kr.EVERY, "the stop landed on a periodic checkpoint step: the test would prove nothing"
    assert (run / "checkpoints" / f"step-{at:08d}").is_dir(), sorted(
        p.name for p in (run / "checkpoints").iterdir()
    )
    assert f"stopped by SIGTERM after step {at}" in text and f"resume with: oreline train -c {cfg}" in text
    # the resumed run is SIGKILLed once its final checkpoint is written (item 2: the final evaluation,
    # generations and end record are then what the next relaunch completes)
    resumed = start(oreline("train", "-c", str(cfg)), log)
    hit = kr.kill_at(resumed, run, "eval", kr.STEPS, random.Random(0), time.time())
    assert hit != "finished", log.read_text()[-3000:]
    assert not any(r["type"] == "end" for r in kr.records(run))
    last = start(oreline("train", "-c", str(cfg)), log)
    assert last.wait(timeout=300) == 0, log.read_text()[-3000:]
    ref = uninterrupted_run.finished()
    kr.assert_identical(ref, run)

    def outcome(recs: list[dict]) -> list:
        return [
            (
                r["type"],
                r["step"],
                r.get("val_loss"),
                r.get("train_loss"),
                r.get("text"),
                r.get("final_val_loss"),
            )
            for r in recs
            if r["type"] in ("eval", "generation", "end")
        ]

    assert outcome(kr.records(run)) == outcome(kr.records(ref)), hit


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_two_ranks_at_one_step(prose_tokens, tmp_path):
    cfg = kr.write_config(tmp_path / "c.toml", tmp_path / "runs", prose_tokens)
    run, log = tmp_path / "runs" / "r", tmp_path / "log"
    proc = start(oreline("train", "-c", str(cfg), "--nproc", "2"), log)
    family: list[int] = []
    try:
        assert kr.wait_for(proc, lambda: kr.has(run, "train", 2), timeout=300), log.read_text()[-3000:]
        family = descendants(proc.pid)
        rc, at = _stop(proc, run, 2)
        text = log.read_text()
        assert rc == 143, text[-3000:]
        assert (run / "checkpoints" / f"step-{at:08d}").is_dir()
        assert f"resume with: oreline train -c {cfg} --nproc 2" in text, text[-3000:]
        assert text.count("resume with:") == 1  # rank 0 says it; the other rank stopped at the same step
        assert not any(alive(p) for p in family)
        resumed = start(oreline("train", "-c", str(cfg), "--nproc", "2"), log)
        assert resumed.wait(timeout=300) == 0, log.read_text()[-3000:]
        starts = [r for r in kr.records(run) if r["type"] == "start"]
        assert starts[-1]["resumed_from"].endswith(f"step-{at:08d}")
        assert [r["step"] for r in kr.records(run) if r["type"] == "train"] == list(range(1, kr.STEPS + 1))
    finally:
        for p in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_repeated_sigterm_is_one_request_and_a_second_ctrl_c_acts_at_once():
    from oreline.train.shutdown import StopRequests

    # a second Ctrl-C does what the handler found at install would have done: Python's own here,
    # whatever the suite inherited (started with `&`, SIGINT arrives ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        stops = StopRequests().install()
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # a service manager signals every process of the job,
            os.kill(os.getpid(), signal.SIGTERM)  # and torchrun passes the signal on again
            assert stops.requested() and stops.signum == signal.SIGTERM  # ... and we are still here
            os.kill(os.getpid(), signal.SIGINT)
            assert stops.signum == signal.SIGTERM
        finally:
            stops.uninstall()
        stops = StopRequests().install()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            assert stops.signum == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # (the handler runs at the next bytecode)
        finally:
            stops.uninstall()
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_a_second_ctrl_c_keeps_an_ignored_sigint_ignored():
    """Started with SIGINT ignored (`nohup oreline train &`): a SIGINT is still a stop request, and a
    second one does what it would have done without oreline: nothing."""
    from oreline.train.shutdown import StopRequests

    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stops = StopRequests().install()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            assert stops.signum == signal.SIGINT
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # (no KeyboardInterrupt at the next bytecode)
        finally:
            stops.uninstall()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_resume_command_drops_resume_and_keeps_the_launch():
    from oreline.train.shutdown import resume_command

    assert (
        resume_command(["train", "-c", "a b.toml", "--resume", "/x/step-4", "train.steps=9"], {})
        == "oreline train -c 'a b.toml' train.steps=9"
    )
    assert (
        resume_command(["train", "-c", "c.toml"], {"ORELINE_LAUNCHED_NPROC": "2", "WORLD_SIZE": "2"})
        == "oreline train -c c.toml --nproc 2"
    )
    assert resume_command(["train", "--resume=none"], {"WORLD_SIZE": "4"}).startswith("torchrun ")


# ---------------------------------------------------------------------------------------------
# item 2: the relaunch completes the final evaluation


def _strip(metrics: Path, step: int, kinds: set[str]) -> list[dict]:
    """Remove the records of `step` a kill after the final checkpoint would not have written; returns them."""
    recs = kr.records(metrics.parent)
    gone = [r for r in recs if r.get("step") == step and r["type"] in kinds]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs if r not in gone))
    return gone


def test_relaunch_completes_the_final_evaluation(train_config, tmp_path, one_thread):
    cfg = train_config(train__steps=8, train__eval_every=4, train__log_every=1, checkpoint__every=4)
    first = train(cfg, console=quiet())
    metrics = Path(first["run_dir"]) / "metrics.jsonl"
    lost = _strip(metrics, 8, {"eval", "generation", "end"})
    assert {r["type"] for r in lost} == {"eval", "generation", "end"}

    out = io.StringIO()
    again = train(cfg, console=Console(file=out, width=200))
    assert "nothing to do" not in out.getvalue()
    recs = kr.records(metrics.parent)
    redone = [r for r in recs if r.get("step") == 8 and r["type"] in ("eval", "generation", "end")]
    key = {
        "eval": ("val_loss", "val_bpb", "train_loss"),
        "generation": ("prompt", "text"),
        "end": ("final_val_loss",),
    }
    assert [(r["type"], [r[k] for k in key[r["type"]]]) for r in redone] == [
        (r["type"], [r[k] for k in key[r["type"]]]) for r in lost
    ]
    assert again["final_val_loss"] == lost[0]["val_loss"] is not None

    # a kill after the evaluation but before the end record: only the end record is written
    _strip(metrics, 8, {"end"})
    train(cfg, console=quiet())
    recs = kr.records(metrics.parent)
    assert [r["type"] for r in recs if r.get("step") == 8].count("eval") == 1
    assert recs[-1]["type"] == "end" and recs[-1]["final_val_loss"] == lost[0]["val_loss"]

    # a finished run: nothing is added
    before = metrics.read_bytes()
    out = io.StringIO()
    train(cfg, console=Console(file=out, width=200))
    assert "nothing to do: the run finished at step 8" in out.getvalue()
    assert metrics.read_bytes() == before
