"""train.cpu_matmul = "auto" is reproducible (issue 20, item 3).

Measured at every launch, the backend followed the machine's load: two uninterrupted runs of one
config chose differently and diverged from step 2, and resumed runs switched backend. The rule
now (oreline.model.kernels.matmul): a fresh run takes this machine's decision, measured once and cached
per machine; a resumed run takes the backend its checkpoint recorded; an explicit config wins
with a warning. The cache is a real file the tests rewrite to stand for "the measurement would now
choose the other backend".
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from oreline.model.kernels import matmul
from oreline.train.checkpoint.format import read_meta
from oreline.train.loop import train

needs_onednn = pytest.mark.skipif(
    "onednn" not in matmul.available_backends(), reason="this torch build has no oneDNN: auto is always blas"
)


def start_record(run_dir: str | Path) -> dict:
    recs = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["type"] == "start"][-1]


def decision_file(cache: Path) -> Path:
    files = list((cache / "cpu-matmul").glob("*.json"))
    assert len(files) == 1, files
    return files[0]


def overrule(path: Path) -> str:
    """Rewrite this machine's decision as the other backend (what another measurement might have said)."""
    entry = json.loads(path.read_text())
    entry["backend"] = "blas" if entry["backend"] == "onednn" else "onednn"
    path.write_text(json.dumps(entry))
    return entry["backend"]


@needs_onednn
def test_fresh_runs_take_this_machines_decision_whatever_the_load(
    train_config, tmp_path, monkeypatch, one_thread
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORELINE_CACHE_DIR", str(cache))

    def run(name: str) -> dict:
        cfg = train_config(
            run__name=name,
            train__steps=2,
            train__eval_every=0,
            train__eval_sequences=4,
            train__optim__warmup_steps=1,
        )
        return start_record(train(cfg, console=Console(file=io.StringIO()))["run_dir"])

    first = run("a")
    path = decision_file(cache)
    backend = first["cpu_matmul_backend"]
    assert json.loads(path.read_text())["backend"] == backend and str(path) in first["cpu_matmul"]

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]  # both cores busy
    try:
        second = run("b")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert second["cpu_matmul_backend"] == backend and str(path) in second["cpu_matmul"]

    other = overrule(path)  # the file decides, not a measurement at launch
    assert run("c")["cpu_matmul_backend"] == other


@needs_onednn
def test_resume_keeps_the_recorded_backend(train_config, tmp_path, monkeypatch, one_thread):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORELINE_CACHE_DIR", str(cache))

    def cfg(steps: int, **more):
        return train_config(
            train__steps=steps,
            checkpoint__every=4,
            train__eval_every=0,
            train__eval_sequences=4,
            train__optim__warmup_steps=1,
            **more,
        )

    run_dir = Path(train(cfg(4), console=Console(file=io.StringIO()))["run_dir"])
    recorded = read_meta(run_dir / "checkpoints" / "step-00000004")["cpu_matmul"]
    assert recorded == start_record(run_dir)["cpu_matmul_backend"]

    other = overrule(decision_file(cache))  # this machine would now choose the other backend
    out = io.StringIO()
    train(cfg(6), allow_config_change=["train.steps"], console=Console(file=out, width=300))
    resumed = start_record(run_dir)
    assert resumed["step"] == 4 and resumed["cpu_matmul_backend"] == recorded != other
    assert "recorded in the checkpoint" in resumed["cpu_matmul"]
    assert (
        f"instead of {other}" in out.getvalue() and "keeps the backend it was trained with" in out.getvalue()
    )
    assert read_meta(run_dir / "checkpoints" / "step-00000006")["cpu_matmul"] == recorded

    out = io.StringIO()  # a config naming the other backend explicitly wins, and says what it costs
    train(
        cfg(8, train__cpu_matmul=other),
        allow_config_change=["train.steps", "train.cpu_matmul"],
        console=Console(file=out, width=300),
    )
    assert start_record(run_dir)["cpu_matmul_backend"] == other
    assert f'train.cpu_matmul = "{other}" names another backend' in out.getvalue()
