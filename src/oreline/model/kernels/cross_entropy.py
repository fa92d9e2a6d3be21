"""Output projection + per-token cross entropy in one autograd function, with one (N, V) buffer.

The plain path — `logits = h @ Wᵀ`, then `F.cross_entropy(reduction="none")` — keeps the fp32
logits AND log-softmax's (N, V) output for backward, then allocates a zero-filled (N, V) gradient
for the NLL backward and a fourth (N, V) for log-softmax's. At the demo shapes those passes over
memory are a large part of a CPU step (profile in docs/measurements.md). This function keeps a
single buffer and works on it in place:

    forward   z = h Wᵀ; loss = max + log Σ exp(z − max) − z[label]   (z becomes softmax in place)
    backward  z ← z − onehot(label)  (= softmax − onehot, in place)
              dh = g · (z W),  dW = zᵀ (g · h)

The per-row upstream gradient g scales the (N, dim) operands rather than the (N, V) buffer, which
saves one pass over it.

It stays exact for ANY upstream gradient g (per row), unlike fused losses that precompute the
gradient of a mean in forward. The price of the in-place backward: it can run once per forward
(`retain_graph=True` twice through it raises, saying so). Targets equal to -100 are ignored
(loss 0, no gradient), as in F.cross_entropy. Logit rows are reduced in fp32 whatever the matmul
dtype (bf16 under autocast); gradients come back in the inputs' dtypes.
"""

from __future__ import annotations

import torch

from oreline.model.kernels.matmul import mm_nn, mm_nt, mm_tn

IGNORE_INDEX = -100


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, backend: str, shape: torch.Size
    ) -> torch.Tensor:
        z = mm_nt(h, weight, backend)  # (N, V) in the autocast/matmul dtype
        compute_dtype = z.dtype
        if z.dtype != torch.float32:
            z = z.float()
        valid = labels != IGNORE_INDEX
        safe = labels.masked_fill(~valid, 0)
        picked = z.gather(1, safe[:, None]).squeeze(1)
        top = z.amax(dim=1, keepdim=True)
        z.sub_(top).exp_()  # z = exp(z − max): the softmax numerators
        total = z.sum(dim=1, keepdim=True)
        loss = (top + total.log()).squeeze(1) - picked
        # Shaped by the out-of-place fill, not by a .view of the result: a view returned from an
        # FSDP2 unit's forward makes FSDP2 warn that an in-place op on it could skip its all-gather.
        loss = loss.view(shape).masked_fill(~valid.view(shape), 0.0)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            z.div_(total)  # probabilities
            ctx.save_for_backward(h, weight, z, safe, valid)
            ctx.compute_dtype = compute_dtype
            ctx.backend = backend
            ctx.used = False
        return loss

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        if ctx.used:
            raise RuntimeError(
                "linear_cross_entropy's backward reuses its buffer in place and can run once per forward; "
                "call the forward again instead of backward(retain_graph=True) twice"
            )
        ctx.used = True
        h, weight, p, safe, valid = ctx.saved_tensors
        g = (g.reshape(-1).float() * valid).contiguous()
        # softmax − onehot, in place; the per-row upstream gradient g scales the (N, dim) products
        # instead of the (N, V) buffer: g·(p − onehot)·W = g·((p − onehot)·W), and likewise for dW
        p.scatter_add_(1, safe[:, None], torch.full_like(g, -1.0)[:, None])
        dz = p if ctx.compute_dtype == torch.float32 else p.to(ctx.compute_dtype)
        dh = dw = None
        if ctx.needs_input_grad[0]:
            dh = (mm_nn(dz, weight.to(dz.dtype), ctx.backend).float() * g[:, None]).to(h.dtype)
        if ctx.needs_input_grad[1]:
            dw = mm_tn(dz, (h.float() * g[:, None]).to(dz.dtype), ctx.backend).to(weight.dtype)
        return dh, dw, None, None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, backend: str = "blas"
) -> torch.Tensor:
    """Per-token CE in nats of `h @ weight.T` against `labels`: (..., dim), (V, dim), (...) → (...) fp32,
    0 where the label is -100. The logits never exist outside this function. `backend`: the fp32
    CPU product backend (oreline.model.kernels.matmul), "blas" being torch's own products."""
    shape = labels.shape
    flat_h = h.reshape(-1, h.shape[-1])
    flat_labels = labels.reshape(-1)
    if flat_h.shape[0] != flat_labels.shape[0]:
        raise ValueError(f"{flat_h.shape[0]} hidden rows but {flat_labels.shape[0]} labels")
    if torch.is_autocast_enabled(h.device.type):
        dtype = torch.get_autocast_dtype(h.device.type)
        flat_h, weight = flat_h.to(dtype), weight.to(dtype)
    with torch.autocast(h.device.type, enabled=False):
        return _LinearCrossEntropy.apply(flat_h, weight, flat_labels, backend, shape)
