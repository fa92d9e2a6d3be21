"""Which kernels a Llama is built with: `train.kernels` = "auto" | "reference" | "cpu".

- "reference": oreline.model.llama's plain functions (nn.Linear, autograd through torch ops).
- "cpu": the fused RMSNorm and RoPE autograd functions (kernels.rmsnorm, kernels.rope), the
  output projection fused with the loss (kernels.cross_entropy), q/k/v as one stacked product
  (matmul.projections), and every fp32 product through the backend `train.cpu_matmul` decided
  (kernels.matmul: oneDNN where it is the faster library). benchmarks/train_vs_hf.py measures
  this set against Hugging Face's model on the same CPU, benchmarks/cpu_kernels.py against the
  reference kernels.
- "auto": "cpu" on a CPU; on CUDA the reference's projections and loss with the RMSNorm and RoPE
  that measured fastest on this GPU (kernels.cuda_choice: benchmarks/gpu_check.py's "kernels" row
  records the measurement; without one, the reference).

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
from oreline.model.kernels import cross_entropy, cuda_choice, matmul, rmsnorm, rope
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
    """ "reference", "cpu" or "cuda" (auto on CUDA: kernels.cuda_choice's measured RMSNorm and
    RoPE): what `choice` means on `device`."""
    if choice not in CHOICES:
        raise ConfigError(f"train.kernels = {choice!r} is unknown", f"use one of {', '.join(CHOICES)}")
    if choice == "auto":
        return {"cpu": "cpu", "cuda": "cuda"}.get(torch.device(device).type, "reference")
    return choice


def kernels_for(
    choice: str,
    device: torch.device | str,
    matmul_backend: str = "blas",
    attention: str = "sdpa",
    cuda_picked: dict[str, str] | None = None,
) -> Kernels:
    """The Kernels for `train.kernels = choice` on `device`; `matmul_backend` serves the CPU set,
    `attention` ("sdpa" | "flex", resolve_attention's) computes document-masked attention,
    `cuda_picked` is the RMSNorm/RoPE record to use on CUDA (a run passes rank 0's; None: this
    machine's)."""
    resolved = resolve_choice(choice, device)
    if resolved == "cpu":
        kernels = cpu_kernels(matmul_backend)
    elif resolved == "cuda":
        kernels = cuda_choice.kernels(cuda_picked or cuda_choice.choice(gpu_name(device))[0])
    else:
        kernels = REFERENCE
    return kernels if attention == kernels.attention else replace(kernels, attention=attention)


def gpu_name(device: torch.device | str) -> str:
    """The CUDA device's name ("" where CUDA is absent: no measurement can match it)."""
    return torch.cuda.get_device_name(device) if torch.cuda.is_available() else ""


ATTENTION_CHOICES = ("auto", "sdpa", "flex")


def resolve_attention(choice: str, device: torch.device | str, doc_mask: bool) -> str:
    """ "sdpa" or "flex": what `train.attention = choice` means on `device`. "auto" takes
    FlexAttention on CUDA when documents are masked (a block-sparse fused kernel instead of a
    dense (T, T) mask; tests/model/test_flex_attention.py holds it equal to the dense path) and
    SDPA otherwise: without doc_mask there is no mask to build, and on a CPU FlexAttention runs
    unfused and has no backward (torch 2.13)."""
    if choice not in ATTENTION_CHOICES:
        raise ConfigError(
            f"train.attention = {choice!r} is unknown", f"use one of {', '.join(ATTENTION_CHOICES)}"
        )
    if choice == "auto":
        return "flex" if doc_mask and torch.device(device).type == "cuda" else "sdpa"
    return choice


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
