"""One writer per run folder: a second `oreline train` on a run in progress is refused, naming the
holder; once that process is gone (SIGKILL), the next launch takes the stale lock over.

The first run is a real `python -m oreline train` subprocess (debug preset, prose token shards of
tests/train/conftest.py, slowed by train.debug.sleep_per_step_s so it is still running).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from oreline.config import to_toml
from oreline.outdir import LOCK, FolderInUse
from oreline.train.loop import train


@pytest.mark.slow
def test_a_second_train_on_a_run_in_use_is_refused(train_config, tmp_path, one_thread):
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
    with pytest.warns(UserWarning, match=f"pid {proc.pid}.*no longer running"):
        summary = train(train_config(train__steps=6, train__eval_every=0), resume="none")
    assert summary["step"] == 6 and not (run / LOCK).exists()
