"""kernels.chunked_cross_entropy against the reference (oreline.model.llama.token_cross_entropy: the
whole logits, then F.cross_entropy): losses and gradients for any per-token upstream gradient, fp32
to rtol 1e-5 / atol 1e-6 (chunk sizes that divide the tokens, that do not, and one chunk for all);
under bf16 autocast against the reference under the same autocast."""

import pytest
import torch

from oreline.model.kernels import matmul
from oreline.model.kernels.chunked_cross_entropy import chunked_linear_cross_entropy
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


@pytest.mark.parametrize("chunk", [1, 16, 25, 96, 1000])
@pytest.mark.parametrize("backend", matmul.available_backends())
def test_equals_the_reference_loss_and_gradients_for_any_upstream_gradient(chunk, backend):
    h, w, labels, upstream = _inputs()
    ours = _grads(
        lambda *a: chunked_linear_cross_entropy(*a, chunk_tokens=chunk, backend=backend),
        h,
        w,
        labels,
        upstream,
    )
    ref = _grads(token_cross_entropy, h, w, labels, upstream)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.all(ours[0][labels == -100] == 0)
    assert torch.all(ours[1][labels == -100] == 0)  # an ignored token sends no gradient back


def test_batched_shape_no_grad_and_huge_logits():
    h, w, labels, upstream = _inputs(n=24)
    with torch.no_grad():
        got = chunked_linear_cross_entropy(h.view(2, 12, -1), w, labels.view(2, 12), chunk_tokens=5)
    assert got.shape == (2, 12) and got.dtype == torch.float32
    torch.testing.assert_close(got.view(-1), token_cross_entropy(h, w, labels).detach(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        w.mul_(200.0)  # logits in the thousands: exp would overflow without the logsumexp shift
    ours = _grads(lambda *a: chunked_linear_cross_entropy(*a, chunk_tokens=7), h, w, labels, upstream)
    ref = _grads(token_cross_entropy, h, w, labels, upstream)
    assert torch.isfinite(ours[0]).all() and torch.isfinite(ours[2]).all()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)  # fp32 logits in the thousands


def test_bf16_autocast_matches_the_reference_under_the_same_autocast():
    h, w, labels, upstream = _inputs(n=64, d=32, v=120)
    exact = _grads(token_cross_entropy, h, w, labels, upstream)  # fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _grads(token_cross_entropy, h, w, labels, upstream)
        ours = _grads(lambda *a: chunked_linear_cross_entropy(*a, chunk_tokens=24), h, w, labels, upstream)
    assert ours[0].dtype == torch.float32 and ours[1].dtype == ours[2].dtype == torch.float32
    # the same bf16 logits reduced in fp32: equal losses
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=1e-5)
    # gradients: bf16 products both; the reference rounds its weight gradient to bf16 once, this one
    # accumulates the chunks' products in fp32, so against the fp32 gradients it is no further off
    for i in (1, 2):
        ours_err = float((ours[i] - exact[i]).abs().max())
        ref_err = float((ref[i] - exact[i]).abs().max())
        assert ours_err <= 1.5 * ref_err + 1e-6, (i, ours_err, ref_err)
        torch.testing.assert_close(ours[i], ref[i], rtol=0.1, atol=1e-2)


def test_backward_twice_through_the_same_graph_gives_the_same_gradients():
    h, w, labels, _ = _inputs()
    loss = chunked_linear_cross_entropy(h, w, labels, chunk_tokens=10).sum()
    first = torch.autograd.grad(loss, (h, w), retain_graph=True)
    second = torch.autograd.grad(loss, (h, w))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_bad_chunk_and_shape_mismatch_say_so():
    h, w, labels, _ = _inputs(n=8)
    with pytest.raises(ValueError, match="chunk_tokens must be positive"):
        chunked_linear_cross_entropy(h, w, labels, chunk_tokens=0)
    with pytest.raises(ValueError, match="8 hidden rows but 7 labels"):
        chunked_linear_cross_entropy(h, w, labels[:7])
