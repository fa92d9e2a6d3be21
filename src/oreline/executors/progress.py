"""Live progress from tasks to the driver: records and bytes read, sent at most twice a second.

A task counts what it reads with `Progress`; the executor decides where the increments go (a
multiprocessing queue for a local pool, a list when tasks run in this process, a Ray actor or
nothing elsewhere) by calling `set_progress_queue` in the worker. Lost increments only make the
bar less precise: sending never blocks and never raises into the task.
"""

from __future__ import annotations

import contextlib
import time

PROGRESS_EVERY_S = 0.5
_progress_queue = None  # set in worker processes by the executor


def set_progress_queue(queue) -> None:
    global _progress_queue
    _progress_queue = queue


def current_queue():
    return _progress_queue


class Progress:
    """Counts records and bytes read and sends increments to the driver at most twice a second."""

    def __init__(self, task: int):
        self.task, self.records, self.bytes, self.last = task, 0, 0, time.monotonic()

    def add(self, records: int, nbytes: int) -> None:
        self.records += records
        self.bytes += nbytes
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if _progress_queue is not None and (self.records or self.bytes):
            with contextlib.suppress(Exception):  # a full or closed queue must never stop the work
                _progress_queue.put_nowait((self.records, self.bytes))
        self.records = self.bytes = 0
        self.last = now or time.monotonic()


class LocalQueue:
    """Stands in for the multiprocessing queue when tasks run in this process."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []

    def put_nowait(self, item: tuple[int, int]) -> None:
        self.items.append(item)


class Rates:
    """Records/s and MB/s since the start, for the driver's bar."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.records = 0
        self.bytes = 0

    def add(self, item: tuple[int, int]) -> None:
        self.records += item[0]
        self.bytes += item[1]

    def text(self) -> str:
        if not self.records:  # phases that do not read records show the task count only
            return ""
        dt = max(time.monotonic() - self.t0, 1e-9)
        return (
            f"{self.records:,} records · {self.records / dt:,.0f} rec/s · {self.bytes / dt / 1e6:,.1f} MB/s"
        )
