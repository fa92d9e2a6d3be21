"""Which RMSNorm and RoPE a CUDA run computes with under `train.kernels = "auto"`: a measurement.

Candidates (each tested equal to the reference in tests/model/kernels/test_norm_and_rope.py):
- RMSNorm: "reference" (llama.rms_norm, autograd through torch ops), "fused" (kernels.rmsnorm's
  hand-written backward), "torch" (`F.rms_norm`, torch's own fused kernel);
- RoPE: "reference" (llama.apply_rope, rotate-half), "fused" (kernels.rope's analytic backward),
  "complex" (one complex product, Meta's and torchtitan's form).

The decision comes from `benchmarks/gpu_check.py`, whose "kernels" row times forward + backward of
each candidate at a training shape (`measure`) and records the fastest per function (`record`)
in `<cache>/cuda-kernels/<key>.json` (the cache of oreline.model.kernels.matmul, keyed by GPU
name and torch version). A training run never measures: "auto" reads that file (`choice`) and,
without one, keeps the reference — torch.compile fuses the reference's elementwise work on a GPU
anyway, and no measurement has shown an eager kernel faster there yet. A candidate must be 5 %
faster than the reference to be chosen, so timing noise does not flip the choice.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from oreline.io import write_atomic
from oreline.model import llama
from oreline.model.kernels import rmsnorm, rope
from oreline.model.kernels.matmul import cache_dir

RMS_NORMS: dict[str, Callable] = {
    "reference": llama.rms_norm,
    "fused": rmsnorm.rms_norm,
    "torch": rmsnorm.torch_rms_norm,
}
ROPES: dict[str, Callable] = {
    "reference": llama.apply_rope,
    "fused": rope.apply_rope,
    "complex": rope.complex_rope,
}
DEFAULT = {"rms_norm": "reference", "rope": "reference"}
MARGIN = 0.95  # a candidate must take ≤ 95 % of the reference's time


def device_key(name: str) -> dict[str, str]:
    return {"gpu": name, "torch": torch.__version__}


def choice_path(name: str, directory: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(device_key(name), sort_keys=True).encode()).hexdigest()[:16]
    return (directory or cache_dir()) / "cuda-kernels" / f"{digest}.json"


def measure(
    device: torch.device,
    tokens: int = 16384,
    dim: int = 2048,
    n_heads: int = 16,
    head_dim: int = 128,
    reps: int = 10,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, dict[str, float]]:
    """Milliseconds of forward + backward of each candidate on activations of a training shape
    (`tokens` rows of width `dim` for RMSNorm; (1, tokens, n_heads, head_dim) for RoPE; bf16 as
    under autocast), best of 3."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, dim, device=device, dtype=dtype, generator=gen)
    w = torch.ones(dim, device=device, requires_grad=True)
    q = torch.randn(1, tokens, n_heads, head_dim, device=device, dtype=dtype, generator=gen)
    args = llama.ModelArgs(dim=n_heads * head_dim, n_heads=n_heads, n_kv_heads=n_heads, max_seq_len=tokens)
    cos, sin = llama.rope_tables(args, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def best(fn: Callable[[], torch.Tensor]) -> float:
        fn().sum().backward()  # warm-up (and any lazy initialisation)
        times = []
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn().sum().backward()
            sync()
            times.append((time.perf_counter() - t0) / reps * 1000)
        return min(times)

    xs, qs = x.requires_grad_(), q.requires_grad_()
    return {
        "rms_norm": {k: best(lambda f=f: f(xs, w, 1e-5)) for k, f in RMS_NORMS.items()},
        "rope": {k: best(lambda f=f: f(qs, cos, sin)) for k, f in ROPES.items()},
    }


def decide(measured: dict[str, dict[str, float]]) -> dict[str, str]:
    """The fastest candidate per function, the reference unless another is ≥ 5 % faster."""
    out = {}
    for fn, times in measured.items():
        ref = times["reference"]
        name, ms = min(times.items(), key=lambda kv: kv[1])
        out[fn] = name if ms <= MARGIN * ref else "reference"
    return out


def record(
    name: str, measured: dict[str, dict[str, float]], directory: Path | None = None
) -> tuple[dict, Path]:
    """Write the decision for GPU `name` (what `choice` reads); returns (decision, file)."""
    path = choice_path(name, directory)
    entry = {
        "key": device_key(name),
        "choice": decide(measured),
        "ms": measured,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_atomic(path, json.dumps(entry, indent=1) + "\n")
    return entry["choice"], path


def choice(name: str, directory: Path | None = None) -> tuple[dict[str, str], str]:
    """(the RMSNorm and RoPE names, where they came from) for GPU `name`: the recorded measurement,
    else the reference (a missing, damaged or stale file, or an unknown name in it)."""
    path = choice_path(name, directory)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return dict(
            DEFAULT
        ), "no measurement on this GPU (benchmarks/gpu_check.py records one): the reference"
    picked = entry.get("choice") if isinstance(entry, dict) else None
    if (
        not isinstance(entry, dict)
        or entry.get("key") != device_key(name)
        or not isinstance(picked, dict)
        or picked.get("rms_norm") not in RMS_NORMS
        or picked.get("rope") not in ROPES
    ):
        return dict(DEFAULT), f"{path} is not a measurement of this GPU and torch: the reference"
    return {"rms_norm": picked["rms_norm"], "rope": picked["rope"]}, (
        f"measured on this GPU ({path}, {entry.get('measured_at')})"
    )


def kernels(picked: dict[str, str]) -> llama.Kernels:
    """The reference Kernels with the picked RMSNorm and RoPE."""
    if picked == DEFAULT:
        return llama.REFERENCE
    return llama.Kernels(
        name=f"cuda (RMSNorm {picked['rms_norm']}, RoPE {picked['rope']})",
        rms_norm=RMS_NORMS[picked["rms_norm"]],
        rope=ROPES[picked["rope"]],
    )
