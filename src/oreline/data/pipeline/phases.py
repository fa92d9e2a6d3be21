"""The parts of a data run the synchronous driver (`run.py`) and the detached Slurm chain
(`chain.py`) share: the modules workers preload, the names the run writes, phase 2 (the dedup
plan over every task's signatures), and the end of a run (stats.json from the tasks' stats,
clean-up of temporary names, `_SUCCESS` when every task finished)."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

import oreline.storage as storage
from oreline.config import Config
from oreline.data.filters.quality import LineRemovals
from oreline.data.pipeline.runner import merge_step_stats
from oreline.data.pipeline.tasks import phase1_dir, phase1_files, phase3_marker, task_name
from oreline.executors import make_executor
from oreline.io import write_json_atomic
from oreline.outdir import LOCK, OWNER, is_temp_of, remove_listed, remove_tree

STATS_VERSION = 1

# Modules a local pool's forkserver imports once, so each worker starts in milliseconds with the
# step modules and their C extensions (pyarrow, resiliparse, fastText, numpy) already loaded.
PRELOAD = [
    "oreline.data.pipeline.tasks",
    "oreline.data.pipeline.runner",
    "oreline.data.pipeline.steps",
    "oreline.data.read.shards",
    "oreline.data.read.warc",
    "oreline.data.read.record",
    "oreline.data.filters.extract",
    "oreline.data.filters.normalize",
    "oreline.data.filters.langid",
    "oreline.data.filters.quality",
    "oreline.data.filters.protocol",
    "oreline.data.dedup.minhash",
    "oreline.data.dedup.staged.plan",
    "oreline.data.filters.chunk",
    "resiliparse.extract.html2text",
    "fasttext",
    "pandas",  # pyarrow imports it on first pa.array() when installed (0.6 s); missing ones are skipped
]

# every top-level name `oreline data` writes, and the shard names of docs/ and rejects/
DATA_NAMES = re.compile(
    r"docs|rejects|work|stats\.json|_SUCCESS|fingerprint\.json|config\.toml|"
    + re.escape(OWNER)
    + "|"
    + re.escape(LOCK)
)

SHARD_NAME = re.compile(r"part-\d{5}-\d{3}\.parquet")


def jobs_left(tasks: list[tuple[int, Path, str]], done) -> list[int]:
    return [i for i, _, _ in tasks if not done(i)]


def finish(
    out: Path,
    tasks,
    finished,
    unknown,
    unreadable,
    crashes,
    dedup_stats,
    ppl_stats,
    workers,
    fp,
    t_start,
    extra=(),
    classifier_stats=None,
) -> dict[str, Any]:
    """Merge the tasks' stats into stats.json; when every task finished, clean up and write _SUCCESS."""
    work = out / "work"
    stats = merge_stats(work, tasks, finished, unknown, crashes, dedup_stats, workers, fp)
    stats["errors"] = unreadable + stats["errors"] + list(extra)  # input folders that could not be listed
    if ppl_stats is not None:
        stats["perplexity"] = ppl_stats
    if classifier_stats is not None:
        stats["classifier"] = classifier_stats
    stats["seconds"] = round(time.perf_counter() - t_start, 3)
    write_json_atomic(out / "stats.json", stats)
    if not crashes and not extra and len(finished) == len(tasks):
        for t in finished:  # the final shards hold everything; drop the intermediate copies
            for p in phase1_files(work, t[0], "kept-") + phase1_files(work, t[0], "rejects-"):
                storage.remove(p)
        remove_wrecks(out)
        write_json_atomic(out / "_SUCCESS", {"data": fp, "docs": stats["output"]["docs"]})
    return stats


def remove_wrecks(out: Path) -> None:
    """Delete the temporary files killed attempts left: each output is written under a temporary
    form of its final name and renamed, so such a name in a finished run is garbage. Only those
    exact forms, of the names this command writes, are deleted (see the module docstring)."""

    def wrecks(folder: Path, final) -> list[str]:
        return [p.name for p in folder.iterdir() if is_temp_of(p.name, final)] if folder.is_dir() else []

    remove_listed(out, wrecks(out, DATA_NAMES))
    for sub in ("docs", "rejects"):
        remove_listed(out / sub, wrecks(out / sub, SHARD_NAME))
    work = out / "work"  # oreline's own folder (never adopted: --force refuses a folder that has one)
    for folder in (
        sorted((p for p in work.rglob("*") if p.is_dir()), reverse=True) + [work] if work.is_dir() else []
    ):
        if folder.exists():
            remove_listed(folder, wrecks(folder, lambda name: not name.startswith(".")))


