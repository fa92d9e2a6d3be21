"""Benchmark: the dedup plan at scale, single-process reference vs staged jobs: memory, CPU, shuffle.

Synthetic signature files in oreline's own format (what phase 1 writes: doc_id, source, offset,
exact key, n_shingles, 128 uint32 MinHash entries), 10,000 documents per file, with planted
duplicates: 4% exact copies (same key and signature) and 6% near copies of a document of the same
or the previous file (10% or 30% of the signature entries redrawn: estimated Jaccard ~0.9, above
the threshold, or ~0.7, a candidate that verification rejects). Verification is "signature" (the
synthetic documents have no texts; exact verification adds the reading of the candidates' texts
to the candidates stage).

Each measured unit runs in its own forked child and is read with wait4: peak RSS (ru_maxrss) and
CPU seconds (user + system). The parent holds only paths, so a child's RSS is its own work plus
the interpreter with numpy/pyarrow loaded (`baseline`, measured as an empty job).

- local: `dedup_plan` (every signature in one process) + `split_by_file` (the per-task lists
  the old phase 2 wrote); peak RSS of that one process is the node's peak.
- staged: `staged_plan` with a measuring executor that forks one child per job, one at a time;
  per stage: jobs, the largest job's peak RSS, CPU seconds summed over jobs, bytes written for the
  next stage. A node running c jobs at once peaks at about c × the largest job.

Run: `.venv/bin/python benchmarks/dedup_scale.py --docs 1000000 [--docs 3000000] [--skip-local-above N]`.
Timings on a shared machine are inflated; compare the ratios printed in the same run.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from oreline.config import DedupConfig
from oreline.data.dedup.minhash import FORMAT
from oreline.data.dedup.reference_plan import dedup_plan, split_by_file
from oreline.data.dedup.staged.layout import Partitions
from oreline.data.dedup.staged.plan import staged_plan

PER_FILE = 10_000
NUM_PERM = 128


def _block(f: int, seed: int) -> np.ndarray:
    return np.random.default_rng((seed, f)).integers(0, 2**32, size=(PER_FILE, NUM_PERM), dtype=np.uint64)


def write_files(folder: Path, docs: int, seed: int = 0) -> list[Path]:
    """Synthetic signature files; a file's base block is regenerated from (seed, file) when the
    next file copies from it, so memory stays at two blocks."""
    paths = []
    prev, prev_exact = None, None
    for f in range((docs + PER_FILE - 1) // PER_FILE):
        n = min(PER_FILE, docs - f * PER_FILE)
        rng = np.random.default_rng((seed, f, 1))
        sig = _block(f, seed)[:n].astype(np.uint32)
        exact = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
        src_block = sig if prev is None else prev
        kind = rng.random(n)
        for i in np.flatnonzero(kind < 0.10).tolist():
            from_prev = prev is not None and rng.random() < 0.5
            block = src_block if from_prev else sig
            j = int(rng.integers(0, len(block) if from_prev else max(1, i)))
            if not from_prev and j >= i:
                continue
            if kind[i] < 0.04:  # exact copy
                sig[i] = block[j]
                exact[i] = prev_exact[j] if from_prev else exact[j]
            else:  # near copy: redraw 10% (or, a third of the time, 30%) of the entries
                sig[i] = block[j]
                redraw = rng.random(NUM_PERM) < (0.3 if rng.random() < 0.33 else 0.1)
                sig[i, redraw] = rng.integers(0, 2**32, size=int(redraw.sum()), dtype=np.uint64).astype(
                    np.uint32
                )
        table = pa.table(
            {
                "doc_id": pa.array([f"doc-{f:05d}-{r:05d}" for r in range(n)], pa.string()),
                "source": pa.array([f"crawl/file-{f:05d}.warc.gz"] * n, pa.string()),
                "offset": pa.array(np.arange(n, dtype=np.int64) * 1000),
                "exact_hi": pa.array(exact[:, 0]),
                "exact_lo": pa.array(exact[:, 1]),
                "n_shingles": pa.array(rng.integers(20, 800, size=n).astype(np.int32)),
                "signature": pa.FixedSizeListArray.from_arrays(pa.array(sig.ravel()), NUM_PERM),
            }
        ).replace_schema_metadata(
            {"format": FORMAT, "num_perm": str(NUM_PERM), "shingle_words": "5", "seed": "1"}
        )
        path = folder / f"task-{f:05d}" / "signatures.parquet"
        path.parent.mkdir(parents=True)
        pq.write_table(table, path)
        paths.append(path)
        prev, prev_exact = sig, exact
    return paths


def in_child(fn, *args):
    """(result, peak RSS in MiB, CPU seconds) of fn(*args) run in a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            out = pickle.dumps(("ok", fn(*args)))
        except BaseException as exc:  # report, never return into the parent's code
            out = pickle.dumps(("error", repr(exc)))
        with os.fdopen(w, "wb") as fh:
            fh.write(out)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    _, status, ru = os.wait4(pid, 0)
    kind, result = pickle.loads(data)
    if kind != "ok":
        raise RuntimeError(f"child failed: {result}")
    return result, ru.ru_maxrss / 1024, ru.ru_utime + ru.ru_stime


