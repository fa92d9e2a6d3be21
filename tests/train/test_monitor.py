"""Loss breakdown, device peaks (table and measured), MFU, and the metrics logger's files."""

from __future__ import annotations

import json
import math

import pytest
import torch

from oreline.train.monitor import (
    MetricsLogger,
    cpu_native_bf16,
    device_peak_flops,
    gpu_peak_flops,
    measure_cpu_matmul_peak,
    mfu,
    mfu_fields,
    truncate_metrics,
)


def test_gpu_peak_table_matches_names_and_refuses_to_guess():
    peak, src = gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16", tf32=False)
    assert peak == 989e12 and "H100 SXM" in src
    assert gpu_peak_flops("NVIDIA H100 PCIe", "bf16", tf32=False)[0] == 756e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-80GB", "fp32", tf32=True)[0] == 156e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-80GB", "fp32", tf32=False)[0] == 19.5e12
    assert gpu_peak_flops("NVIDIA A10", "bf16", tf32=False)[0] == 125e12
    assert gpu_peak_flops("NVIDIA H200", "bf16", tf32=False)[0] == 989e12
    peak, src = gpu_peak_flops("Tesla V100-SXM2-32GB", "bf16", tf32=False)
    assert peak is None and "V100" in src
    peak, src = gpu_peak_flops("Imaginary GPU 9000", "bf16", tf32=False)
    assert peak is None and "Imaginary GPU 9000" in src and "GPU_PEAKS" in src


def test_cpu_peak_is_measured_and_mfu_is_its_share():
    shapes = ((256, 64, 64), (256, 64, 256))
    peak = measure_cpu_matmul_peak(shapes)
    assert 1e8 < peak < 1e14  # FLOP/s of a real CPU, neither zero nor absurd
    got, src = device_peak_flops(torch.device("cpu"), "fp32", shapes)
    assert got == peak and "measured" in src and "256×64×64" in src  # cached: the same figure
    bf16, src = device_peak_flops(torch.device("cpu"), "bf16", shapes)
    if cpu_native_bf16():  # measured in bf16 where the CPU has it, never guessed where it has not
        assert bf16 > 0 and "bf16" in src
    else:
        assert bf16 is None and "native bf16" in src
    assert mfu(6e6, 1000.0, 1.2e10) == pytest.approx(0.5)
    assert mfu(6e6, 1000.0, None) is None


def test_an_mfu_above_one_is_flagged_not_printed_as_a_utilisation(tmp_path):
    from rich.console import Console

    assert mfu_fields(6e6, 1000.0, 1.2e10) == {"mfu": pytest.approx(0.5)}
    assert mfu_fields(6e6, 1000.0, None) == {"mfu": None}
    # a peak measured while other work loaded the cores: the step beats it
    over = mfu_fields(6e6, 1000.0, 3.2e9)
    assert over == {"mfu": None, "mfu_above_peak": pytest.approx(1.875)}
    console = Console(record=True, width=400)
    log = MetricsLogger(tmp_path / "metrics.jsonl", None, console=console)
    base = {"type": "train", "loss": 4.0, "loss_token": 4.0, "loss_eos": None, "loss_bos": None}
    base |= {"lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1000.0, "step_ms": 10.0}
    base |= {"data_wait_frac": 0.0, "rss_mb": 100.0}
    for step in (1, 2):
        log.log(base | {"step": step} | over)
    log.close()
    text = console.export_text()
    assert "187.5%" not in text and text.count("mfu — (above the measured peak)") == 2
    assert text.count("188% of the peak FLOPs measured at start-up") == 1  # said once, with the fix
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["mfu"] is None and rec["mfu_above_peak"] == pytest.approx(1.875)


def test_logger_writes_jsonl_tensorboard_and_nulls_for_nan(tmp_path):
    log = MetricsLogger(tmp_path / "metrics.jsonl", tmp_path / "tb")
    log.log({"type": "start", "step": 0, "device": "cpu"})
    for step in (1, 2, 3):
        log.log(
            {"type": "train", "step": step, "loss": 5.0 - step, "grad_norm": math.nan if step == 2 else 1.0}
        )
    log.log({"type": "generation", "step": 3, "prompt": "The", "text": " end", "mode": "greedy"})
    log.close()
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["type"] for r in recs] == ["start", "train", "train", "train", "generation"]
    assert recs[2]["grad_norm"] is None and recs[2]["loss"] == 3.0
    assert all("time" in r for r in recs)
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_truncate_drops_later_steps_and_cut_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"type": "train", "step": s}) for s in range(1, 7)] + ['{"type": "train", "st']
    path.write_text("\n".join(lines) + "\n")
    assert truncate_metrics(path, 4) == 3
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3, 4]
