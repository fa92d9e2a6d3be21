"""Writing files so a kill never leaves half of one, and hashing them.

Every artifact oreline publishes goes through one of these: the bytes are written under a
temporary name in the destination folder (same file system, so the rename is atomic), flushed and
fsynced, then renamed over the final name. A reader therefore sees the old file or the new one,
never a torn one; a kill leaves at most a dot-prefixed temporary that the next run ignores.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

HASH_BLOCK = 1 << 22  # 4 MiB reads: large enough that hashing runs at memory speed


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; on a clean exit it is fsynced and renamed over `path`.

    For writers that want a file name rather than a handle (pyarrow, numpy, safetensors). On an
    error the temporary is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


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
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            from oreline.errors import InputError

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
