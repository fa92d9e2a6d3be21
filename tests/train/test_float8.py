"""train.precision = "fp8": torchao Float8Linear projections, emulated on the CPU (train.fp8_emulate)
so the whole code path runs here; the same checkpoint format as bf16, switchable at resume."""

from __future__ import annotations

import math

import pytest
import torch

from oreline.config import ModelConfig
from oreline.errors import ConfigError
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train.loop import train

pytest.importorskip("torchao.float8")

from oreline_test_train_fixtures import read_metrics  # noqa: E402

from oreline.train import float8  # noqa: E402

FP8 = {"train__precision": "fp8", "train__fp8_emulate": True, "train__fp8_filter": "all"}


def _losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["type"] == "train"}


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_keeps_the_state_dict_of_the_plain_model(recipe):
    args = resolve_model_args(ModelConfig(preset="debug"), 512)
    torch.manual_seed(0)
    plain = Llama(args)
    torch.manual_seed(0)
    fp8 = Llama(args)
    names = float8.convert(fp8, recipe, emulate=True, size_filter=False)
    assert len(names) == 7 * args.n_layers and not any("lm_head" in n for n in names)
    assert type(fp8.lm_head).__name__ == "OutputHead"  # the output head stays high precision
    a, b = plain.state_dict(), fp8.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert type(b[k]) is torch.Tensor and b[k].dtype == a[k].dtype and torch.equal(a[k], b[k]), k
    # a plain model's checkpoint loads into the fp8 one and back, strictly
    fp8.load_state_dict(a, strict=True)
    plain.load_state_dict(fp8.state_dict(), strict=True)


def test_size_filter_is_torchaos_rule_on_the_presets():
    one_b = resolve_model_args(ModelConfig(preset="1b"))
    debug = resolve_model_args(ModelConfig(preset="debug"), 512)
    with torch.device("meta"):
        small, big = Llama(debug), Llama(one_b)
    assert float8.convert(small, "tensorwise", emulate=True) == []  # too small to gain from fp8
    names = float8.convert(big, "tensorwise", emulate=True)
    # 1b: q (2048, 2048), k/v (512, 2048), o (2048, 2048), gate/up (8192, 2048), down (2048, 8192)
    # tensorwise skips K ≤ 4096 with N ≤ 1024: only k_proj and v_proj stay bf16
    assert {n.rsplit(".", 1)[-1] for n in names} == {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(names) == 5 * one_b.n_layers
    # rowwise skips N ≤ 2048 or K ≤ 1024 or (N ≤ 4096 and K ≤ 2048)
    assert float8.large_enough((8192, 2048), "rowwise") and not float8.large_enough((2048, 8192), "rowwise")
    assert not float8.large_enough((4096, 2048), "rowwise") and float8.large_enough((4096, 4096), "rowwise")
    assert not float8.large_enough((8200, 8192), "tensorwise")  # not a multiple of 16


def test_fp8_is_refused_on_a_cpu_without_emulation(train_config):
    with pytest.raises(ConfigError) as e:
        train(train_config(train__precision="fp8", train__steps=8))
    assert "8.9" in str(e.value) and "fp8_emulate" in str(e.value)


def test_fp8_with_the_cpu_kernels_is_refused(train_config):
    with pytest.raises(ConfigError, match="train.kernels=cpu cannot run with train.precision=fp8"):
        train(train_config(**FP8, train__kernels="cpu", train__steps=8))


def test_fp8_emulated_trains_like_bf16(tmp_path, train_config, one_thread):
    common = dict(train__steps=6, train__log_every=1, train__eval_every=0, eval__prompts=[])
    out = train(train_config(**FP8, run__name="fp8", **common))
    train(train_config(train__precision="bf16", run__name="bf16", **common))
    fp8, bf16 = _losses(tmp_path / "fp8"), _losses(tmp_path / "bf16")
    assert all(math.isfinite(v) for v in fp8.values()) and fp8[6] < fp8[1] - 0.3
    for step in fp8:  # fp8 products (e4m3 keeps 3 mantissa bits) track bf16's loss closely
        assert abs(fp8[step] - bf16[step]) < 0.05 * bf16[step], (step, fp8[step], bf16[step])
    assert fp8 != bf16  # the fp8 path really ran
    start = next(r for r in read_metrics(tmp_path / "fp8" / "metrics.jsonl") if r["type"] == "start")
    assert start["precision"] == "fp8" and math.isfinite(out["final_val_loss"])


def test_resume_switches_between_bf16_and_fp8_with_a_warning(tmp_path, train_config, one_thread):
    common = dict(train__log_every=1, train__eval_every=0, eval__prompts=[], checkpoint__every=2)
    train(train_config(train__precision="bf16", train__steps=2, train__optim__warmup_steps=1, **common))
    second = train(
        train_config(**FP8, train__steps=4, train__optim__warmup_steps=1, **common),
        resume="auto",
        allow_config_change=["train.steps"],
    )
    assert second["resumed_from"].endswith("step-00000002")
    third = train(
        train_config(train__precision="bf16", train__steps=6, train__optim__warmup_steps=1, **common),
        resume="auto",
        allow_config_change=["train.steps"],
    )
    assert third["resumed_from"].endswith("step-00000004")
    recs = read_metrics(tmp_path / "t" / "metrics.jsonl")
    warned = [r for r in recs if r["type"] == "event" and r["kind"] == "compute_change"]
    assert [r["step"] for r in warned] == [2, 4] and all(r["action"] == "warn" for r in warned)
    assert "train.precision: bf16 → fp8" in warned[0]["message"]
    assert "train.precision: fp8 → bf16" in warned[1]["message"]
    losses = [r["loss"] for r in recs if r["type"] == "train"]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)


