"""Output folders (oreline.outdir): the lock of one writer, ownership, listed clean-up, safe names.

Holders of a lock are real processes: a Python child that takes the lock and waits, or one that
has exited (a dead pid on this host).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from oreline.errors import ConfigError, DataIntegrityError
from oreline.outdir import (
    LOCK,
    OWNER,
    FolderInUse,
    FolderLock,
    NotOurFolder,
    claim_folder,
    is_temp_of,
    read_owner,
    safe_child,
)


def _taken_over(capsys, pattern: str) -> None:
    """The take-over was told as one plain line on stderr (no UserWarning, no source line)."""
    err = capsys.readouterr().err
    assert re.fullmatch(f"warning: .*taking over the lock .*{pattern}.*\n", err), err


def test_a_live_holder_is_named_and_a_second_writer_refused(tmp_path, lock_holder, capsys):
    proc = lock_holder(tmp_path / "out", "oreline data")
    with pytest.raises(FolderInUse) as err:
        FolderLock(tmp_path / "out", "oreline data").acquire()
    msg = str(err.value)
    assert (
        f"oreline data (pid {proc.pid} on host {socket.gethostname()}" in msg
        and str(tmp_path / "out" / LOCK) in msg
    )
    proc.kill()
    proc.wait()
    # the holder is gone: its lock is stale and taken over with one line on stderr
    capsys.readouterr()
    with FolderLock(tmp_path / "out", "t") as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    _taken_over(capsys, f"pid {proc.pid}.*no longer running")
    assert not (tmp_path / "out" / LOCK).exists()  # released


def test_a_dead_holder_is_taken_over_and_a_remote_one_is_not(tmp_path, dead_lock, capsys):
    pid = dead_lock(tmp_path / "a")
    lock = FolderLock(tmp_path / "a", "t").acquire()
    _taken_over(capsys, f"pid {pid}")
    assert lock.holder()["pid"] == os.getpid()
    with FolderLock(tmp_path / "a", "again"):  # the same process may re-enter (oreline run → train)
        pass
    assert (tmp_path / "a" / LOCK).exists()  # re-entering does not release the outer lock
    lock.release()
    assert not (tmp_path / "a" / LOCK).exists()

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / LOCK).write_text(
        json.dumps({"host": "elsewhere-node-7", "pid": 1234, "command": "oreline train"})
    )
    with pytest.raises(
        FolderInUse, match=r"pid 1234 on host elsewhere-node-7.*taken over once it has not been"
    ):
        FolderLock(tmp_path / "b", "t").acquire()


def _remote_lock(folder: Path, age_s: float, **fields) -> Path:
    """The lock of a holder on another node, last renewed `age_s` seconds ago."""
    folder.mkdir(parents=True, exist_ok=True)
    rec = {"host": "elsewhere-node-7", "pid": 1234, "command": "oreline train", "token": "t0", **fields}
    (folder / LOCK).write_text(json.dumps(rec))
    then = time.time() - age_s
    os.utime(folder / LOCK, (then, then))
    return folder / LOCK


def test_a_remote_lock_is_taken_over_once_its_lease_ran_out(tmp_path, capsys):
    # renewed 10 s ago: the holder on the other node may well be alive
    _remote_lock(tmp_path / "a", 10, lease_s=120)
    with pytest.raises(FolderInUse, match=r"pid 1234 on host elsewhere-node-7"):
        FolderLock(tmp_path / "a", "t").acquire()
    # not renewed for longer than its lease: taken over on any host, the old holder named
    _remote_lock(tmp_path / "a", 130, lease_s=120)
    with FolderLock(tmp_path / "a", "t") as lock:
        assert lock.holder()["token"] == lock.token
    _taken_over(capsys, r"oreline train \(pid 1234 on host elsewhere-node-7.*lease 120 s")
    # the lease the holder recorded counts, not the taker's
    _remote_lock(tmp_path / "b", 600, lease_s=3600)
    with pytest.raises(FolderInUse, match=r"elsewhere-node-7"):
        FolderLock(tmp_path / "b", "t", lease_s=60).acquire()
    # a lock of an oreline without leases is judged by the taker's lease
    _remote_lock(tmp_path / "c", 90)
    with pytest.raises(FolderInUse):
        FolderLock(tmp_path / "c", "t", lease_s=120).acquire()
    FolderLock(tmp_path / "c", "t", lease_s=60).acquire().release()
    _taken_over(capsys, "elsewhere-node-7")


def test_a_live_holder_renews_its_lease(tmp_path, lock_holder, capsys):
    proc = lock_holder(tmp_path / "out", "oreline data", env={"ORELINE_LOCK_LEASE_S": "0.5"})
    lock = tmp_path / "out" / LOCK
    rec = json.loads(lock.read_text())
    assert rec["lease_s"] == 0.5
    # the holder as if it ran on another node: same lock (token), another host
    lock.write_text(json.dumps({**rec, "host": "elsewhere-node-7"}))
    os.utime(lock, (time.time() - 60, time.time() - 60))
    time.sleep(1.5)  # three renewals, three leases
    assert time.time() - lock.stat().st_mtime < 1.0  # renewed
    with pytest.raises(FolderInUse, match=f"pid {proc.pid} on host elsewhere-node-7"):
        FolderLock(tmp_path / "out", "t").acquire()
    proc.kill()
    proc.wait()
    time.sleep(1.0)  # two leases without a renewal
    capsys.readouterr()
    FolderLock(tmp_path / "out", "t").acquire().release()
    _taken_over(capsys, f"pid {proc.pid} on host elsewhere-node-7.*its process is gone")
    assert not lock.exists()


def test_a_bad_lease_setting_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ORELINE_LOCK_LEASE_S", "soon")
    with pytest.raises(ConfigError, match="ORELINE_LOCK_LEASE_S"):
        FolderLock(tmp_path, "t")


def test_claim_refuses_a_foreign_folder_and_force_never_takes_reserved_names(tmp_path):
    user = tmp_path / "user"
    (user / "sub").mkdir(parents=True)
    (user / "notes.txt").write_text("mine")
    with pytest.raises(NotOurFolder, match=r"not empty \(notes.txt, sub\).*--force"):
        claim_folder(user, "data", "oreline data")
    assert not (user / OWNER).exists()
    with pytest.raises(NotOurFolder, match="notes.txt, names oreline data writes"):
        claim_folder(user, "data", "oreline data", force=True, reserved={"notes.txt"}.__contains__)
    claim_folder(user, "data", "oreline data", force=True, reserved={"docs"}.__contains__)
    assert json.loads((user / OWNER).read_text())["adopted"] == "force"
    claim_folder(user, "data", "oreline data")  # ours now
    with pytest.raises(NotOurFolder, match="holds oreline 'data' output, not 'tokens'"):
        claim_folder(user, "tokens", "oreline tokenize")
    new = claim_folder(tmp_path / "new" / "deep", "tokens", "oreline tokenize")
    assert json.loads((new / OWNER).read_text())["kind"] == "tokens"


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", "..\\x", "C:\\x", "", ".", None, 3])
def test_names_that_leave_their_folder_are_refused(tmp_path, name):
    with pytest.raises(DataIntegrityError, match="manifest.json"):
        safe_child(tmp_path, name, "manifest.json shards[0].name")


def test_safe_names_and_temp_forms():
    assert safe_child(Path("/r"), "train-0.tok", "m") == Path("/r/train-0.tok")
    assert safe_child(Path("/r"), "a/b.bin", "m") == Path("/r/a/b.bin")
    import re

    shard = re.compile(r"part-\d{5}-\d{3}\.parquet")
    assert is_temp_of(".part-00000-000.parquet.tmp-123", shard)
    assert is_temp_of(".part-00000-000.parquet.ab12_xyz", shard)  # tempfile.mkstemp's form
    for name in (
        ".part-00000-mine.parquet.tmp-1",
        ".hidden",
        ".env",
        "part-00000-000.parquet",
        ".part-00000-000.parquet.tmp-x",
    ):
        assert not is_temp_of(name, shard), name


def test_run_name_stays_inside_runs_dir(tmp_path):
    from oreline.config import load_config
    from oreline.runs import RunDir

    for name in ("../escaped", str(tmp_path / "abs"), "a/../../b"):
        cfg = load_config(None, [f"run.runs_dir={tmp_path / 'runs'}", f"run.name={name}"])
        with pytest.raises(ConfigError, match="run.name=.*inside run.runs_dir"):
            RunDir.for_config(cfg)
    cfg = load_config(None, [f"run.runs_dir={tmp_path / 'runs'}", "run.name=group/exp1"])
    assert RunDir.for_config(cfg).root == tmp_path / "runs" / "group" / "exp1"


def test_oreline_run_refuses_an_escaping_name_before_writing(tmp_path):
    cmd = [sys.executable, "-m", "oreline", "run", f"run.runs_dir={tmp_path / 'runs'}", "run.name=../escaped"]
    t0 = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "run.name" in result.stderr and time.monotonic() - t0 < 60
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "runs").exists()


# --- hostile locks (issue 45 item 8, issue 52 item 6) ---------------------------------------------


@pytest.mark.hostile
def test_a_huge_or_future_lease_goes_stale_and_the_lock_file_is_named(tmp_path, capsys, monkeypatch):
    # a lease of 10^12 s recorded by the holder: capped, so a lock silent for longer than the cap goes stale
    _remote_lock(tmp_path / "a", 3700, lease_s=1e12)
    FolderLock(tmp_path / "a", "t").acquire().release()
    _taken_over(capsys, r"elsewhere-node-7.*lease 3600 s")
    # a renewal stamped an hour in the future is no lease: the folder's clock never runs backwards
    _remote_lock(tmp_path / "b", -3600, lease_s=120)
    FolderLock(tmp_path / "b", "t").acquire().release()
    _taken_over(capsys, r"elsewhere-node-7.*3600 s in the future")
    # a live holder's lock is refused, and the message names the file to delete if nothing runs
    lock = _remote_lock(tmp_path / "c", 5, lease_s=120)
    with pytest.raises(FolderInUse, match=f"delete {re.escape(str(lock))}$"):
        FolderLock(tmp_path / "c", "t").acquire()
    # nor can the lease setting ask for a lock that never goes stale
    monkeypatch.setenv("ORELINE_LOCK_LEASE_S", "1e12")
    with pytest.raises(ConfigError, match="ORELINE_LOCK_LEASE_S"):
        FolderLock(tmp_path / "d", "t")


@pytest.mark.hostile
@pytest.mark.parametrize("pid", [1, "1234", None, 12.5])
def test_a_local_lock_whose_pid_cannot_be_checked_is_judged_by_its_lease(tmp_path, capsys, pid):
    """pid 1 is always alive (init) and a pid that is no integer cannot be checked: such a lock on
    this host would block the folder for ever; it is judged by its lease like a remote one."""
    rec = {"host": socket.gethostname(), "pid": pid, "command": "oreline data", "token": "t0", "lease_s": 120}
    _remote_lock(tmp_path / "fresh", 10, **rec)
    with pytest.raises(FolderInUse, match="taken over once it has not been"):
        FolderLock(tmp_path / "fresh", "t").acquire()
    _remote_lock(tmp_path / "old", 130, **rec)
    FolderLock(tmp_path / "old", "t").acquire().release()
    _taken_over(capsys, "its process is gone")


@pytest.mark.hostile
def test_the_take_over_is_one_plain_line(tmp_path, dead_lock, capsys):
    pid = dead_lock(tmp_path / "a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a UserWarning (with its source line) fails here
        FolderLock(tmp_path / "a", "t").acquire().release()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: ") and f"pid {pid}" in err, err


@pytest.mark.hostile
def test_a_lease_is_renewed_by_the_folders_clock(tmp_path, monkeypatch):
    """On a file system that stamps "now" (utime without times) with the writing client's clock, a
    holder whose clock is 2 h behind would look 2 h silent to a taker, and be taken over while it
    runs. The holder stamps its renewals with a probe file's time, the folder's own clock, as the
    taker measures. Here such a file system is the local one with `os.utime(path)` (no times)
    answered by the clock of a client 2 h behind; a new file still gets the folder's time."""
    real_utime = os.utime

    def client_stamped(path, times=None, **kw):
        if times is None and not kw:
            behind = time.time() - 7200
            times = (behind, behind)
        return real_utime(path, times, **kw)

    monkeypatch.setattr(os, "utime", client_stamped)
    holder = FolderLock(tmp_path / "out", "oreline train", lease_s=0.4).acquire()
    try:
        lock = tmp_path / "out" / LOCK
        # the same lock (its token) as if that holder ran on another node
        lock.write_text(json.dumps({**json.loads(lock.read_text()), "host": "elsewhere-node-7"}))
        time.sleep(0.5)  # several renewals
        assert abs(time.time() - lock.stat().st_mtime) < 5
        with pytest.raises(FolderInUse, match="elsewhere-node-7"):
            FolderLock(tmp_path / "out", "t", lease_s=0.4).acquire()
    finally:
        holder.release()


