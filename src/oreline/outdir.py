"""Output folders: who made them, who writes them now, what may be deleted, which names are safe.

Every command that writes a folder (`oreline data`, `tokenize`, `tokenizer train`, `quality
train-reference`, `export`, `import-hf`) goes through this module, so the rules are the same
everywhere:

- **Ownership.** "oreline created this folder" means: the folder holds `.oreline-owner`, a small
  JSON file `{"kind", "host", "pid", "created"}` that oreline writes *before anything else* when it
  creates (or is allowed to adopt) a folder. `claim_folder` accepts a missing or empty folder, one
  whose marker names the same kind, or one an earlier oreline version wrote (a `legacy` check on
  its own self-describing file, e.g. a data run's fingerprint.json with section "data"). Anything
  else is refused with the folder and a few of its entries named. `force=True` adopts a non-empty
  folder only when none of its entries has a name the command itself writes (`reserved`): with or
  without --force, oreline never deletes or overwrites a file it did not write. Run folders
  (`runs/NAME`, `oreline run` and `oreline train`) follow the same rule with kind "run".
- **No links below an output root.** oreline creates no symbolic links, so a link among the names
  a command writes (`work/dedup -> ~/project`, `docs -> ~/corpus`) was planted: writing or cleaning
  up through it would overwrite or delete files elsewhere. `claim_folder` refuses such a folder,
  naming the links (`find_links`); the root itself may be a link (a scratch disk), the user's
  choice. `remove_tree` deletes a folder below a root only when no component from the root down is
  a link (shutil.rmtree itself never follows links inside the tree it deletes).
- **Clean-up deletes listed names only.** `remove_listed` deletes exactly the names it is given;
  temporary files are recognised by the exact form oreline gives them (`is_temp_of`), never by a
  glob over the folder. Folders published as a whole (`publish_folder`: export, import-hf) are
  replaced only when every entry of the earlier output is a regular file (or folder) with a name
  that kind writes (`written`, fixed in the code): a marker or a file list read from the folder
  never decides what is deleted, so a planted `.oreline-owner` cannot get `.git` or notes deleted.
- **One writer per folder.** `FolderLock` is an exclusive lock file `.oreline-lock` holding the
  writer's host, pid, process start time, command and lease, created atomically (written under a
  temporary name, then hard-linked into place: the lock is never seen half-written). The lock is a
  lease: while the holder lives, a thread renews it every quarter lease (its modification time is
  the heartbeat; 30 s at the default lease of 120 s, `ORELINE_LOCK_LEASE_S`). A second writer is
  refused with the holder named, unless the lock is stale: a holder on this host whose pid is gone
  (or reused by another process, told apart by its start time) at once; a lock on another host
  once it has not been renewed for longer than the lease the holder recorded (a job killed on a
  node and requeued onto another), at most MAX_LEASE_S; a lock on this host whose pid cannot be
  checked (pid 1, no integer, no start time) is judged by its lease too, and a renewal stamped in
  the future is stale. A stale lock is taken over with one `warning:` line naming the old holder.
  Its age is measured by the folder's own clock: the holder stamps each renewal with the time the
  file system gives a new probe file, and the taker compares with its own temporary lock file's,
  so clocks of different nodes need not agree (not even where `utime(now)` takes the client's
  clock). The same process may take a lock it already holds (`oreline run` holds the run folder and
  then trains in it). A holder checks that the lock still names it (`check`, also run by every
  write of `oreline.io` below the folder and by the clean-up here) and stops with LockLost when
  another process has taken it over: a holder suspended past its lease never writes on.
- **Names from files stay inside their folder.** `safe_child` refuses absolute names, `..`
  components and empty names read from manifests and indexes, and never echoes file contents.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from oreline.errors import ConfigError, DataIntegrityError, InputError, OrelineError
from oreline.io import OWNER, check_guards, guard_folder, write_new

LOCK = ".oreline-lock"
_MKSTEMP_TAIL = re.compile(r"[a-z0-9_]{8}")  # tempfile.mkstemp's random part
_ATTEMPT_TAIL = re.compile(r"[0-9a-f]{16}")  # an attempt-unique shard temporary (data/read/shards.py)


class FolderInUse(OrelineError):
    """Another oreline process writes this folder (it holds the folder's lock)."""


class LockLost(FolderInUse):
    """This process held the folder's lock, and another process has taken it over since."""


class NotOurFolder(InputError):
    """An output folder holds files oreline did not write."""


# ---------------------------------------------------------------------------------------------
# ownership


def read_owner(folder: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads((Path(folder) / OWNER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _write_owner(folder: Path, kind: str, **extra: Any) -> None:
    from oreline.io import write_json_atomic

    write_json_atomic(
        folder / OWNER,
        {
            "kind": kind,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **extra,
        },
    )


def _owner_temp(name: str) -> bool:
    """The temporary of a marker being written (write_json_atomic: `.NAME.XXXXXXXX.tmp`)."""
    return name.startswith(f".{OWNER}.") and name.endswith(".tmp")


def _shown(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def claim_folder(
    folder: str | Path,
    kind: str,
    command: str,
    *,
    force: bool = False,
    reserved: Callable[[str], bool] | None = None,
    legacy: Callable[[Path], bool] | None = None,
    choose: str | None = None,
) -> Path:
    """Make sure `folder` is oreline's `kind` output folder (creating it if needed); return it.

    `command` is how the user ran it (for the message); `reserved(name)` says whether a top-level
    name is one this command writes (what --force may not adopt, and where links are looked for);
    `legacy(folder)` recognises the output of an oreline version that wrote no marker; `choose`
    tells the user how to pick another folder (default: a new or empty --out folder).
    """
    folder = Path(folder)
    force_hint = choose is None  # a command with --force (the default hint names it)
    choose = choose or f"pass a new or empty --out folder to {command}"
    if not folder.exists():
        try:
            folder.mkdir(parents=True)
        except FileExistsError:  # another launch made it a moment ago: claimed below, as any folder
            pass
        else:
            _write_owner(folder, kind)
            return folder
    if not folder.is_dir():
        raise NotOurFolder(f"{folder} is a file, not a folder", choose)
    owner = read_owner(folder)
    if owner is not None:
        if owner.get("kind") == kind:
            _refuse_links(folder, reserved, choose)
            return folder
        raise NotOurFolder(
            f"{folder} holds oreline {owner.get('kind')!r} output, not {kind!r} output", choose
        )
    # a writer's lock is ours, and so is the marker another launch is writing this moment (its
    # temporary): the folder is new, both may claim it, and the folder's lock decides who writes
    names = sorted(
        p.name for p in folder.iterdir() if not p.name.startswith(LOCK) and not _owner_temp(p.name)
    )
    if names == [OWNER] and (read_owner(folder) or {}).get("kind") == kind:
        _refuse_links(folder, reserved, choose)  # another launch's marker, written since it was read
        return folder
    if not names:
        _write_owner(folder, kind)
        return folder
    if legacy is not None and legacy(folder):
        _refuse_links(folder, reserved, choose)
        _write_owner(folder, kind, adopted="legacy")
        return folder
    if force:
        clash = [n for n in names if reserved is not None and reserved(n)]
        if clash:
            raise NotOurFolder(
                f"{folder} holds {_shown(clash)}, names {command} writes itself; even with --force oreline never "
                "overwrites or deletes files it did not write",
                "pass a new or empty --out folder, or move those out",
            )
        _write_owner(folder, kind, adopted="force")
        return folder
    raise NotOurFolder(
        f"{folder} is not empty ({_shown(names)}) and was not created by {command} (no {OWNER} in it)",
        f"pass a new or empty --out folder, or add --force to write next to these files ({command} never deletes "
        "or overwrites files it did not write)"
        if force_hint
        else choose,
    )


def find_links(folder: Path, names: Callable[[str], bool] | None = None, limit: int = 5) -> list[str]:
    """Symbolic links below `folder` (relative names, at most `limit`), looked for under the
    top-level entries `names` accepts (all when None); a writer's lock files are left out. A linked
    folder is listed, not entered. One readdir per folder: a directory entry's type comes with it."""
    found: list[str] = []
    stack = [(Path(folder), "")]
    while stack and len(found) < limit:
        here, prefix = stack.pop()
        try:
            with os.scandir(here) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not prefix and (entry.name.startswith(LOCK) or (names is not None and not names(entry.name))):
                continue
            if entry.is_symlink():
                found.append(prefix + entry.name)
            elif entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), prefix + entry.name + "/"))
    return sorted(found)[:limit]


def _refuse_links(folder: Path, names: Callable[[str], bool] | None, choose: str) -> None:
    links = find_links(folder, names)
    if links:
        shown = ", ".join(f"{name} -> {os.readlink(folder / name)}" for name in links)
        raise NotOurFolder(
            f"{folder} holds symbolic links where oreline writes ({shown}); oreline creates none, and writing "
            "or cleaning up through them would change files outside the folder",
            f"remove those links (what they point at is left as it is), or {choose}",
        )


def is_kind(folder: Path, kind: str) -> bool:
    owner = read_owner(folder)
    return owner is not None and owner.get("kind") == kind


def is_data_run(folder: Path) -> bool:
    """An `oreline data` output folder: its marker, or (written before markers existed) its
    fingerprint.json with section "data"."""
    if is_kind(folder, "data"):
        return True
    try:
        return json.loads((Path(folder) / "fingerprint.json").read_text()).get("section") == "data"
    except (OSError, ValueError, AttributeError):
        return False


def require_finished_data_run(path: Path, allow_incomplete: bool = False) -> Path:
    """`path`, or the docs/ folder it stands for when it is (the docs/ of) an `oreline data` output.

    A data run that has not finished (no `_SUCCESS`: killed, or a task crashed) holds only part of
    its documents; consumers refuse it unless `allow_incomplete`.
    """
    path = Path(path)
    root = (
        path
        if is_data_run(path)
        else path.parent
        if path.name == "docs" and is_data_run(path.parent)
        else None
    )
    if root is None:
        return path
    if not (root / "_SUCCESS").is_file() and not allow_incomplete:
        raise InputError(
            f"{root} is an oreline data run that has not finished (no _SUCCESS): its documents are a part of the corpus",
            f"finish it by running the same `oreline data INPUTS --out {root}` again, or pass --allow-incomplete "
            "to use the documents written so far",
        )
    return root / "docs"


# ---------------------------------------------------------------------------------------------
# clean-up


def is_temp_of(name: str, final: re.Pattern[str] | Callable[[str], bool]) -> bool:
    """Whether `name` is oreline's temporary form of a final name: `.FINAL.tmp-PID` (token shard
    writers), `.FINAL.tmp-<16 hex>` (document shard writers: attempt-unique across nodes) or
    `.FINAL.XXXXXXXX` (tempfile.mkstemp in write_json_atomic / write_bytes_atomic)."""
    if not name.startswith("."):
        return False
    match = final.fullmatch if isinstance(final, re.Pattern) else final
    head, _, tail = name[1:].rpartition(".")
    if tail.startswith("tmp-") and (tail[4:].isdigit() or _ATTEMPT_TAIL.fullmatch(tail[4:])):
        return bool(head) and bool(match(head))
    return bool(head) and bool(_MKSTEMP_TAIL.fullmatch(tail)) and bool(match(head))


def remove_listed(folder: Path, names: Iterable[str]) -> list[str]:
    """Delete exactly these names (files or oreline's own temporary folders) in `folder`."""
    import shutil

    check_guards(folder)  # a lock this process lost is never acted on
    removed = []
    for name in names:
        p = safe_child(folder, name, f"clean-up of {folder}")
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink(missing_ok=True)
        else:
            continue
        removed.append(name)
    return removed


def remove_tree(root: Path, path: Path) -> bool:
    """Delete the folder `path` below the output root `root`, unless a component from below `root`
    down to `path` is a link (then nothing is deleted and False returned). shutil.rmtree removes the
    links inside the tree it deletes without following them (on Linux it works through directory
    file descriptors), so only the path down to it needs checking."""
    import shutil

    root, path = Path(root), Path(path)
    check_guards(path)
    rel = path.relative_to(root)
    step = root
    for part in rel.parts:
        step = step / part
        if step.is_symlink():
            return False
        if not step.exists():
            return True
    if not path.is_dir():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def _entries(folder: Path) -> list[tuple[str, bool, bool]]:
    """Every entry below `folder` as (relative posix name, is a folder, is a regular file), links
    listed (as neither) and not entered."""
    out = []
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = os.path.join(top, name)
            rel = PurePosixPath(os.path.relpath(p, folder)).as_posix()
            link = os.path.islink(p)
            out.append((rel, not link and os.path.isdir(p), not link and os.path.isfile(p)))
    return sorted(out)


def publish_folder(
    tmp: Path,
    out: Path,
    kind: str,
    command: str,
    written: re.Pattern[str],
    legacy: Callable[[Path], bool] | None = None,
) -> None:
    """Replace `out` by the finished folder `tmp` (a sibling), as one rename.

    `tmp` gets its marker (listing its files, for the reader: nothing trusts that list). An existing
    `out` is replaced only when it is empty, or an earlier `kind` output (its marker, or for output of
    an oreline version without markers `legacy(out)`) every entry of which is a regular file or a
    folder whose relative name `written` matches in full: the names this kind writes, fixed in the
    code. Those names are deleted one by one, nothing else; otherwise `tmp` is deleted and the
    user's folder is left exactly as it was.
    """
    import shutil

    check_guards(out)
    _write_owner(tmp, kind, files=_listing(tmp))
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        shutil.rmtree(tmp)
        raise NotOurFolder(
            f"{out} is {'a symbolic link' if out.is_symlink() else 'a file'}, not an earlier output of {command}",
            "pass a new or empty --out folder (the folder itself, not a link to it)",
        )
    if out.exists():
        owner = read_owner(out)
        ours = owner.get("kind") == kind if owner is not None else legacy is not None and legacy(out)
        entries = _entries(out)
        if entries and not ours:
            shutil.rmtree(tmp)
            raise NotOurFolder(
                f"{out} holds {_shown(sorted(p.name for p in out.iterdir()))}: it is not an earlier output of "
                f"{command} (no {OWNER} of kind {kind!r})",
                "pass a new or empty --out folder",
            )
        extra: list[str] = []  # the foreign entries, a foreign folder's own entries left out
        for rel, is_dir, is_file in entries:
            if not any(rel.startswith(e + "/") for e in extra) and not (
                (is_dir or is_file) and (rel == OWNER or written.fullmatch(rel))
            ):
                extra.append(rel)
        if extra:
            shutil.rmtree(tmp)
            raise NotOurFolder(
                f"{out} is marked as an earlier {command} output, but also holds {_shown(extra)}, which oreline did not "
                "write (a file oreline writes there is a regular file with one of its own names)",
                "move those out, or pass a new --out folder",
            )
        for rel, is_dir, _ in sorted(entries, reverse=True):  # a folder's files before the folder
            (os.rmdir if is_dir else os.unlink)(out / rel)
        out.rmdir()  # fails, deleting nothing more, if a file appeared meanwhile
    os.replace(tmp, out)


# ---------------------------------------------------------------------------------------------
# names read from files


def safe_child(root: Path, name: Any, where: str) -> Path:
    """`root / name` for a relative name read from a file; refuses names that leave `root`.

    The error names the entry and `where` it came from, never the content of what it points at.
    """
    bad = None
    if not isinstance(name, str) or not name:
        bad = "is not a non-empty string"
    elif "\x00" in name:
        bad = "contains a NUL byte"
    elif (
        PurePosixPath(name).is_absolute()
        or PureWindowsPath(name).is_absolute()
        or PureWindowsPath(name).drive
    ):
        bad = "is an absolute path"
    elif any(part == ".." for part in re.split(r"[\\/]", name)):
        bad = "climbs out of its folder with '..'"
    elif all(part in ("", ".") for part in re.split(r"[\\/]", name)):
        bad = "names the folder itself"
    if bad:
        raise DataIntegrityError(
            f"{where}: the file name {str(name)[:120]!r} {bad}",
            f"names there must stay inside {root}; rebuild that file with oreline",
        )
    return Path(root) / name


# ---------------------------------------------------------------------------------------------
# one writer per folder


def _proc_start(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    now = _proc_start(pid)
    return start is None or now is None or now == start


LEASE_ENV = "ORELINE_LOCK_LEASE_S"
DEFAULT_LEASE_S = 120.0
# The longest lease a lock may claim: a holder renews every quarter lease, so an hour covers any
# pause worth waiting out, and a lock that records a year (or 1e300 s) still goes stale.
MAX_LEASE_S = 3600.0


def lock_lease_s() -> float:
    """The lease a lock taken now records: $ORELINE_LOCK_LEASE_S seconds, else 120."""
    raw = os.environ.get(LEASE_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_S
    try:
        lease = float(raw)
    except ValueError:
        lease = -1.0
    if not (0 < lease <= MAX_LEASE_S):
        raise ConfigError(
            f"{LEASE_ENV}={raw[:40]!r} is not a number of seconds between 0 and {MAX_LEASE_S:.0f}",
            f"set {LEASE_ENV} to the lock lease in seconds (default {DEFAULT_LEASE_S:.0f}), or unset it",
        )
    return lease


def _lease_of(rec: dict[str, Any], default: float) -> float:
    """The lease the holder recorded, at most MAX_LEASE_S (a lock of an oreline without leases, or
    with a lease that is no positive number: `default`)."""
    lease = rec.get("lease_s")
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease < float("inf"):
        return default
    return min(float(lease), MAX_LEASE_S)


def _checkable_pid(rec: dict[str, Any]) -> int | None:
    """The holder's pid when this host can tell whether it still runs: an integer above 1 recorded
    with its start time. pid 1 (init, always alive), a pid that is no integer or a lock without
    the start time (nothing tells a reused pid apart) is judged by its lease, like a remote one."""
    pid = rec.get("pid")
    if (
        isinstance(pid, bool)
        or not isinstance(pid, int)
        or pid <= 1
        or not isinstance(rec.get("proc_start"), str)
    ):
        return None
    return pid


class FolderLock:
    """Exclusive lock of a folder for one writer; a context manager (`with FolderLock(d, "cmd"):`).

    A lease: while held, a daemon thread renews it (touches the lock file) every `lease_s / 4`."""

    def __init__(self, folder: str | Path, command: str, lease_s: float | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self.command = command
        self.token = uuid.uuid4().hex
        self.lease_s = float(lease_s) if lease_s is not None else lock_lease_s()
        self.held = False
        self.lost: str | None = None  # set by the renewing thread when another process took the lock
        self._reentrant = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _record(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "proc_start": _proc_start(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": self.command,
            "token": self.token,
            "lease_s": self.lease_s,
        }

    def holder(self) -> dict[str, Any] | None:
        try:
            rec = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return rec if isinstance(rec, dict) else {}

    def _create(self) -> float | None:
        """Link our lock into place. None when it is ours now; else the folder's clock now (the
        modification time of our temporary lock file), against which the holder's age is measured."""
        tmp = self.folder / f".{LOCK}.{self.token}"
        write_new(tmp, (json.dumps(self._record(), indent=2) + "\n").encode("utf-8"))
        try:
            os.link(tmp, self.path)  # atomic, and fails if a lock exists: never two holders
            return None
        except FileExistsError:
            return tmp.stat().st_mtime
        finally:
            tmp.unlink(missing_ok=True)

    def _folder_now(self) -> float:
        """The folder's own clock: the modification time the file system gives a new file there.
        On file systems that stamp a file's times with the writing client's clock when asked for
        "now" (utime without times), hosts whose clocks disagree would misjudge each other's age."""
        probe = self.folder / f".{LOCK}.{self.token}.now"
        write_new(probe, b"")
        try:
            return probe.stat().st_mtime
        finally:
            probe.unlink(missing_ok=True)

    def _age(self, now: float) -> float | None:
        """Seconds since the lock was last renewed, by the folder's clock; None if it is gone."""
        try:
            return now - self.path.stat().st_mtime
        except FileNotFoundError:
            return None

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            now = self._create()
            if now is None:
                self._hold()
                return self
            rec, age = self.holder(), self._age(now)
            if rec is None or age is None:
                continue  # released between our attempt and the read
            host, pid = rec.get("host"), rec.get("pid")
            local = host == socket.gethostname()
            if local and pid == os.getpid() and rec.get("proc_start") == _proc_start(os.getpid()):
                self.held, self._reentrant = True, True  # this process holds it already (and renews it)
                return self
            lease = _lease_of(rec, self.lease_s)
            checkable = _checkable_pid(rec) if local else None
            if checkable is not None and not _alive(checkable, rec.get("proc_start")):
                self._take_over(rec, "which is no longer running")
                continue
            # A holder whose pid cannot be checked from here (another host, or a lock that names no
            # usable pid) renews its lease every lease/4: one silent for longer than the lease was
            # killed or cut off. A renewal stamped in the future (age < 0) is no lease at all: the
            # folder's clock never runs backwards, so a live holder cannot have written it.
            if checkable is None and (age > lease or age < 0):
                when = f"{-age:.0f} s in the future" if age < 0 else f"{age:.0f} s ago"
                self._take_over(
                    rec,
                    f"whose lease was last renewed {when} (lease {lease:.0f} s): its process is gone",
                    judged_mtime=now - age,
                )
                continue
            who = (
                f"{rec.get('command', '?')} (pid {pid} on host {host}, since {rec.get('started', '?')})"
                if rec
                else "an unreadable lock"
            )
            if checkable is not None:
                hint = "wait for that process to finish, or stop it"
                if age > lease:
                    hint += f" (it has not renewed its lock for {age:.0f} s: it may hang)"
            else:
                hint = (
                    f"wait for that process to finish, or stop it; its lock is renewed while it runs (last "
                    f"{max(age, 0):.0f} s ago) and is taken over once it has not been for {lease:.0f} s"
                )
            hint += f"; if no oreline process writes {self.folder} any more, delete {self.path}"
            raise FolderInUse(f"{self.folder} is being written by {who}: lock {self.path}", hint)
        raise FolderInUse(f"could not take the lock {self.path} (it changed hands three times)", "run again")

    def _take_over(self, rec: dict[str, Any], why: str, judged_mtime: float | None = None) -> None:
        """Remove a stale holder's lock; only that lock, even when another process races us to it or
        the holder renews it meanwhile (`judged_mtime`: the renewal time it was judged by; a lock
        renewed since, its modification time changed, is given back)."""
        aside = self.folder / f".{LOCK}.stale-{self.token}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            now = json.loads(aside.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            now = {}
        if not isinstance(now, dict):
            now = {}
        renewed = judged_mtime is not None and aside.stat().st_mtime != judged_mtime
        if now.get("token") != rec.get("token") or renewed:  # not the lock we judged stale: give it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        else:
            host = rec.get("host")
            where = "this host" if host == socket.gethostname() else f"host {host}"
            # one plain line on stderr (a warnings.warn would print a UserWarning and a source line)
            print(
                f"warning: {self.path}: taking over the lock of {rec.get('command', '?')} (pid {rec.get('pid')} "
                f"on {where}, since {rec.get('started', '?')}), {why}",
                file=sys.stderr,
                flush=True,
            )
        aside.unlink(missing_ok=True)

    def _hold(self) -> None:
        self.held, self.lost = True, None
        self._stop.clear()
        guard_folder(self.folder, self.check)  # every write below the folder checks the lock first
        self._renewer = threading.Thread(target=self._renew, name="oreline-lock-lease", daemon=True)
        self._renewer.start()

    def _lost_to(self) -> str | None:
        """Who holds the lock now when it is no longer ours (None while it is)."""
        rec = self.holder()
        if rec is not None and rec.get("token") == self.token:
            return None
        if rec is None:
            return f"{self.path} is gone (deleted, or taken over and released)"
        if rec == {}:
            return f"{self.path} is unreadable"
        return (
            f"{self.path} now names {rec.get('command', '?')} (pid {rec.get('pid')} on host {rec.get('host')}, "
            f"since {rec.get('started', '?')})"
        )

    def check(self) -> None:
        """Raise LockLost unless this process still holds the lock: called before every checkpoint
        save, publish and clean-up (and by every write of oreline.io below the folder). A holder
        suspended or cut off for longer than its lease may have been taken over meanwhile; going on
        would write the same files as the new holder."""
        if not self.held or self._reentrant:
            return
        lost = self._lost_to()
        if lost is not None and self.holder() is None:  # a taker that found it fresh puts it back at once
            time.sleep(0.05)
            lost = self._lost_to()
        if lost is None:
            return
        self.lost = lost
        raise LockLost(
            f"{self.folder}: this process ({self.command}, pid {os.getpid()}) no longer holds the folder's lock: "
            f"{lost}. It was taken over after this process had not renewed it for its lease of {self.lease_s:.0f} s "
            "(suspended, or cut off from the file system); this process stopped before writing anything more",
            "let the process that holds the lock now finish, or stop it; then run the same command again to "
            "continue from what was saved",
        )

    def _renew(self) -> None:
        """The heartbeat: stamp the lock with the folder's clock while it is still ours (a transient
        error is retried at the next beat; a lock that names another holder is not touched again)."""
        while not self._stop.wait(self.lease_s / 4):
            rec = self.holder()
            if rec and rec.get("token") != self.token:
                self.lost = lost = self._lost_to() or "?"
                logging.getLogger("oreline").error(
                    "the lock %s was taken over: %s; this process no longer holds it", self.path, lost
                )
                return
            with contextlib.suppress(OSError, LockLost):  # (lost meanwhile: seen at the next beat)
                now = self._folder_now()
                os.utime(self.path, (now, now))

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if self._reentrant:
            return
        guard_folder(self.folder, None)
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=10)
            self._renewer = None
        rec = self.holder()
        if rec and rec.get("token") == self.token:
            # a folder that turned read-only under the run keeps the file: harmless (the next writer
            # takes over a lock whose holder has exited), and the error that stopped the run is the
            # one to show, not a traceback from here on top of it
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
