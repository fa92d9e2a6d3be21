"""fp32 matrix products on CPU through oneDNN where it is faster than the BLAS torch uses.

Why: torch's x86 CPU wheel runs fp32 `mm` / `F.linear` through MKL, and MKL chooses its code
path by CPU *vendor*: on AMD it runs AVX2 kernels even where the CPU has AVX-512. oneDNN (bundled
with torch as "MKL-DNN") dispatches on CPUID *features*, and on an AVX-512 AMD EPYC it runs the
demo model's products up to about twice as fast (docs/measurements.md).

Both are plain fp32: against a float64 reference the errors are of the same order (oneDNN's
~2× MKL's, a different blocking of the same sums), nothing like bf16's. Which one is faster
depends on the CPU, so `backend="auto"` measures both (a few milliseconds) and picks oneDNN only
when it is clearly (≥ 1.2×) faster; `"blas"` is torch's default, `"onednn"` forces it. Intel
CPUs, where MKL already uses AVX-512/AMX, usually keep `blas`.

The two give different last bits, so a run must not change backend half-way, and two runs of
one config should not differ by the load of the machine at their start (a choice measured at
every launch differs with the load, docs/measurements.md). The rule oreline train follows for
"auto":
- a fresh run takes **this machine's decision**: measured once and cached in
  `<cache>/cpu-matmul/<key>.json` (`machine_choice`; the cache is ORELINE_CACHE_DIR, else
  $XDG_CACHE_HOME/oreline, else ~/.cache/oreline), the key being the CPU model and flags, the
  torch version and the thread count; every later run on that machine reads the file, and the
  run prints which file decided. Delete the file to measure again. Where the cache cannot be
  written the run measures and says so.
- a resumed run takes **the backend its checkpoint recorded** (`adopt_recorded`), whatever the
  cache or a measurement says now; a config naming the other backend explicitly wins, with a
  message that the resumed run will not be bit-identical.
- every rank takes rank 0's decision (oreline.train.session).

Nothing here is process-wide: the backend is a value, "onednn" or "blas", held by each
`Linear` (and passed to `linear` / `mm_*`), chosen by oreline.model.kernels.select when the
model is built.

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

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from oreline import compat
from oreline.errors import ConfigError
from oreline.io import write_new

BACKENDS = ("auto", "onednn", "blas")


def _onednn_available() -> bool:
    # a private op: oreline.compat decides whether this torch may use it (else BLAS, with a warning)
    return compat.onednn_linear() is not None


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


def check_backend(backend: str) -> str:
    """`backend` itself if it is a known setting this torch can run, else a ConfigError."""
    if backend not in BACKENDS:
        raise ConfigError(f"cpu matmul backend {backend!r} is unknown", f"use one of {', '.join(BACKENDS)}")
    if backend == "onednn" and not _onednn_available():
        raise ConfigError(
            "this torch build has no oneDNN (torch.backends.mkldnn is unavailable)",
            'set train.cpu_matmul = "blas" or "auto"',
        )
    return backend


def resolve_backend(setting: str) -> tuple[str, str]:
    """(backend, how it was decided) for a `train.cpu_matmul` setting: "auto" is this machine's
    cached decision (`machine_choice`), an explicit backend is itself."""
    check_backend(setting)
    if setting == "auto":
        return machine_choice()
    return setting, "train.cpu_matmul"


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


def _decide(measured: dict[str, float]) -> str:
    return "onednn" if measured["onednn"] >= 1.2 * measured["blas"] else "blas"


def _describe_measured(measured: dict[str, float], threads: int) -> str:
    return f"oneDNN {measured['onednn']:.0f} vs BLAS {measured['blas']:.0f} GFLOP/s on {threads} threads"


# ---------------------------------------------------------------------------------------------
# the decision of "auto": once per machine, and the one a checkpoint recorded


def cache_dir() -> Path:
    """Where per-machine decisions live: ORELINE_CACHE_DIR, else $XDG_CACHE_HOME/oreline, else ~/.cache/oreline."""
    if os.environ.get("ORELINE_CACHE_DIR"):
        return Path(os.environ["ORELINE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "oreline"


def machine_key() -> dict[str, object]:
    """What the measurement depends on: CPU model and flags, torch version, threads, oneDNN presence."""
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name == "model name" and not model:
                model = value.strip()
            elif name == "flags" and not flags:
                flags = value.strip()
    except OSError:
        import platform

        model = platform.processor() or platform.machine()
    return {
        "cpu": model,
        "flags_sha256": hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "onednn": _onednn_available(),
    }


def machine_choice(directory: Path | None = None) -> tuple[str, str]:
    """(backend, where it came from): this machine's cached decision, measured and cached on first use.

    Concurrent first runs each measure, and the first file published wins (os.link fails on an
    existing name): every run reads the published file, so they all agree.
    """
    key = machine_key()
    if not key["onednn"]:
        return "blas", "no oneDNN in this torch"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = (directory or cache_dir()) / "cpu-matmul" / f"{digest}.json"
    entry = _read_entry(path, key)
    if entry is None:
        measured = _measure()
        new = {
            "key": key,
            "backend": _decide(measured),
            "gflops": measured,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            _publish_entry(path, new)
        except OSError as exc:
            return new["backend"], (
                f"measured now ({_describe_measured(measured, key['threads'])}); "
                f"could not cache the decision in {path} ({exc}): the next run measures again"
            )
        entry = _read_entry(path, key) or new
    how = (
        _describe_measured(entry["gflops"], key["threads"]) if isinstance(entry.get("gflops"), dict) else "?"
    )
    return entry["backend"], f"this machine's decision in {path} ({how}, measured {entry.get('measured_at')})"


def _read_entry(path: Path, key: dict) -> dict | None:
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(entry, dict)
        or entry.get("key") != key
        or entry.get("backend") not in available_backends()
    ):
        return None
    return entry


def _publish_entry(path: Path, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    write_new(tmp, (json.dumps(entry, indent=1) + "\n").encode())
    try:
        os.link(tmp, path)  # publish only if no other run did first
    except FileExistsError:
        if _read_entry(path, entry["key"]) is None:  # a damaged or stale file: replace it
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def adopt_recorded(recorded: str | None, setting: str, current: str, where: str) -> tuple[str, str | None]:
    """On resume: (the backend to continue with, a line to print or None).

    With `setting` "auto" the backend the checkpoint `where` recorded wins over `current` (this
    machine's decision): a resumed run must compute as before. A backend the config names
    explicitly wins over the record, with a warning.
    """
    if recorded not in BACKENDS[1:]:
        return current, None  # an older checkpoint, or trained on a GPU
    if setting != "auto":
        if setting == recorded:
            return current, None
        return current, (
            f'[yellow]warning:[/] train.cpu_matmul = "{setting}" names another backend than the one the '
            f"checkpoint was trained with ({recorded}): the resumed run's products differ in the last bits from "
            f'an uninterrupted run\'s; set train.cpu_matmul = "auto" to keep {recorded}'
        )
    if recorded not in available_backends():
        return current, (
            f"[yellow]warning:[/] the checkpoint was trained with cpu matmul backend {recorded}, which this torch "
            f"build lacks: continuing with {current}; the run will not be bit-identical to an uninterrupted one"
        )
    if recorded != current:
        return recorded, (
            f"CPU fp32 matmuls: {recorded}, recorded in the checkpoint {where}, instead of {current}: "
            "a resumed run keeps the backend it was trained with"
        )
    return current, None


def _use_onednn(backend: str, *tensors: torch.Tensor) -> bool:
    if backend != "onednn":
        return False
    for t in tensors:
        if t.device.type != "cpu" or t.dtype != torch.float32:
            return False
    return not torch.is_autocast_enabled("cpu")


# ---------------------------------------------------------------------------------------------
# the three products of a linear layer (no autograd: call them inside autograd Functions)


def mm_nt(a: torch.Tensor, b: torch.Tensor, backend: str) -> torch.Tensor:
    """a · bᵀ: a (…, K), b (N, K) → (…, N). The forward of a Linear layer."""
    return _lp(a, b) if _use_onednn(backend, a, b) else F.linear(a, b)


def mm_nn(a: torch.Tensor, b: torch.Tensor, backend: str) -> torch.Tensor:
    """a · b: a (…, N), b (N, K) → (…, K). The input gradient dy · W."""
    return _lp(a, b.t()) if _use_onednn(backend, a, b) else torch.matmul(a, b)


def mm_tn(a: torch.Tensor, b: torch.Tensor, backend: str) -> torch.Tensor:
    """aᵀ · b over the flattened leading dims: a (…, N), b (…, K) → (N, K). The weight gradient dyᵀ · x."""
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    if not _use_onednn(backend, a2, b2):
        return a2.t().mm(b2)
    if a2.shape[1] > b2.shape[1]:  # N > K: (bᵀ · a)ᵀ is the faster order for oneDNN
        return _lp(b2.t(), a2.t()).t().contiguous()
    return _lp(a2.t(), b2.t())


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.backend = backend
        return mm_nt(x, weight, backend)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight = ctx.saved_tensors
        dx = mm_nn(g, weight, ctx.backend) if ctx.needs_input_grad[0] else None
        dw = mm_tn(g, x, ctx.backend) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def linear(x: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
    """F.linear(x, weight) without bias; through oneDNN (forward and backward) when `backend` is
    "onednn" and the product is an fp32 CPU one, else torch's own."""
    if _use_onednn(backend, x, weight):
        return _Linear.apply(x, weight, backend)
    return F.linear(x, weight)


class Linear(torch.nn.Linear):
    """nn.Linear without bias whose products go through `linear` with its `backend` (same
    parameters, same state dict as the reference model's nn.Linear)."""

    def __init__(self, in_features: int, out_features: int, backend: str):
        super().__init__(in_features, out_features, bias=False)
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.backend)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", backend={self.backend}"


