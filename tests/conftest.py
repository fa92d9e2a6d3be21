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
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from oreline.config import EMBEDDED_SAMPLES, sample_problems

# ---------------------------------------------------------------------------------------------
# hermetic runs: what a test sees does not depend on where or how the suite was started

# Variables a launcher or a cluster job sets, which would change what oreline does (a torchrun rank,
# a Slurm array task, a requeue, a signing key): a suite started inside one must not inherit them.
# SLURM_CONF stays: it names the cluster the tests marked `slurm` use.
INHERITED_RUN_ENV = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ORELINE_LAUNCHED_NPROC",
    "ORELINE_RESUME_COMMAND",
    "ORELINE_REQUEUE_FILE",
    "ORELINE_CHECKPOINT_KEY",
    "ORELINE_SLURM_TASK_KEY",
    "ORELINE_INFLATE",
)


@pytest.fixture(scope="session", autouse=True)
def hermetic_session(tmp_path_factory):
    """Every test runs in an empty temporary working folder (a relative path, such as the demo
    config's `runs_dir = "runs"`, lands there and never in the checkout's runs/), with per-machine
    decisions cached in a session folder instead of ~/.cache/oreline, without the launcher and
    cluster variables of the shell that started it, and with Python's own SIGINT/SIGTERM/SIGUSR1
    dispositions: started in the background (`nohup … &`) the suite inherits SIGINT ignored, and so
    would every process a test starts. Tests reach the repository by absolute paths (__file__)."""
    saved_env = {k: os.environ.get(k) for k in (*INHERITED_RUN_ENV, "ORELINE_CACHE_DIR")}
    saved_env.update({k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "TORCHELASTIC_"))})
    for key in list(os.environ):
        if key in INHERITED_RUN_ENV or (key.startswith(("SLURM_", "TORCHELASTIC_")) and key != "SLURM_CONF"):
            del os.environ[key]
    os.environ["ORELINE_CACHE_DIR"] = str(tmp_path_factory.mktemp("oreline-cache"))
    # a relative PYTHONPATH (`PYTHONPATH=src pytest`) would name another folder from the new working
    # folder, and the processes tests start would import another oreline, or none
    saved_env["PYTHONPATH"] = os.environ.get("PYTHONPATH")
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) if p else p for p in os.environ["PYTHONPATH"].split(os.pathsep)
        )
    saved_signals = {
        sig: signal.signal(sig, handler)
        for sig, handler in (
            (signal.SIGINT, signal.default_int_handler),
            (signal.SIGTERM, signal.SIG_DFL),
            (signal.SIGUSR1, signal.SIG_DFL),
        )
    }
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(cwd)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---------------------------------------------------------------------------------------------
# helpers several test folders use. Test folders are not packages (--import-mode=importlib): tests
# take them as fixtures; a module-level helper of a test file imports the plain function from
# `oreline_test_helpers` (this module, registered under that name at the end of the file).


def run_cli(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "oreline", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        # rich would wrap long messages (and paths) at 80 columns
        env={**os.environ, "COLUMNS": "10000", **(env or {})},
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def oreline_cli() -> Callable[..., tuple[int, str]]:
    """oreline_cli(*args, timeout=180, env=None): run `python -m oreline ARGS` as a user would, in a
    fresh process; (exit code, stdout + stderr)."""
    return run_cli


def run_and_kill(
    cmd, ready: Callable[[], bool], *, env=None, timeout: float = 120.0, poll: float = 0.005
) -> bool:
    proc = subprocess.Popen(
        cmd, start_new_session=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False  # finished before the kill point
            if ready():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(poll)
        raise AssertionError("the run never reached the kill point")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def kill_at() -> Callable[..., bool]:
    """kill_at(cmd, ready, env=None, timeout=120): start `cmd` in its own process group and SIGKILL
    the whole group as soon as ready() holds; True if it was killed, False if it finished first."""
    return run_and_kill


# what differs between two runs of the same work: wall time, rates, process ids, the pool's size
TIMING_FIELDS = frozenset({"seconds", "signature_seconds", "pid", "workers", "tokens_per_second"})


def drop_timings(obj):
    if isinstance(obj, dict):
        return {k: drop_timings(v) for k, v in obj.items() if k not in TIMING_FIELDS}
    if isinstance(obj, list):
        return [drop_timings(v) for v in obj]
    return obj


@pytest.fixture(scope="session")
def untimed() -> Callable:
    """untimed(stats): a stats or manifest record without its timing fields (TIMING_FIELDS), at any
    depth, so that two runs of the same work compare equal."""
    return drop_timings


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


@pytest.fixture(scope="module")
def child_env(samples) -> dict[str, str]:
    """The environment of a child Python (the hostile-input cases' capped children): it imports the
    oreline under test and finds the samples (good documents)."""
    import oreline

    env = dict(os.environ)
    src = str(Path(oreline.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["ORELINE_SAMPLES"] = str(samples)
    return env


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    # a pytest-xdist worker (`-n 2`) collected the tests: its counts go to the controller's summary
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["oreline_extended"] = session.config.stash.get(_EXTENDED, None)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: every worker collected the same tests, so any worker's counts do."""
    info = getattr(node, "workeroutput", {}).get("oreline_extended")
    if info is not None:
        node.config.stash[_EXTENDED] = info


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
# scripts/local-slurm.sh (scripts/test.sh and .ci/run start a private one; SLURM_CONF names its
# config). Without one they are skipped, with the reason: why scripts/test.sh could not start one
# (ORELINE_SLURM_UNAVAILABLE), or the command that starts one.
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
    reason = (
        f"no Slurm cluster: {os.environ['ORELINE_SLURM_UNAVAILABLE']}"
        if os.environ.get("ORELINE_SLURM_UNAVAILABLE")
        else "no Slurm cluster: run the suite with scripts/test.sh (it starts one), or start one with "
        "`scripts/local-slurm.sh start`"
    )
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


# A user's own steps in a Python file, as the README's worked example writes them: a keyword
# filter (which raises on one word, to show an exception is that document's reject) and a mapper.
USER_STEPS = '''
def drop_keyword(doc, words=("casino",)):
    """A filter: the reason to drop the document, or None to keep it."""
    low = doc.text.lower()
    hit = next((w for w in words if w in low), None)
    if hit == "explode":
        raise ValueError("this document breaks the filter")
    return f"keyword:{hit}" if hit else None


def shout(doc):
    """A mapper: returns the document, changed."""
    doc.metadata["shouted"] = True
    doc.text = doc.text.upper()
    return doc
'''


def user_step_config(folder: Path, *overrides: str, words=("casino", "explode")):
    """The default config (plus `overrides`) with its step list and two user steps from a Python
    file written into `folder` (user_steps.py): drop_keyword(words), then shout."""
    from oreline.config import config_from_dict, load_config, to_dict

    path = Path(folder) / "user_steps.py"
    if not path.is_file():
        path.write_text(USER_STEPS)
    cfg = load_config(None, list(overrides))
    tree = to_dict(cfg)
    tree["data"]["steps"] = [to_dict(s) for s in cfg.data.step_list()] + [
        {"kind": "python", "function": f"{path}:drop_keyword", "args": {"words": list(words)}},
        {"kind": "python", "function": f"{path}:shout", "name": "shout"},
    ]
    return config_from_dict(tree)


sys.modules.setdefault("oreline_test_helpers", sys.modules[__name__])