class MeasuringExecutor:
    """One forked child per job, one at a time; records peak RSS and CPU per stage."""

    name = "measuring"

    def __init__(self):
        self.stages: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "rss": 0.0, "cpu": 0.0, "bytes": 0})

    def map(self, fn, jobs, *, label, resources=None):
        results = []
        for job in jobs:
            res, rss, cpu = in_child(fn, *job)
            st = self.stages[label]
            st["jobs"] += 1
            st["rss"] = max(st["rss"], rss)
            st["cpu"] += cpu
            st["bytes"] += int(res.get("bytes", 0)) if isinstance(res, dict) else 0
            results.append(res)
        return results


def local_run(paths: list[Path], out: Path, cfg: DedupConfig) -> dict:
    plan = dedup_plan(paths, out, cfg)
    ids = [pq.read_table(p, columns=["doc_id"]).column("doc_id").to_pylist() for p in paths]
    lists = split_by_file(plan, ids, list(range(len(paths))))
    return {"removed": len(plan), "listed": sum(len(x) for x in lists)}


def _noop() -> dict:
    return {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, action="append", help="documents (repeatable); default 1,000,000")
    ap.add_argument(
        "--skip-local-above", type=int, default=2_000_000, help="run the reference only up to this size"
    )
    ap.add_argument("--tmp", default=None, help="folder for the synthetic files (default: a temporary one)")
    args = ap.parse_args()
    cfg = DedupConfig(verify="signature")
    _, base_rss, _ = in_child(_noop)
    print(
        f"baseline (interpreter + numpy + pyarrow, empty job): {base_rss:.0f} MiB peak RSS; {os.cpu_count()} CPUs"
    )
    for docs in args.docs or [1_000_000]:
        tmp = Path(tempfile.mkdtemp(dir=args.tmp, prefix="oreline-dedup-scale-"))
        try:
            t0 = time.perf_counter()
            paths = write_files(tmp / "sig", docs)
            sig_bytes = sum(p.stat().st_size for p in paths)
            print(
                f"\n{docs:,} documents in {len(paths)} signature files ({sig_bytes / 2**20:,.0f} MiB), "
                f"written in {time.perf_counter() - t0:.0f} s; partitions {Partitions.for_docs(docs)}"
            )
            local = None
            if docs <= args.skip_local_above:
                t0 = time.perf_counter()
                res, rss, cpu = in_child(local_run, paths, tmp / "local", cfg)
                local = (rss, cpu)
                print(
                    f"local  : peak RSS {rss:,.0f} MiB ({(rss - base_rss) * 2**20 / docs:,.0f} bytes/doc above baseline), "
                    f"CPU {cpu:,.1f} s, wall {time.perf_counter() - t0:,.1f} s, removed {res['removed']:,}"
                )
            ex = MeasuringExecutor()
            t0 = time.perf_counter()
            stats = staged_plan(
                paths,
                tmp / "staged",
                cfg,
                ex,
                list_paths=[tmp / "lists" / f"{i}.json" for i in range(len(paths))],
            )
            wall = time.perf_counter() - t0
            removed = stats["exact_duplicates"] + stats["near_duplicates"]
            print(
                f"staged : wall {wall:,.1f} s, removed {removed:,} (exact {stats['exact_duplicates']:,}, near {stats['near_duplicates']:,}), "
                f"candidate pairs {stats['candidate_pairs']:,}, verified {stats['verified_pairs']:,}"
            )
            print(f"  {'stage':<24}{'jobs':>6}{'max job RSS MiB':>17}{'CPU s':>9}{'written MiB':>13}")
            for label, st in ex.stages.items():
                print(
                    f"  {label:<24}{st['jobs']:>6}{st['rss']:>17,.0f}{st['cpu']:>9,.1f}{st['bytes'] / 2**20:>13,.1f}"
                )
            peak = max(st["rss"] for st in ex.stages.values())
            cpu = sum(st["cpu"] for st in ex.stages.values())
            shuffled = sum(st["bytes"] for st in ex.stages.values())
            line = (
                f"  total: largest job {peak:,.0f} MiB, CPU {cpu:,.1f} s, written between stages "
                f"{shuffled / 2**20:,.0f} MiB ({shuffled / docs:,.0f} bytes/doc)"
            )
            if local:
                line += f"; vs local: peak memory {local[0] / peak:.1f}× lower per job, CPU {cpu / local[1]:.2f}× the local plan's"
            print(line)
            if local:
                same = stats == __import__("json").loads((tmp / "local" / "dedup_stats.json").read_text())
                print(f"  stats identical to the local plan's: {same}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        sys.stdout.flush()


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
