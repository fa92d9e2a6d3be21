"""Run a stage's tasks as Slurm array jobs, and the Slurm client calls the rest of oreline uses.

`SlurmExecutor.map(fn, jobs)` is synchronous from the driver's side, like the local pool:

1. the jobs are written once, as JSON, into a private folder of the run's work folder
   (`work/slurm/<label>-<k>/`, mode 0700 like `work/slurm`): `fn` travels as "module:qualname" and
   must be one of oreline's task functions (`oreline.executors.wire.TASKS`), the arguments as
   tagged JSON (`oreline.executors.wire`), so the array task runs the same task function the local
   and Ray executors run, on equal arguments, and writes the same markers;
2. one array index runs `tasks_per_job` consecutive jobs (`python -m oreline.executors.slurm_task
   FOLDER BASE INDEX`; INDEX = $SLURM_ARRAY_TASK_ID); the task writes each job's result atomically
   as `results/<job>.json`, and skips a job whose result is already there;
3. an array never exceeds the cluster's MaxArraySize (larger stages are split into several array
   jobs) and `throttle` becomes `%N` on each;
4. the driver polls `squeue` until the arrays have left the queue; a job without a result file
   (the task raised, was cancelled, hit its time limit, lost its node) is resubmitted, at most
   `max_retries` times, and then comes back as a `TaskCrashed` naming the array task and its
   log file, so the caller lists the input and the log in the run's errors, and a re-run of
   the command submits only what its markers say is missing.

`SlurmExecutor.submit(fn, jobs, after=…)` is the detached form (`oreline data --detach`): the same
job folder and array tasks, submitted with `--dependency=afterok:…` and `--kill-on-invalid-dep=yes`
(or `afterany`), returning the job ids at once; with no driver left to resubmit, a task that raises
is run again inside its array task, up to `max_retries` times.

What someone else who can write the work folder could do, and why they cannot:
- swap the script between its writing and sbatch reading it: no script is written anywhere.
  Every submission, retries included, hands sbatch the script's text on standard input (Slurm
  keeps its own copy; `scontrol write batch_script JOB` shows it), and the job's options on
  sbatch's command line, one argument each, never parsed by a shell. `submitted.txt` in the
  stage's folder records both for the reader; nothing reads it back;
- run code through a job or result file: they are JSON that names a task function out of a fixed
  list and carries plain data; nothing the driver or a task loads from the work folder is a
  pickle or imports a name it holds;
- run oreline's own tasks on arguments of their choosing, or forge a result: each `map` draws a
  random key that reaches its array tasks only through the job's environment (sbatch passes the
  submitting environment on), never through the work folder; the driver seals the jobs file with
  an HMAC-SHA256 under that key, the task checks the seal before it decodes anything and seals
  each result the same way, and the driver checks a result's seal before it decodes it. A file
  planted or altered in the work folder is refused with its path named;
- write into the folders at all: `work/slurm` and each stage's folder are created 0700, and a
  `work/slurm` that another user owns, or that others may write, is refused (or, when it is
  ours, made 0700 again).
Every value that reaches the script is checked and quoted (`oreline.executors.slurm_script`).

Nothing here needs `sacct` (a cluster without slurmdbd has none): the result files are the
record of what finished. The driver can be killed at any time: the array jobs it submitted
finish on their own, and the re-run skips every task whose marker they wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

import oreline.executors.wire as wire
from oreline.errors import ClusterError
from oreline.executors.interface import Resources, TaskCrashed
from oreline.job_inputs import private_folder, write_private
from oreline.slurm_script import shell_word

JOBS_FILE = "jobs.json"
RECORD_FILE = "submitted.txt"  # what was handed to sbatch, for the reader; never read back
KEY_ENV = "ORELINE_SLURM_TASK_KEY"  # the per-map HMAC key; in the job's environment, never on disk


def seal(data: bytes, key: str) -> bytes:
    """`data` prefixed with its HMAC-SHA256 under `key`."""
    return hmac.new(key.encode(), data, hashlib.sha256).digest() + data


def unseal(blob: bytes, key: str, path: Path) -> bytes:
    """The bytes of a sealed file, after its seal is checked (nothing is decoded before)."""
    mac, data = blob[:32], blob[32:]
    if not key or not hmac.compare_digest(mac, hmac.new(key.encode(), data, hashlib.sha256).digest()):
        raise ClusterError(
            f"{path} does not carry the seal of the oreline process that submitted this stage "
            "(written or changed by someone else, or by another submission); it was not loaded",
            "check who can write to the run's work folder, delete the stage's folder under work/slurm/ "
            "and re-run the command",
        )
    return data


def _append_record(path: Path, text: str) -> None:
    """Append to a record file of ours (never through a link planted in its place)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path, flags, 0o600), "a", encoding="utf-8") as f:
        f.write(text)


