"""kernels.cross_entropy.linear_cross_entropy against the reference (oreline.model.llama.token_cross_entropy:
logits, then F.cross_entropy): losses and gradients, fp32 to rtol 1e-5 / atol 1e-6, on both product backends."""

import pytest
import torch
import torch.nn.functional as F

from oreline.model.kernels import matmul
from oreline.model.kernels.cross_entropy import linear_cross_entropy
from oreline.model.llama import token_cross_entropy


def _inputs(n=96, d=16, v=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = torch.randn(v, d, generator=g).mul(0.5).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::7] = -100
    upstream = torch.rand(n, generator=g) + 0.5  # a different gradient per row: no mean assumed
    return h, w, labels, upstream


def _grads(fn, h, w, labels, upstream):
    h.grad = w.grad = None
    loss = fn(h, w, labels)
    (loss * upstream).sum().backward()
    return loss.detach(), h.grad.clone(), w.grad.clone()


def _reference(h, w, labels):
    return F.cross_entropy(F.linear(h, w), labels, ignore_index=-100, reduction="none")


@pytest.mark.parametrize("backend", matmul.available_backends())
def test_equals_the_models_reference_loss_for_any_upstream_gradient(backend):
    h, w, labels, upstream = _inputs()
    ours = _grads(lambda *a: linear_cross_entropy(*a, backend=backend), h, w, labels, upstream)
    ref = _grads(token_cross_entropy, h, w, labels, upstream)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.all(ours[0][labels == -100] == 0)


def test_matches_logits_then_cross_entropy_for_any_upstream_gradient():
    h, w, labels, upstream = _inputs()
    ours = _grads(linear_cross_entropy, h, w, labels, upstream)
    ref = _grads(_reference, h, w, labels, upstream)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.all(ours[0][labels == -100] == 0)


def test_batched_shape_and_no_grad_path():
    h, w, labels, _ = _inputs(n=24)
    with torch.no_grad():
        got = linear_cross_entropy(h.detach().view(2, 12, -1), w.detach(), labels.view(2, 12))
    assert got.shape == (2, 12) and got.dtype == torch.float32
    torch.testing.assert_close(got.view(-1), _reference(h, w, labels).detach(), rtol=1e-5, atol=1e-6)


def test_huge_logits_do_not_overflow():
    h, w, labels, upstream = _inputs()
    with torch.no_grad():
        w.mul_(200.0)  # logits in the thousands: exp would overflow without the max shift
    ours = _grads(linear_cross_entropy, h, w, labels, upstream)
    ref = _grads(_reference, h, w, labels, upstream)
    assert torch.isfinite(ours[0]).all()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


def test_bf16_autocast_close_to_fp32_and_grads_in_input_dtype():
    h, w, labels, upstream = _inputs()
    ref = _grads(_reference, h, w, labels, upstream)
    h.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, labels)
    assert loss.dtype == torch.float32
    (loss * upstream).sum().backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    torch.testing.assert_close(loss.detach(), ref[0], rtol=0.05, atol=0.05)
    torch.testing.assert_close(w.grad, ref[2], rtol=0.1, atol=0.05)


def test_second_backward_through_the_same_graph_refuses():
    h, w, labels, _ = _inputs()
    loss = linear_cross_entropy(h, w, labels).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        loss.backward()
