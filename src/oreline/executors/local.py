"""Run tasks in a local process pool (or inline), with a live progress bar.

`run_tasks(fn, jobs, workers)` calls `fn(*args)` once per job and returns the results in job
order. With one worker (or one job) the calls run in this process: no start-up cost, and
tracebacks stay readable. Otherwise a `ProcessPoolExecutor` with the `forkserver` start method
(safe with threads in the parent, cheaper than `spawn` after the first worker) runs one task
per call.

A worker process that dies (a segfault in a C extension, the OOM killer) breaks the whole pool
and every task in flight with it. Those tasks are retried one at a time, each in a fresh
single-worker pool, so an innocent task that shared the pool still finishes; a task that kills
its worker again is returned as a `TaskCrashed` result for the caller to report (its input file
is then listed in the run's errors, and re-running the command retries it).

Progress: workers put `(records, bytes)` increments on a multiprocessing queue (see
`executors/progress.py`); the parent drains it and shows records/s and MB/s next to the task count.
The bar goes to stderr and is disabled when stderr is not a terminal.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import oreline.executors.progress as progress_mod
from oreline.executors.interface import Resources, TaskCrashed


def _worker_init(progress_queue) -> None:
    progress_mod.set_progress_queue(progress_queue)


def _context(preload: Sequence[str] = ()):
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        # workers fork from a server that has already imported the step modules and their C
        # extensions (pyarrow, resiliparse, fastText, numpy): each worker then starts in ms
        ctx.set_forkserver_preload(list(preload))
    return ctx


class LocalExecutor:
    """A process pool on this machine (`workers` processes; inline for one)."""

    name = "local"

    def __init__(self, workers: int = 1, preload: Sequence[str] = (), console: Console | None = None):
        self.workers = max(1, int(workers))
        self.preload = tuple(preload)
        self.console = console

    def map(self, fn, jobs, *, label, resources=Resources()) -> list[Any]:
        # resources: the pool runs one single-threaded task per worker; memory is not enforced here
        return run_tasks(fn, jobs, self.workers, label, self.console, preload=self.preload)


def progress_bar(console: Console) -> Progress:
    """The live bar every executor shows: label, bar, tasks done/total, rates, elapsed time."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=False,
    )


def run_tasks(
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    workers: int,
    label: str,
    console: Console | None = None,
    preload: Sequence[str] = (),
) -> list[Any]:
    """Results of fn(*job) for every job, in job order (TaskCrashed where a worker died twice)."""
    results: list[Any] = [None] * len(jobs)
    if not jobs:
        return results
    console = console or Console(stderr=True)
    rates = progress_mod.Rates()
    with progress_bar(console) as bar:
        tid = bar.add_task(label, total=len(jobs), rate="")
        if workers <= 1 or len(jobs) == 1:
            local = progress_mod.LocalQueue()
            previous = progress_mod.current_queue()
            progress_mod.set_progress_queue(local)
            try:
                for i, job in enumerate(jobs):
                    results[i] = fn(*job)
                    for item in local.items:
                        rates.add(item)
                    local.items.clear()
                    bar.update(tid, advance=1, rate=rates.text())
            finally:
                progress_mod.set_progress_queue(previous)
            return results
        ctx = _context(preload)
        progress_queue = ctx.Queue()
        crashed = _run_pool(
            fn, jobs, list(range(len(jobs))), workers, ctx, progress_queue, results, bar, tid, rates
        )
        for i in crashed:  # retry alone, so the culprit cannot take a neighbour down with it
            again = _run_pool(fn, jobs, [i], 1, ctx, progress_queue, results, bar, tid, rates)
            if again:
                results[i] = TaskCrashed(jobs[i], "worker process died while running this task (twice)")
                bar.update(tid, advance=1)
        progress_queue.close()
    return results


def _drain(progress_queue, rates: progress_mod.Rates) -> None:
    while True:
        try:
            rates.add(progress_queue.get_nowait())
        except (queue_mod.Empty, OSError, ValueError):
            return


def _run_pool(fn, jobs, indices, workers, ctx, progress_queue, results, bar, tid, rates) -> list[int]:
    """Run jobs[indices] in one pool; return the indices lost to a broken pool."""
    crashed: list[int] = []
    with ProcessPoolExecutor(
        max_workers=min(workers, len(indices)),
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(progress_queue,),
    ) as pool:
        pending = {pool.submit(fn, *jobs[i]): i for i in indices}
        while pending:
            done, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            _drain(progress_queue, rates)
            for fut in done:
                i = pending.pop(fut)
                try:
                    results[i] = fut.result()
                except BrokenProcessPool:
                    crashed.append(i)
                    continue
                bar.update(tid, advance=1)
            bar.update(tid, rate=rates.text())
    _drain(progress_queue, rates)
    return sorted(crashed)
