"""Switches that change how fast, or in how much memory, a step runs, never what it computes.

- `enable_activation_checkpointing` (`train.activation_checkpointing`): recompute each block's
  activations in backward instead of keeping them;
- `compile_blocks` (`train.compile`): torch.compile per transformer block;
- `tune_cpu_allocator` (`train.cpu_allocator = "tuned"`): keep large freed blocks mapped (glibc);
- `lean_cpu_allocator` (`train.cpu_allocator = "lean"`): hand large freed blocks back at once (glibc).

`session.setup_run` applies them; each says what it measured.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each block's activations in backward (non-reentrant torch.utils.checkpoint).

    The block's `forward` is replaced on the instance, so parameter names (and checkpoints, and
    the HF export) stay exactly as without it.
    """
    from torch.utils.checkpoint import checkpoint

    for block in model.model.layers:
        inner = block.forward

        @functools.wraps(inner)
        def forward(*args: Any, _inner: Any = inner, **kwargs: Any) -> torch.Tensor:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward


def compile_blocks(model: torch.nn.Module) -> None:
    """torch.compile each transformer block (regional compilation) instead of the whole model.

    The blocks are identical, so one compiled graph serves them all: the first step compiled in
    ~19 s instead of ~2 min for the whole demo model on this loaded machine, and steps ran as fast
    (672-701 ms vs 727-741 ms of CPU time, 1 thread, with the tuned allocator; eager 758-830 ms).
    Elementwise work (RMSNorm, RoPE, SiLU·up, residual adds) is fused; the output head and the
    loss stay eager. See PyTorch's "regional compilation" recipe.
    """
    for block in model.model.layers:
        block.compile()


def _mallopt(settings: list[tuple[int, int]]) -> bool:
    """glibc's mallopt(param, value) for each pair; False where it is not glibc or refuses one."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False  # not glibc (macOS, musl): nothing to set
    return all(mallopt(param, value) == 1 for param, value in settings)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


def tune_cpu_allocator() -> str | None:
    """glibc only: keep freed large blocks in the heap for reuse instead of unmapping them.

    A CPU step allocates tens of MB per activation (the demo's logits alone are 64 MB). glibc
    serves blocks above M_MMAP_THRESHOLD (dynamic, at most 32 MB) with mmap and unmaps them on
    free, so every step the kernel zero-fills the same pages again; page faults were ~13% of a
    demo step here (measured in process CPU time, 1 thread: 940 → 815 ms). Raising the mmap and
    trim thresholds keeps those blocks mapped, which is what the jemalloc/tcmalloc swap of
    PyTorch's CPU performance-tuning guide achieves, without preloading a library. The cost: the
    process keeps its peak heap (RSS does not shrink after a step), and more: freed blocks that
    do not fit the next request stay resident too (an FSDP2 rank of the 125m preset on gloo
    peaked at 3.3-4.0 GB while its tensors never exceeded 1.5 GB; benchmarks/rank_memory.py).
    Returns what was set, or None.
    """
    if not _mallopt([(M_MMAP_THRESHOLD, 1 << 30), (M_TRIM_THRESHOLD, (1 << 31) - 1)]):
        return None
    return "glibc mallopt: M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=2 GiB"


LEAN_MMAP_THRESHOLD = 1 << 20


def lean_cpu_allocator() -> str | None:
    """glibc only: serve every block of 1 MiB or more with its own mmap, so that freeing it gives
    its pages back to the kernel at once; the process's RSS then follows its live tensors.

    glibc's own setting moves its mmap threshold up to the largest block freed so far (at most
    32 MB): after the first step nearly every tensor of a 125m FSDP2 rank (a block's unsharded
    weights and gradients, up to 9.4 MB each; the shards; the activations) comes from the heap,
    whose freed pages stay resident wherever a live block sits above them. A rank then peaked 270-430 MB
    above its live tensors (W=2 and 4, gloo; mallinfo2 against VmRSS through the step); with the
    threshold fixed at 1 MiB, RSS stayed at live tensors + ~260 MB of interpreter and libraries
    at every point of the step. The cost is the page faults that `tune_cpu_allocator` avoids:
    every large block is zero-filled by the kernel again (process CPU time per step +10% over
    glibc's setting at 125m/W=2 here, more with 4 ranks on 2 cores). Returns what was set, or None.
    """
    if not _mallopt([(M_MMAP_THRESHOLD, LEAN_MMAP_THRESHOLD)]):
        return None
    return "glibc mallopt: M_MMAP_THRESHOLD=1 MiB (fixed: freed large blocks go back to the kernel)"


CPU_ALLOCATORS = {"tuned": tune_cpu_allocator, "lean": lean_cpu_allocator}


def set_cpu_allocator(mode: str) -> str | None:
    """Apply `train.cpu_allocator` ("tuned", "lean"; "default" leaves glibc as it is); returns
    what was set, None where nothing was (not glibc, or "default")."""
    setter = CPU_ALLOCATORS.get(mode)
    return setter() if setter is not None else None
