"""train.cpu_allocator = "lean": a freed tensor's pages (64 KiB or more) go back to the kernel at once.

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
import ctypes
import sys
import torch
from oreline.train.performance import set_cpu_allocator

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = Mallinfo2

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

print(set_cpu_allocator(sys.argv[1]))
if sys.argv[2] == "large":
    first = torch.ones(4 << 20)  # 16 MB: mmapped under any setting
    del first  # glibc's own setting now serves blocks up to 16 MB from the heap
    blocks = [torch.ones(4 << 20)]
    pins = [torch.ones(256)]  # a live block above it: the heap cannot shrink past it
else:  # 64 activation-sized blocks (96 KiB: 32 tokens x 768 fp32), small live blocks between them
    mapped = mallinfo2().hblks
    blocks, pins = [], []
    for _ in range(64):
        blocks.append(torch.ones(24 << 10))
        pins.append(torch.ones(256))
    mapped = mallinfo2().hblks - mapped  # of them, how many glibc gave an mmap of their own
before = rss()
blocks.clear()
print(before - rss())
print(mapped if sys.argv[2] == "small" else -1)
"""


def returned_bytes(mode: str, size: str = "large") -> tuple[str, int, int]:
    """(what set_cpu_allocator said, bytes of RSS that freeing a 16 MB tensor, or 64 tensors of
    96 KiB with `size="small"`, gave back, how many of the 64 were mmapped (-1 for "large"))."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = str(SRC)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, size], env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return out[0], int(out[1]), int(out[2])


glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


@pytest.mark.slow  # two fresh interpreters importing torch
@glibc
def test_lean_gives_freed_blocks_back_where_glibcs_own_setting_keeps_them():
    said, lean, _ = returned_bytes("lean")
    assert "M_MMAP_THRESHOLD=64 KiB" in said
    assert lean >= 15 << 20
    said, default, _ = returned_bytes("default")
    assert said == "None"  # "default" sets nothing
    assert default < 4 << 20  # the case lean exists for: 16 MB freed, none of it returned


@pytest.mark.slow  # two fresh interpreters importing torch
@glibc
def test_lean_maps_activation_sized_blocks_too():
    # blocks under glibc's threshold come from the heap, where, freed between live blocks, their
    # pages stay resident (with lean at 1 MiB, ~40 MB of a 125m rank's peak RSS at seq_len 32);
    # lean maps blocks of 64 KiB or more (unless a free heap chunk or the heap's top fits them)
    _, lean, mapped = returned_bytes("lean", "small")
    assert mapped >= 60, mapped
    assert lean >= 5 << 20  # 64 x 96 KiB = 6.3 MB, unmapped when freed
    _, _, mapped = returned_bytes("default", "small")
    assert mapped == 0  # glibc's own threshold starts at 128 KiB


def test_config_accepts_lean():
    assert TrainConfig(cpu_allocator="lean").cpu_allocator == "lean"
    with pytest.raises(ValueError):
        TrainConfig(cpu_allocator="jemalloc")
