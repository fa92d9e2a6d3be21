"""RMSNorm with a hand-written backward (the reference is oreline.model.llama.rms_norm).

Autograd's chain of pow/mean/add/rsqrt/mul/mul saves and revisits each temporary. Here every
row reduction is one pass that allocates nothing of the input's size: the forward statistic is
`vector_norm` (not mean(x²), a squared temporary then a sum), and the backward's two reductions
are matrix-vector products, so the step makes ~2 passes forward and ~6 backward. Only x (kept
anyway by the residual stream) and the (…, 1) row scale r are saved.

With x̂ = x·r, r = (mean(x²) + eps)^-½ and y = x̂·w, and gx = g·x:
  dw = Σ_rows g·x̂ = gxᵀ · r                     (a matrix-vector product over the rows)
  dx = r · (g·w − x̂ · mean(g·w·x̂)) = g·w·r − x · (r³ · (gx · w) / d)

Timings against the reference: docs/measurements.md.
"""

from __future__ import annotations

import torch


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        d = x.shape[-1]
        # ‖x‖² / d: one reduction pass; squaring the norm again costs one rounding (~1e-7 relative)
        r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(d).add_(eps).rsqrt_()  # (…, 1)
        ctx.save_for_backward(xf, r, weight)
        ctx.in_dtype = x.dtype
        return torch.mul(xf, r).mul_(weight) if x.dtype == torch.float32 else weight * (xf * r).to(x.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        xf, r, weight = ctx.saved_tensors
        d = xf.shape[-1]
        gf, wf = g.float(), weight.float()
        gx = torch.mul(gf, xf).reshape(-1, d)  # (rows, d)
        rows = r.reshape(-1)  # (rows,)
        dw = torch.mv(gx.t(), rows).to(weight.dtype)  # Σ_rows g·x·r
        c = torch.mv(gx, wf).mul_(rows.pow(3)).div_(d).view(r.shape)  # r³ · Σ g·w·x / d, (…, 1)
        dx = torch.mul(gf, r).mul_(wf).addcmul_(xf, c, value=-1.0)
        return dx.to(ctx.in_dtype), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) · weight, the statistic in fp32: llama.rms_norm's values."""
    return _RMSNormFn.apply(x, weight, eps)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference's numerics through torch's own `F.rms_norm` (one fused kernel on CUDA in
    recent torch): normalised in fp32, cast back, then scaled by the weight, as llama.rms_norm."""
    y = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * y.to(x.dtype)
