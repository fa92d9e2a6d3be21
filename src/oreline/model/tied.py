"""One full-size gradient for a tied embedding table during backward, not two.

With tied embeddings one (vocab, dim) table is both the input embedding and the output projection.
Plain autograd gives it two full-size gradients: the output projection's dW (computed first, at the
start of backward, then held in autograd's input buffer of the table until every block's backward
has run) and the embedding lookup's own dense gradient, a zero-filled (vocab, dim) matrix with one
row per token of the batch filled in, which autograd then adds to the first. At 125m (vocab 32,000,
dim 768) that second matrix is 98 MB of the peak of backward, on every FSDP2 rank whatever the
world size (the tied table is one unit, gathered whole; benchmarks/rank_memory.py, docs/measurements.md).

Here the two uses of the table in one forward share a `TiedGradient`: the output projection's use
hands its dW to it instead of to autograd, and the embedding's backward adds its rows into that
same matrix in place and returns it as the table's only gradient. The embedding's rows are computed
by the same kernel as before (aten's embedding_dense_backward) over the batch's distinct token ids
only, so each row sums its tokens in the same order as the dense kernel; adding it into dW is the
same single addition per element that autograd made (fp32: bitwise the same gradient;
tests/model/test_tied.py). Either backward order is correct: an output-projection gradient that
arrives after the embedding's backward is returned to autograd as usual.

The embedding's backward needs the ids only, not the table: once the output layers' backward (the
output projection's, then the final norm's) has run, nothing in backward reads the table again.
`after_output` (the owner's callback, called right then) lets FSDP2 free its gathered copy of the
table and the final norm, the root unit's parameters, there instead of at the end of backward
(oreline.train.dist.wrap_model: the root unit's `reshard`; 98 MB at 125m through the whole
backward of the blocks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


class TiedGradient:
    """Joins the two uses of one tied table in one forward. Make a new one per forward."""

    def __init__(self, after_output: Callable[[], None] | None = None) -> None:
        # the output projection's dW, held until the embedding's backward adds its rows into it
        self.head_grad: torch.Tensor | None = None
        self.embedding_done = False
        self.after_output = after_output  # called once the output layers' backward has run (see above)

    def embedding(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """F.embedding(ids, weight), whose backward returns the table's whole gradient."""
        return _EmbeddingUse.apply(weight, ids, self)

    def head_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """`weight` for the output projection, whose gradient goes to the embedding's backward."""
        return _HeadUse.apply(weight, self)

    def output_input(self, h: torch.Tensor) -> torch.Tensor:
        """`h` on its way into the output layers (final norm, output projection): its backward, which
        runs once theirs has, calls `after_output`."""
        return _OutputStart.apply(h, self) if self.after_output is not None else h


class _HeadUse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: torch.Tensor, tie: TiedGradient) -> torch.Tensor:
        ctx.tie = tie
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        tie = ctx.tie
        # create_graph (grad mode on) or an embedding backward already run: autograd adds it as usual
        if tie.embedding_done or torch.is_grad_enabled() or g.layout != torch.strided:
            return g, None
        # added into in place later: no overlapping (expanded) layout; a transposed one is fine
        # (nn.Linear's dW is one), and AccumulateGrad copies it to the table's layout as before
        tie.head_grad = g if g.is_contiguous() or (g.dim() == 2 and g.t().is_contiguous()) else g.contiguous()
        return None, None


class _OutputStart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, tie: TiedGradient) -> torch.Tensor:
        ctx.tie = tie
        return h.view_as(h)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        tie = ctx.tie
        # only when the output projection's dW is held here (not under create_graph, whose
        # double backward could read the table again)
        if tie.head_grad is not None and not torch.is_grad_enabled() and tie.after_output is not None:
            tie.after_output()
        return g, None


class _EmbeddingUse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: torch.Tensor, ids: torch.Tensor, tie: TiedGradient) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.tie = tie
        ctx.num_weights = weight.shape[0]
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (ids,) = ctx.saved_tensors
        tie = ctx.tie
        head, tie.head_grad = tie.head_grad, None
        tie.embedding_done = True
        if head is None or torch.is_grad_enabled():  # no dW held (or double backward): the dense gradient
            dense = torch.ops.aten.embedding_dense_backward(g, ids, ctx.num_weights, -1, False)
            return (dense if head is None else head + dense), None, None
        # the rows of the distinct ids only: row j sums the tokens whose id is uniq[j], in token
        # order, exactly as the dense kernel sums the tokens of that id's row
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        rows = torch.ops.aten.embedding_dense_backward(
            g.reshape(-1, g.shape[-1]), inverse, uniq.numel(), -1, False
        )
        head.index_add_(0, uniq, rows.to(head.dtype))  # distinct ids: one addition per element
        return head, None, None
