"""A write that fails for want of a writable folder (a read-only mount) is one `error:` line
naming the folder and the fix, from every command, never a traceback (oreline.errors.write_failure,
the CLI's last resort). The folder is a real read-only tmpfs (tests/conftest.py `small_disk`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oreline


def _read_only(small_disk, fill=None) -> Path:
    disk = small_disk("64m")
    if fill is not None:
        fill(disk)
    done = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount a tmpfs read-only here: {done.stderr.strip()[:200]}")
    return disk


def _oreline(*args: str) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(Path(oreline.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "oreline", *args], capture_output=True, text=True, timeout=600, env=env
    )
    return done.returncode, done.stdout + done.stderr


def _one_error(code: int, said: str, folder: Path) -> str:
    assert code == 2 and "Traceback" not in said and said.count("error:") == 1, said[-3000:]
    line = " ".join(said[said.index("error: ") :].split())
    assert "read-only file system" in line and f"make {folder} writable" in line, line
    return line


def test_report_of_a_read_only_run_folder_is_one_error(healthy_run, small_disk):
    disk = _read_only(small_disk, lambda d: shutil.copytree(healthy_run, d / "run"))
    _one_error(*_oreline("report", str(disk / "run")), disk / "run")


def test_data_and_train_into_a_read_only_folder_are_one_error(samples, small_disk):
    disk = _read_only(small_disk)
    wet = samples / "web-archives" / "commoncrawl-samples" / "whirlwind.warc.wet.gz"
    _one_error(*_oreline("data", str(wet), "--out", str(disk / "d")), disk)
    _one_error(*_oreline("train", f"run.runs_dir={disk}"), disk)


_HOLD_THEN_FAIL = """
import sys
from oreline.outdir import FolderLock
from oreline.errors import CheckpointError
with FolderLock(sys.argv[1], "oreline train"):
    print("held", flush=True)
    sys.stdin.readline()  # the folder turns read-only meanwhile
    raise CheckpointError("checkpoint step 8 could not be written", "free the folder")
"""


def test_a_folder_turning_read_only_under_a_run_shows_the_run_s_error_alone(small_disk):
    """Mid-run, a clean checkpoint error was followed by a traceback from the lock's release (its
    file could not be removed any more): the run's own error is the one that comes out."""
    from oreline.outdir import FolderLock

    disk = small_disk("8m")
    run = disk / "run"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(oreline.__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_THEN_FAIL, str(run)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "held"
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    _, err = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 1
    assert err.count("Traceback") == 1 and "CheckpointError: checkpoint step 8" in err, err
    assert "Read-only file system" not in err, err
    subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    FolderLock(run, "oreline train").acquire().release()  # the lock its exited holder left is taken over


_TENSORBOARD = """
import sys, time
from oreline.cli import quiet_thread_write_failures
from torch.utils.tensorboard import SummaryWriter
quiet_thread_write_failures()
writer = SummaryWriter(sys.argv[1], flush_secs=1)
writer.add_scalar("loss", 1.0, 1)
writer.flush()
print("written", flush=True)
sys.stdin.readline()  # the folder turns read-only meanwhile
deadline, step = time.time() + 90, 2
while time.time() < deadline:
    try:  # the writer re-raises its thread's error here (oreline's tracker counts it as a failure)
        writer.add_scalar("loss", 1.0, step)
    except OSError:
        break
    step += 1
    time.sleep(0.01)
print("done", flush=True)
"""


def test_tensorboard_s_writer_thread_dying_of_a_read_only_folder_is_one_warning(small_disk):
    """Its thread's traceback came on top of the run's error: one warning line now."""
    disk = small_disk("8m")
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(Path(oreline.__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _TENSORBOARD, str(disk / "tb")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "written"
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    out, err = proc.communicate("go\n", timeout=180)
    said = " ".join((out + err).split())
    assert "done" in out and "Traceback" not in said, said[-3000:]
    assert said.count("warning: a background writer") == 1 and "read-only file system" in said, said[-3000:]
