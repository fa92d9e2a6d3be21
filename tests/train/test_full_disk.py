"""A full disk during training is one OrelineError, not a traceback, and recovery after freeing
space is exact. The disk is a real small tmpfs (tests/conftest.py `small_disk`): the kernel says
ENOSPC exactly as on a full disk; the run is a real `python -m oreline train` subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oreline.config import to_toml
from oreline.train.checkpoint.format import read_latest


@pytest.mark.slow
def test_training_on_a_full_disk_ends_with_one_error_and_resumes_exactly(train_config, small_disk, tmp_path):
    disk = small_disk("20m")
    cfg = train_config(
        run__runs_dir=str(disk),
        train__steps=12,
        train__eval_every=0,
        checkpoint__every=2,
        checkpoint__keep_last=5,
    )
    (tmp_path / "cfg.toml").write_text(to_toml(cfg))
    run, ckpts = disk / "t", disk / "t" / "checkpoints"
    command = [sys.executable, "-m", "oreline", "train", "-c", str(tmp_path / "cfg.toml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    # two checkpoints fit, the third does not: the disk is filled once the run has written step 6
    probe = subprocess.run(
        [*command, "train.steps=6"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    size = sum(p.stat().st_size for p in (ckpts / "step-00000006").iterdir())
    filler = small_disk.fill(disk, leave=int(1.5 * size))
    done = subprocess.run(
        [*command, "--allow-config-change", "train.steps"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    err = done.stderr
    assert done.returncode == 2, err[-3000:]
    assert "Traceback" not in err and "CheckpointException" not in err, err[-3000:]
    said = " ".join(err[err.index("error: ") :].split())  # the last thing said, however it wraps
    assert err.count("error:") == 1 and said.startswith(f"error: no space left on the device of {ckpts}"), err
    assert (
        "a checkpoint needs about" in said and "free space there" in said and said.endswith("step-00000008")
    )
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")]
    latest = read_latest(ckpts)
    assert latest == "step-00000008"  # it trained on, then ran out of room at step 10
    # space freed: the same command continues from the last complete checkpoint, to the end
    filler.unlink()
    again = subprocess.run(
        [*command, "--allow-config-change", "train.steps"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {ckpts / latest}" in " ".join(again.stderr.split())
    assert read_latest(ckpts) == "step-00000012"
    assert run.is_dir()
