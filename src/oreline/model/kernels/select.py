"""Which kernels a Llama is built with: `train.kernels` = "auto" | "reference" | "cpu".

- "reference": oreline.model.llama's plain functions (nn.Linear, autograd through torch ops).
- "cpu": the fused RMSNorm and RoPE autograd functions (kernels.rmsnorm, kernels.rope), the
  output projection fused with the loss (kernels.cross_entropy), q/k/v as one stacked product
  (matmul.projections), and every fp32 product through the backend `train.cpu_matmul` decided
  (kernels.matmul: oneDNN where it is the faster library). benchmarks/train_vs_hf.py measures
  this set against Hugging Face's model on the same CPU, benchmarks/cpu_kernels.py against the
  reference kernels.
- "auto": "cpu" on a CPU, "reference" on CUDA. No GPU measurement has shown a fused kernel
  faster there yet (benchmarks/gpu_check.py is the one to run), and torch.compile fuses the
  reference's elementwise work on a GPU anyway.

`with_chunked_loss` swaps any set's token loss for kernels.chunked_cross_entropy's
(`train.loss = "chunked"`, which oreline.train.session decides).

The choice is a value passed to `Llama(args, kernels)`, never process-wide state: two models in
one process may compute differently, and a resumed run swaps its backend on its own model only
(`use_matmul_backend`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from oreline.errors import ConfigError
from oreline.model.kernels import cross_entropy, matmul, rmsnorm, rope
from oreline.model.kernels.chunked_cross_entropy import chunked_linear_cross_entropy
from oreline.model.llama import REFERENCE, Kernels

CHOICES = ("auto", "reference", "cpu")


def cpu_kernels(matmul_backend: str) -> Kernels:
    """The CPU set, its fp32 products through `matmul_backend` ("onednn" or "blas")."""
    matmul.check_backend(matmul_backend)
    return Kernels(
        name=f"cpu (fused RMSNorm, RoPE, q/k/v product and output loss; {matmul_backend} matmuls)",
        projection=partial(matmul.Linear, backend=matmul_backend),
        projections=matmul.projections,
        rms_norm=rmsnorm.rms_norm,
        rope=rope.apply_rope,
        logits=partial(matmul.linear, backend=matmul_backend),
        token_loss=partial(cross_entropy.linear_cross_entropy, backend=matmul_backend),
    )


def resolve_choice(choice: str, device: torch.device | str) -> str:
    """ "reference" or "cpu": what `choice` means on `device`."""
    if choice not in CHOICES:
        raise ConfigError(f"train.kernels = {choice!r} is unknown", f"use one of {', '.join(CHOICES)}")
    if choice == "auto":
        return "cpu" if torch.device(device).type == "cpu" else "reference"
    return choice


def kernels_for(choice: str, device: torch.device | str, matmul_backend: str = "blas") -> Kernels:
    """The Kernels for `train.kernels = choice` on `device`; `matmul_backend` serves the CPU set."""
    return cpu_kernels(matmul_backend) if resolve_choice(choice, device) == "cpu" else REFERENCE


def with_chunked_loss(kernels: Kernels, chunk_tokens: int, backend: str = "blas") -> Kernels:
    """`kernels` whose token loss is the chunked one (kernels.chunked_cross_entropy: at most
    `chunk_tokens` rows of logits at a time), its fp32 CPU products through `backend`."""
    loss = partial(chunked_linear_cross_entropy, chunk_tokens=chunk_tokens, backend=backend)
    return replace(kernels, name=f"{kernels.name}; chunked loss ({chunk_tokens} tokens)", token_loss=loss)


def _chunk_tokens(kernels: Kernels) -> int | None:
    loss = kernels.token_loss
    if isinstance(loss, partial) and loss.func is chunked_linear_cross_entropy:
        return loss.keywords["chunk_tokens"]
    return None


def matmul_backend(model: torch.nn.Module) -> str | None:
    """The fp32 product backend `model`'s projections use, or None when they are plain nn.Linear."""
    for module in model.modules():
        if isinstance(module, matmul.Linear):
            return module.backend
    return None


def use_matmul_backend(model: torch.nn.Module, backend: str) -> None:
    """Switch a CPU-kernel model's products to `backend` (a resume keeps its checkpoint's backend).
    A reference model has no backend to switch: it is left as it is."""
    core = getattr(model, "_orig_mod", model)
    if not isinstance(getattr(core, "kernels", None), Kernels) or matmul_backend(core) is None:
        return
    for module in core.modules():
        if isinstance(module, matmul.Linear):
            module.backend = backend
    chunk = _chunk_tokens(core.kernels)
    core.kernels = (
        cpu_kernels(backend) if chunk is None else with_chunked_loss(cpu_kernels(backend), chunk, backend)
    )
