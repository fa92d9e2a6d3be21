"""Shared fixtures and the two data tiers of the suite.

Default tier: every test reads the sample set embedded in the package (`samples/` at the repository
root, linked as src/oreline/samples). Its SHA256SUMS is checked once per session; a missing or
altered file fails every test that uses the `samples` fixture, naming the file — the suite never
skips for missing data.

Extended tier: tests marked `@pytest.mark.extended("path", ...)` need files of the larger sample
collection (Servo captures, language-ID sentences, the extraction benchmark…) and read it through
the `full_samples` fixture, i.e. ORELINE_SAMPLES. Without ORELINE_SAMPLES they are deselected and
the summary says how many; with it, a test whose named paths are missing there is skipped with
the path in the reason, and the summary counts those skips.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from oreline.config import EMBEDDED_SAMPLES, sample_problems


@pytest.fixture(scope="session")
def samples() -> Path:
    """The embedded sample set, checked against its SHA256SUMS once per session."""
    problems = sample_problems()
    if problems:
        pytest.fail(
            "embedded sample data is damaged: "
            + "; ".join(problems)
            + " — restore it with `git checkout -- samples`",
            pytrace=False,
        )
    return EMBEDDED_SAMPLES


@pytest.fixture(scope="session")
def full_samples() -> Path:
    """The larger sample collection (ORELINE_SAMPLES), for tests marked `extended`."""
    return Path(os.environ["ORELINE_SAMPLES"]).expanduser().resolve()


def _extended_paths(item: pytest.Item) -> list[str]:
    return [p for mark in item.iter_markers("extended") for p in mark.args]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    env = os.environ.get("ORELINE_SAMPLES")
    extended = [item for item in items if item.get_closest_marker("extended")]
    config.stash[_EXTENDED] = {"selected": 0, "deselected": 0, "missing": []}
    if not extended:
        return
    if not env:
        config.hook.pytest_deselected(items=extended)
        items[:] = [item for item in items if not item.get_closest_marker("extended")]
        config.stash[_EXTENDED]["deselected"] = len(extended)
        return
    root = Path(env).expanduser()
    config.stash[_EXTENDED]["selected"] = len(extended)
    for item in extended:
        missing = [p for p in _extended_paths(item) if not (root / p).exists()]
        if missing:
            config.stash[_EXTENDED]["missing"].append(item.nodeid)
            item.add_marker(
                pytest.mark.skip(reason=f"extended: ORELINE_SAMPLES={root} lacks {', '.join(missing)}")
            )


_EXTENDED = pytest.StashKey[dict]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    info = config.stash.get(_EXTENDED, None)
    if not info or not (info["selected"] or info["deselected"]):
        return
    if info["deselected"]:
        terminalreporter.write_line(
            f"extended tier: {info['deselected']} tests deselected (ORELINE_SAMPLES is not set; "
            "set it to the larger sample folder, e.g. ../shared/data, to run them)"
        )
    else:
        skipped = info["missing"]
        line = (
            f"extended tier: {info['selected']} tests selected from ORELINE_SAMPLES, {len(skipped)} skipped"
        )
        terminalreporter.write_line(line + (": " + ", ".join(skipped) if skipped else ""))


# The manufactured healthy run that tests/doctor and tests/report break one thing at a time.
# Test folders are not packages (--import-mode=importlib): load the factory by path once and
# register it, so test modules can `import_module("oreline_test_run_factory")`.
RUN_FACTORY = "oreline_test_run_factory"
if RUN_FACTORY not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        RUN_FACTORY, Path(__file__).parent / "doctor" / "run_factory.py"
    )
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

    def hold(folder, command="oreline data", env=None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(folder), command],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
        )
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
        (Path(folder) / LOCK).write_text(
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "pid": proc.pid,
                    "proc_start": "1",
                    "started": "2026-01-01T00:00:00Z",
                    "command": command,
                }
            )
        )
        return proc.pid

    return dead


# Tests marked `slurm` submit real jobs to the cluster `sinfo` reaches: the single-node cluster of
# scripts/local-slurm.sh (`.ci/run` starts it; SLURM_CONF names its config). Without one they are
# skipped, with the command that starts it in the reason.
LOCAL_SLURM_CONF = (
    Path(os.environ.get("ORELINE_SLURM_DIR") or f"/tmp/oreline-slurm-{os.getuid()}") / "slurm.conf"
)


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """SLURM_CONF of a reachable cluster (exported to this process and its children)."""
    import shutil
    import subprocess

    if not os.environ.get("SLURM_CONF") and LOCAL_SLURM_CONF.is_file():
        os.environ["SLURM_CONF"] = str(LOCAL_SLURM_CONF)
    reason = "no Slurm cluster: start one with `scripts/local-slurm.sh start` (CI does)"
    if shutil.which("sinfo") is None:
        pytest.skip(f"{reason}; `sinfo` is not installed")
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{reason}; `sinfo` did not answer in 20 s")
    states = proc.stdout.split()
    if proc.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc")) for s in states):
        pytest.skip(f"{reason}; sinfo: {(proc.stderr or proc.stdout).strip()[:200] or 'no usable node'}")
    return os.environ.get("SLURM_CONF", "")


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) → a folder on a tmpfs of `size` (e.g. "4m") that is really full when full (ENOSPC
    from the kernel, as on a full disk); unmounted at the end. Needs root (CI runs as root); skipped
    where mounting is not allowed."""
    import os
    import subprocess

    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"small-disk-{len(mounted)}"
        where.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()[:200]}")
        mounted.append(where)
        return where

    mount.fill = fill_disk  # (test modules reach conftest helpers through fixtures)
    yield mount
    for where in reversed(mounted):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill_disk(folder: Path, leave: int) -> Path:
    """Fill the file system of `folder` up to `leave` free bytes with one file; return it."""
    import shutil

    filler = Path(folder) / "filler.bin"
    with open(filler, "wb") as fh:
        room = shutil.disk_usage(folder).free - leave
        while room > 0:
            n = fh.write(b"\0" * min(room, 1 << 20))
            room -= n
    return filler
