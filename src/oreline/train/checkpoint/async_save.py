"""Async save: the one checkpoint a process may have in flight, and finishing it.

With `checkpoint.async = true` (CUDA only; `ASYNC_ON_CPU` lets tests run the same path with CPU
tensors), `save.save_checkpoint` hands the state to `dcp.async_save`, which stages it to CPU
memory and writes it in a background thread, and registers the save here with the step that
finalises it (meta.json, checksums.json, the rename into place, `latest`, retention). Until then
the checkpoint exists only as a `.tmp-` folder, so everything that looks for or reads a
checkpoint in this process first calls `wait_for_pending_save()`: the next save, the search for
the checkpoint to resume or roll back to (`resume.find_resumable`), loading one
(`load.load_checkpoint`, `load.resolve_checkpoint`), and the loop before it exits. A fresh
process has nothing pending: a save that a kill interrupted is a `.tmp-` folder, which is never
resumed from.

Every rank calls `wait_for_pending_save` at the same point: finalising is a collective (the file
digests are gathered, then a barrier).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Async save is for CUDA: on CPU, staging a copy of the state costs about what writing it does.
# Tests set this to run the same background path with CPU tensors, where DCP's staging copy works
# the same way.
ASYNC_ON_CPU = False


@dataclass
class _PendingSave:
    future: Any  # DCP's future of the background write
    finalize: Callable[[], Path]  # meta, checksums, rename; returns the published folder


_PENDING: _PendingSave | None = None


def start(future: Any, finalize: Callable[[], Path]) -> None:
    """Register a save whose tensors `future` is writing and that `finalize` publishes."""
    global _PENDING
    _PENDING = _PendingSave(future, finalize)


def wait_for_pending_save() -> Path | None:
    """Finish an async save in flight (meta, checksums, rename); its folder, or None if none was."""
    global _PENDING
    if _PENDING is None:
        return None
    pending, _PENDING = _PENDING, None
    pending.future.result()
    return pending.finalize()
