"""`oreline data`: input files → clean, deduplicated Parquet shards, with a funnel of every step.

Steps, in order, each switchable by its config section:

    read → protocol → extract (HTML only) → normalize → langid → quality (one step per rule,
    then the perplexity filter when `data.quality.perplexity_model` is set) → dedup (exact +
    MinHash, global) → chunk (off by default) → Parquet shards

The run has three phases over tasks (one task per input file, in a deterministic order):

1. per task, in parallel: read → … → quality, writing the kept documents, rejects, stats and
   dedup signatures, then a completion marker (`tasks.run_phase1`);
2. global, as stages of jobs on the same executor: the dedup plan over all signature files
   (`dedup/staged/plan.py` `staged_plan`: exact, LSH buckets, verification, components; no job holds
   every document), ending in one removal list per task; with a perplexity model and no
   `perplexity_max`, the CCNet bucket cut-offs from per-task bottom-k samples of the run's own
   scored documents, merged here (`perplexity.perplexity_phase`, stats.json "perplexity");
3. per task, in parallel: drop the removals, chunk, write `docs/part-NNNNN-KKK.parquet` and
   `rejects/part-NNNNN-KKK.parquet`, then a marker (`tasks.run_phase3`).

With `data.executor = "slurm"` and `data.slurm.detach` (`--detach`) the driver submits the three
phases as a chain of Slurm jobs and returns (see "the detached Slurm chain" below).

Output folder: `docs/`, `rejects/` (every dropped document with step, reason, id, url, source
and truncated text), `stats.json` (the funnel), `config.toml` + `fingerprint.json`, `work/`
(per-task markers, stats and signatures; its intermediate documents are deleted at the end)
and `_SUCCESS`. Re-running the same command resumes: finished phases and tasks are skipped by
their markers and the output is exactly that of an uninterrupted run. A folder written with a
different data config or other inputs is refused (FingerprintMismatch).

Ownership and clean-up (`oreline.outdir`): the first file written into the output folder is
`.oreline-owner` (kind "data"); a non-empty folder without it is refused (a data run written by an
oreline version without the marker is recognised by its fingerprint.json, section "data"). With
`force=True` a non-empty folder is used as long as none of its top-level names is one this command
writes (`DATA_NAMES`). While it runs, the command holds the folder's lock `.oreline-lock`: a second
`oreline data` into the same folder is refused, naming the holder. The end-of-run clean-up deletes
only oreline's own temporary names (`.NAME.tmp-PID` of a shard, `.NAME.XXXXXXXX` of an atomic JSON
write) of the files this command writes, and the intermediate documents under `work/`; nothing
else in the folder is touched, hidden or not.

The funnel (`stats.json`): `steps` lists name, docs_in, docs_out, bytes_in, bytes_out, seconds
and dropped {reason: count} per step, with docs_out of step k equal to docs_in of step k+1;
`inputs` has per-file facts (records, record types, revisits, bytes) and the files of unknown
kind; `errors` lists each damaged span of an input (WARC damage is skipped to the next readable
record): `{file, offset (in the file), skipped_bytes, reason, error, record_id when known}`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

import oreline.storage as storage
from oreline.config import EXECUTION_KEYS, Config, expand, fingerprint, to_dict, write_resolved
from oreline.data.pipeline.runner import merge_step_stats
from oreline.data.pipeline.tasks import (
    dedup_enabled,
    phase1_dir,
    phase1_files,
    phase3_marker,
    remove_stale_attempts,
    run_phase1,
    run_phase3,
    task_name,
)
from oreline.data.read.inputs import KINDS, discover_inputs, input_kind
from oreline.errors import (
    ConfigError,
    DataIntegrityError,
    DiskFull,
    FingerprintMismatch,
    InputError,
    disk_full_cause,
)
from oreline.executors import make_executor
from oreline.executors.interface import TaskCrashed
from oreline.io import write_json_atomic
from oreline.outdir import (
    LOCK,
    OWNER,
    FolderLock,
    claim_folder,
    is_data_run,
    is_temp_of,
    remove_listed,
    remove_tree,
)

STATS_VERSION = 1

# Modules a local pool's forkserver imports once, so each worker starts in milliseconds with the
# step modules and their C extensions (pyarrow, resiliparse, fastText, numpy) already loaded.
PRELOAD = [
    "oreline.data.pipeline.tasks",
    "oreline.data.pipeline.runner",
    "oreline.data.pipeline.steps",
    "oreline.data.read.shards",
    "oreline.data.read.warc",
    "oreline.data.filters.extract",
    "oreline.data.filters.normalize",
    "oreline.data.filters.langid",
    "oreline.data.filters.quality",
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


def data_fingerprint(cfg: Config, files: list[tuple[Path, str]]) -> str:
    """What decides the output: the data settings (not where or on how many workers tasks run)
    and the input files."""
    data = to_dict(cfg.data)
    for key in (*EXECUTION_KEYS, "inputs", "extra_inputs"):
        data.pop(key, None)
    listed = [[str(p), kind, storage.size(p)] for p, kind in files]
    if cfg.data.extract.enabled and cfg.data.extract.extractor == "pruned":
        # retrained boilerplate selectors are another run
        from oreline.data.filters.boilerplate import selectors_sha256

        data["extract"]["selectors_sha256"] = selectors_sha256()
    if cfg.data.quality.perplexity_model:  # a retrained reference model is another run
        from oreline.data.filters.perplexity import reference_fingerprint

        data["quality"]["perplexity_model_fingerprint"] = reference_fingerprint(
            expand(cfg.data.quality.perplexity_model)
        )
    return fingerprint({"data": data, "inputs": listed})


def _check_or_write_fingerprint(out: Path, cfg: Config, fp: str, files: list[tuple[Path, str]]) -> None:
    fp_path = out / "fingerprint.json"
    if fp_path.is_file():
        try:
            old = json.loads(fp_path.read_text()).get("data")
        except json.JSONDecodeError:
            old = None
        if old == fp:
            return
        raise FingerprintMismatch(
            f"{out} holds a data run with other settings or inputs (data fingerprint {str(old)[:12]}…, this run {fp[:12]}…)",
            f"use a new --out folder, or delete {out} to start over",
        )
    out.mkdir(parents=True, exist_ok=True)
    config_fp = write_resolved(cfg, out, section="data")
    write_json_atomic(
        fp_path, {"config": config_fp, "section": "data", "data": fp, "inputs": [str(p) for p, _ in files]}
    )


def _jobs_left(tasks: list[tuple[int, Path, str]], done) -> list[int]:
    return [i for i, _, _ in tasks if not done(i)]


def run_data(
    inputs: list[str] | list[Path],
    out_dir: str | Path,
    cfg: Config,
    workers: int | None = None,
    console: Console | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Run the data pipeline over `inputs` into `out_dir`; returns the stats (also in stats.json).

    With workers > 1 the tasks run in forkserver processes, which import the caller's main
    module: a script that calls this must guard its top level with `if __name__ == "__main__":`.
    `force` writes into a non-empty folder oreline did not create (see the module docstring).
    """
    t_start = time.perf_counter()
    out = Path(out_dir)
    console = console or Console(stderr=True)
    if cfg.data.slurm.detach and cfg.data.executor != "slurm":
        raise ConfigError(
            f"data.slurm.detach (--detach) submits a chain of Slurm jobs, but data.executor is {cfg.data.executor!r}",
            "add --executor slurm (data.executor = 'slurm'), or drop --detach",
        )
    workers = max(1, int(workers or cfg.data.workers))
    unreadable: list[dict[str, Any]] = []
    items = [expand(str(i)) for i in inputs]  # {samples} in config inputs
    paths = [i for i in items if not storage.is_url(i)]
    files, unknown = discover_inputs(paths, errors=unreadable) if paths else ([], [])
    url_files, url_unknown = _discover_urls([i for i in items if storage.is_url(i)])
    files, unknown = files + url_files, unknown + url_unknown
    if not files:
        raise InputError(
            f"no readable input among {len(unknown)} file(s) given ({', '.join(str(u) for u in unknown[:3])})",
            "pass files ending in " + " ".join(s for group in KINDS.values() for s in group),
        )
    try:
        claim_folder(
            out, "data", "oreline data", force=force, reserved=DATA_NAMES.fullmatch, legacy=is_data_run
        )
        with FolderLock(out, "oreline data"):
            return _run_data(files, unknown, unreadable, out, cfg, workers, console, t_start)
    except Exception as exc:  # a full disk, wherever it struck (a worker's error arrives wrapped)
        full = disk_full_cause(exc)
        if full is None:
            raise
        raise _disk_full(out, full, sum(_size(f) for f, _ in files)) from None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # (an object-store URL)
        return 0


