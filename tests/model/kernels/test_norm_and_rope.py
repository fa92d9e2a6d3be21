"""The fused RMSNorm and RoPE autograd functions equal oreline.model.llama's reference functions.

Stated tolerances, fp32 on CPU: values and gradients within rtol 1e-5 / atol 1e-6 (the same sums
in another order; measured differences are ~1e-7). In bf16 both round the fp32 result once, so
they agree to bf16's resolution (rtol 1e-2).
"""

import pytest
import torch

from oreline.model.kernels import rmsnorm, rope
from oreline.model.llama import ModelArgs, apply_rope, rms_norm, rope_tables

FP32 = {"rtol": 1e-5, "atol": 1e-6}


def _value_and_grads(fn, inputs, upstream):
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*inputs)
    out.backward(upstream)
    return [out.detach()] + [t.grad for t in inputs if t.requires_grad]


@pytest.mark.parametrize("shape", [(4, 16, 64), (3, 5, 7, 48)])
def test_rmsnorm_equals_the_reference_in_value_and_gradients(shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen) * 3.0
    w = torch.rand(shape[-1], generator=gen) + 0.5
    g = torch.randn(*shape, generator=gen)
    ours = _value_and_grads(lambda x, w: rmsnorm.rms_norm(x, w, 1e-5), [x, w], g)
    ref = _value_and_grads(lambda x, w: rms_norm(x, w, 1e-5), [x, w], g)
    assert len(ours) == 3
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, **FP32)


def test_rmsnorm_bf16_matches_the_reference_dtype_and_value():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 32, generator=gen).bfloat16()
    w = (torch.rand(32, generator=gen) + 0.5).bfloat16()
    a, b = rmsnorm.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5)
    assert a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        None,
        {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ],
)
def test_rope_equals_the_reference_in_value_and_gradient(rope_scaling):
    args = ModelArgs(dim=64, n_heads=4, n_kv_heads=2, max_seq_len=32, rope_scaling=rope_scaling)
    cos, sin = rope_tables(args)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 32, 4, args.head_dim, generator=gen)
    g = torch.randn(2, 32, 4, args.head_dim, generator=gen)
    ours = _value_and_grads(lambda x: rope.apply_rope(x, cos, sin), [x], g)
    ref = _value_and_grads(lambda x: apply_rope(x, cos, sin), [x], g)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, **FP32)
    # a rotation keeps lengths: the check would catch a swapped sign that both might share
    torch.testing.assert_close(ours[0].norm(dim=-1), x.norm(dim=-1), **FP32)


def test_rope_bf16_matches_the_reference():
    args = ModelArgs(dim=64, n_heads=4, n_kv_heads=2, max_seq_len=16)
    cos, sin = rope_tables(args)
    x = torch.randn(1, 16, 4, args.head_dim).bfloat16()
    a, b = rope.apply_rope(x, cos, sin), apply_rope(x, cos, sin)
    assert a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape", [(4, 16, 64), (3, 5, 7, 48)])
def test_torch_rms_norm_equals_the_reference_in_value_and_gradients(shape):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=gen) * 3.0
    w = torch.rand(shape[-1], generator=gen) + 0.5
    g = torch.randn(*shape, generator=gen)
    ours = _value_and_grads(lambda x, w: rmsnorm.torch_rms_norm(x, w, 1e-5), [x, w], g)
    ref = _value_and_grads(lambda x, w: rms_norm(x, w, 1e-5), [x, w], g)
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, **FP32)
    xb, wb = x.bfloat16(), w.bfloat16()
    a, b = rmsnorm.torch_rms_norm(xb, wb, 1e-5), rms_norm(xb, wb, 1e-5)
    assert a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_complex_rope_equals_the_reference_in_value_and_gradient(dtype):
    args = ModelArgs(dim=64, n_heads=4, n_kv_heads=2, max_seq_len=32, rope_theta=500.0)
    cos, sin = rope_tables(args)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 32, 4, args.head_dim, generator=gen).to(dtype)
    g = torch.randn(2, 32, 4, args.head_dim, generator=gen).to(dtype)
    ours = _value_and_grads(lambda x: rope.complex_rope(x, cos, sin), [x], g)
    ref = _value_and_grads(lambda x: apply_rope(x, cos, sin), [x], g)
    tol = FP32 if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == b.dtype == dtype
        torch.testing.assert_close(a, b, **tol)
