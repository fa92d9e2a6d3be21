"""fp32 matrix products on CPU through oneDNN where it is faster than the BLAS torch uses.

Why: torch's x86 CPU wheel runs fp32 `mm` / `F.linear` through MKL, and MKL chooses its code
path by CPU *vendor*: on AMD it runs AVX2 kernels even where the CPU has AVX-512. oneDNN (bundled
with torch as "MKL-DNN") dispatches on CPUID *features*. On this project's 2-core AMD EPYC
(AVX-512, full-width FMA units) one thread measured, for the demo model's shapes:

    (M, K, N)            MKL F.linear    oneDNN linear     (GFLOP/s, fp32 in and out, fp32 accumulate)
    2048 × 256 × 768        93               211
    2048 × 768 × 256        90               209
    2048 × 256 × 8192       64               105 (forward), 179 (x^T·dy, the weight gradient)

Both are plain fp32: against a float64 reference the errors are of the same order (oneDNN's
~2× MKL's, a different blocking of the same sums), nothing like bf16's. Which one is faster
depends on the CPU, so `backend="auto"` measures both once per process (a few milliseconds) and
picks oneDNN only when it is clearly (≥ 1.2×) faster; `"blas"` is torch's default, `"onednn"`
forces it. Intel CPUs, where MKL already uses AVX-512/AMX, usually keep `blas`.

The three products of a Linear layer y = x·Wᵀ are written with oneDNN's linear primitive
(`torch.ops.mkldnn._linear_pointwise`, dense in, dense out, strided views allowed):

    forward  y  = x · Wᵀ        linear(x, W)
    backward dx = dy · W        linear(dy, Wᵀ)      (Wᵀ a view: no copy)
             dW = dyᵀ · x       linear(dyᵀ, xᵀ), or (xᵀ · dy)ᵀ when N > K (2× faster for the
                                output head, whose dy is (tokens, vocab))

Under torch.compile the oneDNN call is an opaque custom op (`oreline::onednn_mm_nt`), so
compiled blocks keep oneDNN's products and inductor fuses the elementwise work around them.
Outside fp32 on CPU — CUDA, bf16/fp16 tensors or autocast, a torch built without oneDNN — every
function here is exactly torch's own product.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from oreline.errors import ConfigError

BACKENDS = ("auto", "onednn", "blas")
_setting = "auto"
_chosen: str | None = None  # what "auto" measured, once per process
_measured: dict[str, float] = {}


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _lp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a · bᵀ through oneDNN: a (…, K), b (N, K), either may be a strided view."""
    if torch.compiler.is_compiling():
        return _onednn_mm_nt(a, b)
    return torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")


@torch.library.custom_op("oreline::onednn_mm_nt", mutates_args=())
def _onednn_mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """_lp as an opaque custom op for torch.compile: inductor cannot lower mkldnn._linear_pointwise
    in a training graph (it expects weights prepacked for inference), but it calls an opaque op as
    an external kernel and fuses the elementwise work around it."""
    return torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")


@_onednn_mm_nt.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((*a.shape[:-1], b.shape[0]))


def set_cpu_matmul_backend(backend: str) -> None:
    """"auto" (measure once), "onednn" or "blas" (torch's default) for fp32 CPU products."""
    global _setting, _chosen
    if backend not in BACKENDS:
        raise ConfigError(f"cpu matmul backend {backend!r} is unknown", f"use one of {', '.join(BACKENDS)}")
    if backend == "onednn" and not _onednn_available():
        raise ConfigError("this torch build has no oneDNN (torch.backends.mkldnn is unavailable)",
                          "set train.cpu_matmul = \"blas\" or \"auto\"")
    _setting, _chosen = backend, None


@contextmanager
def forced_backend(backend: str) -> Iterator[None]:
    """Run a block with `backend` ("onednn" or "blas"), then restore the setting (peak measurements)."""
    global _setting, _chosen
    saved = (_setting, _chosen)
    set_cpu_matmul_backend(backend)
    try:
        yield
    finally:
        _setting, _chosen = saved


def available_backends() -> list[str]:
    return ["blas", "onednn"] if _onednn_available() else ["blas"]


def _measure() -> dict[str, float]:
    """GFLOP/s of one forward product of a mid-sized shape with each backend, best of 3."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(1024, 256, generator=gen), torch.randn(1024, 256, generator=gen)
    flops = 2 * 1024 * 256 * 1024

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(4):
                fn()
            times.append((time.perf_counter() - t0) / 4)
        return flops / min(times) / 1e9

    return {"blas": best(lambda: F.linear(x, w)), "onednn": best(lambda: _lp(x, w))}


def cpu_matmul_backend() -> str:
    """The backend fp32 CPU products use in this process ("onednn" or "blas")."""
    global _chosen
    if _setting != "auto":
        return _setting
    if _chosen is None:
        if not _onednn_available():
            _chosen = "blas"
        else:
            _measured.update(_measure())
            _chosen = "onednn" if _measured["onednn"] >= 1.2 * _measured["blas"] else "blas"
    return _chosen


def describe_backend() -> str:
    """One line for logs: the backend, and what "auto" measured when it measured."""
    backend = cpu_matmul_backend()
    if _setting == "auto" and _measured:
        return (f"{backend} (auto: oneDNN {_measured['onednn']:.0f} vs BLAS {_measured['blas']:.0f} GFLOP/s "
                f"on {torch.get_num_threads()} threads)")
    return f"{backend} ({_setting})"


def _use_onednn(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.device.type != "cpu" or t.dtype != torch.float32:
            return False
    if torch.is_autocast_enabled("cpu"):
        return False
    if torch.compiler.is_compiling() and _setting == "auto" and _chosen is None:
        return False  # never time kernels while tracing; oreline train decides before it compiles
    return cpu_matmul_backend() == "onednn"


# ---------------------------------------------------------------------------------------------
# the three products of a linear layer (no autograd: call them inside autograd Functions)


def mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a · bᵀ: a (…, K), b (N, K) → (…, N). The forward of a Linear layer."""
    return _lp(a, b) if _use_onednn(a, b) else F.linear(a, b)


def mm_nn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a · b: a (…, N), b (N, K) → (…, K). The input gradient dy · W."""
    return _lp(a, b.t()) if _use_onednn(a, b) else torch.matmul(a, b)


def mm_tn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aᵀ · b over the flattened leading dims: a (…, N), b (…, K) → (N, K). The weight gradient dyᵀ · x."""
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    if not _use_onednn(a2, b2):
        return a2.t().mm(b2)
    if a2.shape[1] > b2.shape[1]:  # N > K: (bᵀ · a)ᵀ is the faster order for oneDNN
        return _lp(b2.t(), a2.t()).t().contiguous()
    return _lp(a2.t(), b2.t())


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return mm_nt(x, weight)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        dx = mm_nn(g, weight) if ctx.needs_input_grad[0] else None
        dw = mm_tn(g, x) if ctx.needs_input_grad[1] else None
        return dx, dw


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) without bias; through oneDNN (forward and backward) when it is the faster backend."""
    if _use_onednn(x, weight):
        return _Linear.apply(x, weight)
    return F.linear(x, weight)


class Linear(torch.nn.Linear):
    """nn.Linear without bias whose products go through `linear` (same parameters, same state dict)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)
