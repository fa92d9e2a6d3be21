"""benchmarks/gpu_check.py runs end to end on a CPU (debug preset, tiny sizes), so that it works the
first time it meets a GPU: every section has its row, none crashed, and the rows that need CUDA say so."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "env",
    "throughput",
    "torchtitan",
    "async checkpoint",
    "NaN injected",
    "syncs",
    "kernels",
    "flex attention",
    "fp8",
)


@pytest.mark.slow
def test_gpu_check_runs_every_section_on_cpu(tmp_path):
    out = tmp_path / "table.md"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--device",
            "cpu",
            "--time-limit",
            "360",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = out.read_text()
    assert table.strip() in proc.stdout
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| ")
    ]
    by_section = {}
    for section, setting, result in rows[1:]:  # rows[0] is the header
        by_section.setdefault(section, []).append((setting, result))
    assert set(SECTIONS) <= set(by_section), by_section.keys()
    for section, entries in by_section.items():
        for setting, result in entries:
            assert not result.startswith("error"), f"{section} {setting}: {result}"
    assert by_section["syncs"][0][1] == "skipped: no CUDA"
    titan = by_section["torchtitan"][0][1]
    assert titan.startswith("not installed") or "tokens/s" in titan or titan.startswith("skipped")
    # the sections that run first always get their time, and work on a CPU
    assert by_section["NaN injected"][0][1].startswith("recovered")
    assert [s for s, _ in by_section["async checkpoint"]] == [
        "debug blocking",
        "debug async, first save",
        "debug async, second save",
    ]
    assert all("step stalled" in r for _, r in by_section["async checkpoint"])
    assert all(r.endswith("holds the weights at the save") for _, r in by_section["async checkpoint"])
    first = by_section["throughput"][0]
    assert first[0] == "debug eager AC off" and "tokens/s" in first[1] and "MFU" in first[1]
    fused = dict(by_section["throughput"])["debug eager AC off, fused kernels"]
    assert "tokens/s" in fused or fused == "skipped: time limit", fused
    # the eager RMSNorm / RoPE candidates: timed, a choice made, nothing recorded off CUDA
    kernels = dict(by_section["kernels"])
    assert set(kernels) == {"rms_norm fwd+bwd eager", "rope fwd+bwd eager"}, kernels
    assert all("chosen:" in r and "not recorded" in r for r in kernels.values())
    # FlexAttention equals the dense mask (forward on a CPU); its throughput rows need CUDA
    flex = dict(by_section["flex attention"])
    equal = flex.get("debug flex vs dense mask", "skipped: time limit")
    assert equal.startswith("equal:") or equal == "skipped: time limit", flex
    # fp8 rows, emulated on a CPU: every block projection in fp8, trained beside the fp32 baseline
    for setting, result in by_section["fp8"]:
        if "tokens/s" not in result:
            assert "skipped" in result or "not installed" in result or "stopped" in result, (setting, result)
        elif " fp8 " in setting and "torchtitan" not in setting:
            assert result.endswith("fp8 in 14 projections"), (setting, result)
    # the fp32 baselines beside fp8 are the throughput rows' own measurements (found by their
    # settings, not their labels), shown again rather than timed twice
    fp8, throughput = dict(by_section["fp8"]), dict(by_section["throughput"])
    for mode in ("eager", "compile"):
        same = throughput.get(f"debug {mode} AC off", "")
        if "tokens/s" in same and f"debug fp32 {mode} AC off" in fp8:
            assert fp8[f"debug fp32 {mode} AC off"] == f"{same} (the throughput row's measurement)", mode
    if "tokens/s" in throughput["debug eager AC off"]:
        assert "debug fp32 eager AC off" in fp8, fp8
    levers = dict(by_section["levers"])
    for name in ("debug eager AC full vs selective", "debug eager loss full vs chunked"):
        assert "tokens/s" in levers[name] or levers[name] == "skipped: time limit", levers[name]
