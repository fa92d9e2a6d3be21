"""How the checkpoint modules call torch.distributed.checkpoint (DCP): the process group or none,
DCP's warnings and torch.save's CRC around a call, and DCP's wrapped load errors.

Saving and loading both run with or without a process group (torchrun, or one plain process); DCP
then needs `no_dist=True` (`oreline.compat.dcp_no_dist`), and warns on every call that it "assumes
a single process". A failed load reaches the caller as DCP's CheckpointException, a BaseException
whose text is a traceback: `load_errors` turns it into the CheckpointError that names the file.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from oreline import compat
from oreline.errors import CheckpointError


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world() -> int:
    """The number of ranks (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    if world() > 1:
        dist.barrier()


_ASYNC_GROUP = None  # a gloo group of every rank, made at the first async save that needs one


def async_save_group() -> dist.ProcessGroup | None:
    """The process group for `dcp.async_save` (None: the default one will do).

    DCP's async save plans over a CPU backend and refuses a group without one ("A CPU backend must
    be enabled for async save"), but on CUDA oreline.train.dist starts NCCL alone, as torchrun users
    do: `checkpoint.async` then failed at the first save (seen on an H200 by
    benchmarks/gpu_check.py). Such a run gets a gloo group of every rank, made once; every rank
    saves at the same step, and `new_group` is a collective they all reach there.
    """
    global _ASYNC_GROUP
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if torch.device("cpu") in getattr(dist.group.WORLD, "_device_types", ()):
        return None
    if _ASYNC_GROUP is None:
        _ASYNC_GROUP = dist.new_group(backend="gloo")
    return _ASYNC_GROUP


def no_process_group() -> bool:
    """True when DCP must run without collectives (`compat.dcp_no_dist`)."""
    return world() == 1 and not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def no_zip_crc32():
    """torch.save (which DCP uses per tensor) computes a CRC32 of every record: on this CPU that was
    ~80% of a save's CPU time (benchmarks/checkpoint_io.py). checksums.json already covers every
    byte with xxh3-128, so the CRC is redundant; loading does not need it."""
    config = compat.torch_save_config()
    if config is None:  # outside the tested torch range: the CRC stays on (slower, same files)
        yield
        return
    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = before


# DCP warns on every call without a process group that it "assumes a single process": it does,
# that is what world 1 means. Filtered around each call, and for the whole process because async
# saves warn from DCP's background thread, where a catch_warnings() context does not reach.
_SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)


@contextlib.contextmanager
def quiet_single_process():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
        yield


@contextlib.contextmanager
def load_errors(path: Path):
    """A failed DCP load as the CheckpointError that caused it (DCP wraps every rank's exception in its
    own CheckpointException, a BaseException whose text is a traceback), or as one naming the folder."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        errors = [failure[0] for failure in exc.failures.values()]
        for err in errors:
            if isinstance(err, CheckpointError):
                raise err from None
        first = errors[0] if errors else exc
        raise CheckpointError(
            f"loading {path} failed ({type(first).__name__}: {str(first)[:300]})",
            "check it with oreline checkpoint verify; resume from another checkpoint or "
            "start fresh with --resume none",
        ) from None