# ---------------------------------------------------------------------------------------------
# the Slurm client


def _client(cmd: str) -> str:
    path = shutil.which(cmd)
    if path is None:
        raise ClusterError(
            f"`{cmd}` is not on PATH, so no Slurm cluster can be reached from here",
            "run oreline on a Slurm login node (or start the local test cluster: scripts/local-slurm.sh start "
            "and set SLURM_CONF as it says), or choose executor = 'local'",
        )
    return path


def slurm_call(
    args: Sequence[str], timeout: float = 60.0, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess:
    """Run a Slurm client command (`input`: its stdin); ClusterError with its stderr when it fails."""
    cmd = [_client(args[0]), *args[1:]]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, input=input or "", check=False
        )
    except subprocess.TimeoutExpired as e:
        raise ClusterError(
            f"`{shlex.join(args)}` did not answer within {timeout:.0f} s",
            "check that slurmctld is up (`sinfo`) and retry",
        ) from e
    if proc.returncode != 0:
        raise ClusterError(
            f"`{shlex.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}",
            "check the cluster with `sinfo`, and the options in the script named above",
        )
    return proc


def submit(script: str, options: Sequence[str] = (), env: dict[str, str] | None = None) -> str:
    """sbatch OPTIONS with the script's text on stdin; the job id (of an array: the array's id).

    The text, not a path: a script file could be replaced between its writing and sbatch reading it
    (or at a retry). `env` is the environment sbatch runs in, which the job inherits."""
    if not script.startswith("#!"):
        raise ValueError("submit takes the script's text (starting with #!), not a path")
    out = slurm_call(["sbatch", "--parsable", *options], env=env, input=script).stdout.strip()
    return out.split(";")[0]  # "<id>[;<cluster>]"


def queued(job_ids: Sequence[str]) -> dict[str, str]:
    """{job or array task id: state} of the given jobs still in the queue (pending, running, ...)."""
    if not job_ids:
        return {}
    cmd = [_client("squeue"), "-h", "-j", ",".join(job_ids), "-o", "%i %T"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:  # every one of them has left the controller's memory
            return {}
        raise ClusterError(f"squeue failed: {proc.stderr.strip()[-500:]}", "check the cluster with `sinfo`")
    out = {}
    for line in proc.stdout.splitlines():
        if line.strip():
            jid, _, state = line.strip().partition(" ")
            out[jid] = state
    return out


def cluster_setting(name: str, default: str | None = None) -> str | None:
    """One line of `scontrol show config` (e.g. MaxArraySize)."""
    with contextlib.suppress(ClusterError, subprocess.SubprocessError, OSError):
        for line in slurm_call(["scontrol", "show", "config"]).stdout.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == name:
                return value.strip()
    return default


def array_chunks(indices: Sequence[int], max_array_size: int) -> list[tuple[int, list[int]]]:
    """Split sorted indices into (base, offsets) with every offset < max_array_size."""
    out: list[tuple[int, list[int]]] = []
    for i in sorted(indices):
        if out and i - out[-1][0] < max_array_size:
            out[-1][1].append(i - out[-1][0])
        else:
            out.append((i, [0]))
    return out


def array_spec(offsets: Sequence[int]) -> str:
    """0,1,2,3,7 → '0-3,7' (sbatch --array)."""
    parts: list[str] = []
    start = prev = None
    for o in offsets:
        if start is None:
            start = prev = o
        elif o == prev + 1:
            prev = o
        else:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = o
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)


# ---------------------------------------------------------------------------------------------
# the executor


