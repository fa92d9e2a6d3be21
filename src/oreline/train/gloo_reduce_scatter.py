"""FSDP2's gradient reduce-scatter on gloo (CPU ranks), done as an in-place all-reduce.

gloo's reduce_scatter is an all-reduce of a full-size copy of its input, of which each rank keeps
its chunk: while the collective runs a rank holds FSDP2's reduce-scatter input (a unit's unsharded
gradients), that copy, and the output shard. FSDP2 never reads the input again after the call (it
only keeps a reference until the reduce-scatter's event), so the all-reduce can run in the input
itself: one unit's unsharded gradients less while it runs (98 MB at 125m for the root unit, the
tied table's gradient, whatever the world size; the rank's peak fell 53 MB at W=2 and not at W=4,
whose peak was then in the blocks' backward: docs/measurements.md). It is also faster, since the
copy is gone; the bytes on the wire are gloo's own all-reduce's in both cases. The input's memory
is released as soon as the op has copied this rank's chunk out: FSDP2 would keep it until the next
unit's post-backward, i.e. through that unit's whole backward (a block's unsharded gradients, 34.6
MB at 125m, on top of the next block's gathered weights and gradients).

What no reduce-scatter can remove: FSDP2 copies a unit's gradients into the input (torch's
`_chunk_cat`, which refuses an output that overlaps its inputs, so the input cannot be the
gradient itself) and frees the gradients only after that copy, so a unit's unsharded gradient
exists twice for a moment: 2 × 98 MB at 125m for the root unit (the tied table).

The results are bitwise those of gloo's reduce_scatter (sum and average, 2 and 4 ranks; the test
in tests/train/fsdp_helpers.py compares the gradients of a training step with both). NCCL reduces
in place already: `wrap_model` installs this on gloo only.

The contract (torch's `_fsdp_collectives.foreach_reduce`): FSDP2 allocates the input (the padded
unsharded gradients, rank-major: chunk r is rank r's shard) and the output through `allocate`,
divides the input by its pre-divide factor if any, calls the op with `op` = SUM, AVG or
PREMUL_SUM(1/factor) and no async_op, and applies its post-divide factor to the output itself.
SUM and AVG (what FSDP2 passes for fp32 and bf16 gradients unless a gradient divide factor other
than the group size is set) run in place; anything else, or an async call, is handed to FSDP2's
default reduce-scatter unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

from oreline import compat


def gloo_reduce_scatter() -> Any:
    """An FSDP2 ReduceScatter for gloo ranks (the class's docstring above), or None on a torch
    outside the tested range (oreline.compat: FSDP2's default reduce-scatter is kept)."""
    DefaultReduceScatter = compat.fsdp_reduce_scatter_base(  # noqa: N806 (a class)
        "the in-place gloo reduce-scatter",
        "gloo's reduce_scatter holds a full-size copy of each unit's gradients",
    )
    if DefaultReduceScatter is None:
        return None

    class GlooReduceScatter(DefaultReduceScatter):
        def __call__(
            self,
            output_tensor: torch.Tensor,
            input_tensor: torch.Tensor,
            group: Any,
            op: Any,
            async_op: bool = False,
        ) -> Any:
            if async_op or op not in (tdist.ReduceOp.SUM, tdist.ReduceOp.AVG):
                return super().__call__(output_tensor, input_tensor, group, op, async_op)
            world = tdist.get_world_size(group)
            # gloo has no AVG all-reduce: sum, then divide this rank's chunk (gloo's reduce_scatter
            # does the same, so the quotient is bitwise its)
            tdist.all_reduce(input_tensor, op=tdist.ReduceOp.SUM, group=group)
            output_tensor.copy_(input_tensor.view(world, -1)[tdist.get_rank(group)])
            if op == tdist.ReduceOp.AVG:
                output_tensor.div_(world)
            # FSDP2 keeps its reference to the input until the next unit's reduce-scatter (a CUDA
            # stream's keep-alive; nothing reads it): freed now, not through that unit's backward
            input_tensor.untyped_storage().resize_(0)
            return None

    return GlooReduceScatter()
