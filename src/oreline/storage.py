"""Where task inputs and outputs live: local paths, a filesystem every node mounts, or an fsspec URL.

Every path a task reads or writes in a run that can span nodes goes through these functions, so
the same code serves a local disk, a shared filesystem (NFS, Lustre, a bind mount) and an object
store (`s3://…`, `gs://…`, any URL fsspec knows). Local paths use the os module directly (no
overhead, exact POSIX semantics); URLs use fsspec, imported on first use.

Commits that hold on shared storage (the protocol of `data/pipeline/tasks.py`):
- an attempt writes under attempt-unique names (`attempt_id()`), never under a name another
  attempt (a zombie worker and its retry, on two nodes with the same PID) could also write;
- an attempt publishes a marker last (`publish_first`), listing the exact files it wrote; a marker
  is one complete object (a rename on a filesystem, a single PUT on an object store), so a reader
  sees it whole or not at all;
- readers trust markers only: a file that no marker lists does not exist for them;
- clean-up deletes names that oreline's own markers or attempt folders name, never a glob.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from oreline.io import check_guards, json_bytes, refuse_planted, write_bytes_atomic

COPY_BLOCK = 8 << 20  # streamed copies of remote inputs: 8 MiB at a time


def is_url(path: str | os.PathLike) -> bool:
    """Whether `path` is an fsspec URL (`s3://b/k`, `memory://x`); `file://` counts as local."""
    text = str(path)
    return "://" in text and not text.startswith("file://")


def local(path: str | os.PathLike) -> str:
    text = str(path)
    return text[len("file://") :] if text.startswith("file://") else text


def _fs(url: str):
    from fsspec.core import url_to_fs

    return url_to_fs(url)


def join(base: str | os.PathLike, *parts: str) -> str:
    """`base/part/…` for a path or a URL (pathlib would fold `s3://` into `s3:/`)."""
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *parts])
    return str(Path(local(base), *parts))


def attempt_id() -> str:
    """A name no other attempt of any task, on any node, will use."""
    return uuid.uuid4().hex[:16]


def exists(path: str | os.PathLike) -> bool:
    if is_url(path):
        fs, p = _fs(str(path))
        return fs.exists(p)
    return os.path.exists(local(path))


def size(path: str | os.PathLike) -> int:
    if is_url(path):
        fs, p = _fs(str(path))
        return int(fs.size(p))
    return os.stat(local(path)).st_size


def open_read(path: str | os.PathLike) -> IO[bytes]:
    """A binary stream of the file (seekable: a local file, or fsspec's buffered remote file)."""
    if is_url(path):
        fs, p = _fs(str(path))
        return fs.open(p, "rb")
    return open(local(path), "rb")  # noqa: SIM115 - the caller closes it


def read_bytes(path: str | os.PathLike) -> bytes:
    with open_read(path) as fh:
        return fh.read()


def read_json(path: str | os.PathLike) -> Any | None:
    """The JSON object at `path`, or None when there is none (or it is not whole JSON)."""
    try:
        return json.loads(read_bytes(path))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def listdir(path: str | os.PathLike) -> list[str]:
    """The names in a folder (empty when it does not exist)."""
    if is_url(path):
        fs, p = _fs(str(path))
        try:
            return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False))
        except FileNotFoundError:
            return []
    try:
        return sorted(os.listdir(local(path)))
    except (FileNotFoundError, NotADirectoryError):
        return []


def makedirs(path: str | os.PathLike) -> None:
    if is_url(path):
        fs, p = _fs(str(path))
        fs.makedirs(p, exist_ok=True)  # object stores have no folders; a no-op there
    else:
        os.makedirs(local(path), exist_ok=True)


def remove(path: str | os.PathLike) -> None:
    """Delete one file, or one folder oreline wrote (an attempt folder) with what is in it."""
    if is_url(path):
        fs, p = _fs(str(path))
        if fs.exists(p):
            fs.rm(p, recursive=fs.isdir(p))
        return
    p = Path(local(path))
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _local_tmp(path: Path, data: bytes) -> Path:
    refuse_planted(path)
    check_guards(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return Path(tmp)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` by `data` as one step: a rename locally, one PUT on an object store."""
    if is_url(path):
        fs, p = _fs(str(path))
        fs.pipe_file(p, data)
        return
    write_bytes_atomic(local(path), data)


def publish_first(path: str | os.PathLike, data: bytes) -> bool:
    """Write `data` to `path` unless a marker is already there; True if this call wrote it.

    On a filesystem the first writer wins: the complete temporary file is hard-linked to the
    final name, which fails when the name exists (atomic on local disks and NFS). Where links do
    not exist (object stores, some FUSE mounts) the last writer wins; every contender writes a
    complete, valid marker, so readers still see one whole attempt. On an object store with
    conditional writes (S3's If-None-Match, through s3fs) the first writer wins there too.
    """
    if is_url(path):
        fs, p = _fs(str(path))
        try:  # a conditional PUT (If-None-Match: *) where the store has one: first writer wins
            fs.pipe_file(p, data, mode="create")
            return True
        except FileExistsError:
            return False
        except TypeError:  # this filesystem has no exclusive create
            pass
        except Exception as exc:
            if "PreconditionFailed" in repr(exc) or "412" in str(exc):
                return False
            raise
        if fs.exists(p):
            return False
        fs.pipe_file(p, data)
        return True
    target = Path(local(path))
    tmp = _local_tmp(target, data)
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here: fall back to last-writer-wins
        if target.exists():
            return False
        os.replace(tmp, target)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """`io.write_json_atomic`'s bytes, to a local path or a URL."""
    write_bytes(path, json_bytes(obj))


def find(url: str) -> list[str]:
    """The files a URL names: itself, every file under it (a prefix/folder, sorted), or the
    matches of a glob; [] when it names nothing. URLs keep their protocol (`s3://b/k`)."""
    fs, p = _fs(url)
    if any(c in p for c in "*?["):
        hits = sorted(fs.glob(p))
    elif fs.isdir(p):
        hits = sorted(fs.find(p))
    elif fs.exists(p):
        hits = [p]
    else:
        hits = []
    return [fs.unstrip_protocol(h) for h in hits if not fs.isdir(h)]


@contextmanager
def local_copy(path: str | os.PathLike) -> Iterator[Path]:
    """A local path with the file's bytes: the path itself when it is local, else a streamed copy
    under the same file name (kind and compression are read from the name) deleted afterwards.

    The WARC reader takes a file path; reading an object-store input through a local copy costs one
    input file of local disk per running task (Common Crawl files are ~1 GB)."""
    if not is_url(path):
        yield Path(local(path))
        return
    folder = Path(tempfile.mkdtemp(prefix="oreline-input-"))
    target = folder / str(path).rstrip("/").rsplit("/", 1)[-1]
    try:
        with open_read(path) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, COPY_BLOCK)
        yield target
    finally:
        shutil.rmtree(folder, ignore_errors=True)
