"""Switches that change how fast, or in how much memory, a step runs, never what it computes.

- `enable_activation_checkpointing` (`train.activation_checkpointing`): recompute each block's
  activations in backward instead of keeping them;
- `compile_blocks` (`train.compile`): torch.compile per transformer block;
- `tune_cpu_allocator` (`train.cpu_allocator = "tuned"`): keep large freed blocks mapped (glibc).

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


def tune_cpu_allocator() -> str | None:
    """glibc only: keep freed large blocks in the heap for reuse instead of unmapping them.

    A CPU step allocates tens of MB per activation (the demo's logits alone are 64 MB). glibc
    serves blocks above M_MMAP_THRESHOLD (dynamic, at most 32 MB) with mmap and unmaps them on
    free, so every step the kernel zero-fills the same pages again; page faults were ~13% of a
    demo step here (measured in process CPU time, 1 thread: 940 → 815 ms). Raising the mmap and
    trim thresholds keeps those blocks mapped, which is what the jemalloc/tcmalloc swap of
    PyTorch's CPU performance-tuning guide achieves, without preloading a library. The cost: the
    process keeps its peak heap (RSS does not shrink after a step). Returns what was set, or None.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None  # not glibc (macOS, musl): nothing to tune
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    if mallopt(m_mmap_threshold, 1 << 30) != 1 or mallopt(m_trim_threshold, (1 << 31) - 1) != 1:
        return None
    return "glibc mallopt: M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=2 GiB"