class SlurmExecutor:
    """Array jobs on the cluster `sbatch` reaches; `work` is a folder every node can read and write."""

    name = "slurm"

    def __init__(self, settings: Any = None, work: Path | str | None = None, console: Console | None = None):
        from oreline.config import SlurmConfig

        self.settings = settings if settings is not None else SlurmConfig()
        if work is None:
            raise ClusterError(
                "the Slurm executor needs a folder shared by every node for its job files",
                "pass one (the data pipeline uses its output's work folder)",
            )
        work = Path(work).resolve()
        if not work.exists():  # a work folder made for these files is as private as they are
            work.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                work.mkdir(mode=0o700)
        self.root = work / "slurm"
        self.console = console or Console(stderr=True)
        _client("sbatch")

    def _folder(self, label: str) -> Path:
        private_folder(self.root)
        k = 0
        while True:
            folder = self.root / f"{label}-{k}"
            try:
                folder.mkdir(mode=0o700)
                return private_folder(folder)
            except FileExistsError:
                k += 1

    def _options(self, folder: Path, label: str, resources: Resources, time_limit: str | None) -> list[str]:
        """sbatch's options for the stage's array tasks: command-line arguments, one value each."""
        s = self.settings
        cpus = max(int(s.cpus_per_task), int(-(-resources.cpus // 1)))
        options = [
            f"--job-name=oreline-{label}",
            f"--output={folder}/logs/%A_%a.out",
            f"--cpus-per-task={cpus}",
            f"--time={time_limit or s.time_limit}",
            f"--chdir={os.getcwd()}",
            "--export=ALL",  # the key travels in the environment
        ]
        mem = s.mem_mb or resources.memory_mb or 0
        if mem:
            options.append(f"--mem={int(mem)}")
        if s.partition:
            options.append(f"--partition={s.partition}")
        return options + list(s.sbatch_args)

    def _script(self, folder: Path, base: int) -> str:
        """The text of the array job running packs BASE + $SLURM_ARRAY_TASK_ID (sbatch reads it on stdin)."""
        return "\n".join(
            [
                "#!/usr/bin/env bash",
                f"# one array index runs a pack of tasks: pack {base} + the index",
                f"exec {shell_word(sys.executable, 'the Python executable')} -m oreline.executors.slurm_task "
                f'{shell_word(folder, "the run work folder")} {int(base)} "$SLURM_ARRAY_TASK_ID"',
                "",
            ]
        )

    def _prepare(
        self,
        fn,
        jobs: Sequence[tuple],
        label: str,
        resources: Resources,
        retries: int,
        time_limit: str | None,
    ) -> tuple[Path, list[str], dict[str, str]]:
        """The stage's folder with its sealed jobs file; sbatch's options; the environment to submit in."""
        name = wire.task_name(fn)  # before anything is written: a task Slurm cannot run by name
        folder = self._folder(label)
        (folder / "logs").mkdir(mode=0o700)
        (folder / "results").mkdir(mode=0o700)
        key = secrets.token_hex(32)
        env = {**os.environ, KEY_ENV: key}
        try:
            data = wire.dumps(
                "jobs",
                fn=name,
                jobs=[tuple(j) for j in jobs],
                pack=int(self.settings.tasks_per_job),
                retries=retries,
            )
        except TypeError as exc:
            raise ClusterError(
                f"the jobs of {label} cannot travel to Slurm array tasks: {exc}",
                "pass plain values (str, int, float, bool, None, lists, tuples, dicts, paths), oreline config "
                "sections or the dataclasses in oreline.executors.wire.DATACLASSES",
            ) from exc
        write_private(folder / JOBS_FILE, seal(data, key))
        return folder, self._options(folder, label, resources, time_limit), env

    def _submit_packs(
        self,
        folder: Path,
        packs: Sequence[int],
        env: dict[str, str],
        stage_options: Sequence[str],
        options: Sequence[str] = (),
    ) -> tuple[list[str], dict[int, str]]:
        """Array job(s) for the given packs, split below MaxArraySize; (job ids, pack → "jobid_index").
        Each submission, retries included, hands sbatch the script's text on stdin."""
        s = self.settings
        max_array = int(cluster_setting("MaxArraySize", "1001") or 1001)
        submitted: list[str] = []
        where: dict[int, str] = {}
        for base, offsets in array_chunks(packs, max_array):
            spec = array_spec(offsets) + (f"%{s.throttle}" if s.throttle else "")
            argv = [f"--array={spec}", *stage_options, *options]
            script = self._script(folder, base)
            jid = submit(script, argv, env=env)
            _append_record(
                folder / RECORD_FILE, f"# job {jid}: sbatch {shlex.join(argv)} <<'EOF'\n{script}EOF\n\n"
            )
            submitted.append(jid)
            for o in offsets:
                where[base + o] = f"{jid}_{o}"
        return submitted, where

    def map(
        self,
        fn: Callable[..., Any],
        jobs: Sequence[tuple],
        *,
        label: str,
        resources: Resources = Resources(),
    ) -> list[Any]:
        if not jobs:
            return []
        s = self.settings
        folder, stage_options, env = self._prepare(fn, jobs, label, resources, 0, None)
        key = env[KEY_ENV]
        pack = int(s.tasks_per_job)
        packs = -(-len(jobs) // pack)
        where: dict[int, str] = {}  # pack → "jobid_index" of its last attempt (its log file's name)
        missing = list(range(packs))
        for attempt in range(int(s.max_retries) + 1):
            submitted, placed = self._submit_packs(folder, missing, env, stage_options)
            where.update(placed)
            self.console.print(
                f"{label}: {len(missing)} array task(s) submitted as job(s) {', '.join(submitted)}"
                + (f" (retry {attempt} of {s.max_retries})" if attempt else "")
                + f"; logs in {folder / 'logs'}"
            )
            self._wait(submitted, folder, len(jobs), label)
            missing = [
                p
                for p in missing
                if not all(_result(folder, j).is_file() for j in _pack_jobs(p, pack, len(jobs)))
            ]
            if not missing:
                break
        results: list[Any] = []
        for j, job in enumerate(jobs):
            path = _result(folder, j)
            if path.is_file():
                results.append(wire.loads(unseal(path.read_bytes(), key, path), "result", path)["value"])
            else:
                tid = where[j // pack]
                results.append(
                    TaskCrashed(
                        job,
                        f"Slurm array task {tid} ({label}) failed {int(s.max_retries) + 1} time(s); "
                        f"log: {folder / 'logs' / (tid + '.out')}; {_rerun_hint()}",
                    )
                )
        return results

    def submit(
        self,
        fn: Callable[..., Any],
        jobs: Sequence[tuple],
        *,
        label: str,
        resources: Resources = Resources(),
        after: Sequence[str] = (),
        after_any: bool = False,
        time_limit: str | None = None,
    ) -> Submitted:
        """Submit fn(*job) for every job as array job(s) and return at once (no waiting, no results:
        the tasks' markers are the record). The arrays start once every job in `after` has succeeded
        (afterok; a failed or cancelled one cancels them: --kill-on-invalid-dep=yes), or, with
        `after_any`, has ended in any state. A task that raises is run again in its array task, up
        to max_retries times; nobody resubmits an array task that dies (the re-run of the command does)."""
        folder, stage_options, env = self._prepare(
            fn, jobs, label, resources, int(self.settings.max_retries), time_limit
        )
        options = []
        if after:
            options = [f"--dependency={'afterany' if after_any else 'afterok'}:{':'.join(after)}"]
            options += [] if after_any else ["--kill-on-invalid-dep=yes"]
        pack = int(self.settings.tasks_per_job)
        ids, where = self._submit_packs(folder, range(-(-len(jobs) // pack)), env, stage_options, options)
        logs = [str(folder / "logs" / f"{where[j // pack]}.out") for j in range(len(jobs))]
        return Submitted(label, ids, [where[j // pack] for j in range(len(jobs))], logs)

    def _wait(self, job_ids: list[str], folder: Path, total: int, label: str) -> None:
        seen = -1
        while True:
            left = queued(job_ids)
            done = sum(1 for _ in (folder / "results").glob("*.json"))
            if done != seen and self.console.is_terminal:
                self.console.print(f"{label}: {done}/{total} done, {len(left)} in the queue", end="\r")
                seen = done
            if not left:
                return
            time.sleep(float(self.settings.poll_s))


@dataclass(frozen=True)
class Submitted:
    """Array job(s) `SlurmExecutor.submit` queued: their ids, and per job its array task and log file."""

    label: str
    job_ids: list[str]
    tasks: list[str]  # "jobid_index" per job
    logs: list[str]  # per job


def _rerun_hint() -> str:
    """What resumes: the oreline command of this process when there is one (its markers make the re-run
    submit only the missing tasks)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    is_oreline = getattr(spec, "name", "") == "oreline.__main__" or Path(sys.argv[0] or "x").name == "oreline"
    if is_oreline and len(sys.argv) > 1:
        return f"re-run `oreline {shlex.join(sys.argv[1:])}` to retry it (it submits only what is missing)"
    return "re-run the command to retry it (it submits only what is missing)"


def _pack_jobs(pack_index: int, pack: int, n: int) -> range:
    return range(pack_index * pack, min(n, (pack_index + 1) * pack))


def _result(folder: Path, job: int) -> Path:
    return folder / "results" / f"{job:08d}.json"


def run_pack(folder: Path, pack_index: int) -> int:
    """The body of one array task: run the pack's jobs that have no result yet; 0 when all succeeded."""
    key = os.environ.get(KEY_ENV, "")
    path = folder / JOBS_FILE
    spec = wire.loads(unseal(path.read_bytes(), key, path), "jobs", path)
    fn = wire.task_function(spec["fn"], path)
    jobs, pack, retries = spec["jobs"], int(spec["pack"]), int(spec["retries"])
    for j in _pack_jobs(pack_index, pack, len(jobs)):
        out = _result(folder, j)
        if out.is_file():
            continue  # an earlier attempt of this pack finished this job
        print(f"[oreline slurm task] job {j}: {getattr(fn, '__qualname__', fn)}{_short(jobs[j])}", flush=True)
        for attempt in range(retries + 1):  # detached stages retry here: no driver resubmits them
            try:
                result = fn(*jobs[j])
                break
            except Exception:
                if attempt == retries:
                    raise
                traceback.print_exc()
                print(
                    f"[oreline slurm task] job {j}: attempt {attempt + 1} of {retries + 1} failed", flush=True
                )
        write_private(out, seal(wire.dumps("result", value=result), key))
    return 0


def _short(job: tuple) -> str:
    text = repr(
        tuple(a if isinstance(a, (str, int, float, bool, type(None))) else type(a).__name__ for a in job)
    )
    return re.sub(r"\s+", " ", text)[:300]
