"""Schedules (warmup, cosine, linear, WSD, constant), their validation, and AdamW parameter groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from oreline.config import ModelConfig, OptimConfig, TrainConfig
from oreline.errors import ConfigError
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train.optim import build_optimizer, group_of, lr_at, param_groups, schedule_samples, warmup_steps


def tc(steps: int = 100, **optim) -> TrainConfig:
    base = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "warmup_ratio": None}
    return TrainConfig(steps=steps, optim=OptimConfig(**{**base, **optim}))


def lrs(cfg: TrainConfig) -> list[float]:
    return [lr_at(s, cfg) for s in range(cfg.steps)]


def test_warmup_is_linear_and_reaches_lr_at_its_last_step():
    cfg = tc(schedule="cosine")
    v = lrs(cfg)
    assert v[0] == pytest.approx(1e-4)  # (0 + 1) / 10 of lr: the first step already trains
    assert v[9] == pytest.approx(1e-3)
    diffs = [v[i + 1] - v[i] for i in range(9)]
    assert all(d == pytest.approx(1e-4) for d in diffs)


def test_cosine_decays_monotonically_to_min_lr_with_the_midpoint_halfway():
    cfg = tc(schedule="cosine", steps=111, warmup_steps=11)  # decay spans steps 11..110 = 99 intervals
    v = lrs(cfg)
    after = v[11:]
    assert all(a >= b for a, b in zip(after, after[1:], strict=False))
    assert v[-1] == pytest.approx(1e-4)
    mid = 11 + 99 // 2  # p = 49/99, close to 0.5
    expected = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * 49 / 99))
    assert v[mid] == pytest.approx(expected)


def test_linear_decay_is_a_straight_line():
    cfg = tc(schedule="linear", steps=21, warmup_steps=0)
    v = lrs(cfg)
    assert v[0] == pytest.approx(1e-3) and v[-1] == pytest.approx(1e-4)
    assert v[10] == pytest.approx(1e-3 - (1e-3 - 1e-4) * 0.5)
    steps = [v[i] - v[i + 1] for i in range(20)]
    assert all(d == pytest.approx(steps[0]) for d in steps)


def test_wsd_is_flat_until_the_decay_share_then_linear_to_min_lr():
    cfg = tc(schedule="wsd", steps=100, warmup_steps=10, decay_ratio=0.2)
    v = lrs(cfg)
    assert all(x == pytest.approx(1e-3) for x in v[9:80])
    assert v[80] == pytest.approx(1e-3)  # decay starts at step 80 (the last 20 steps)
    assert all(a > b for a, b in zip(v[80:], v[81:], strict=False))
    assert v[-1] == pytest.approx(1e-4)


def test_constant_after_warmup_and_multiplier_scales():
    cfg = tc(schedule="constant")
    assert lr_at(50, cfg) == pytest.approx(1e-3)
    assert lr_at(50, cfg, multiplier=0.8) == pytest.approx(0.8e-3)
    assert lr_at(37, cfg) == lr_at(37, cfg)  # pure: no hidden state between calls


def test_warmup_ratio_and_validation_errors_name_the_keys():
    assert warmup_steps(tc(steps=200, warmup_steps=None, warmup_ratio=0.05)) == 10
    with pytest.raises(ConfigError) as err:
        warmup_steps(tc(steps=10, warmup_steps=10))
    assert "train.optim.warmup_steps=10" in str(err.value) and "train.steps=10" in str(err.value)
    with pytest.raises(ConfigError) as err:
        lr_at(0, tc(steps=20, warmup_steps=None, warmup_ratio=1.5))
    assert "warmup_ratio=1.5" in str(err.value)
    with pytest.raises(ConfigError, match="min_lr"):
        warmup_steps(tc(min_lr=1e-2))


def test_schedule_samples_are_one_based_steps_with_their_lr():
    cfg = tc(schedule="cosine", steps=100, warmup_steps=10)
    samples = schedule_samples(cfg)
    steps = [s for s, _ in samples]
    assert steps == [1, 10, 25, 50, 75, 100]
    assert samples[0][1] == pytest.approx(lr_at(0, cfg))
    assert samples[1][1] == pytest.approx(1e-3)  # end of warmup
    assert samples[-1][1] == pytest.approx(1e-4)


def test_param_groups_exclude_norms_and_biases_from_decay():
    args = resolve_model_args(ModelConfig(preset="debug"), 512)  # untied lm_head
    model = Llama(args)
    cfg = OptimConfig(weight_decay=0.1, embedding_weight_decay=0.01)
    groups = {g["name"]: g for g in param_groups(model, cfg)}
    assert set(groups) == {"decay", "no_decay", "embedding"}
    assert groups["decay"]["weight_decay"] == 0.1
    assert groups["no_decay"]["weight_decay"] == 0.0
    assert groups["embedding"]["weight_decay"] == 0.01
    assert set(groups["embedding"]["param_names"]) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert all("norm" in n for n in groups["no_decay"]["param_names"])
    assert all(p.dim() == 2 for p in groups["decay"]["params"])
    # every parameter in exactly one group
    names = [n for g in groups.values() for n in g["param_names"]]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert group_of("mlp.up_proj.bias", cfg) == "no_decay"


def test_tied_embedding_appears_once_and_optimizer_gets_the_groups():
    args = resolve_model_args(ModelConfig(preset="debug", tie_embeddings=True), 512)
    model = Llama(args)
    opt = build_optimizer(model, OptimConfig(fused=False), torch.device("cpu"))
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(seen) == len(set(seen)) == len(list(model.parameters()))
    assert {g["name"] for g in opt.param_groups} == {"decay", "no_decay", "embedding"}
    assert all(not g["fused"] for g in opt.param_groups)


def test_decay_only_touches_the_decay_group():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)  # weight decays, bias does not
            self.norm = nn.LayerNorm(4)

    model = Tiny()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.5, fused=False), torch.device("cpu"))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: only decoupled weight decay moves a parameter
    opt.step()
    after = dict(model.named_parameters())
    assert not torch.equal(after["proj.weight"], before["proj.weight"])
    for name in ("proj.bias", "norm.weight", "norm.bias"):
        assert torch.equal(after[name], before[name]), name
