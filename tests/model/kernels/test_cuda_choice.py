"""train.kernels = "auto" on CUDA: the RMSNorm and RoPE recorded by a measurement (gpu_check's
"kernels" row), the reference without one. The measurement itself runs here on the CPU (the
same code, other timings); the file it writes decides what a model built for that GPU computes with."""

from __future__ import annotations

import json

import torch

from oreline.model.kernels import cuda_choice, rmsnorm, rope
from oreline.model.llama import REFERENCE, Llama, ModelArgs


def test_no_measurement_keeps_the_reference(tmp_path):
    picked, source = cuda_choice.choice("NVIDIA H100 80GB HBM3", tmp_path)
    assert picked == cuda_choice.DEFAULT and "no measurement" in source
    assert cuda_choice.kernels(picked) is REFERENCE


def test_a_recorded_measurement_decides_and_the_model_equals_the_reference(tmp_path):
    measured = cuda_choice.measure(
        torch.device("cpu"), tokens=64, dim=64, n_heads=2, head_dim=32, reps=1, dtype=torch.float32
    )
    assert set(measured["rms_norm"]) == {"reference", "fused", "torch"}
    assert set(measured["rope"]) == {"reference", "fused", "complex"}
    assert all(ms > 0 for times in measured.values() for ms in times.values())
    # a measurement where F.rms_norm and the complex RoPE win, recorded for one GPU only
    timings = {
        "rms_norm": {"reference": 1.0, "fused": 0.97, "torch": 0.5},
        "rope": {"reference": 1.0, "fused": 0.99, "complex": 0.7},
    }
    picked, path = cuda_choice.record("GPU A", timings, tmp_path)
    assert picked == {"rms_norm": "torch", "rope": "complex"}
    assert cuda_choice.choice("GPU A", tmp_path)[0] == picked
    assert cuda_choice.choice("GPU B", tmp_path)[0] == cuda_choice.DEFAULT  # another GPU: not measured
    kernels = cuda_choice.kernels(picked)
    assert kernels.rms_norm is rmsnorm.torch_rms_norm and kernels.rope is rope.complex_rope
    # within the 5 % margin the reference stays
    assert cuda_choice.decide({"rope": {"reference": 1.0, "fused": 0.97, "complex": 0.99}}) == {
        "rope": "reference"
    }
    # a damaged file falls back to the reference
    path.write_text(json.dumps({"key": cuda_choice.device_key("GPU A"), "choice": {"rms_norm": "x"}}))
    assert cuda_choice.choice("GPU A", tmp_path)[0] == cuda_choice.DEFAULT
    # the chosen set computes the reference model's values and gradients
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, ffn_dim=160, max_seq_len=32)
    torch.manual_seed(0)
    ref = Llama(args)
    fast = Llama(args, kernels)
    fast.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    outs = []
    for model in (ref, fast):
        loss = model(ids, labels=torch.roll(ids, -1, 1)).mean()
        loss.backward()
        outs.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-6)
    for n, g in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][n], g, rtol=1e-4, atol=1e-5, msg=n)
