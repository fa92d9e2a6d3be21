"""Writing files so a kill never leaves half of one and a planted link is never written through;
hashing them.

Every file oreline writes goes through one of these: the bytes are written under a temporary name
in the destination folder (created with O_EXCL|O_NOFOLLOW; same file system, so the rename is
atomic), flushed and fsynced, then renamed over the final name. A reader therefore sees the old
file or the new one, never a torn one; a kill leaves at most a dot-prefixed temporary that the next
run ignores. Appends (metrics.jsonl, logs) open with O_NOFOLLOW|O_APPEND (`open_append`).

oreline creates no symbolic links, so a link at the name of a file it writes, or between a folder
oreline owns (one holding `.oreline-owner`, at any level above the file) and the file, was
planted: writing through it would overwrite a file elsewhere (`eval/ -> ~/notes`,
`items.jsonl -> ~/.bashrc`). Every writer here refuses such a write with `PlantedLink`, naming
the link, before it creates anything; so does `real_folder`, which a library that writes into a
folder itself (a tracker, Slurm's log files) is given. A folder of another user inside an owned
folder is refused the same way. The owned folder itself, and anything above it, may be a link (a
scratch disk): that is the user's choice.

A process that holds a folder's lock (`oreline.outdir.FolderLock`) registers a guard here
(`guard_folder`); every write below that folder first runs it, so a process that lost its lock to
another one stops instead of writing into the new holder's folder.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from oreline.errors import InputError

OWNER = ".oreline-owner"  # the ownership marker of an oreline folder (oreline.outdir)
_UMASK = os.umask(0o022)  # read once (umask can only be read by setting it), then put back
os.umask(_UMASK)
HASH_BLOCK = 1 << 22  # 4 MiB reads: large enough that hashing runs at memory speed


class PlantedLink(InputError):
    """A write would go through a symbolic link, or a folder of another user, inside an oreline folder."""


def planted_link(path: str | Path, root: str | Path | None = None) -> tuple[Path, Path] | None:
    """(the link or foreign folder, the oreline folder it sits in) a write to `path` would go
    through, or None. `path` itself counts; folders that do not exist yet are not links. `root`:
    a folder to treat as oreline's even without its marker (a run folder an older oreline wrote).
    One lstat and one stat per folder up to the file system's root."""
    p = Path(os.path.abspath(path))
    top = os.path.abspath(root) if root is not None else None
    uid = os.geteuid()
    found: Path | None = None  # the highest link (or foreign folder) seen so far, below `here`
    for here in (p, *p.parents):
        if found is not None and (str(here) == top or os.path.isfile(here / OWNER)):
            return found, here
        try:
            st = os.lstat(here)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or (here != p and st.st_uid != uid):
            found = here
    return None


def refuse_planted(path: str | Path, root: str | Path | None = None) -> None:
    """Raise PlantedLink when a write to `path` would go through a planted link (`planted_link`)."""
    hit = planted_link(path, root)
    if hit is None:
        return
    bad, owned = hit
    if bad.is_symlink():
        what = f"{bad} is a symbolic link (-> {os.readlink(bad)})"
    else:
        what = f"{bad} belongs to another user (uid {os.lstat(bad).st_uid})"
    raise PlantedLink(
        f"not writing {path}: {what} inside the oreline folder {owned}; oreline creates no links, and writing "
        "through it would change files outside the folder",
        f"remove {bad} (what it points at is left as it is), then run the same command again",
    )


# folder (absolute) -> (the pid that registered it, its lock's check)
_GUARDS: dict[str, tuple[int, Callable[[], None]]] = {}


def guard_folder(folder: str | Path, check: Callable[[], None] | None) -> None:
    """Run `check` before every write below `folder` (None: stop). `check` raises to refuse it.
    Only in this process: a forked worker inherits the table, not the lock (its parent checks)."""
    key = os.path.abspath(folder)
    if check is None:
        _GUARDS.pop(key, None)
    else:
        _GUARDS[key] = (os.getpid(), check)


def check_guards(path: str | Path) -> None:
    """Run the guards of the folders `path` lies in (a lock this process must still hold)."""
    if not _GUARDS:
        return
    p, me = os.path.abspath(path), os.getpid()
    for folder, (pid, check) in list(_GUARDS.items()):
        if pid == me and (p == folder or p.startswith(folder.rstrip(os.sep) + os.sep)):
            check()


