"""`oreline train --nproc N` under torchrun (oreline.train.torchrun). What the launched ranks do
(dying with the launcher, stopping on SIGTERM) is tests/train/test_shutdown.py."""

from __future__ import annotations

import sys

import pytest

from oreline.train.torchrun import torchrun_command


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "-c", "c.toml", "--nproc", "2", "train.steps=3"],
        ["train", "--nproc=2", "-c", "c.toml", "train.steps=3"],
    ],
)
def test_nproc_relaunch_runs_torchrun_from_this_interpreter_without_nproc(argv):
    """`oreline train --nproc 2 …` re-runs the same command under torchrun: this interpreter's
    torch.distributed.run, one node, and no --nproc left, so the ranks do not launch again."""
    assert torchrun_command(2, argv) == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "oreline",
        "train",
        "-c",
        "c.toml",
        "train.steps=3",
    ]
