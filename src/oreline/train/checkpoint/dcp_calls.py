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


_ASYNC_GROUP: tuple = (None, None)  # (the default group, a gloo group of its ranks made for it)


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
    world_group = dist.group.WORLD
    if torch.device("cpu") in getattr(world_group, "_device_types", ()):
        return None
    if _ASYNC_GROUP[0] is not world_group:  # first save, or a process group started anew since
        _ASYNC_GROUP = (world_group, dist.new_group(backend="gloo"))
    return _ASYNC_GROUP[1]


_PUBLISH_GROUP: tuple = (None, None)  # (the default group, a gloo group of its ranks made for it)


def publish_group() -> dist.ProcessGroup | None:
    """The process group an async save is published over (None without a process group).

    The publish runs in a background thread as soon as the tensor write completes
    (`async_save`), while the training thread goes on with its own collectives on the default
    group: two threads must not issue collectives on one group. This gloo group of every rank,
    made once (at the first async save, which every rank reaches at the same step: `new_group` is
    a collective), carries only the publish's digest gather and its agreement.
    """
    global _PUBLISH_GROUP
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world_group = dist.group.WORLD
    if _PUBLISH_GROUP[0] is not world_group:
        _PUBLISH_GROUP = (world_group, dist.new_group(backend="gloo"))
    return _PUBLISH_GROUP[1]


_STAGER: tuple = ((), None)  # (the state's structure, DCP's stager holding pinned copies of it)


def _structure(state: object, path: str = "") -> tuple:
    """Names, shapes and dtypes of every tensor in a nested state dict (what the staged copy is)."""
    if isinstance(state, dict):
        return tuple(x for k in sorted(state, key=str) for x in _structure(state[k], f"{path}/{k}"))
    if isinstance(state, torch.Tensor):
        return ((path, tuple(state.shape), str(state.dtype)),)
    return ((path, type(state).__name__),)


def pinned_stager(state: dict, on_cuda: bool) -> dict:
    """`async_stager=` for `dcp.async_save` on CUDA: the state staged into pinned CPU copies made at
    the first save and reused by later ones while the state keeps its structure (empty off CUDA,
    or where this torch lacks the API).

    Without it DCP stages through the writer (FileSystemWriter is a BlockingAsyncStager without a
    cache), which allocates pageable CPU memory for the whole state at every save: on an H200 the
    training thread waited 1.99 s for a 125m model's async save against 2.28 s for a blocking one
    (benchmarks/gpu_check.py). The same stager with its cache on copies the same way, into pinned
    buffers it keeps. The copy stays synchronous (staged before the step goes on, so the optimizer
    cannot change what is written); the buffers cost host memory equal to this rank's share of
    the state, for the life of the process. Reusing them is safe because a save finishes the one
    in flight first (`async_save.wait_for_pending_save`).
    """
    global _STAGER
    if not on_cuda or not compat.dcp_async_takes_stager():
        return {}
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    structure = _structure(state)
    if _STAGER[1] is None or _STAGER[0] != structure:  # a new shape would not fit the cached copies
        _STAGER = (structure, BlockingAsyncStager(cache_staged_state_dict=True))
    return {"async_stager": _STAGER[1]}


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
