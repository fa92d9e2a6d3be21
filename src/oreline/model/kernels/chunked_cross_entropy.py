"""Output projection + per-token cross entropy over chunks of tokens: no (tokens × vocab) buffer.

At a Llama-3 vocabulary the output head is the largest activation of a step: 8,192 tokens ×
128,256 logits are 4.2 GB in fp32, and the reference loss (logits, `.float()`, F.cross_entropy)
keeps that several times over (the logits, log-softmax's output, their gradients), the fused
loss of kernels.cross_entropy once. This function never holds more than `chunk_tokens` rows of
logits at a time (torchtune's and Liger's chunked/fused linear cross entropy do the same):

    forward   per chunk c: z = h_c Wᵀ (compute dtype), then in fp32
              lse_c = logsumexp(z), loss_c = lse_c − z[label]; keep lse (tokens floats)
    backward  per chunk c: z = h_c Wᵀ again, dz = g_c · (exp(z − lse_c) − onehot(label))
              dh_c = dz W,  dW += dzᵀ h_c   (dW accumulated in fp32)

Measured on this project's CPU (benchmarks/chunked_loss.py, fp32, 1 thread, dim 256, chunks of
1,024): at 8,192 tokens × 128,256 vocab the peak over the inputs was 11.76 GiB for the reference,
4.08 GiB for the fused loss and 0.64 GiB for this one; its time 0.71× the reference's, 1.36× the
fused loss's (at the demo's 2,048 × 8,192: 1.51× the fused), so on a CPU train.loss=auto keeps the
fused loss and takes this one on CUDA only.

The price is the forward product computed a second time in backward (4 head matmuls instead of
3; at 8B × 128k vocabulary the head is ~6% of a step's FLOPs, so ~2% more). Unlike losses that
compute the gradient of a mean during forward (Liger), this stays exact for ANY per-token upstream
gradient g, so oreline.train.step's Σ·scale, the loss factor of the debug injections and any other
weighting work unchanged, and it can be backpropagated more than once. Labels equal to -100 are
ignored (loss 0, no gradient), as in F.cross_entropy; logit rows are reduced in fp32 whatever the
matmul dtype (bf16 under autocast); gradients come back in the inputs' dtypes.
"""

from __future__ import annotations

import torch

from oreline.model.kernels.matmul import mm_nn, mm_nt, mm_tn

IGNORE_INDEX = -100
DEFAULT_CHUNK_TOKENS = 1024  # 1,024 × 128,256 fp32 logits = 0.5 GB live at a time


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
    z = mm_nt(h, weight, backend)
    return z if z.dtype == torch.float32 else z.float()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int, backend: str
    ) -> torch.Tensor:
        n = h.shape[0]
        valid = labels != IGNORE_INDEX
        safe = labels.masked_fill(~valid, 0)
        loss = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            z = _chunk_logits(h[start:end], weight, backend)
            picked = z.gather(1, safe[start:end, None]).squeeze(1)
            # logsumexp in place (torch.logsumexp would allocate a second chunk-sized buffer)
            top = z.amax(dim=1, keepdim=True)
            lse[start:end] = (top + z.sub_(top).exp_().sum(dim=1, keepdim=True).log()).squeeze(1)
            loss[start:end] = lse[start:end] - picked
            del z
        loss.masked_fill_(~valid, 0.0)
        ctx.save_for_backward(h, weight, safe, valid, lse)
        ctx.chunk, ctx.backend = chunk, backend
        return loss

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        h, weight, safe, valid, lse = ctx.saved_tensors
        chunk, backend = ctx.chunk, ctx.backend
        g = g.float() * valid  # ignored rows: no gradient, whatever came from above
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.empty_like(h) if need_h else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        for start in range(0, h.shape[0], chunk):
            end = min(start + chunk, h.shape[0])
            hc = h[start:end]
            dz = _chunk_logits(hc, weight, backend)
            dz.sub_(lse[start:end, None]).exp_()  # softmax, in place
            dz.scatter_add_(1, safe[start:end, None], torch.full_like(lse[start:end, None], -1.0))
            dz.mul_(g[start:end, None])
            if dz.dtype != h.dtype:
                dz = dz.to(h.dtype)
            if need_h:
                dh[start:end] = mm_nn(dz, weight, backend)
            if need_w and dz.dtype == torch.float32 and backend != "onednn":
                dw.addmm_(dz.t(), hc)  # accumulated where it lies: no (vocab × dim) temporary
            elif need_w:
                part = mm_tn(dz, hc, backend)
                dw.add_(part if part.dtype == torch.float32 else part.float())
            del dz
        return dh, (dw.to(weight.dtype) if need_w else None), None, None, None


def chunked_linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    backend: str = "blas",
) -> torch.Tensor:
    """Per-token CE in nats of `h @ weight.T` against `labels`: (..., dim), (V, dim), (...) → (...)
    fp32, 0 where the label is -100, with at most `chunk_tokens` rows of logits alive at a time.
    `backend`: the fp32 CPU product backend (oreline.model.kernels.matmul), "blas" being torch's."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive (got {chunk_tokens})")
    shape = labels.shape
    flat_h = h.reshape(-1, h.shape[-1])
    flat_labels = labels.reshape(-1)
    if flat_h.shape[0] != flat_labels.shape[0]:
        raise ValueError(f"{flat_h.shape[0]} hidden rows but {flat_labels.shape[0]} labels")
    if torch.is_autocast_enabled(h.device.type):  # the products in the autocast dtype, as F.linear's
        dtype = torch.get_autocast_dtype(h.device.type)
        flat_h, weight = flat_h.to(dtype), weight.to(dtype)
    with torch.autocast(h.device.type, enabled=False):
        loss = _ChunkedLinearCrossEntropy.apply(flat_h, weight, flat_labels, int(chunk_tokens), backend)
    return loss.view(shape)
