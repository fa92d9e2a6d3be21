"""oreline.model.kernels.matmul: oneDNN products equal torch's own in value and gradient, and fall back where they must."""

import pytest
import torch
import torch.nn.functional as F

from oreline.errors import ConfigError
from oreline.model.kernels import matmul

needs_onednn = pytest.mark.skipif(
    "onednn" not in matmul.available_backends(),
    reason="this torch build has no oneDNN (torch.backends.mkldnn unavailable)",
)


def _f64_reference(x, w, g):
    """y, dx, dw of F.linear in float64: the truth both backends are compared with."""
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y = F.linear(x64, w64)
    y.backward(g.double())
    return y.detach(), x64.grad, w64.grad


@needs_onednn
@pytest.mark.parametrize("shape", [(64, 32, 48), (2, 40, 24, 96), (96, 64, 16), (7, 33, 65)])
def test_onednn_linear_is_fp32_exact_in_value_and_gradients(shape):
    *lead, k, n = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*lead, k, generator=gen, requires_grad=True)
    w = torch.randn(n, k, generator=gen, requires_grad=True)
    g = torch.randn(*lead, n, generator=gen)  # N > K and N < K both: mm_tn takes two orders
    ref = _f64_reference(x, w, g)
    for backend in ("onednn", "blas"):
        x.grad = w.grad = None
        y = matmul.linear(x, w, backend)
        y.backward(g)
        for got, want in zip((y.detach(), x.grad, w.grad), ref, strict=True):
            assert got.dtype == torch.float32 and got.shape == want.shape
            # fp32 rounding of K- or M-term sums, nothing like bf16 (which is off by ~1e-2 relative)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        assert w.grad.is_contiguous()


@needs_onednn
def test_strided_inputs_and_no_grad_path():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(24, 6, 32, generator=gen).transpose(0, 1)  # (6, 24, 32), not contiguous
    w = torch.randn(40, 32, generator=gen)
    g = torch.randn(6, 24, 40, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(matmul.mm_nt(x, w, "onednn"), F.linear(x, w), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(matmul.mm_nn(g, w, "onednn"), g @ w, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            matmul.mm_tn(g, x, "onednn"), g.reshape(-1, 40).t() @ x.reshape(-1, 32), rtol=1e-5, atol=1e-4
        )


@needs_onednn
def test_falls_back_to_torch_for_other_dtypes_and_autocast():
    x, w = torch.randn(16, 32), torch.randn(24, 32)
    assert not matmul._use_onednn("onednn", x.bfloat16(), w.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not matmul._use_onednn("onednn", x, w)
        y = matmul.linear(x, w, "onednn")
    assert y.dtype == torch.bfloat16  # autocast's own F.linear ran
    assert matmul._use_onednn("onednn", x, w)
    assert not matmul._use_onednn("blas", x, w)


def test_backend_setting_is_validated_and_auto_is_this_machines_decision(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="onednn, blas"):
        matmul.resolve_backend("mkl")
    assert matmul.resolve_backend("blas") == ("blas", "train.cpu_matmul")
    monkeypatch.setenv("ORELINE_CACHE_DIR", str(tmp_path))
    first, how = matmul.resolve_backend("auto")
    assert first in matmul.available_backends()
    assert matmul.resolve_backend("auto")[0] == first  # measured once per machine, then read back
    assert first == "blas" or ("GFLOP/s" in how and str(tmp_path) in how)


def test_linear_module_keeps_nn_linear_parameters():
    layer = matmul.Linear(8, 4, backend="onednn" if "onednn" in matmul.available_backends() else "blas")
    assert isinstance(layer, torch.nn.Linear) and layer.bias is None
    assert list(layer.state_dict()) == ["weight"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@needs_onednn
def test_compiled_linear_keeps_onednn_and_matches_eager():
    """Under torch.compile the product is the opaque oreline::onednn_mm_nt op (inductor cannot lower
    mkldnn._linear_pointwise in a training graph); values and gradients equal the eager ones."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 32, generator=gen, requires_grad=True)
    w = torch.randn(96, 32, generator=gen, requires_grad=True)
    g = torch.randn(64, 96, generator=gen)

    def f(x, w):
        return F.silu(matmul.linear(x, w, "onednn")) * 2.0

    eager = f(x, w)
    eager.backward(g)
    want = (eager.detach(), x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)  # fullgraph: no graph break around the op
    got = compiled(x, w)
    got.backward(g)
    for a, b in zip((got.detach(), x.grad, w.grad), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_projections_are_one_product_equal_to_each_projection_alone():
    """q, k, v through one stacked product: each output and every weight's gradient equal the
    projections one by one (in float64 terms, as above), and the product is ONE oneDNN call."""
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    linears = [matmul.Linear(32, n, "onednn") for n in (32, 16, 16)]
    x = torch.randn(2, 10, 32, generator=gen, requires_grad=True)
    gs = [torch.randn(2, 10, lin.out_features, generator=gen) for lin in linears]
    with torch.profiler.profile() as prof:
        ys = matmul.projections(x, linears)
    assert sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise") == 1
    torch.autograd.backward(ys, gs)
    got_dx, got_dw = x.grad.clone(), [lin.weight.grad.clone() for lin in linears]
    dx64 = torch.zeros(2, 10, 32, dtype=torch.float64)
    for y, g, lin, dw in zip(ys, gs, linears, got_dw, strict=True):
        want_y, want_dx, want_dw = _f64_reference(x, lin.weight, g)
        torch.testing.assert_close(y.detach().double(), want_y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dw.double(), want_dw, rtol=1e-5, atol=1e-5)
        dx64 += want_dx
    torch.testing.assert_close(got_dx.double(), dx64, rtol=1e-5, atol=1e-5)


def test_projections_fall_back_to_one_by_one_outside_onednn():
    torch.manual_seed(4)
    x = torch.randn(3, 8)
    for linears in (
        [matmul.Linear(8, 4, "blas"), matmul.Linear(8, 6, "blas")],
        [torch.nn.Linear(8, 4, bias=False)],
    ):
        with torch.no_grad():
            ys = matmul.projections(x, linears)
            for y, lin in zip(ys, linears, strict=True):
                assert torch.equal(y, lin(x))
