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
