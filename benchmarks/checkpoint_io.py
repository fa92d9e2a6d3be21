"""Checkpoint save / load bandwidth of a 125m-preset model + AdamW state against this disk's raw speed.

Peers measured in the same run, on the same folder:
- raw write: `dd if=/dev/zero of=F bs=1M count=N conv=fsync` with N = the checkpoint's size in MiB;
- python write: the same number of real fp32 bytes written from this process (8 MiB writes + fsync);
- DCP's stock FileSystemWriter (one torch.save archive per tensor, CRC32 off as in oreline before),
  i.e. `save_checkpoint` with `RAW_TENSOR_FILES = False`, against oreline's RawTensorWriter;
- raw read: the same file read back in 8 MiB chunks after its pages were evicted from the page
  cache (posix_fadvise DONTNEED, which needs no privileges and leaves other processes' caches alone).

Measured for oreline (`oreline.train.checkpoint`):
- save: `save_checkpoint` end to end (DCP write with fsync, meta.json, xxh3 checksums, rename,
  `latest`); MB/s = checkpoint bytes / seconds; target ≥ 70 % of raw write;
- load: `load_checkpoint` into a live model + optimizer (checksum verification + DCP read) with the
  checkpoint's pages evicted first;
- resume start-up: build the model, build the optimizer, find + verify + load; target < 2 × load.

Every timed write (each save, each dd, each python write) first writes and deletes a ballast file
of the checkpoint's size (`reuse_blocks`): this VM's disk is thin-provisioned, and writes to blocks
never written before ran at 335-441 MB/s against 1.2-1.6 GB/s for blocks freed and written again
(dd, 1.5 GB, measured 2026-12-02). Without the ballast, whichever writer happens to land on fresh
blocks loses 3x (the first saves of a process did; dd rewriting one file never did). A training run
with retention writes into blocks its deleted checkpoints freed, i.e. the ballast case.

Usage: .venv/bin/python benchmarks/checkpoint_io.py [--preset 125m] [--dir /tmp] [--repeats 2]
(~1.5 GB on disk for 125m; a minute or two on 2 cores.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import oreline.train.checkpoint.save as ck_save
from oreline.config import CheckpointConfig, ModelConfig
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train.checkpoint.format import dir_bytes, file_digest, step_name
from oreline.train.checkpoint.load import load_checkpoint
from oreline.train.checkpoint.resume import find_resumable
from oreline.train.checkpoint.save import last_save_stats, save_checkpoint
from oreline.train.checkpoint.verify import forget_verified

MB = 1e6


def evict(path: Path) -> None:
    """Drop the page-cache pages of every file under path (clean pages only: sync first)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def reuse_blocks(folder: Path, nbytes: int) -> None:
    """Write + fsync + delete a ballast file of nbytes, so the next write lands on blocks the
    thin-provisioned disk has already backed (see the module docstring); then sync everything."""
    ballast = folder / "ballast.bin"
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={ballast}", "bs=1M", f"count={max(1, nbytes >> 20)}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    ballast.unlink()
    os.sync()