def projections(x: torch.Tensor, linears: Sequence[torch.nn.Module]) -> list[torch.Tensor]:
    """x through several bias-free projections of the same input (Attention's q, k, v) as ONE
    product with their weights stacked, its output split back: [l(x) for l in linears] in value.

    One (tokens × 256 → 512) product instead of three narrower ones measured 1.16× faster, forward
    and backward, at the demo model's shapes (1 CPU thread): the narrow k/v products (128 outputs)
    use oneDNN's blocking poorly, and x is read (and transposed for the weight gradients) once.
    The stacked weight is a copy made per call (dim × Σ out, small next to the product); its
    gradient flows back to each Linear's own weight, so parameters and state dict are unchanged.
    Each Linear's own `backend` decides, as in its forward; anything oneDNN does not run here
    (bf16, autocast, CUDA, BLAS, plain nn.Linear) takes the projections one by one.
    """
    backends = {getattr(lin, "backend", None) for lin in linears}
    weights = [lin.weight for lin in linears]
    if len(linears) > 1 and len(backends) == 1 and _use_onednn(backends.pop(), x, *weights):
        y = _Linear.apply(x, torch.cat(weights), "onednn")
        return list(y.split([w.shape[0] for w in weights], dim=-1))
    return [lin(x) for lin in linears]