def _disk_full(out: Path, exc: OSError, input_bytes: int) -> DiskFull:
    """A full disk as one error (a worker's arrives wrapped in the pool's exceptions): the folder,
    the room there and the fix; the run resumes from its finished tasks when started again."""
    import shutil

    try:
        free = f"{shutil.disk_usage(out).free / 2**20:.1f} MB free"
    except OSError:
        free = "free space unknown"
    size = f"; the inputs total {input_bytes / 2**20:.1f} MB" if input_bytes else ""
    return DiskFull(
        f"no space left on the device of {out} while writing {exc.filename or 'the output'} ({free}{size})",
        "free space there or pass another --out, then run the same `oreline data` command again: it "
        "continues from the tasks that finished",
    )


def _discover_urls(urls: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Inputs on an object store (fsspec URLs): each URL, the files under it, or a glob's matches."""
    files: list[tuple[str, str]] = []
    unknown: list[str] = []
    seen: set[str] = set()
    for url in urls:
        found = storage.find(url)
        if not found:
            raise InputError(
                f"input {url!r} names no object",
                "check the URL (and the credentials of its store, e.g. AWS_* for s3://)",
            )
        for f in found:
            if f in seen:
                continue
            seen.add(f)
            kind = input_kind(f)
            if kind is None:
                unknown.append(f)
            else:
                files.append((f, kind))
    return files, unknown


def _run_data(
    files, unknown, unreadable, out: Path, cfg: Config, workers: int, console: Console, t_start: float
) -> dict[str, Any]:
    work = out / "work"
    fp = data_fingerprint(cfg, files)
    _check_or_write_fingerprint(out, cfg, fp, files)
    if (out / "_SUCCESS").is_file() and (out / "stats.json").is_file():
        return json.loads((out / "stats.json").read_text())
    tasks = [(i, p, kind) for i, (p, kind) in enumerate(files)]
    # a detached chain writes this folder from its jobs, after its driver has let go of the lock:
    # no run of any executor may write beside it
    if cfg.data.executor == "slurm" or (work / "slurm" / CHAIN).is_file():
        _check_no_chain_running(out)
    if cfg.data.executor == "slurm" and cfg.data.slurm.detach:
        return _submit_chain(tasks, unknown, unreadable, out, cfg, workers, console, fp)
    executor = make_executor(
        cfg.data.executor,
        workers=workers,
        preload=PRELOAD,
        console=console,
        ray=cfg.data.ray,
        slurm=cfg.data.slurm,
        work=work,
    )

    # phase 1: read → filters → signatures, one task per file
    left = _jobs_left(tasks, lambda i: (phase1_dir(work, i) / "DONE").is_file())
    jobs = [(i, str(tasks[i][1]), tasks[i][2], str(work), cfg) for i in left]
    crashes = [r for r in executor.map(run_phase1, jobs, label="filter") if isinstance(r, TaskCrashed)]
    finished = [t for t in tasks if (phase1_dir(work, t[0]) / "DONE").is_file()]
    # folders of killed or beaten attempts of the finished tasks (their markers name another one)
    remove_stale_attempts(work, [i for i, _, _ in finished])

    # phase 2: the global dedup plan, split per task
    dedup_stats = _dedup_phase(work, finished, cfg, executor) if dedup_enabled(cfg) else {}
    ppl_stats = None  # and the perplexity cut-offs from a sample of this run's own documents
    if cfg.data.quality.perplexity_model:
        from oreline.data.filters.perplexity import perplexity_phase

        ppl_stats = perplexity_phase(work, [phase1_dir(work, i) for i, _, _ in finished], cfg, executor)

    # phase 3: drop removals, chunk, write the shards
    left = _jobs_left(finished, lambda i: phase3_marker(work, i).is_file())
    jobs = [(i, str(work), str(out), cfg) for i in left]
    crashes += [r for r in executor.map(run_phase3, jobs, label="write") if isinstance(r, TaskCrashed)]

    return _finish(
        out, tasks, finished, unknown, unreadable, crashes, dedup_stats, ppl_stats, workers, fp, t_start
    )


def _finish(
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
) -> dict[str, Any]:
    """Merge the tasks' stats into stats.json; when every task finished, clean up and write _SUCCESS."""
    work = out / "work"
    stats = _merge_stats(work, tasks, finished, unknown, crashes, dedup_stats, workers, fp)
    stats["errors"] = unreadable + stats["errors"] + list(extra)  # input folders that could not be listed
    if ppl_stats is not None:
        stats["perplexity"] = ppl_stats
    stats["seconds"] = round(time.perf_counter() - t_start, 3)
    write_json_atomic(out / "stats.json", stats)
    if not crashes and not extra and len(finished) == len(tasks):
        for t in finished:  # the final shards hold everything; drop the intermediate copies
            for p in phase1_files(work, t[0], "kept-") + phase1_files(work, t[0], "rejects-"):
                storage.remove(p)
        _remove_wrecks(out)
        write_json_atomic(out / "_SUCCESS", {"data": fp, "docs": stats["output"]["docs"]})
    return stats


# ---------------------------------------------------------------------------------------------
# the detached Slurm chain (data.executor = "slurm", data.slurm.detach = true / --detach)
#
# The driver submits the three phases as jobs and returns: phase 1 as an array job (one index per
# task or pack), the global stage (dedup plan and perplexity cut-offs) as one job `afterok` that
# array, which maps its own stages through the Slurm executor synchronously from inside the job,
# phase 3 as an array job `afterok` the global job, all with --kill-on-invalid-dep=yes: a task
# that fails for good cancels every job after it, so nothing global runs over a partial phase 1.
# A last job, `afterany` all of them, merges the stats: it lists each task that did not finish
# with its input, its array task and log file, and the command that resumes, and writes
# _SUCCESS only when everything finished. The same task functions write the same markers as the
# synchronous run, so the resume (the same command again) submits only what is missing, and the
# output is the local run's byte for byte. The job ids go to work/slurm/chain.json, so a second
# submission while a chain still runs is refused.

CHAIN = "chain.json"


def _check_no_chain_running(out: Path) -> None:
    from oreline.errors import ClusterError
    from oreline.executors.slurm import queued

    path = out / "work" / "slurm" / CHAIN
    if not path.is_file():
        return
    job_ids = json.loads(path.read_text())["job_ids"]
    try:
        left = queued(job_ids)
    except ClusterError as exc:
        raise ClusterError(
            f"{out} was last written by a detached Slurm chain (jobs {', '.join(job_ids)}), and its queue "
            f"cannot be checked from here: {exc.args[0] if exc.args else exc}",
            f"run this where squeue works, or, if those jobs have ended, delete {path} and run again",
        ) from exc
    if left:
        raise ClusterError(
            f"the jobs of an earlier `oreline data --detach` into {out} are still in the queue "
            f"({', '.join(sorted(left))})",
            "wait until they end (squeue), or scancel them, then run the command again",
        )


def _submit_chain(
    tasks, unknown, unreadable, out: Path, cfg: Config, workers: int, console: Console, fp: str
):
    from oreline.executors.interface import Resources
    from oreline.executors.slurm import SlurmExecutor, _rerun_hint

    work = out / "work"
    s = cfg.data.slurm
    ex = SlurmExecutor(s, work=work, console=console)
    stage = {"resources": Resources(cpus=s.stage_cpus or workers), "time_limit": s.stage_time_limit}
    left1 = _jobs_left(tasks, lambda i: (phase1_dir(work, i) / "DONE").is_file())
    filt = (
        ex.submit(
            run_phase1, [(i, str(tasks[i][1]), tasks[i][2], str(work), cfg) for i in left1], label="filter"
        )
        if left1
        else None
    )
    dedup = ex.submit(
        run_chain_stage,
        [("dedup", str(out), tasks, cfg, workers, {})],
        label="dedup",
        after=filt.job_ids if filt else (),
        **stage,
    )
    left3 = _jobs_left(tasks, lambda i: phase3_marker(work, i).is_file())
    write = (
        ex.submit(
            run_phase3, [(i, str(work), str(out), cfg) for i in left3], label="write", after=dedup.job_ids
        )
        if left3
        else None
    )
    resume = _rerun_hint()
    record = {
        "fp": fp,
        "unknown": [str(u) for u in unknown],
        "unreadable": unreadable,
        "resume": resume,
        "dedup": {"task": dedup.tasks[0], "log": dedup.logs[0]},
        "filter": {i: {"task": t, "log": g} for i, t, g in zip(left1, filt.tasks, filt.logs, strict=True)}
        if filt
        else {},
        "write": {i: {"task": t, "log": g} for i, t, g in zip(left3, write.tasks, write.logs, strict=True)}
        if write
        else {},
    }
    before = [*(filt.job_ids if filt else []), *dedup.job_ids, *(write.job_ids if write else [])]
    merge = ex.submit(
        run_chain_stage,
        [("merge", str(out), tasks, cfg, workers, record)],
        label="merge",
        after=before,
        after_any=True,
        **stage,
    )
    jobs = {j.label: j.job_ids for j in (filt, dedup, write, merge) if j is not None}
    job_ids = [i for ids in jobs.values() for i in ids]
    write_json_atomic(work / "slurm" / CHAIN, {"job_ids": job_ids, "jobs": jobs})
    console.print(
        "submitted: "
        + " → ".join(f"{label} {', '.join(ids)}" for label, ids in jobs.items())
        + f"; stats.json (and _SUCCESS when all went well) come with the merge job; follow it with "
        f"`squeue -j {','.join(job_ids)}`; if a task fails for good, the jobs after it are cancelled, "
        f"and stats.json names it: then {resume}"
    )
    return {"detached": True, "jobs": jobs, "resume": resume}


def run_chain_stage(stage: str, out: str, tasks, cfg: Config, workers: int, record: dict) -> dict[str, Any]:
    """The body of the chain's global job ("dedup") and of its last job ("merge")."""
    t_start = time.perf_counter()
    out_dir = Path(out)
    work = out_dir / "work"
    finished = [t for t in tasks if (phase1_dir(work, t[0]) / "DONE").is_file()]
    if stage == "dedup":
        if len(finished) != len(
            tasks
        ):  # afterok makes this unreachable; a hand-run job must not dedup a part
            raise DataIntegrityError(
                f"{len(tasks) - len(finished)} task(s) of phase 1 have not finished",
                "run `oreline data` again with the same inputs: it submits what is missing",
            )
        remove_stale_attempts(work, [i for i, _, _ in finished])
        executor = make_executor(
            cfg.data.executor, workers=workers, preload=PRELOAD, slurm=cfg.data.slurm, work=work
        )
        if dedup_enabled(cfg):
            _dedup_phase(work, finished, cfg, executor)
        if cfg.data.quality.perplexity_model:
            from oreline.data.filters.perplexity import perplexity_phase

            perplexity_phase(work, [phase1_dir(work, i) for i, _, _ in finished], cfg, executor)
        write_json_atomic(work / "slurm" / "dedup.DONE", {"job": os.environ.get("SLURM_JOB_ID")})
        return {}
    # merge: whatever the jobs before it left, in stats.json
    resume = record["resume"]
    dedup_ok = (work / "slurm" / "dedup.DONE").is_file()
    crashes: list[TaskCrashed] = []
    for i, path, kind in tasks:
        if not (phase1_dir(work, i) / "DONE").is_file():
            where = record["filter"].get(i) or record["filter"].get(str(i)) or {"task": "?", "log": "?"}
            crashes.append(
                TaskCrashed(
                    (i, str(path), kind),
                    f"Slurm array task {where['task']} (filter) did not finish; log: {where['log']}; "
                    f"the chain stopped before the dedup job {record['dedup']['task'].split('_')[0]}; {resume}",
                )
            )
        elif dedup_ok and not phase3_marker(work, i).is_file():
            where = record["write"].get(i) or {"task": "?", "log": "?"}
            crashes.append(
                TaskCrashed(
                    (i, str(path), kind),
                    f"Slurm array task {where['task']} (write) did not finish; log: {where['log']}; {resume}",
                )
            )
    extra = []
    if len(finished) == len(tasks) and not dedup_ok:
        job, log = record["dedup"]["task"].split("_")[0], record["dedup"]["log"]
        # every filter task wrote its marker, yet afterok can still have held the dedup job back: a
        # task cancelled or killed after its work ends not-OK; then the dedup job left no log at all
        why = (
            f"failed; log: {log}"
            if Path(log).is_file()
            else "never started: a filter task ended without success after it had finished its work "
            "(cancelled or killed on its way out; see the filter logs)"
        )
        extra.append({"file": None, "offset": None, "error": f"the dedup job {job} {why}; {resume}"})
    ddir = work / "dedup" / "DONE"
    dedup_stats = json.loads(ddir.read_text()) if dedup_ok and ddir.is_file() else {}
    ppl_stats = None
    if dedup_ok and cfg.data.quality.perplexity_model:
        from oreline.data.filters.perplexity import perplexity_phase

        ppl_stats = perplexity_phase(
            work, [phase1_dir(work, i) for i, _, _ in finished], cfg
        )  # its cached result
    unknown = [Path(u) for u in record["unknown"]]
    _finish(
        out_dir,
        tasks,
        finished,
        unknown,
        record["unreadable"],
        crashes,
        dedup_stats,
        ppl_stats,
        workers,
        record["fp"],
        t_start,
        extra,
    )
    return {}


def _remove_wrecks(out: Path) -> None:
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


def _dedup_phase(work: Path, finished: list[tuple[int, Path, str]], cfg: Config, executor) -> dict[str, Any]:
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
            _plan_executor(executor, sig_paths),
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


def _plan_executor(executor, sig_paths: list[Path]):
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


def _merge_stats(work: Path, tasks, finished, unknown, crashes, dedup_stats, workers, fp) -> dict[str, Any]:
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
    for s in p1:
        normalize_removed.update(s["normalize_removed"])
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
        },
        "errors": errors,
        "normalize_removed": dict(normalize_removed),
        "extract_paths": extract_paths,
        "dedup": dedup_stats,
        "output": output,
        "workers": workers,
        "pid": os.getpid(),
    }