def raw_write(path: Path, mib: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    return mib * 2**20 / (time.perf_counter() - t0) / MB


def raw_write_tensor(path: Path, mib: int) -> float:
    """A second peer: the same amount of real (random fp32) bytes written from this process in 8 MiB
    writes + fsync, i.e. what any writer of tensor memory pays that dd's zero page does not."""
    t = torch.randn(mib * 2**20 // 4)
    mv = memoryview(t.numpy()).cast("B")
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as fh:
        for off in range(0, len(mv), 8 << 20):
            fh.write(mv[off : off + (8 << 20)])
        os.fsync(fh.fileno())
    return len(mv) / (time.perf_counter() - t0) / MB


def raw_read(path: Path) -> float:
    evict(path)
    n = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(8 << 20):
            n += len(chunk)
    return n / (time.perf_counter() - t0) / MB


def build(args):
    model = Llama(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def one_step(model, opt, vocab: int) -> None:
    x = torch.randint(0, vocab, (1, 17))
    logits = model(x[:, :-1])
    F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="125m")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="folder on the disk to measure")
    ap.add_argument("--repeats", type=int, default=2, help="best of N for every figure")
    ap.add_argument(
        "--write-threads", type=int, default=ck_save.WRITE_THREADS, help="DCP files/threads per rank"
    )
    a = ap.parse_args()
    ck_save.WRITE_THREADS = a.write_threads

    args = resolve_model_args(ModelConfig(preset=a.preset))
    work = Path(tempfile.mkdtemp(prefix="oreline-ckpt-io-", dir=a.dir))
    try:
        t0 = time.perf_counter()
        model, opt = build(args)
        one_step(model, opt, args.vocab_size)  # AdamW state exists only after a step
        print(
            f"{a.preset}: {sum(p.numel() for p in model.parameters()):,} parameters + AdamW state "
            f"(built and stepped in {time.perf_counter() - t0:.1f} s); folder {work}"
        )
        cfg = CheckpointConfig(keep_last=1)
        meta = {"model_args": args.to_dict(), "tokens_seen": 0}

        state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        state_bytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values())
        saves, loads, startups, parts = [], [], [], []
        stock_saves, stock_parts = [], []
        size = stock_size = 0
        for r in range(a.repeats):
            # oreline's raw tensor files and DCP's stock writer, the peer (alternating which goes first)
            order = ["stock", "raw"] if r % 2 == 0 else ["raw", "stock"]
            for writer in order:
                ck_save.RAW_TENSOR_FILES = writer == "raw"
                root = work / f"ckpts-{writer}-{r}"
                reuse_blocks(work, state_bytes)
                t0 = time.perf_counter()
                path = save_checkpoint(root, 1, model, opt, meta, cfg=cfg)
                (saves if writer == "raw" else stock_saves).append(time.perf_counter() - t0)
                (parts if writer == "raw" else stock_parts).append(last_save_stats())
                if writer == "stock":
                    stock_size = dir_bytes(path)
                    shutil.rmtree(root)
            ck_save.RAW_TENSOR_FILES = True
            root = work / f"ckpts-raw-{r}"
            path = root / step_name(1)
            size = dir_bytes(path)

            evict(path)
            forget_verified()  # verify again: it is part of a real load
            t0 = time.perf_counter()
            load_checkpoint(path, model, opt, restore_rng=False)
            loads.append(time.perf_counter() - t0)

            evict(path)
            forget_verified()
            t0 = time.perf_counter()
            m2, o2 = build(args)
            found = find_resumable(root)
            load_checkpoint(found, m2, o2, restore_rng=False)
            startups.append(time.perf_counter() - t0)
            del m2, o2
            if r < a.repeats - 1:
                shutil.rmtree(root)

        evict(path)
        t0 = time.perf_counter()
        for f in path.iterdir():
            if f.is_file():
                file_digest(f)
        hash_s = time.perf_counter() - t0

        raw = work / "raw.bin"
        mib = max(1, round(size / 2**20))
        writes, tensor_writes = [], []
        for i in range(a.repeats):
            if i:
                raw.unlink()
            reuse_blocks(work, state_bytes)
            writes.append(raw_write(raw, mib))
            raw.unlink()
            reuse_blocks(work, state_bytes)
            tensor_writes.append(raw_write_tensor(raw, mib))  # (the last one stays: it is read back)
        reads = [raw_read(raw) for _ in range(a.repeats)]
        raw.unlink()

        w_raw, r_raw = max(writes), max(reads)
        save_mbs, load_mbs = size / min(saves) / MB, size / min(loads) / MB
        print(
            f"checkpoint: {size / MB:,.1f} MB in {len(list(path.iterdir()))} files "
            f"({ck_save.WRITE_THREADS} DCP write thread(s))"
        )
        w_tensor = max(tensor_writes)
        print(
            f"raw write (dd conv=fsync, {mib} MiB): {w_raw:,.0f} MB/s   raw read (evicted): {r_raw:,.0f} MB/s   "
            f"python write of {mib} MiB of tensor bytes + fsync: {w_tensor:,.0f} MB/s"
        )
        print(
            f"save_checkpoint: {min(saves):.2f} s = {save_mbs:,.0f} MB/s = {save_mbs / w_raw:.0%} of raw write "
            f"(target ≥ 70%), {save_mbs / w_tensor:.0%} of the python tensor-bytes write"
        )
        stock_mbs = stock_size / min(stock_saves) / MB
        print(
            f"  peer, DCP's stock FileSystemWriter (torch.save per tensor): {min(stock_saves):.2f} s = "
            f"{stock_mbs:,.0f} MB/s = {stock_mbs / w_raw:.0%} of raw write; raw tensor files are "
            f"{save_mbs / stock_mbs:.2f}x its speed (tensor files alone: "
            f"{min(p['dcp_s'] for p in stock_parts) / min(p['dcp_s'] for p in parts):.2f}x)"
        )
        best = parts[saves.index(min(saves))]
        print(
            f"  of which DCP tensor files written + fsynced: {best['dcp_s']:.2f} s = "
            f"{size / best['dcp_s'] / MB:,.0f} MB/s ({size / best['dcp_s'] / MB / w_raw:.0%} of raw write); "
            f"checksums: {best['checksum_s']:.2f} s"
        )
        print(
            f"load_checkpoint: {min(loads):.2f} s = {load_mbs:,.0f} MB/s = {load_mbs / r_raw:.0%} of raw read "
            f"(of which checksum verification alone, evicted: {hash_s:.2f} s)"
        )
        print(
            f"resume start-up (build model + optimizer, find, verify, load): {min(startups):.2f} s = "
            f"{min(startups) / min(loads):.2f} × load (target < 2×)"
        )
        print(
            f"all runs: save {[round(s, 2) for s in saves]} s (stock writer {[round(s, 2) for s in stock_saves]} s), load {[round(s, 2) for s in loads]} s, "
            f"start-up {[round(s, 2) for s in startups]} s, raw write {[round(w) for w in writes]} MB/s, "
            f"tensor-bytes write {[round(w) for w in tensor_writes]} MB/s, "
            f"raw read {[round(r) for r in reads]} MB/s"
        )
        ok = save_mbs >= 0.7 * w_raw and min(startups) < 2 * min(loads)
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
