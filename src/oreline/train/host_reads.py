"""Counting what a training step reads from the device on the host (`train.debug.count_host_reads`).

A CUDA kernel launch returns at once; the host runs ahead and queues work. Reading a device value
on the host — `.item()`, `float(t)`, `int(t)`, `bool(t)` (so `if t:`), a copy to the CPU — waits
until everything queued before it has run: the queue empties, and for a small model the GPU then
idles while the host launches the next kernels one by one. The training loop reads nothing on an
ordinary step (oreline.train.loop); this counter is how that is checked, on any device.

`HostReadCounter` is a `TorchDispatchMode`: every aten op of the step passes through it, and it
counts `_local_scalar_dense` (what item/float/int/bool call; `is_nonzero` and `item` are counted
too in case a build dispatches them) and `_to_copy` / `copy_` whose destination is the CPU and
whose source is not. On a CPU-only run every tensor lives on the host, so copies cannot be seen
and `.tolist()` / `.numpy()` (which read memory without an op) are not counted: on CPU the count
covers the scalar reads, on CUDA the copies as well.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oreline.io import write_atomic

aten = torch.ops.aten
SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default}
COPIES = {aten._to_copy.default, aten.copy_.default}


def _device(x: Any) -> torch.device | None:
    return x.device if isinstance(x, torch.Tensor) else None


def is_host_read(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this aten call reads a device value on the host."""
    if func in SCALAR_READS:
        return True
    if func is aten._to_copy.default:
        src, dst = _device(args[0]), kwargs.get("device")
        return src is not None and dst is not None and torch.device(dst).type == "cpu" and src.type != "cpu"
    if func is aten.copy_.default:
        dst, src = _device(args[0]), _device(args[1])
        return dst is not None and src is not None and dst.type == "cpu" and src.type != "cpu"
    return False


class HostReadCounter(TorchDispatchMode):
    """Counts host reads of device values by op name while active (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if is_host_read(func, args, kwargs):
            self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)


class StepReads:
    """Per-step counts for the loop: `with reads.step(n, why):` around one step; `write()` at the end.

    `why` is what the step did besides training ("log", "eval", "checkpoint", ... — empty for an
    ordinary step). Without `enabled` it does nothing and costs nothing.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.steps: list[dict[str, Any]] = []
        self._mode: HostReadCounter | None = None

    def start(self) -> None:
        if self.enabled:
            self._mode = HostReadCounter()
            self._mode.__enter__()

    def stop(self, step: int, why: list[str]) -> None:
        if self._mode is None:
            return
        self._mode.__exit__(None, None, None)
        counts, self._mode = self._mode.counts, None
        self.steps.append(
            {"step": step, "why": list(why), "reads": sum(counts.values()), "ops": dict(counts)}
        )

    def abandon(self) -> None:
        """Leave the counting mode if a step ended by an exception (a stop, an error)."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    def write(self, run_root: Path, rank: int) -> Path | None:
        """`<run>/debug/host-reads-rankNNNNN.json`: one entry per step taken."""
        if not self.enabled:
            return None
        path = Path(run_root) / "debug" / f"host-reads-rank{rank:05d}.json"
        write_atomic(path, json.dumps(self.steps, indent=1) + "\n")
        return path