def test_precision_fp32_to_bf16_still_needs_allowing():
    from oreline.errors import CheckpointError
    from oreline.train.checkpoint.resume import check_resume_compatible

    meta = {"step": 4, "config": {"train": {"precision": "fp32"}}}
    with pytest.raises(CheckpointError, match="train.precision"):
        check_resume_compatible(meta, {"train": {"precision": "bf16"}})
    meta = {"step": 4, "config": {"train": {"precision": "bf16", "fp8_recipe": "tensorwise"}}}
    allowed = check_resume_compatible(meta, {"train": {"precision": "fp8", "fp8_recipe": "rowwise"}})
    assert set(allowed) == {"train.precision", "train.fp8_recipe"}


def test_fsdp2_fp8_all_gather_trains_and_saves_the_bf16_format(tmp_path):
    """FSDP2 (a one-rank gloo group) with tensorwise fp8 all-gather: the weights become torchao's
    fp8-cast tensors inside the DTensors, the loss follows bf16's, and the checkpoint holds plain
    fp32 tensors that load into a bf16 model and back."""
    import torch.distributed as tdist

    from oreline.config import CheckpointConfig, TrainConfig
    from oreline.train import dist
    from oreline.train.checkpoint import save
    from oreline.train.checkpoint.load import load_checkpoint, load_model_state
    from oreline.train.session import build_model

    args = resolve_model_args(ModelConfig(preset="debug"), 512)
    info = dist.DistInfo(0, 1, 0, torch.device("cpu"), "gloo", True, "fsdp")
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))

    def build(precision: str, seed: int = 3):
        tc = TrainConfig(parallel="fsdp", precision=precision, fp8_emulate=True, fp8_filter="all", seed=seed)
        model, train_model = build_model(args, Llama(args).kernels, tc, info)
        return model, train_model, torch.optim.AdamW(model.parameters(), 1e-3)

    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        losses, paths = {}, {}
        for precision in ("bf16", "fp8"):
            model, train_model, opt = build(precision)
            local = model.model.layers[0].mlp.up_proj.weight.to_local()
            assert (type(local).__name__ == "WeightWithDynamicFloat8CastTensor") == (precision == "fp8")
            losses[precision] = []
            for _ in range(4):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = train_model(ids, labels=torch.roll(ids, -1, 1)).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                if precision == "fp8":
                    float8.precompute_scales(model)
                losses[precision].append(float(loss.detach()))
            paths[precision] = save.save_checkpoint(
                tmp_path / precision, 4, model, opt, {"config": {}, "model_args": args.to_dict()},
                cfg=CheckpointConfig(every=1),
            )  # fmt: skip
            held, _, _ = load_model_state(paths[precision])
            assert all(type(v) is torch.Tensor and v.dtype == torch.float32 for v in held.values())
            assert all(torch.equal(held[k], v.full_tensor()) for k, v in model.state_dict().items())
        assert losses["fp8"] != losses["bf16"] and losses["fp8"][-1] < losses["fp8"][0]
        assert all(abs(a - b) < 0.02 for a, b in zip(losses["fp8"], losses["bf16"], strict=True))
        for precision, other in (("bf16", "fp8"), ("fp8", "bf16")):  # each loads the other's checkpoint
            model, _, opt = build(precision, seed=5)
            load_checkpoint(paths[other], model, opt)
            held, _, _ = load_model_state(paths[other])
            assert all(torch.equal(held[k], v.full_tensor()) for k, v in model.state_dict().items())
    finally:
        tdist.destroy_process_group()
