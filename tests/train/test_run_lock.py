"""One writer per run folder: a second `oreline train` on a run in progress is refused, naming the
holder; once that process is gone (SIGKILL), the next launch takes the stale lock over.

The first run is a real `python -m oreline train` subprocess (debug preset, prose token shards of
tests/train/conftest.py, slowed by train.debug.sleep_per_step_s so it is still running).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from oreline.config import to_toml
from oreline.outdir import LOCK, FolderInUse, FolderLock
from oreline.train.loop import train


@pytest.mark.slow
def test_a_second_train_on_a_run_in_use_is_refused(train_config, tmp_path, one_thread, capfd):
    cfg = train_config(train__steps=400, train__debug__sleep_per_step_s=0.2)
    run = tmp_path / "t"
    (tmp_path / "cfg.toml").write_text(to_toml(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "oreline", "train", "-c", str(tmp_path / "cfg.toml")],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not (run / LOCK).is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        with pytest.raises(FolderInUse) as err:
            train(cfg)
        msg = str(err.value)
        assert (
            f"oreline train (pid {proc.pid} on host {socket.gethostname()}" in msg and str(run / LOCK) in msg
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert (run / LOCK).exists()  # the killed run could not release it
    capfd.readouterr()
    summary = train(train_config(train__steps=6, train__eval_every=0), resume="none")
    assert re.search(
        f"^warning: .*taking over the lock .*pid {proc.pid}.*no longer running", capfd.readouterr().err, re.M
    )
    assert summary["step"] == 6 and not (run / LOCK).exists()


@pytest.mark.slow
def test_a_killed_run_on_another_node_is_taken_over_once_its_lease_ran_out(
    train_config, tmp_path, one_thread, capfd
):
    """Slurm requeues a job killed on one node onto another: the lock names a host this node cannot
    check. While its holder lives (renewing the lease) it is refused; once the holder is SIGKILLed
    and the lease has run out, `--resume auto` takes the lock over and resumes from its checkpoint."""
    lease = 2.0
    cfg = train_config(train__steps=400, train__debug__sleep_per_step_s=0.2, checkpoint__every=2)
    run = tmp_path / "t"
    (tmp_path / "cfg.toml").write_text(to_toml(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "oreline", "train", "-c", str(tmp_path / "cfg.toml")],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "ORELINE_LOCK_LEASE_S": str(lease)},
    )
    try:
        deadline = time.monotonic() + 180
        while (
            not (run / "checkpoints" / "latest").is_file()
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        rec = json.loads((run / LOCK).read_text())
        assert rec["lease_s"] == lease
        # the same lock (its token), as if that run were on another node
        (run / LOCK).write_text(json.dumps({**rec, "host": "elsewhere-node-7"}))
        time.sleep(2 * lease)  # a live holder renews: its lease stays fresh
        with pytest.raises(FolderInUse, match=f"pid {proc.pid} on host elsewhere-node-7"):
            train(cfg)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    time.sleep(lease + 0.5)  # no renewals now
    saved = int((run / "checkpoints" / "latest").read_text().strip().removeprefix("step-"))
    more = train_config(train__steps=saved + 2, train__eval_every=0, checkpoint__every=2)
    changed = ["train.steps", "train.eval_every", "train.debug.sleep_per_step_s"]
    capfd.readouterr()
    summary = train(more, resume="auto", allow_config_change=changed)
    err = capfd.readouterr().err
    assert re.search(
        f"^warning: .*taking over the lock .*pid {proc.pid} on host elsewhere-node-7.*its process is gone",
        err,
        re.M,
    )
    assert summary["resumed_from"] is not None and summary["step"] == saved + 2 and not (run / LOCK).exists()


@pytest.mark.hostile
@pytest.mark.slow
def test_a_run_whose_lock_was_taken_over_stops_before_its_next_save(train_config, tmp_path, one_thread):
    """Issue 45 item 7: a holder suspended past its lease (SIGSTOP here; a partitioned node alike) is
    taken over by another process; when it wakes it must not save into the folder the new holder
    writes. Before, it went on training and saving the same steps as the new holder."""
    lease = 1.0
    cfg = train_config(train__steps=400, train__debug__sleep_per_step_s=0.2, checkpoint__every=2)
    run = tmp_path / "t"
    (tmp_path / "cfg.toml").write_text(to_toml(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "oreline", "train", "-c", str(tmp_path / "cfg.toml")],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "ORELINE_LOCK_LEASE_S": str(lease)},
    )
    latest = run / "checkpoints" / "latest"
    taker = None
    try:
        deadline = time.monotonic() + 180
        while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        rec = json.loads((run / LOCK).read_text())
        # the same lock (its token), as if that run were on another node: judged by its lease
        (run / LOCK).write_text(json.dumps({**rec, "host": "elsewhere-node-7"}))
        first = latest.read_text()
        while latest.read_text() == first and time.monotonic() < deadline:
            time.sleep(0.005)  # just after a save was published: the next is two steps away
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(2 * lease + 0.5)  # suspended: no renewals, the lease lapses
        saved = sorted(p.name for p in (run / "checkpoints").iterdir())
        taker = FolderLock(run, "oreline train (the second)", lease_s=60).acquire()
        os.kill(proc.pid, signal.SIGCONT)
        code = proc.wait(timeout=120)
        err = proc.stderr.read().decode()
        assert code != 0, err[-2000:]
        assert "no longer holds the folder's lock" in err and "Traceback" not in err, err[-2000:]
        assert f"oreline train (the second) (pid {os.getpid()} on host {socket.gethostname()}" in err, err[
            -2000:
        ]
        assert (
            sorted(p.name for p in (run / "checkpoints").iterdir()) == saved
        )  # nothing saved, published or deleted
        assert json.loads((run / LOCK).read_text())["token"] == taker.token  # and the new holder's lock kept
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
        if taker is not None:
            taker.release()