# ---------------------------------------------------------------------------------------------
# printing


def _pct(a: int, b: int) -> str:
    if not a:
        return "—"
    change = (b - a) / a * 100
    return f"{'−' if change < 0 else '+'}{abs(change):.1f}%"


def funnel_lines(stats: dict[str, Any], top: int = 4) -> list[str]:
    """One line per step: 'langid: −41.2% (lang:other 9,110 · lang:score<0.65 31,012)'."""
    lines = []
    for st in stats["steps"]:
        reasons = sorted(st["dropped"].items(), key=lambda kv: -kv[1])
        shown = " · ".join(f"{r} {n:,}" for r, n in reasons[:top])
        if len(reasons) > top:
            shown += f" · {len(reasons) - top} more"
        lines.append(
            f"{st['name']}: {_pct(st['docs_in'], st['docs_out'])}" + (f" ({shown})" if shown else "")
        )
    return lines


def print_funnel(stats: dict[str, Any], console: Console) -> None:
    """The funnel as a table: documents and bytes per step, change in percent and top drop reasons."""
    table = Table(title="oreline data: funnel", show_lines=False)
    for col, just in (
        ("step", "left"),
        ("docs in", "right"),
        ("docs out", "right"),
        ("change", "right"),
        ("MB out", "right"),
        ("s", "right"),
    ):
        table.add_column(col, justify=just, no_wrap=True)
    table.add_column("dropped (top reasons)", justify="left", overflow="fold", min_width=30)
    for st in stats["steps"]:
        reasons = sorted(st["dropped"].items(), key=lambda kv: -kv[1])
        shown = " · ".join(f"{r} {n:,}" for r, n in reasons[:4]) + (
            f" · +{len(reasons) - 4} more" if len(reasons) > 4 else ""
        )
        table.add_row(
            st["name"],
            f"{st['docs_in']:,}",
            f"{st['docs_out']:,}",
            _pct(st["docs_in"], st["docs_out"]),
            f"{st['bytes_out'] / 1e6:,.2f}",
            f"{st['seconds']:.2f}",
            shown,
        )
    # a pipe or log file gets a readable width instead of rich's 80-column default
    console.print(table, width=None if console.is_terminal else 160, crop=console.is_terminal)
    inp, out = stats["inputs"], stats["output"]
    secs = stats.get("seconds") or 0.0
    console.print(
        f"{inp['tasks']} input files ({inp['bytes'] / 1e6:,.1f} MB, {inp['records']:,} records, {inp['revisits']:,} revisits)"
        f" → {out['docs']:,} documents ({out['bytes'] / 1e6:,.2f} MB) in {len(out['shards'])} shard(s)"
        + (
            f" in {secs:.1f} s ({inp['records'] / secs:,.0f} records/s, {inp['bytes'] / secs / 1e6:,.2f} MB/s,"
            f" {stats.get('workers', 1)} worker(s))"
            if secs
            else ""
        )
    )
    if inp["unknown"]:
        names = ", ".join(Path(u["file"]).name for u in inp["unknown"][:5])
        console.print(
            f"[yellow]{len(inp['unknown'])} file(s) of unknown kind not read:[/] {names}"
            + (" …" if len(inp["unknown"]) > 5 else "")
        )
    if stats["errors"]:
        console.print(
            f"[yellow]{len(stats['errors'])} input error(s)[/] (damaged input skipped; see stats.json errors):"
        )
        for e in stats["errors"][:5]:
            console.print(f"  {Path(str(e['file'])).name} @ {e['offset']}: {str(e['error'])[:120]}")
    if stats.get("perplexity"):
        from oreline.data.filters.perplexity import cutoff_line

        console.print(cutoff_line(stats["perplexity"]))
    if stats["normalize_removed"]:
        removed = " · ".join(
            f"{k} {v:,}" for k, v in sorted(stats["normalize_removed"].items(), key=lambda kv: -kv[1])
        )
        console.print(f"normalize changed: {removed}")
    if stats.get("extract_paths"):
        paths = " · ".join(
            f"{k} {v['docs']:,} ({v['seconds']:.2f} s)"
            for k, v in sorted(stats["extract_paths"].items(), key=lambda kv: -kv[1]["docs"])
        )
        console.print(f"extraction paths: {paths}")
