"""Shared fixtures. Sample data is located by ORELINE_SAMPLES (default ../shared/data)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from oreline.config import samples_dir


@pytest.fixture(scope="session")
def samples() -> Path:
    """The sample-data folder; tests that need it skip with the reason when it is absent."""
    path = samples_dir()
    if not (path / "web-archives").is_dir():
        pytest.skip(f"sample data not found at {path}: set ORELINE_SAMPLES to the shared data folder")
    return path


# The manufactured healthy run that tests/doctor and tests/report break one thing at a time.
# Test folders are not packages (--import-mode=importlib): load the factory by path once and
# register it, so test modules can `import_module("oreline_test_run_factory")`.
RUN_FACTORY = "oreline_test_run_factory"
if RUN_FACTORY not in sys.modules:
    _spec = importlib.util.spec_from_file_location(RUN_FACTORY, Path(__file__).parent / "doctor" / "run_factory.py")
    sys.modules[RUN_FACTORY] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[RUN_FACTORY])
run_factory = sys.modules[RUN_FACTORY]


@pytest.fixture(scope="session")
def healthy_template(tmp_path_factory) -> Path:
    """A healthy run (real tokenizer, shards, checkpoints), built once per session."""
    return run_factory.session_template(tmp_path_factory)


@pytest.fixture
def healthy_run(healthy_template, tmp_path) -> Path:
    """A fresh copy of the healthy run that the test may break."""
    return run_factory.copy_run(healthy_template, tmp_path / "run")


# Lock holders for the one-writer tests (oreline.outdir.FolderLock): a live process on this host
# that holds a folder's lock until the test ends, and the lock file of a process that has exited.
_HOLD = """
import sys, time
from oreline.outdir import FolderLock
FolderLock(sys.argv[1], sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(300)
"""


@pytest.fixture
def lock_holder():
    """hold(folder, command) → a live process (Popen) holding the folder's lock; killed at the end."""
    import os
    import subprocess

    procs = []

    def hold(folder, command="oreline data") -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder), command], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def dead_lock():
    """dead(folder, command) → write the lock of a process on this host that has exited; its pid."""
    import json
    import os
    import socket
    import subprocess

    from oreline.outdir import LOCK

    def dead(folder, command="oreline data") -> int:
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        os.makedirs(folder, exist_ok=True)
        (Path(folder) / LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": proc.pid, "proc_start": "1",
                                                     "started": "2026-01-01T00:00:00Z", "command": command}))
        return proc.pid

    return dead
