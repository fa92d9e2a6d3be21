"""AdamW with parameter groups, and learning-rate schedules as pure functions of the step.

Parameter groups (by parameter name, Hugging Face Llama names):
- `decay`: matrices of attention and MLP, weight decay `optim.weight_decay`;
- `no_decay`: names containing any of `optim.no_decay_patterns` (default "bias", "norm": the
  RMSNorm gains and any biases) — decaying a gain towards 0 only fights the norm it implements
  (GPT-2/nanoGPT, Megatron's `no_weight_decay_cond`);
- `embedding`: `embed_tokens` and an untied `lm_head`, weight decay
  `optim.embedding_weight_decay` (default 0, as in OLMo 2 / nanoGPT speedruns, where decaying
  rare tokens' rows towards 0 costs loss without a stability gain).

Schedules: linear warmup over `warmup_steps` (or `warmup_ratio × train.steps`), then
- cosine: `min_lr + (lr - min_lr) · ½(1 + cos(π·p))` (Loshchilov & Hutter, SGDR),
- linear: `lr - (lr - min_lr) · p`,
- wsd (warmup-stable-decay; Hu et al. 2024, MiniCPM): constant `lr` until the last
  `decay_ratio` share of steps, then linear to `min_lr`,
- constant: `lr` after warmup,
where `p` runs from 0 at the end of warmup to 1 at the last step. `lr_at(step, train_cfg)` has
no hidden state, so resuming at step N gives the same learning rate as never stopping; a
rollback's reduction is an explicit multiplier kept in the checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from oreline.config import OptimConfig, TrainConfig
from oreline.errors import ConfigError

EMBEDDING_PATTERNS = ("embed_tokens", "lm_head")


# ---------------------------------------------------------------------------------------------
# parameter groups and the optimizer


def group_of(name: str, cfg: OptimConfig) -> str:
    """'embedding', 'no_decay' or 'decay' for a parameter name."""
    if any(p in name for p in EMBEDDING_PATTERNS):
        return "embedding"
    if any(p in name for p in cfg.no_decay_patterns):
        return "no_decay"
    return "decay"


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """AdamW parameter groups by name; tied weights appear once (named_parameters dedups)."""
    decay = {"decay": cfg.weight_decay, "no_decay": 0.0, "embedding": cfg.embedding_weight_decay}
    groups: dict[str, dict] = {
        g: {"name": g, "params": [], "param_names": [], "weight_decay": wd} for g, wd in decay.items()
    }
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        g = groups[group_of(name, cfg)]
        g["params"].append(param)
        g["param_names"].append(name)
    return [g for g in groups.values() if g["params"]]


def use_fused(cfg: OptimConfig, device: torch.device) -> bool:
    """Fused AdamW: on CUDA by default, and on CPU too (torch ≥ 2.4 has a fused CPU kernel)."""
    if cfg.fused is not None:
        return cfg.fused
    return device.type in ("cuda", "cpu")


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    groups = param_groups(model, cfg)
    # `param_names` is not an AdamW option; keep it out of the groups torch sees (and saves).
    torch_groups = [{k: v for k, v in g.items() if k != "param_names"} for g in groups]
    return torch.optim.AdamW(
        torch_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=use_fused(cfg, device)
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


# ---------------------------------------------------------------------------------------------
# schedules


def warmup_steps(train: TrainConfig) -> int:
    """Warmup length in steps; a ConfigError naming the keys when it leaves no room to decay."""
    o = train.optim
    if o.warmup_steps is not None:
        warm, key = o.warmup_steps, f"train.optim.warmup_steps={o.warmup_steps}"
    elif o.warmup_ratio is not None:
        warm, key = (
            round(o.warmup_ratio * train.steps),
            f"train.optim.warmup_ratio={o.warmup_ratio} (= {round(o.warmup_ratio * train.steps)} steps)",
        )
    else:
        warm, key = 0, "no warmup"
    if warm < 0:
        raise ConfigError(f"{key} is negative", "set train.optim.warmup_steps to 0 or more")
    if warm >= train.steps and train.steps > 1:
        raise ConfigError(
            f"{key} is not shorter than train.steps={train.steps}",
            "lower train.optim.warmup_steps / warmup_ratio or raise train.steps",
        )
    if o.min_lr > o.lr:
        raise ConfigError(
            f"train.optim.min_lr={o.min_lr} is above train.optim.lr={o.lr}", "set min_lr at or below lr"
        )
    if o.schedule == "wsd" and not 0.0 < o.decay_ratio <= 1.0:
        raise ConfigError(f"train.optim.decay_ratio={o.decay_ratio} is outside (0, 1]", "use e.g. 0.2")
    return warm


def lr_at(step: int, train: TrainConfig, multiplier: float = 1.0) -> float:
    """Learning rate of optimizer step `step` (0-based) of `train.steps`; a pure function."""
    o = train.optim
    total = train.steps
    warm = warmup_steps(train)
    if step < warm:
        # (step + 1) / warm: the first step already moves, the last warmup step reaches lr.
        return o.lr * (step + 1) / warm * multiplier
    if o.schedule == "constant":
        return o.lr * multiplier
    last = total - 1
    if o.schedule == "wsd":
        decay_start = max(warm, total - max(1, round(o.decay_ratio * total)))
        if step < decay_start:
            return o.lr * multiplier
        span = last - decay_start
        p = 1.0 if span <= 0 else (step - decay_start) / span
        return (o.lr - (o.lr - o.min_lr) * min(p, 1.0)) * multiplier
    span = last - warm
    p = 1.0 if span <= 0 else min((step - warm) / span, 1.0)
    if o.schedule == "cosine":
        return (o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))) * multiplier
    if o.schedule == "linear":
        return (o.lr - (o.lr - o.min_lr) * p) * multiplier
    raise ConfigError(f"unknown train.optim.schedule {o.schedule!r}", "use cosine, linear, wsd or constant")


def schedule_samples(train: TrainConfig) -> list[list[float]]:
    """[[step, lr], ...] at step 1, the end of warmup, 25/50/75 % and the last step.

    Steps here are 1-based like the `step` of metrics records (step N is the N-th optimizer
    step, trained with `lr_at(N - 1)`).
    """
    n = train.steps
    warm = warmup_steps(train)
    if n == 0:  # a 0-step init_from run takes no step
        return []
    points = sorted(
        {1, max(warm, 1), max(1, round(0.25 * n)), max(1, round(0.5 * n)), max(1, round(0.75 * n)), n}
    )
    return [[s, lr_at(s - 1, train)] for s in points]