def dedup_phase(work: Path, finished: list[tuple[int, Path, str]], cfg: Config, executor) -> dict[str, Any]:
    """Phase 2: the staged dedup plan (dedup/staged/plan.py) over every task's signatures, as jobs on the
    run's executor; its last stage writes each task's removal list."""
    ddir = work / "dedup"
    marker = ddir / "DONE"
    if marker.is_file():
        return json.loads(marker.read_text())
    from oreline.data.dedup.staged.plan import staged_plan

    t0 = time.perf_counter()
    signed = [i for i, _, _ in finished if (phase1_dir(work, i) / "signatures.parquet").is_file()]
    # the dedup survivor order puts sources first: a record id found in several files stays in the
    # first file by input path
    by_path = {i: r for r, (i, _, _) in enumerate(sorted(finished, key=lambda t: str(t[1])))}
    stats: dict[str, Any] = {}
    if signed:
        sig_paths = [phase1_dir(work, i) / "signatures.parquet" for i in signed]
        stats = staged_plan(
            sig_paths,
            ddir,
            cfg,
            plan_executor(executor, sig_paths),
            # exact verification re-reads only the candidates' texts from the phase-1 kept shards
            text_files=[
                p for i, _, _ in sorted(finished) for p in sorted(phase1_dir(work, i).glob("kept-*.parquet"))
            ],
            list_paths=[ddir / f"{task_name(i)}.json" for i in signed],
            keeper_order=[by_path[i] for i in signed],
        )
    for i, _, _ in finished:
        if not (ddir / f"{task_name(i)}.json").is_file():
            write_json_atomic(ddir / f"{task_name(i)}.json", {})
    stats["seconds"] = round(time.perf_counter() - t0, 6)
    write_json_atomic(marker, stats)
    remove_tree(work.parent, ddir / "stages")  # the lists and removals.parquet hold the result
    return stats


INLINE_PLAN_DOCS = 50_000


def plan_executor(executor, sig_paths: list[Path]):
    """The local pool runs a plan of fewer than INLINE_PLAN_DOCS documents in this process (the same
    job functions, one at a time, writing the same files): its stages then cost less than
    starting a pool for them (the demo's 17 bucket jobs: measured in docs/design.md), and each job's
    memory is bounded by the plan's size. Ray and Slurm keep every stage, whatever its size, so
    their runs exercise the same scheduling at every scale."""
    if executor.name != "local":
        return executor
    docs = sum(pq.ParquetFile(p).metadata.num_rows for p in sig_paths)
    return (
        make_executor("local", workers=1, console=executor.console) if docs < INLINE_PLAN_DOCS else executor
    )


