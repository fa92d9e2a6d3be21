"""Float8 training (`train.precision = "fp8"`) through torchao's Float8Linear.

fp8 is a compute choice, not a storage one: bf16 autocast as for precision=bf16, and the large
projections of the blocks swapped for torchao's `Float8Linear` (an `nn.Linear` subclass whose
weight stays the same fp32 parameter; its products cast input, weight and gradient to float8 with
dynamic scales). The state dict has the same keys, shapes and dtypes as a bf16 model's, so a
checkpoint of one resumes under the other (oreline.train.checkpoint.resume lets precision change
between bf16 and fp8 with a warning in the run's events).

- Recipes (`train.fp8_recipe`): "tensorwise" (one scale per tensor: cuBLAS's fp8 GEMM, the fastest)
  or "rowwise" (a scale per row: more accurate, CUTLASS's rowwise GEMM), torchao's
  `Float8LinearConfig.from_recipe_name`.
- Which layers: only the blocks' projections (q/k/v/o, gate/up/down), never the output head (its
  logits feed the loss: torchtitan and torchao leave it in high precision), and among those only
  the ones whose GEMMs are large enough for fp8 to pay off: `large_enough` is torchao's
  `_auto_filter_for_recipe` size rule (torchao/float8/float8_linear_utils.py, 0.18), which
  torchtitan's `auto_filter_small_kn` calls: every dim a multiple of 16 (the fp8 GEMMs' rule),
  and, measured by torchao on H100, tensorwise skips K ≤ 4096 with N ≤ 1024, rowwise skips
  N ≤ 2048, K ≤ 1024, or N ≤ 4096 with K ≤ 2048 (weight shape (N, K)). A small model may thus have
  no fp8 layer at all: `convert` says how many were converted.
- FSDP2: with tensorwise, `enable_fsdp_float8_all_gather` makes FSDP2 all-gather the weights
  already cast to fp8 (half the bytes of bf16), and `precompute_scales` after each optimizer step
  computes every weight's scale in one fused pass instead of one small all-reduce per layer
  (torchtitan's recipe). Rowwise all-gathers bf16 (torchao supports fp8 all-gather for tensorwise
  only).
- Hardware: fp8 GEMMs need compute capability 8.9+ (Ada, Hopper, Blackwell). Anywhere else
  `check_support` refuses, unless `train.fp8_emulate` asks torchao to emulate the products in high
  precision: the mode the tests run on a CPU, so the code path is exercised without a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from oreline.errors import ConfigError

# the projections a block computes with; the output head (lm_head) is never converted
BLOCK_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MIN_CAPABILITY = (8, 9)


def check_support(device: torch.device, emulate: bool) -> None:
    """Refuse fp8 where its GEMMs cannot run (a CPU, a GPU below SM 8.9) unless emulated, and
    without torchao installed."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"train.precision=fp8 needs torchao ({exc})",
            "pip install 'oreline[fp8]' (torchao), or use train.precision=bf16",
        ) from exc
    if emulate:
        return
    if device.type != "cuda":
        raise ConfigError(
            f"train.precision=fp8 needs a CUDA GPU with fp8 tensor cores (compute capability 8.9+: H100, "
            f"L40, RTX 4090); this run is on {device.type}",
            "use train.precision=bf16 here (or train.fp8_emulate=true to test the fp8 code path, slowly)",
        )
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        raise ConfigError(
            f"train.precision=fp8 needs compute capability 8.9+ (fp8 tensor cores); "
            f"{torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}",
            "use train.precision=bf16 on this GPU (or train.fp8_emulate=true to test the fp8 code path, slowly)",
        )


def large_enough(weight_shape: tuple[int, ...], recipe: str) -> bool:
    """Whether a projection of weight shape (N, K) gains from fp8 under `recipe` (torchao's
    `_auto_filter_for_tensorwise` / `_auto_filter_for_rowwise` thresholds, measured on H100)."""
    n, k = weight_shape
    if n % 16 or k % 16:  # fp8 GEMMs need every dim a multiple of 16
        return False
    if recipe == "tensorwise":
        return not (k <= 4096 and n <= 1024)
    if recipe == "rowwise":
        return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))
    raise ConfigError(f"train.fp8_recipe={recipe!r} is unknown", "use tensorwise or rowwise")


def float8_config(recipe: str, emulate: bool, fsdp: bool) -> Any:
    """torchao's Float8LinearConfig for `recipe`; fp8 all-gather under FSDP2 with tensorwise."""
    from torchao.float8 import Float8LinearConfig

    if recipe not in ("tensorwise", "rowwise"):
        raise ConfigError(f"train.fp8_recipe={recipe!r} is unknown", "use tensorwise or rowwise")
    config = Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(
        config, emulate=emulate, enable_fsdp_float8_all_gather=fsdp and recipe == "tensorwise"
    )


def convert(
    model: nn.Module,
    recipe: str,
    emulate: bool,
    fsdp: bool = False,
    size_filter: bool = True,
    projections: tuple[str, ...] = BLOCK_PROJECTIONS,
) -> list[str]:
    """Swap the blocks' large projections for Float8Linear, in place (before FSDP2 wraps the
    model; a meta-device model is fine). Returns the converted module names. `size_filter=False`
    converts every block projection whose dims are multiples of 16 (the tests' tiny models);
    `projections` names them (another model's: gpu_check's torchtitan peer)."""
    from torchao.float8 import convert_to_float8_training

    def wanted(module: nn.Module, fqn: str) -> bool:
        if type(module) is not nn.Linear or fqn.rsplit(".", 1)[-1] not in projections:
            return False  # the output head, and the CPU kernels' own Linear (a stacked q/k/v product)
        shape = tuple(module.weight.shape)
        if not size_filter:
            return shape[0] % 16 == 0 and shape[1] % 16 == 0
        return large_enough(shape, recipe)

    names = [fqn for fqn, m in model.named_modules() if wanted(m, fqn)]
    if names:
        convert_to_float8_training(
            model, config=float8_config(recipe, emulate, fsdp), module_filter_fn=wanted
        )
    return names


def is_float8(model: nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(m, Float8Linear) for m in model.modules())


def precompute_scales(model: nn.Module) -> None:
    """After an optimizer step (FSDP2 with tensorwise fp8 all-gather): every weight's fp8 scale in
    one pass, torchao's `precompute_float8_dynamic_scale_for_fsdp` (one all-reduce for all of them)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
