"""The CCNet cut-off phase of `oreline data`, between phases 1 and 3 (bucket mode: no `perplexity_max`).

The cut-offs (p30 and p60) come from a deterministic sample of this run's own phase-1 survivors:
each task draws its bottom-k sample (the k smallest hashes of document ids; `task_sample`, a job
on the run's executor) and the driver merges them one at a time (bottom-k samples are mergeable),
so the sample does not depend on task order or worker count and memory is 2·k pairs. The result
is written to work/perplexity/cutoffs.json (the phase's marker) and to stats.json "perplexity";
phase 3 applies it with `oreline.data.filters.perplexity.bucket_step`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from oreline.data.filters.ngram_scorer import reference_fingerprint
from oreline.data.filters.perplexity import bucket_mode

BUCKET_PERCENTILES = (30, 60)  # CCNet: head below the 30th, tail above the 60th percentile


def cutoffs_path(work: Path) -> Path:
    return Path(work) / "perplexity" / "cutoffs.json"


def perplexity_phase(work: Path, task_dirs: list[Path], cfg, executor=None) -> dict[str, Any] | None:
    """The global phase between 1 and 3: stats.json's "perplexity" (bucket cut-offs or the absolute cut-off).

    The cut-offs' sample is drawn per task, as jobs on `executor` (the run's; inline without one),
    and merged here one task's sample at a time: memory 2·k pairs, whatever the number of tasks."""
    q = cfg.data.quality
    if not (q.enabled and q.perplexity_model):
        return None
    if not bucket_mode(cfg):
        return {
            "mode": "max",
            "perplexity_max": q.perplexity_max,
            "model": q.perplexity_model,
            "model_fingerprint": reference_fingerprint(_expand(q.perplexity_model)),
        }
    out_file = cutoffs_path(work)
    if out_file.is_file():
        return json.loads(out_file.read_text())
    t0 = time.perf_counter()
    scored, sample = run_sample(task_dirs, out_file.parent / "samples", q.perplexity_sample_docs, executor)
    return _write_cutoffs(scored, sample, out_file, cfg, t0)


def run_sample(
    task_dirs: list[Path],
    folder: Path,
    k: int,
    executor=None,
    column: str = "perplexity",
    label: str = "perplexity",
) -> tuple[int, list[tuple[int, float]]]:
    """(scored documents, bottom-k sample of `column`) over the kept files of the phase-1 task
    folders: one `task_sample` job per task on `executor` (inline without one), each writing its
    sample under `folder`, merged here one task at a time (memory 2·k pairs)."""
    jobs = [
        (
            [str(p) for p in sorted(Path(d).glob("kept-*.parquet"))],
            str(folder / f"{Path(d).name}.json"),
            k,
            column,
        )
        for d in task_dirs
    ]
    if executor is None:
        results = [task_sample(*job) for job in jobs]
    else:
        from oreline.executors.interface import TaskCrashed

        results = executor.map(task_sample, jobs, label=f"{label} sample")
        crashed = [r for r in results if isinstance(r, TaskCrashed)]
        if crashed:
            from oreline.errors import DataIntegrityError

            raise DataIntegrityError(
                f"{len(crashed)} {label} sample job(s) crashed their worker twice ({crashed[0].error})",
                "run the same command again: finished jobs are kept and the crashed ones retried",
            )
    sample: list[tuple[int, float]] = []
    for r in results:
        sample = merge_bottom_k(sample, read_sample(r["path"]), k)
    return sum(r["scored"] for r in results), sample


def _sample_key(doc_id: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
    )