def merge_stats(work: Path, tasks, finished, unknown, crashes, dedup_stats, workers, fp) -> dict[str, Any]:
    p1 = [json.loads((phase1_dir(work, i) / "stats.json").read_text()) for i, _, _ in finished]
    p3 = [
        json.loads(phase3_marker(work, i).read_text())
        for i, _, _ in finished
        if phase3_marker(work, i).is_file()
    ]
    steps = merge_step_stats([s["steps"] for s in p1]) + merge_step_stats([s["steps"] for s in p3])
    for st in steps:
        if st["name"] == "dedup":  # signatures (phase 1) and the plan (phase 2) are dedup's work too
            st["seconds"] = round(
                st["seconds"] + sum(s["signature_seconds"] for s in p1) + dedup_stats.get("seconds", 0.0), 6
            )
    normalize_removed: Counter = Counter()
    extract_paths: dict[str, dict[str, float]] = {}
    errors: list[dict[str, Any]] = []
    files: dict[str, Any] = {}
    line_filters: dict[str, LineRemovals] = {}
    for s in p1:
        normalize_removed.update(s["normalize_removed"])
        for rule_step, counts in s.get("line_filters", {}).items():
            line_filters.setdefault(rule_step, LineRemovals()).add(counts)
        for path, v in s.get("extract_paths", {}).items():
            entry = extract_paths.setdefault(path, {"docs": 0, "seconds": 0.0})
            entry["docs"] += v["docs"]
            entry["seconds"] = round(entry["seconds"] + v["seconds"], 6)
        errors.extend(s["errors"])
        files[s["file"]] = s["input"]
    # every task's job starts with its index (phase 1: (i, input, kind, ...), phase 3: (i, work, out,
    # cfg)): the user is told the input file, never the work folder
    inputs = {i: str(path) for i, path, _ in tasks}
    for c in crashes:
        errors.append(
            {"file": inputs.get(c.args[0], "?") if c.args else "?", "offset": None, "error": c.error}
        )
    output = {
        "docs": sum(s["output"]["docs"] for s in p3),
        "bytes": sum(s["output"]["bytes"] for s in p3),
        "shards": sorted(f"docs/{n}" for s in p3 for n in s["output"]["shards"]),
        "reject_shards": sorted(f"rejects/{n}" for s in p3 for n in s["output"]["reject_shards"]),
    }
    by_type: Counter = Counter()
    for info in files.values():
        by_type.update(info.get("by_type", {}))
    text_field = text_field_summary(files)
    return {
        "version": STATS_VERSION,
        "fingerprint": fp,
        "steps": steps,
        "inputs": {
            "files": files,
            "unknown": [{"file": str(u), "reason": "unknown kind (suffix)"} for u in unknown],
            "tasks": len(tasks),
            "tasks_finished": len(p3),
            "records": sum(i.get("records", 0) for i in files.values()),
            "bytes": sum(i.get("bytes", 0) for i in files.values()),
            "record_types": dict(by_type),
            "revisits": sum(i.get("revisits", 0) for i in files.values()),
            **({"text_field": text_field} if text_field else {}),
        },
        "errors": errors,
        "warnings": [w for w in [text_field_warning(text_field)] if w],
        "normalize_removed": dict(normalize_removed),
        "line_filters": {k: v.as_dict() for k, v in line_filters.items()},
        "extract_paths": extract_paths,
        "dedup": dedup_stats,
        "output": output,
        "workers": workers,
        "pid": os.getpid(),
    }


def text_field_summary(files: dict[str, Any]) -> dict[str, Any] | None:
    """The text-key counts of the JSONL/Parquet inputs together (their `text_field`s, see
    data/read/inputs.py TextFieldCounts); None when there were none."""
    per = [info["text_field"] for info in files.values() if "text_field" in info]
    if not per:
        return None
    fields: Counter = Counter()
    for tf in per:
        fields.update(tf["fields"])
    records = sum(tf["records"] for tf in per)
    missing = sum(tf["missing"] for tf in per)
    empty = sum(tf["empty"] for tf in per)
    return {
        "key": per[0]["key"],
        "files": len(per),
        "files_missing": sum(1 for tf in per if tf["missing"]),
        "records": records,
        "with_text": records - missing - empty,
        "missing": missing,
        "empty": empty,
        "fields": dict(sorted(fields.items(), key=lambda kv: (-kv[1], kv[0]))[:20]),
    }


def describe_missing_text(tf: dict[str, Any]) -> str:
    """'4 of 5 JSONL/Parquet records (in 1 of 2 files) have no text under 'text'
    (data.read.jsonl_text_key); those records hold the fields 'content' (4), 'id' (4)'."""
    fields = ", ".join(f"{k!r} ({n:,})" for k, n in list(tf["fields"].items())[:10])
    return (
        f"{tf['missing']:,} of {tf['records']:,} JSONL/Parquet records (in {tf['files_missing']:,} of "
        f"{tf['files']:,} files) have no text under {tf['key']!r} (data.read.jsonl_text_key)"
        + (f"; those records hold the fields {fields}" if fields else "")
    )


def text_field_warning(tf: dict[str, Any] | None) -> str | None:
    """A warning when most JSONL/Parquet records lacked the text key: a wrong key keeps the few
    records that happen to have it and drops the rest, with no error."""
    if not tf or tf["missing"] * 2 <= tf["records"]:
        return None
    return (
        describe_missing_text(tf) + ": they were dropped as read:no_text (kept in rejects/); if the text is "
        "under another field, run again with data.read.jsonl_text_key=FIELD into a new --out folder"
    )
