"""Async save: the one checkpoint a process may have in flight, published as soon as it is written.

With `checkpoint.async = true` (CUDA only; `ASYNC_ON_CPU` lets tests run the same path with CPU
tensors), `save.save_checkpoint` hands the state to `dcp.async_save`, which stages it to CPU
memory and writes it in a background thread, and registers the save here with the step that
publishes it (meta.json, checksums.json, the rename into place, `latest`, retention). A thread
started here waits for the tensor write and publishes right then, while training goes on: after
a crash the newest resumable checkpoint is at most one `checkpoint.every` old, not two. Until it
is published the checkpoint exists only as a `.tmp-` folder, so everything that looks for or reads
a checkpoint in this process first calls `wait_for_pending_save()` (which also raises what the
save failed with): the next save, the search for the checkpoint to resume or roll back to
(`resume.find_resumable`), loading one (`load.load_checkpoint`, `load.resolve_checkpoint`), and
the loop before it exits. A fresh process has nothing pending: a save that a kill interrupted is
a `.tmp-` folder, which is never resumed from.

Publishing is a collective (the ranks' file digests are gathered, then they agree that rank 0
published): with a process group it runs over a gloo group of its own (`dcp_calls.publish_group`),
never over the one the training thread uses at the same time.
"""

from __future__ import annotations

import threading
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
    thread: threading.Thread
    outcome: dict[str, Any]  # "path" once published, or "error"


_PENDING: _PendingSave | None = None


def start(future: Any, publish: Callable[[BaseException | None], Path]) -> None:
    """Register a save whose tensors `future` (DCP's) is writing: `publish(None)` runs as soon as
    the write completes, `publish(error)` when it failed (every rank must reach the publish's
    collectives either way)."""
    global _PENDING
    outcome: dict[str, Any] = {}

    def run() -> None:
        error: BaseException | None = None
        try:
            future.result()
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            error = exc
        try:
            outcome["path"] = publish(error)
        except BaseException as exc:
            outcome["error"] = exc

    _PENDING = _PendingSave(
        threading.Thread(target=run, name="oreline-checkpoint-publish", daemon=True), outcome
    )
    _PENDING.thread.start()


def published() -> bool:
    """Whether the save in flight (if any) has been published or has failed."""
    return _PENDING is None or not _PENDING.thread.is_alive()


def wait_for_pending_save() -> Path | None:
    """Wait for the async save in flight to be published; its folder, or None if none was. What it
    failed with (a CheckpointError naming the folder) is raised here."""
    global _PENDING
    if _PENDING is None:
        return None
    pending, _PENDING = _PENDING, None
    pending.thread.join()
    if "error" in pending.outcome:
        raise pending.outcome["error"]
    return pending.outcome["path"]