@pytest.mark.hostile
def test_a_holder_whose_lock_was_taken_over_writes_nothing_more(tmp_path):
    """Issue 45 item 7 at the lock's level: once the lock names another holder, every write through
    oreline.io below the folder and every clean-up stops with LockLost naming that holder."""
    from oreline.io import write_json_atomic
    from oreline.outdir import LockLost, remove_listed

    holder = FolderLock(tmp_path / "out", "oreline data", lease_s=60).acquire()
    try:
        write_json_atomic(tmp_path / "out" / "a.json", {"n": 1})  # still ours
        lock = tmp_path / "out" / LOCK
        taker = {**json.loads(lock.read_text()), "token": "t1", "pid": 4321, "host": "elsewhere-node-7"}
        lock.write_text(json.dumps({**taker, "command": "oreline data (the second)"}))
        with pytest.raises(
            LockLost,
            match=r"no longer holds .*oreline data \(the second\) \(pid 4321 on host elsewhere-node-7",
        ):
            write_json_atomic(tmp_path / "out" / "a.json", {"n": 2})
        with pytest.raises(LockLost):
            remove_listed(tmp_path / "out", ["a.json"])
        assert json.loads((tmp_path / "out" / "a.json").read_text()) == {"n": 1}
    finally:
        holder.release()
    assert lock.exists()  # the new holder's lock is not released by the old one
    write_json_atomic(tmp_path / "out" / "b.json", {})  # released: no guard any more


_RACE = """
import json, sys, time
from oreline.outdir import claim_folder
start = float(sys.argv[1])
while time.time() < start:  # every launch at the same moment
    pass
out = []
for folder in sys.argv[2:]:
    try:
        claim_folder(folder, "run", "oreline run", choose="choose another run.name")
        out.append("ok")
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


def test_launches_racing_on_a_new_folder_all_claim_it(tmp_path):
    """Two launches on a new run folder gave the loser a FileExistsError traceback, or "was not
    created by oreline" about the folder the winner had made milliseconds earlier (its marker
    still a temporary). Every launch claims it; the folder's lock then decides who writes."""
    folders = [str(tmp_path / f"runs-{i}" / "demo") for i in range(40)]
    start = time.time() + 3
    launches = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(start), *folders], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in launches]
    failures = [r for result in results for r in result if r != "ok"]
    assert not failures, failures[:3]
    for folder in folders:
        assert read_owner(Path(folder))["kind"] == "run"
