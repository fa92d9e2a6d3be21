"""Switches that change how fast, or in how much memory, a step runs, never what it computes.

- `enable_activation_checkpointing` (`train.activation_checkpointing`,
  `train.activation_checkpointing_every`): recompute block activations in backward instead of
  keeping them, all of them ("full") or all but the products' outputs ("selective");
- `compile_blocks` (`train.compile`): torch.compile per transformer block;
- `tune_cpu_allocator` (`train.cpu_allocator = "tuned"`): keep large freed blocks mapped (glibc);
- `lean_cpu_allocator` (`train.cpu_allocator = "lean"`): hand large freed blocks back at once (glibc).

`session.setup_run` applies them; each says what it measured.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

CHECKPOINTING = ("none", "full", "selective")


def selective_ops() -> set:
    """The ops whose outputs selective checkpointing keeps: the matrix products and attention,
    the expensive ops whose recomputation would cost as much as their first run (torchtitan's
    `_save_list`, less its collectives and float8 scale ops, which oreline's blocks do not run inside).
    Everything else in a block — RMSNorm, RoPE, SiLU, the gate product, residual adds, casts —
    is elementwise and memory-bound, and is recomputed from the kept products in backward.
    Batched products (aten.bmm) are left out on purpose: SDPA's math fallback computes its
    (tokens × tokens) scores with them, the largest tensor of a block."""
    aten = torch.ops.aten
    ops = {aten.mm.default, aten.addmm.default, aten._scaled_mm.default}
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ):
        if hasattr(aten, name):
            ops.add(getattr(aten, name).default)
    # the CPU kernels' oneDNN product (oreline.model.kernels.matmul) is a custom op of its own
    oreline_ops = getattr(torch.ops, "oreline", None)
    if oreline_ops is not None and hasattr(oreline_ops, "onednn_mm_nt"):
        ops.add(oreline_ops.onednn_mm_nt.default)
    return ops


def _selective_context() -> Any:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = selective_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def enable_activation_checkpointing(model: torch.nn.Module, mode: str = "full", every: int = 1) -> list[int]:
    """Recompute block activations in backward (non-reentrant torch.utils.checkpoint); returns the
    indices of the blocks checkpointed.

    mode "full": a checkpointed block keeps only its input and recomputes its whole forward in
    backward (~1/3 more block FLOPs). "selective": it keeps the outputs of its products and
    attention (`selective_ops`) and recomputes only the elementwise ops between them (PyTorch's
    selective activation checkpointing, `create_selective_checkpoint_contexts`, as torchtitan's
    "op" mode): most of full's memory saving on the norms and the MLP's SiLU·up, little of its
    recompute time. "none" changes nothing. `every` = N checkpoints blocks 0, N, 2N, … only
    (torchtitan's "layer" frequency); the others keep everything.

    The block's `forward` is replaced on the instance, so parameter names (and checkpoints, and
    the HF export) stay exactly as without it, and FSDP2's `fully_shard` on the block later wraps
    the checkpointed forward (the checkpoint runs inside the unit's all-gather, as torchtitan
    orders it); `compile_blocks` afterwards compiles the checkpointed forward.
    """
    from torch.utils.checkpoint import checkpoint

    if mode not in CHECKPOINTING:
        raise ValueError(f"activation checkpointing mode {mode!r}: use one of {', '.join(CHECKPOINTING)}")
    if every < 1:
        raise ValueError(f"activation checkpointing every {every} blocks: use 1 or more")
    if mode == "none":
        return []
    extra: dict[str, Any] = {"context_fn": _selective_context} if mode == "selective" else {}
    chosen = []
    for i, block in enumerate(model.model.layers):
        if i % every:
            continue
        inner = block.forward

        @functools.wraps(inner)
        def forward(*args: Any, _inner: Any = inner, **kwargs: Any) -> torch.Tensor:
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)

        block.forward = forward
        chosen.append(i)
    return chosen


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


LEAN_MMAP_THRESHOLD = 64 << 10


def lean_cpu_allocator() -> str | None:
    """glibc only: serve every block of 64 KiB or more with its own mmap, so that freeing it gives
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

    64 KiB, not 1 MiB: blocks under the threshold still come from the heap, and at short sequences
    the activations are such blocks (32 tokens × 768 fp32 = 96 KiB); freed in backward between live
    blocks they left 35-42 MB of resident free heap at a 125m rank's peak (1 MiB; 3 MB with 64 KiB,
    as in the debug preset): 43-53 MB of the peak RSS at W=4 / W=2, no CPU cost visible
    (benchmarks/rank_memory.py, docs/measurements.md). Blocks below 64 KiB (norm weights, small
    tensors) stay on the heap, where an mmap each would cost more than it saves; glibc also serves
    a larger block from the heap when a free chunk or the heap's top fits it.
    """
    if not _mallopt([(M_MMAP_THRESHOLD, LEAN_MMAP_THRESHOLD)]):
        return None
    return "glibc mallopt: M_MMAP_THRESHOLD=64 KiB (fixed: freed blocks of 64 KiB or more go to the kernel)"


CPU_ALLOCATORS = {"tuned": tune_cpu_allocator, "lean": lean_cpu_allocator}


def set_cpu_allocator(mode: str) -> str | None:
    """Apply `train.cpu_allocator` ("tuned", "lean"; "default" leaves glibc as it is); returns
    what was set, None where nothing was (not glibc, or "default")."""
    setter = CPU_ALLOCATORS.get(mode)
    return setter() if setter is not None else None
