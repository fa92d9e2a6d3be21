"""Loader start-up at scale: launch-to-first-batch, peak RSS and open files against corpus size.

Grid: 10, 1,000 and 10,000 shards × 10^9, 10^11 and 10^12 tokens (uint32 ids, vocabulary
131,072, as a Llama-3-size tokenizer writes them). Each corpus is one sparse shard (a real header,
a hole for the tokens, the document index's last entry) hard-linked once per shard, so 10^12
tokens (4 TB as the loader sees them) cost no disk. The holes read as zero pages, so the batch
reads here are faster than from a real disk; start-up, which is what this measures, reads only
headers either way.

Each row runs in a fresh process under `ulimit -n 1024` (RLIMIT_NOFILE soft limit): the parent
spawns `python loader_scale.py --child DIR`, which imports oreline, opens a `TokenLoader`
(seq_len 2048, micro_batch 8) and takes one batch, then 100 more to let the mapping LRU fill.
Printed per row: launch-to-first-batch (spawn → first batch: interpreter, torch and oreline
imports included; wall and the child's CPU seconds, the steadier figure on a shared machine),
the loader's own share (open + first batch), peak RSS (ru_maxrss) and the most
file descriptors open at once. Target (issue 33): flat — the 10^12 row within 1.5× of the 10^9 row
in time and within 200 MB in RSS, at each shard count.

Measured (2026-12-05, the shared 2-core CPU machine; wall seconds swing with other users' load,
the CPU column does not): launch-to-first-batch 1.4-1.8 s wall (CPU 1.4-1.8 s) in every row, the
loader's own share 0.02 s at 10 shards, 0.03-0.05 s at 1,000 and 0.30 s at 10,000 (header reads,
~30 µs a shard), peak RSS 291/245/255 MB at 10/1,000/10,000 shards whatever the token count
(±4 MB), open descriptors 14 at 10 shards and 68 at 1,000 and 10,000 (the 64-mapping LRU). Flat:
10^12/10^9 time ×0.80, ×0.97, ×1.01 and RSS +0, -4, +1 MB at 10, 1,000, 10,000 shards.

`oreline train` on 10,000 hard links of a real 3.4 M-token shard (34 B tokens, vocabulary 4096,
the demo model, seq_len 256) under `ulimit -n 1024`: third step 5.5 s after launch, peak RSS
757 MB (/usr/bin/time -v); the same run on the one shard: 5.5 s, 762 MB. The loader before this
change died in the same set-up after 9.4 s with `OSError: [Errno 24] Too many open files`, peak
RSS 7.1 GB. tests/train/test_many_shards.py is that run in small.

Run: .venv/bin/python benchmarks/loader_scale.py [--dir DIR] [--src SRC_DIR]
(`--src` runs another checkout's oreline, e.g. to compare with the loader before this change.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARDS = (10, 1_000, 10_000)
TOKENS = (10**9, 10**11, 10**12)
VOCAB = 131_072
SEQ_LEN, MICRO = 2048, 8
NOFILE = 1024


def build(folder: Path, shards: int, tokens: int) -> Path:
    """`shards` hard links of one sparse shard; together `tokens` tokens (rounded down per shard)."""
    from oreline.tokens import shards as fmt

    folder.mkdir(parents=True)
    per = tokens // shards
    docs = max(1, per // 1000)
    code = fmt.dtype_code_for(VOCAB)
    fp = "ab" * 32
    header = fmt.ShardHeader(
        code, per, docs, VOCAB, -(-(fmt.HEADER_SIZE + per * fmt.DTYPES[code].itemsize) // 8) * 8, fp
    )
    first = folder / "train-0000000000-00000-000.tok"
    with open(first, "wb") as fh:
        fh.write(header.pack())
        fh.truncate(header.file_size)
        fh.seek(header.file_size - 8)
        fh.write(per.to_bytes(8, "little"))
    entries = []
    for k in range(shards):
        path = folder / f"train-0000000000-{k:05d}-000.tok"
        if k:
            os.link(first, path)
        entries.append(
            {
                "name": path.name,
                "split": "train",
                "tokens": per,
                "documents": docs,
                "sha256": "0" * 64,  # never read at start-up
                "bytes": header.file_size,
            }
        )
    manifest = {
        "shards": entries,
        "tokenizer_fingerprint": fp,
        "data_fingerprint": "cd" * 32,
        "bos_id": 1,
        "eos_id": 2,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def child(folder: str, spawned: float) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from oreline.tokens.loader import TokenLoader

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    t0 = time.perf_counter()
    loader = TokenLoader(folder, seq_len=SEQ_LEN, micro_batch=MICRO, seed=0)
    opened = time.perf_counter() - t0
    loader.next_batch()
    first = time.time() - spawned
    own = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    most = fds()
    t1 = time.perf_counter()
    for _ in range(100):
        loader.next_batch()
        most = max(most, fds())
    per_batch = (time.perf_counter() - t1) / 100
    print(
        json.dumps(
            {
                "launch_to_first_batch_s": first,
                "cpu_to_first_batch_s": cpu,
                "loader_open_s": opened,
                "loader_first_batch_s": own,
                "ms_per_batch": per_batch * 1e3,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "open_fds_max": most,
                "sequences": loader.num_sequences,
            }
        )
    )


def run_row(folder: Path, src: str | None) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    spawned = time.time()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(folder), "--spawned", repr(spawned)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return {"error": f"exit {proc.returncode}: {tail[0][:160]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="where the corpora go (default: a temporary folder)")
    ap.add_argument("--src", help="import oreline from this source folder in the measured processes")
    ap.add_argument("--shards", type=int, nargs="*", default=list(SHARDS))
    ap.add_argument("--tokens", type=float, nargs="*", default=list(TOKENS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.spawned)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = []
        print(
            f"{'shards':>7} {'tokens':>8} | {'launch→batch':>12} {'(CPU)':>7} {'loader':>8} {'ms/batch':>8} "
            f"{'peak RSS':>9} {'open fds':>8}"
        )
        for shards in args.shards:
            for tokens in (int(t) for t in args.tokens):
                folder = build(Path(tmp) / f"s{shards}-t{tokens}", shards, tokens)
                r = run_row(folder, args.src)
                rows.append({"shards": shards, "tokens": tokens, **r})
                if "error" in r:
                    print(f"{shards:>7} {tokens:>8.0e} | {r['error']}")
                else:
                    print(
                        f"{shards:>7} {tokens:>8.0e} | {r['launch_to_first_batch_s']:>10.2f} s "
                        f"{r['cpu_to_first_batch_s']:>5.2f} s "
                        f"{r['loader_first_batch_s']:>6.3f} s {r['ms_per_batch']:>8.2f} "
                        f"{r['peak_rss_mb']:>6.0f} MB {r['open_fds_max']:>8}"
                    )
        print()
        for shards in args.shards:
            row = {r["tokens"]: r for r in rows if r["shards"] == shards and "error" not in r}
            lo, hi = row.get(min(int(t) for t in args.tokens)), row.get(max(int(t) for t in args.tokens))
            if lo and hi and lo is not hi:
                ratio = hi["launch_to_first_batch_s"] / lo["launch_to_first_batch_s"]
                cpu = hi["cpu_to_first_batch_s"] / lo["cpu_to_first_batch_s"]
                drss = hi["peak_rss_mb"] - lo["peak_rss_mb"]
                ok = ratio <= 1.5 and drss <= 200
                print(
                    f"{shards:>6} shards: largest/smallest corpus time ×{ratio:.2f} (CPU ×{cpu:.2f}; target ≤ 1.5), "
                    f"RSS {drss:+.0f} MB (target ≤ 200): {'flat' if ok else 'NOT flat'}"
                )


if __name__ == "__main__":
    main()
