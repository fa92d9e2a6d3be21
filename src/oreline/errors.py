"""Errors that tell the user what to do next.

Every oreline error carries a hint; `str(err)` is "<what went wrong>: <what to do>" so that a
message printed by the CLI is actionable on its own. Raise the most specific subclass.
"""

from __future__ import annotations


class OrelineError(Exception):
    """Base class. `hint` says what the user should do next."""

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint
        super().__init__(f"{message}: {hint}" if hint else message)


class ConfigError(OrelineError):
    """A config file or override is invalid (unknown key, bad value, inconsistent settings)."""


class InputError(OrelineError):
    """Input files are missing, unreadable or of an unknown kind."""


class DataIntegrityError(OrelineError):
    """A file that checks itself failed its check (magic, version, count, checksum, fingerprint)."""


class FingerprintMismatch(DataIntegrityError):
    """An artifact was produced from different inputs than the ones in use (stale cache)."""


class CheckpointError(OrelineError):
    """A checkpoint is missing, invalid, or incompatible with the run that tries to load it."""


class TrainingError(OrelineError):
    """The training run cannot continue (global batch mismatch, unrecoverable instability, ...)."""


class DistributedError(OrelineError):
    """torch.distributed set-up or a peer rank failed."""


class ClusterError(OrelineError):
    """A cluster scheduler (Slurm) cannot be reached, refused a job, or a job failed for good."""


class DiskFull(OrelineError):
    """A write failed because the device (or the user's quota) is full."""


def free_space(folder) -> str:
    """What a full-disk error says about `folder`'s device: "N MB free" (or that it is unknown)."""
    import shutil

    try:
        return f"{shutil.disk_usage(folder).free / 2**20:.1f} MB free"
    except OSError:
        return "free space unknown"


def disk_full_cause(exc: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError behind `exc` (itself, or along its cause/context chain, as a worker
    process's error arrives wrapped), or None when the failure is something else."""
    import errno
    import os

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return exc
        # a Rust library's I/O error (safetensors' SafetensorError) carries the errno in its text only
        for code in (errno.ENOSPC, errno.EDQUOT):
            if not isinstance(exc, OSError) and f"(os error {code})" in str(exc):
                return OSError(code, os.strerror(code))
        exc = exc.__cause__ or exc.__context__
    return None


class ShardDamaged(DataIntegrityError):
    """A token shard a running job reads was changed, cut or holds ids it cannot have. `path` is the
    shard; `kind` is "changed" (its identity — inode, size, mtime, header — differs from launch:
    nothing of the new file was read) or "content" (its bytes are wrong while its identity is the
    one verified: training may have read them before); `verified_at` is the time (Unix seconds)
    its content was last verified, None when unknown. The training loop adds the checkpoints."""

    def __init__(self, message: str, hint: str, path: str, kind: str, verified_at: float | None = None):
        super().__init__(message, hint)
        self.path, self.kind, self.verified_at = path, kind, verified_at


class NotWritable(InputError):
    """A folder the command writes is read-only (a read-only mount, missing permissions)."""


def write_failure(exc: BaseException | None) -> OrelineError | None:
    """The one error a failed write deserves, for an exception no layer turned into one (the CLI's
    last resort, so that a read-only folder or a full disk is never a traceback): the folder, why
    and what to do next. None when `exc` is not a write failure, along its cause/context chain."""
    import errno
    import os
    from pathlib import Path

    full = disk_full_cause(exc)
    seen = set()
    denied = None
    while denied is None and exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            denied = exc
        exc = exc.__cause__ or exc.__context__
    hit = denied or full
    if hit is None:
        return None
    path = Path(os.fsdecode(hit.filename)) if hit.filename else None  # (a library may give bytes)
    # the folder the user can act on: a temporary's folder, or the folder that could not be made
    folder = (
        path
        if path is not None and (path.is_dir() or not path.parent.exists())
        else getattr(path, "parent", None)
    )
    where = f" {folder}" if folder is not None else ""
    if hit is full:
        return DiskFull(
            f"no space left on the device of{where or ' the output'} while writing {path or 'a file'}",
            "free space there or write elsewhere (--out, run.runs_dir=...), then run the same command again",
        )
    what = f"{path.name} in {folder}" if path is not None and folder != path else f"{path or 'a file'}"
    return NotWritable(
        f"cannot write {what}: {os.strerror(hit.errno).lower()}",
        f"make{where or ' the folder'} writable (a read-only mount or missing permissions), or write "
        "elsewhere (--out, run.runs_dir=...), then run the same command again",
    )
