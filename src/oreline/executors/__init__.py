"""Executors: where the tasks of a stage run. They only schedule; they never change what a task writes.

The contract every stage and executor keeps (docs/design.md, "Tasks and executors"):
- a task is `fn(*job)` where `fn` is a module-level function (importable by name, so a Ray worker
  or a Slurm array task on another node can run it; the Slurm executor runs only the functions
  listed in `executors/wire.py`) and `job` a tuple of plain values (str, int, float, bool, None,
  bytes, paths, tuples/lists/dicts of them, numpy scalars, config sections and the dataclasses
  `executors/wire.py` lists: what travels to a Slurm task as JSON, with no pickle);
- `Executor.map(fn, jobs, label=…, resources=…)` returns one result per job, in job order;
- a task that raised a data error records it in its own result (the task functions do that
  themselves); a task whose worker died (segfault, OOM killer, a lost node) is retried, and one
  that kills its worker again comes back as a `TaskCrashed` naming the job, so the caller lists
  its input in the run's errors and a re-run retries it;
- a task writes under attempt-unique temporary names and commits with a marker listing its
  files, so two attempts of one task running at once leave one valid output.

`make_executor(name, …)` picks the implementation: `local` (a process pool on this machine,
the default), `ray` (Ray core tasks on a cluster) or `slurm` (array jobs). Implementations
other than `local` import their engine lazily, so oreline runs without them installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oreline.errors import ConfigError
from oreline.executors.interface import Executor

EXECUTORS = ("local", "ray", "slurm")


def make_executor(
    name: str, *, workers: int = 1, preload: Sequence[str] = (), console: Any = None, **options: Any
) -> Executor:
    """The executor called `name`; `options` are the engine's own settings (e.g. a Ray address).

    `workers` is the local pool's size; `preload` names modules a local pool imports once before
    forking workers; `console` is where the live progress bar goes (stderr by default)."""
    if name == "local":
        from oreline.executors.local import LocalExecutor

        return LocalExecutor(workers=workers, preload=preload, console=console)
    if name == "ray":  # options: ray=RayConfig (data.ray); workers and preload are the cluster's affair
        from oreline.executors.ray import RayExecutor

        return RayExecutor(options.get("ray"), console=console)
    if name == "slurm":
        from oreline.executors.slurm import SlurmExecutor

        return SlurmExecutor(options.get("slurm"), work=options.get("work"), console=console)
    raise ConfigError(
        f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)} (data.executor or --executor)"
    )
