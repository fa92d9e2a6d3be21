"""`oreline train` refuses a model or a micro-batch far beyond this machine before allocating it.

The real command line on the prose fixture: model.dim=10**6 (22 T parameters) and
train.micro_batch=10**9 must end in one error with the arithmetic, not in an allocation
failure traceback, an out-of-memory kill or hours of swapping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from oreline.config import to_toml


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("model.dim=1000000", ["model.dim=1000000", "parameters × 16 bytes"]),
        ("train.micro_batch=1000000000", ["train.micro_batch=1000000000 × train.seq_len=64"]),
    ],
)
def test_train_refuses_before_allocating(override, needles, tmp_path, train_config):
    config = tmp_path / "train.toml"
    config.write_text(to_toml(train_config(train__cpu_matmul="blas")))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "oreline", "train", "-c", str(config), override],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "10000"},
    )
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    assert "training needs at least" in out and "available RAM (psutil)" in out, out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not (tmp_path / "t" / "checkpoints").exists()
    print(f"{override}: refused after {seconds:.1f} s")
