"""The detached Slurm chain of `oreline data` (data.executor = "slurm", data.slurm.detach / --detach).

The driver submits the three phases as jobs and returns: phase 1 as an array job (one index per
task or pack), the global stage (dedup plan and perplexity cut-offs) as one job `afterok` that
array, which maps its own stages through the Slurm executor synchronously from inside the job,
phase 3 as an array job `afterok` the global job, all with --kill-on-invalid-dep=yes: a task
that fails for good cancels every job after it, so nothing global runs over a partial phase 1.
A last job, `afterany` all of them, merges the stats: it lists each task that did not finish
with its input, its array task and log file, and the command that resumes, and writes
_SUCCESS only when everything finished. The same task functions write the same markers as the
synchronous run, so the resume (the same command again) submits only what is missing, and the
output is the local run's byte for byte. The job ids go to work/slurm/chain.json, so a second
submission while a chain still runs is refused.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from oreline.config import Config
from oreline.data.pipeline import tasks as phase_tasks  # the task functions the chain's jobs run
from oreline.data.pipeline.phases import PRELOAD, dedup_phase, finish, jobs_left
from oreline.errors import DataIntegrityError
from oreline.executors import make_executor
from oreline.executors.interface import TaskCrashed
from oreline.io import write_json_atomic

CHAIN = "chain.json"


def check_no_chain_running(out: Path) -> None:
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


def submit_chain(tasks, unknown, unreadable, out: Path, cfg: Config, workers: int, console: Console, fp: str):
    from oreline.executors.interface import Resources
    from oreline.executors.slurm import SlurmExecutor, _rerun_hint

    work = out / "work"
    s = cfg.data.slurm
    ex = SlurmExecutor(s, work=work, console=console)
    stage = {"resources": Resources(cpus=s.stage_cpus or workers), "time_limit": s.stage_time_limit}
    left1 = jobs_left(tasks, lambda i: (phase_tasks.phase1_dir(work, i) / "DONE").is_file())
    filt = (
        ex.submit(
            phase_tasks.run_phase1,
            [(i, str(tasks[i][1]), tasks[i][2], str(work), cfg) for i in left1],
            label="filter",
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
    left3 = jobs_left(tasks, lambda i: phase_tasks.phase3_marker(work, i).is_file())
    write = (
        ex.submit(
            phase_tasks.run_phase3,
            [(i, str(work), str(out), cfg) for i in left3],
            label="write",
            after=dedup.job_ids,
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
    finished = [t for t in tasks if (phase_tasks.phase1_dir(work, t[0]) / "DONE").is_file()]
    if stage == "dedup":
        if len(finished) != len(
            tasks
        ):  # afterok makes this unreachable; a hand-run job must not dedup a part
            raise DataIntegrityError(
                f"{len(tasks) - len(finished)} task(s) of phase 1 have not finished",
                "run `oreline data` again with the same inputs: it submits what is missing",
            )
        phase_tasks.remove_stale_attempts(work, [i for i, _, _ in finished])
        executor = make_executor(
            cfg.data.executor, workers=workers, preload=PRELOAD, slurm=cfg.data.slurm, work=work
        )
        if phase_tasks.dedup_enabled(cfg):
            dedup_phase(work, finished, cfg, executor)
        if cfg.data.quality.perplexity_model:
            from oreline.data.pipeline.perplexity_cutoffs import perplexity_phase

            perplexity_phase(work, [phase_tasks.phase1_dir(work, i) for i, _, _ in finished], cfg, executor)
        if cfg.data.quality.classifier:
            from oreline.data.pipeline.classifier_cutoff import classifier_phase

            classifier_phase(work, [phase_tasks.phase1_dir(work, i) for i, _, _ in finished], cfg, executor)
        write_json_atomic(work / "slurm" / "dedup.DONE", {"job": os.environ.get("SLURM_JOB_ID")})
        return {}
    # merge: whatever the jobs before it left, in stats.json
    resume = record["resume"]
    dedup_ok = (work / "slurm" / "dedup.DONE").is_file()
    crashes: list[TaskCrashed] = []
    for i, path, kind in tasks:
        if not (phase_tasks.phase1_dir(work, i) / "DONE").is_file():
            where = record["filter"].get(i) or record["filter"].get(str(i)) or {"task": "?", "log": "?"}
            crashes.append(
                TaskCrashed(
                    (i, str(path), kind),
                    f"Slurm array task {where['task']} (filter) did not finish; log: {where['log']}; "
                    f"the chain stopped before the dedup job {record['dedup']['task'].split('_')[0]}; {resume}",
                )
            )
        elif dedup_ok and not phase_tasks.phase3_marker(work, i).is_file():
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
        from oreline.data.pipeline.perplexity_cutoffs import perplexity_phase

        ppl_stats = perplexity_phase(
            work, [phase_tasks.phase1_dir(work, i) for i, _, _ in finished], cfg
        )  # its cached result
    classifier_stats = None
    if dedup_ok and cfg.data.quality.classifier:
        from oreline.data.pipeline.classifier_cutoff import classifier_phase

        classifier_stats = classifier_phase(
            work, [phase_tasks.phase1_dir(work, i) for i, _, _ in finished], cfg
        )  # its cached result
    unknown = [Path(u) for u in record["unknown"]]
    finish(
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
        classifier_stats=classifier_stats,
    )
    return {}