def merge_bottom_k(a: list[tuple[int, float]], b: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    """The k smallest (key, perplexity) of two samples: bottom-k samples merge into the bottom-k of the union."""
    import heapq

    return heapq.nsmallest(k, a + b)


def bottom_k(
    kept_files: list[str] | list[Path], k: int, column: str = "perplexity"
) -> tuple[int, list[tuple[int, float]]]:
    """(scored documents, their k smallest (hash of id, score)) over some kept files.

    A bottom-k sample: uniform, independent of task order and worker count, memory bounded by k,
    and mergeable (`merge_bottom_k`), so each task draws its own and the driver merges them.
    `column`: the score's flat column (perplexity; quality_score for the classifier's cut-off)."""
    import heapq

    import pyarrow.parquet as pq

    heap: list[tuple[int, float]] = []  # max-heap by (key, ppl), negated: the k smallest seen
    seen = 0
    for path in kept_files:
        table = pq.read_table(path, columns=["id", column])
        for doc_id, ppl in zip(table.column("id").to_pylist(), table.column(column).to_pylist(), strict=True):
            if ppl is None or not math.isfinite(ppl):
                continue
            seen += 1
            item = (-_sample_key(doc_id), -ppl)
            if len(heap) < k:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)
    return seen, sorted((-key, -ppl) for key, ppl in heap)


def task_sample(kept_files: list[str], out: str, k: int, column: str = "perplexity") -> dict[str, Any]:
    """Job: one task's bottom-k sample of `column`, written to `out` (skipped when it exists)."""
    path = Path(out)
    if path.is_file():
        return {"scored": json.loads(path.read_text())["scored"], "path": out}
    seen, sample = bottom_k(kept_files, k, column)
    from oreline.io import write_json_atomic

    write_json_atomic(path, {"scored": seen, "sample": [list(x) for x in sample]})
    return {"scored": seen, "path": out}


def read_sample(path: str) -> list[tuple[int, float]]:
    return [(int(key), float(ppl)) for key, ppl in json.loads(Path(path).read_text())["sample"]]


def compute_cutoffs(kept_files: list[Path], out_file: Path, cfg) -> dict[str, Any]:
    """Cut-offs of the head/middle/tail buckets from a deterministic sample of these documents.

    The sample is the `perplexity_sample_docs` scored documents with the smallest hash of their
    id (ties: the smaller perplexity), so it does not depend on the files' order. Written once to
    `out_file` (the phase's marker) and returned for stats.json. One process; the pipeline draws
    the same sample per task and merges (`perplexity_phase`)."""
    if out_file.is_file():
        return json.loads(out_file.read_text())
    t0 = time.perf_counter()
    seen, sample = bottom_k(kept_files, cfg.data.quality.perplexity_sample_docs)
    return _write_cutoffs(seen, sample, out_file, cfg, t0)


def _write_cutoffs(
    seen: int, sample: list[tuple[int, float]], out_file: Path, cfg, t0: float
) -> dict[str, Any]:
    values = np.array([p for _, p in sample])
    lo, hi = BUCKET_PERCENTILES
    result = {
        "mode": "buckets",
        "percentiles": [lo, hi],
        "scored_docs": seen,
        "sample_docs": int(values.size),
        "cutoffs": [float(np.percentile(values, lo)), float(np.percentile(values, hi))]
        if values.size
        else None,
        "sample_median": float(np.median(values)) if values.size else None,
        "keep": list(cfg.data.quality.perplexity_keep_buckets),
        "model": cfg.data.quality.perplexity_model,
        "model_fingerprint": reference_fingerprint(_expand(cfg.data.quality.perplexity_model)),
        "seconds": round(time.perf_counter() - t0, 6),
    }
    from oreline.io import write_json_atomic

    write_json_atomic(out_file, result)
    return result


def _expand(path: str) -> str:
    from oreline.config import expand

    return expand(path)


def cutoff_line(info: dict[str, Any]) -> str:
    """The funnel's line about the perplexity cut-off(s) of the run."""
    if info.get("mode") == "max":
        return f"perplexity: documents above {info['perplexity_max']:g} per word dropped (data.quality.perplexity_max)"
    if not info.get("cutoffs"):
        return f"perplexity buckets: no scored documents in the sample ({info.get('scored_docs', 0)} scored)"
    a, b = info["cutoffs"]
    lo, hi = info["percentiles"]
    return (
        f"perplexity buckets (CCNet, p{lo}/p{hi} of a sample of {info['sample_docs']:,} of this run's "
        f"{info['scored_docs']:,} scored docs): head ≤ {a:,.1f} < middle ≤ {b:,.1f} < tail; kept: {', '.join(info['keep'])}"
    )
