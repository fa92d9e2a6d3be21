"""Communication time: the spans during which a collective was in flight (`comm_ms`, `comm_frac`
in metrics.jsonl).

For DDP a comm hook (`timed_allreduce_hook`, installed by `oreline.train.dist.wrap_model`) wraps
each bucket's all-reduce and records when it started and when its future completed (perf_counter
on CPU, CUDA events on GPU: nothing waits for the device); the loop adds the span of its own small
all-reduces (`with COMM.span():` around target counts, loss sums, the step's agreement). The
spans are read on logging steps (`CommTimer.take`). For FSDP2 the gradient reduce-scatters are
timed only with `train.profile`: the timer replaces FSDP2's private reduce-scatter
(`timed_reduce_scatter`, through oreline.compat) and waits for each one, so it stays out of
ordinary runs, whose FSDP comm_ms then holds the loop's own all-reduces only.

Overlapping spans are merged (their union is counted, not their sum), so comm_ms is the wall time
during which a collective was in flight, part of which overlaps backward compute;
comm_frac = comm_ms / step_ms. FSDP's parameter all-gathers are not included.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from oreline import compat


def _distributed() -> bool:
    return tdist.is_initialized() and tdist.get_world_size() > 1


class CommTimer:
    """Spans of collectives; `take()` returns the seconds of their union since the last take.

    CPU spans are perf_counter pairs. CUDA spans are event pairs, turned into seconds relative to
    a reference event at take time, which waits for the device: the loop takes on logging steps only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[Any, Any]] = []
        self._ref: Any = None
        # where the collectives run: CUDA events on a GPU (NCCL), perf_counter otherwise;
        # `oreline.train.dist.init_distributed` sets it
        self.device = torch.device("cpu")

    def stamp(self) -> Any:
        if self.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            with self._lock:
                if self._ref is None:
                    self._ref = torch.cuda.Event(enable_timing=True)
                    self._ref.record()
            return ev
        return time.perf_counter()

    def add(self, start: Any, end: Any) -> None:
        with self._lock:
            self._spans.append((start, end))

    def span(self) -> Any:
        """`with COMM.span():` around a collective the loop itself makes."""
        return _Span(self)

    def take(self) -> float:
        with self._lock:
            spans, ref = self._spans, self._ref
            self._spans, self._ref = [], None
        if not spans:
            return 0.0
        if not isinstance(spans[0][0], float):
            torch.cuda.synchronize()
            spans = [(ref.elapsed_time(a) / 1e3, ref.elapsed_time(b) / 1e3) for a, b in spans]
        total, cur_start, cur_end = 0.0, None, None
        for a, b in sorted(spans):
            if cur_end is None or a > cur_end:
                if cur_end is not None:
                    total += cur_end - cur_start
                cur_start, cur_end = a, b
            else:
                cur_end = max(cur_end, b)
        return total + (cur_end - cur_start)


class _Span:
    def __init__(self, timer: CommTimer):
        self.timer = timer

    def __enter__(self) -> None:
        self.start = self.timer.stamp() if _distributed() else None

    def __exit__(self, *exc: Any) -> None:
        if self.start is not None:
            self.timer.add(self.start, self.timer.stamp())


COMM = CommTimer()


@dataclass(frozen=True)
class AllReduceState:
    timer: CommTimer
    dtype: torch.dtype | None  # None: the gradients' own dtype; bf16: train.reduce_dtype = "bf16"


def timed_allreduce_hook(state, bucket):  # no annotations: DDP rejects the string ones of `from __future__`
    """DDP comm hook: the default mean all-reduce of one gradient bucket, with its span recorded
    (in bf16 when train.reduce_dtype = "bf16": half the bytes, then copied back into the bucket)."""
    start = state.timer.stamp()
    buf = bucket.buffer()
    buf.div_(tdist.get_world_size())
    low = buf.to(state.dtype) if state.dtype is not None and state.dtype != buf.dtype else None
    fut = tdist.all_reduce(buf if low is None else low, async_op=True).get_future()

    def done(f: torch.futures.Future) -> torch.Tensor:
        state.timer.add(start, state.timer.stamp())
        out = f.value()[0]
        return out if low is None else buf.copy_(out)

    return fut.then(done)


def timed_reduce_scatter(inner: Any = None):
    """An FSDP2 reduce-scatter that records the span of every call into COMM: `inner` (the one
    `wrap_model` would install otherwise: gloo's in-place one) or, if None, FSDP2's default."""
    DefaultReduceScatter = compat.fsdp_reduce_scatter_base()  # noqa: N806 (a class)
    if DefaultReduceScatter is None:
        return None

    class TimedReduceScatter(DefaultReduceScatter):
        def __init__(self, inner: Any) -> None:
            self.inner = inner if inner is not None else DefaultReduceScatter()

        def allocate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            return self.inner.allocate(*args, **kwargs)

        def __call__(
            self,
            output_tensor: torch.Tensor,
            input_tensor: torch.Tensor,
            group: Any,
            op: Any,
            async_op: bool = False,
        ) -> Any:
            start = COMM.stamp()
            work = self.inner(output_tensor, input_tensor, group, op, async_op)
            if work is not None and async_op:
                work.wait()
            COMM.add(start, COMM.stamp())
            return None if async_op else work

    return TimedReduceScatter(inner)
