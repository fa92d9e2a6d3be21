"""Resume time of a checkpoint against its size: verify-then-load (before) vs verify-while-reading (now).

A resume used to hash the whole checkpoint (`verify_checkpoint`, every byte) on every rank and then
read it again to load it: for an 8B model that was 96 GB read per rank before training started. Now
the search checks everything but the tensor data files' bytes (sizes, manifest, small files, the
DCP index) and each rank hashes the data files it reads as it reads them
(`verify.reading_check`, `raw_tensors.RawTensorReader`). Both are timed in the same run, on the
same checkpoint, alternating, each with the checkpoint's pages evicted from the page cache first
(posix_fadvise DONTNEED: no privileges, other processes' caches untouched):

- before: `verify_checkpoint(path)` (every byte hashed) + `load_checkpoint` of a checkpoint marked
  verified (what `find_resumable` + `load_checkpoint` did: the load then hashed nothing);
- now: `find_resumable` + `load_checkpoint` (the data files hashed in the read pass).

Bytes read by the process (/proc/self/io rchar) are printed with each: before ≈ 2 × the size,
now ≈ 1 ×. One process (world 1): with N ranks the old way read N × the checkpoint in total.

Usage: .venv/bin/python benchmarks/resume_time.py [--preset 125m] [--dir /tmp] [--repeats 2]
(~1.5 GB on disk for 125m; a few minutes on 2 cores.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from oreline.config import ModelConfig
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train.checkpoint.format import dir_bytes
from oreline.train.checkpoint.load import load_checkpoint
from oreline.train.checkpoint.resume import find_resumable
from oreline.train.checkpoint.save import save_checkpoint
from oreline.train.checkpoint.verify import forget_verified, mark_verified, verify_checkpoint

MB = 1e6


def evict(path: Path) -> None:
    """Drop the page-cache pages of every file under path (clean pages only: sync first)."""
    for f in [p for p in path.rglob("*") if p.is_file()]:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bytes_read() -> int:
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["rchar"])


def build(args):
    model = Llama(args)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def before(root: Path, model, opt) -> Path:
    path = root / "step-00000001"
    ok, problems = verify_checkpoint(path)  # what find_resumable did: every byte hashed
    assert ok, problems
    mark_verified(path)  # ... so that the load did not hash it again
    load_checkpoint(path, model, opt)
    return path


def now(root: Path, model, opt) -> Path:
    path = find_resumable(root)
    load_checkpoint(path, model, opt)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="125m")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    args = resolve_model_args(ModelConfig(preset=a.preset))
    work = Path(tempfile.mkdtemp(prefix="oreline-resume-time-", dir=a.dir))
    try:
        model, opt = build(args)
        x = torch.randint(0, args.vocab_size, (1, 17))
        F.cross_entropy(model(x[:, :-1]).reshape(-1, args.vocab_size), x[:, 1:].reshape(-1)).backward()
        opt.step()  # AdamW state exists: the checkpoint is model + optimizer, as in training
        save_checkpoint(work, 1, model, opt, {"model_args": args.to_dict()})
        size = dir_bytes(work / "step-00000001")
        print(f"{a.preset}: checkpoint {size / MB:,.0f} MB in {work}")
        del model, opt
        target = build(args)
        times: dict[str, list[tuple[float, int]]] = {"before": [], "now": []}
        for _ in range(a.repeats):
            for name, fn in (("before", before), ("now", now)):
                forget_verified()  # a fresh resume: nothing trusted
                evict(work)
                r0, t0 = bytes_read(), time.perf_counter()
                fn(work, *target)
                times[name].append((time.perf_counter() - t0, bytes_read() - r0))
        for name, runs in times.items():
            best, read = min(runs)
            print(
                f"{name:6s}: resume (find + verify + load) {best:6.2f} s = {size / MB / best:7,.0f} MB/s of "
                f"checkpoint; read {read / size:.2f} × its size (all runs: "
                + ", ".join(f"{t:.2f} s" for t, _ in runs)
                + ")"
            )
        b, n = min(times["before"])[0], min(times["now"])[0]
        print(f"now / before: {n / b:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
