"""The interface between stages and executors: one task's resources, a crashed task, `Executor`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class TaskCrashed:
    """The result of a task whose worker died twice (or whose retries the engine gave up)."""

    args: tuple
    error: str


@dataclass(frozen=True)
class Resources:
    """What one task needs: CPUs (fractions allowed where the engine supports them) and memory."""

    cpus: float = 1.0
    memory_mb: int | None = None


class Executor(Protocol):
    name: str

    def map(
        self,
        fn: Callable[..., Any],
        jobs: Sequence[tuple],
        *,
        label: str,
        resources: Resources = Resources(),
    ) -> list[Any]:
        """fn(*job) for every job, in job order; TaskCrashed where the worker died for good."""
        ...
