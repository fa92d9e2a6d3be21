"""Rotary embeddings with no temporaries and an analytic backward (the reference is
oreline.model.llama.apply_rope).

x·cos + rotate_half(x)·sin is written half by half into one output: with x = (x1, x2) and both
halves of cos/sin equal, that is (x1·c − x2·s, x2·c + x1·s): two passes over x, where autograd's
version makes five temporaries (the rotate-half cat, a neg and three products) and saves x. A
rotation's gradient is the inverse rotation, rotate(g, cos, −sin), so nothing of x is saved.
Timings against the reference: docs/measurements.md.
"""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    h = xf.shape[-1] // 2
    x1, x2 = xf[..., :h], xf[..., h:]
    c, s = cos[..., :h], sin[..., :h]
    if torch.compiler.is_compiling():  # inductor takes no out= views, and fuses this anyway
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
    out = torch.empty_like(xf)
    o1, o2 = out[..., :h], out[..., h:]
    torch.mul(x1, c, out=o1).addcmul_(x2, s, value=-1.0)
    torch.mul(x2, c, out=o2).addcmul_(x1, s)
    return out.to(x.dtype)


class _RoPEFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(g, cos, -sin), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, T, H, hd) by position; cos/sin are (T, hd). Computed in fp32, cast back."""
    return _RoPEFn.apply(x, cos[None, :, None, :], sin[None, :, None, :])


def complex_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as one complex product (Meta's and torchtitan's form), in HF's rotate-half layout: the
    halves (x1, x2) are the real and imaginary parts, (x1 + i·x2)·(c + i·s) = (x1·c − x2·s) +
    i·(x2·c + x1·s), the reference's two halves. Autograd handles the backward (the conjugate
    rotation). cos/sin are (T, hd) with equal halves, as llama.rope_tables makes them."""
    h = x.shape[-1] // 2
    xf = x.float()
    z = torch.complex(xf[..., :h], xf[..., h:])
    rot = torch.complex(cos[:, :h], sin[:, :h])[None, :, None, :]  # (1, T, 1, hd/2)
    y = z * rot
    return torch.cat([y.real, y.imag], dim=-1).to(x.dtype)