def real_folder(path: str | Path, mode: int = 0o777, root: str | Path | None = None) -> Path:
    """`path` as a real folder of this user (created if missing), for a library that writes into it
    itself (a tracker, Slurm's log files) and follows whatever links it meets: a link at it or
    between it and the oreline folder above it (or `root`), or a folder of another user, is refused."""
    path = Path(path)
    refuse_planted(path, root)
    check_guards(path)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    refuse_planted(path, root)  # (a link made between the check and mkdir: mkdir accepts it, this does not)
    if not path.is_dir():
        raise PlantedLink(f"{path} is not a folder", f"move {path} away, then run the same command again")
    return path


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; on a clean exit it is fsynced and renamed over `path`.

    For writers that want a file name rather than a handle (pyarrow, numpy, safetensors). On an
    error the temporary is removed and `path` is untouched. A planted link on the way is refused
    (`refuse_planted`) before anything is created; the rename replaces a name, never follows it.
    """
    path = Path(path)
    _refuse_link_at(path)
    refuse_planted(path)
    check_guards(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp opens with O_CREAT|O_EXCL|O_NOFOLLOW: the temporary is a new file, never a link's target
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # the mode open() would give it (mkstemp's is 0600)
    finally:
        os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any):
    """Like open(path, mode) for writing, but the file appears under `path` only when complete."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes whole files; mode {mode!r} is not a write mode")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as fh:
        yield fh
        fh.flush()


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Replace `path` by `data` (str: UTF-8) as one rename, never through a planted link."""
    with atomic_open(path, "wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    write_atomic(path, data)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_atomic(path, text)


def _refuse_link_at(path: Path) -> None:
    """A link at the name of a file oreline writes is refused wherever it is: the rename would
    replace the link (its target is safe), but someone made it, and the user should hear of it."""
    if path.is_symlink():
        raise PlantedLink(
            f"not writing {path}: it is a symbolic link (-> {os.readlink(path)}); oreline writes files, never links",
            f"remove {path} (what it points at is left as it is), then run the same command again",
        )


def open_nofollow(path: str | Path, *, exclusive: bool = False, mode: int = 0o644) -> IO[bytes]:
    """`path` opened for writing in binary (created, or emptied) with O_NOFOLLOW: for files that
    are written in place under a temporary name of oreline's own, then renamed (a shard, a tensor
    file inside a `.tmp-` folder). A link there, or on the way inside an oreline folder, is refused;
    `exclusive`: the file must not exist yet (O_EXCL); `mode`: a new file's mode before the umask
    (0o600 for a secret, so that it is never readable by others, not even for a moment)."""
    path = Path(path)
    _refuse_link_at(path)
    refuse_planted(path)
    check_guards(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_planted(path)
            raise PlantedLink(
                f"not writing {path}: it is a symbolic link",
                f"remove {path}, then run the same command again",
            ) from exc
        raise
    return os.fdopen(fd, "wb")


def write_new(path: str | Path, data: bytes, *, sync: bool = False, mode: int = 0o644) -> None:
    """Create `path`, which must not exist (O_EXCL|O_NOFOLLOW), holding `data` (fsynced if `sync`)."""
    with open_nofollow(path, exclusive=True, mode=mode) as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())


def open_append(path: str | Path, encoding: str = "utf-8") -> IO[str]:
    """`path` opened for appending text (created if missing) with O_NOFOLLOW: a link there, or on the
    way to it inside an oreline folder, is refused (PlantedLink) instead of appended to."""
    path = Path(path)
    _refuse_link_at(path)
    refuse_planted(path)
    check_guards(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link made at the name after the check
            raise PlantedLink(
                f"not appending to {path}: it is a symbolic link",
                f"remove {path}, then run the same command again",
            ) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PlantedLink(
            f"{path} is not a regular file", f"move {path} away, then run the same command again"
        )
    return os.fdopen(fd, "a", encoding=encoding)


def json_bytes(obj: Any) -> bytes:
    """JSON with sorted keys and a final newline (stable bytes, so files diff and hash cleanly)."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_bytes_atomic(path, json_bytes(obj))


def write_lines_atomic(path: str | Path, lines: Iterable[str], **kwargs: Any) -> None:
    """Each item followed by a newline (JSONL, ARPA, …)."""
    with atomic_open(path, "w", encoding="utf-8", **kwargs) as fh:
        for line in lines:
            fh.write(line)
            fh.write("\n")


def write_with(path: str | Path, writer: Callable[[Path], Any]) -> None:
    """Call `writer(tmp_path)` and publish what it wrote under `path` (pyarrow/numpy writers)."""
    with atomic_path(path) as tmp:
        writer(tmp)


def hash_stream(fh: IO[bytes], h: Any = None) -> Any:
    h = h if h is not None else hashlib.sha256()
    while block := fh.read(HASH_BLOCK):
        h.update(block)
    return h


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return hash_stream(fh).hexdigest()


def files_fingerprint(paths: Iterable[Path]) -> str:
    """sha256 over (name, content) of files in sorted order: names matter, folders do not."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(Path(path).name.encode())
        with open(path, "rb") as fh:
            hash_stream(fh, h)
    return h.hexdigest()


def open_regular(path: str | Path) -> IO[bytes]:
    """Open `path` for reading in binary, only if it is a regular file (InputError otherwise).

    A FIFO named like an artifact (`model.gguf`) blocks a plain open() until something writes to
    it, and a device (/dev/zero behind a symlink) never ends: readers of files a run folder merely
    holds open them with O_NONBLOCK, check fstat on the open descriptor (no race with a rename),
    then read them as usual.
    """
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a folder"
                if stat.S_ISDIR(mode)
                else "not a regular file"
            )
            raise InputError(f"{path} is {kind}", "replace it with the file itself, or remove it")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
