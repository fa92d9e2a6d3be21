"""`oreline train` refuses a model or a micro-batch far beyond this machine before allocating it.

The real command line on the prose fixture: model.dim=10**6 (22 T parameters) and
train.micro_batch=10**9 must end in one error with the arithmetic, not in an allocation
failure traceback, an out-of-memory kill or hours of swapping.
"""

from __future__ import annotations

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
def test_train_refuses_before_allocating(override, needles, tmp_path, train_config, oreline_cli):
    config = tmp_path / "train.toml"
    config.write_text(to_toml(train_config(train__cpu_matmul="blas")))
    t0 = time.perf_counter()
    code, out = oreline_cli("train", "-c", str(config), override, timeout=300)
    seconds = time.perf_counter() - t0
    assert code == 2, out
    assert "Traceback" not in out, out
    assert "training needs at least" in out and "available RAM (psutil)" in out, out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not (tmp_path / "t" / "checkpoints").exists()
    print(f"{override}: refused after {seconds:.1f} s")
