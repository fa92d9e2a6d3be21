"""train.cpu_allocator = "lean": a freed large tensor's pages go back to the kernel at once.

mallopt settings are process-wide, so each case runs in a fresh interpreter. glibc's own setting
raises its mmap threshold to the size of a freed mmapped block; the next block of that size then
comes from the heap, and with a live block above it, freeing it leaves its pages resident. That
is what made an FSDP2 rank's peak RSS exceed its live tensors (benchmarks/rank_memory.py).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from oreline.config import TrainConfig

SRC = Path(__file__).resolve().parents[2] / "src"

PROBE = """
import sys
import torch
from oreline.train.performance import set_cpu_allocator

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

print(set_cpu_allocator(sys.argv[1]))
first = torch.ones(4 << 20)  # 16 MB: mmapped under any setting
del first  # glibc's own setting now serves blocks up to 16 MB from the heap
block = torch.ones(4 << 20)
pin = torch.ones(256)  # a live block above it: the heap cannot shrink past it
before = rss()
del block
print(before - rss())
"""


def returned_bytes(mode: str) -> tuple[str, int]:
    """(what set_cpu_allocator said, bytes of RSS that freeing a 16 MB tensor gave back)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = str(SRC)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return out[0], int(out[1])


glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


@pytest.mark.slow  # two fresh interpreters importing torch
@glibc
def test_lean_gives_freed_blocks_back_where_glibcs_own_setting_keeps_them():
    said, lean = returned_bytes("lean")
    assert "M_MMAP_THRESHOLD=1 MiB" in said
    assert lean >= 15 << 20
    said, default = returned_bytes("default")
    assert said == "None"  # "default" sets nothing
    assert default < 4 << 20  # the case lean exists for: 16 MB freed, none of it returned


def test_config_accepts_lean():
    assert TrainConfig(cpu_allocator="lean").cpu_allocator == "lean"
    with pytest.raises(ValueError):
        TrainConfig(cpu_allocator="jemalloc")
