"""The data pipeline as Slurm array jobs on a real cluster (scripts/local-slurm.sh; CI starts it).

- `data.executor = "slurm"` gives byte-identical shards, the same rejects and the same stats as
  the local executor on the sample web archives;
- one array task cancelled mid-run (`scancel JOB_INDEX`) with no retries left: the run lists that
  input with the array task's log in its errors and writes no _SUCCESS; the re-run of the same
  command submits only the missing task and the output is then identical to the local run;
- a task that fails is resubmitted up to `max_retries` times, and reported with its log after that;
- `--detach` submits the run as a chain of jobs and returns: a filter array task cancelled for
  good stops the chain before the dedup job, the merge job lists the input and its log, and the
  resubmission runs only the missing task and ends with the local run's output;
- a filter task cancelled after its work still holds the detached dedup job back: stats.json says
  that job never started, and the resubmission runs it without any filter task.

The cancelled task waits for its scancel (a sitecustomize on the PYTHONPATH the submission hands
to the job), so the cancel lands before or after its work as the test says, never by a race.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oreline.config import load_config
from oreline.data.pipeline.run import run_data
from oreline.executors.interface import TaskCrashed
from oreline.executors.slurm import SlurmExecutor, array_chunks, array_spec, queued

pytestmark = pytest.mark.slurm

INPUTS = [
    "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
    "dolma-wget-2024/sample-0000.warc.gz",
    "warcio-edge-cases/example.warc.gz",
]
FAST = ["data.slurm.poll_s=0.3"]


@pytest.fixture(scope="module")
def local_ref(samples, tmp_path_factory) -> tuple[list[str], Path]:
    inputs = [str(samples / "web-archives" / p) for p in INPUTS]
    out = tmp_path_factory.mktemp("local") / "out"
    run_data(inputs, out, load_config(), workers=1)
    return inputs, out


def _files(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for sub in ("docs", "rejects")
        for p in sorted((out / sub).glob("*.parquet"))
    }


def _same_as_local(out: Path, ref: Path) -> None:
    assert (out / "_SUCCESS").is_file()
    got, want = _files(out), _files(ref)
    assert list(got) == list(want) and got == want, "the shards differ from the local run's"
    strip = lambda s: [{k: v for k, v in st.items() if k != "seconds"} for st in s["steps"]]  # noqa: E731
    s_got, s_want = (json.loads((o / "stats.json").read_text()) for o in (out, ref))
    assert strip(s_got) == strip(s_want)
    assert s_got["output"] == s_want["output"] and s_got["output"]["docs"] > 0
    assert s_got["errors"] == s_want["errors"]


def test_slurm_executor_output_is_byte_identical_to_local(slurm_cluster, local_ref, tmp_path):
    inputs, ref = local_ref
    out = tmp_path / "slurm"
    stats = run_data(inputs, out, load_config(None, ["data.executor=slurm", *FAST]))
    assert stats["output"]["docs"] > 0
    _same_as_local(out, ref)
    # the stages ran as array jobs: one per map call, one index per input file, each with its log
    filt = out / "work" / "slurm" / "filter-0"
    assert len(list((filt / "logs").glob("*_*.out"))) == len(INPUTS)
    # sbatch read the script on stdin and its options from its command line: no script file to swap
    assert "--cpus-per-task=1" in (filt / "submitted.txt").read_text()
    assert not list((out / "work" / "slurm").rglob("*.sbatch")) and not list((out / "work").rglob("*.pkl"))
    for folder in [out / "work", out / "work" / "slurm", *(out / "work" / "slurm").iterdir()]:
        if folder.is_dir():
            assert folder.stat().st_mode & 0o777 == 0o700, folder


def test_a_python_user_step_on_slurm_equals_the_local_run(slurm_cluster, samples, tmp_path):
    """A user's step from a Python file runs in the Slurm array tasks with the local run's output."""
    from oreline_test_helpers import user_step_config

    inputs = [str(samples / "web-archives" / p) for p in INPUTS]
    words = ("privacy", "search", "explode")
    run_data(inputs, tmp_path / "local", user_step_config(tmp_path, words=words), workers=1)
    stats = run_data(
        inputs, tmp_path / "slurm", user_step_config(tmp_path, "data.executor=slurm", *FAST, words=words)
    )
    _same_as_local(tmp_path / "slurm", tmp_path / "local")
    steps = {s["name"]: s for s in stats["steps"]}
    assert any(r.startswith("drop_keyword:keyword:") for r in steps["drop_keyword"]["dropped"])
    assert steps["shout"]["docs_out"] > 0


@pytest.mark.slow
def test_quality_classifier_top_fraction_on_slurm_equals_the_local_run(
    slurm_cluster, samples, local_ref, tmp_path
):
    """The classifier step and its run-wide top-fraction cut-off (its sample jobs are array jobs
    too) give the local run's output. Stand-in: Gutenberg prose against the local run's web pages."""
    import zipfile

    from oreline.quality.classifier import train_classifier

    inputs, web = local_ref
    prose = tmp_path / "prose"
    prose.mkdir()
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        for name in ("austen-persuasion.txt", "chesterton-ball.txt", "shakespeare-caesar.txt"):
            (prose / name).write_text(zf.read(f"gutenberg/{name}").decode("latin-1"), encoding="utf-8")
    train_classifier([str(prose)], [str(web)], tmp_path / "clf", bucket=20_000)
    quality = [f"data.quality.classifier={tmp_path / 'clf'}", "data.quality.classifier_keep_top_fraction=0.3"]
    run_data(inputs, tmp_path / "local", load_config(None, quality), workers=1)
    stats = run_data(inputs, tmp_path / "slurm", load_config(None, ["data.executor=slurm", *FAST, *quality]))
    assert next(s for s in stats["steps"] if s["name"] == "quality:classifier_top")["dropped"]
    _same_as_local(tmp_path / "slurm", tmp_path / "local")
    assert stats["classifier"] == json.loads((tmp_path / "local" / "stats.json").read_text())[
        "classifier"
    ] | {"seconds": stats["classifier"]["seconds"]}


def _cli(inputs: list[str], out: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "oreline",
        "data",
        *inputs,
        "--out",
        str(out),
        "--executor",
        "slurm",
        *overrides,
    ]


def _holding(tmp_path: Path, index: int, when: str) -> tuple[dict[str, str], Path]:
    """An environment whose filter array task INDEX waits to be cancelled, `before` its work or
    `after` it (on its way out, its marker written), and the file it touches once it waits.

    sbatch hands the submitting environment to the job (--export=ALL), so a sitecustomize on its
    PYTHONPATH runs in that task's Python only for chains submitted with this environment. Waiting
    for the file, not for squeue's RUNNING, is what makes the cancel land where the test says:
    a small task can finish between the poll that sees it running and the scancel."""
    hook, flag = tmp_path / f"hold-{when}", tmp_path / f"held-{when}"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, os, pathlib, time\n"
        "def _hold():\n"
        f"    flag = pathlib.Path({str(flag)!r})\n"
        "    flag.with_suffix('.tmp').write_text(os.environ['SLURM_ARRAY_JOB_ID'])\n"
        "    flag.with_suffix('.tmp').replace(flag)  # whole, once seen\n"
        "    time.sleep(600)  # until scancel\n"
        "if (os.environ.get('SLURM_JOB_NAME') == 'oreline-filter'\n"
        f"        and os.environ.get('SLURM_ARRAY_TASK_ID') == '{index}'\n"
        "        and not os.environ.get('ORELINE_TEST_HELD')):\n"
        "    os.environ['ORELINE_TEST_HELD'] = '1'  # the task's own child processes are not held\n"
        f"    _hold() if {when!r} == 'before' else atexit.register(_hold)\n"
    )
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}, flag


def _cancel_when_held(flag: Path, index: int, timeout: float = 120) -> str:
    """scancel the held array task once it waits; its id ("JOB_INDEX")."""
    deadline = time.monotonic() + timeout
    while not flag.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.is_file(), f"array task {index} of the filter stage never reached the hold"
    victim = f"{flag.read_text()}_{index}"
    subprocess.run(["scancel", victim], check=True)
    return victim


def test_scancel_of_one_array_task_then_the_rerun_completes_it(slurm_cluster, local_ref, tmp_path):
    inputs, ref = local_ref
    out = tmp_path / "slurm"
    # one task at a time (throttle), no retry: the cancelled index stays missing in this run
    args = ["data.slurm.throttle=1", "data.slurm.max_retries=0", *FAST]
    env, flag = _holding(tmp_path, 1, "before")
    proc = subprocess.Popen(
        _cli(inputs, out, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    victim = _cancel_when_held(flag, 1)
    text, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, text[-3000:]
    assert not (out / "_SUCCESS").exists()
    stats = json.loads((out / "stats.json").read_text())
    failed = [e for e in stats["errors"] if "Slurm array task" in e["error"]]
    assert len(failed) == 1 and failed[0]["file"] == inputs[1], stats["errors"]
    log = failed[0]["error"].split("log: ")[1].split(";")[0]
    assert victim in failed[0]["error"] and Path(log).is_file(), failed[0]
    assert "CANCELLED" in Path(log).read_text()
    assert f"re-run `oreline data {inputs[0]}" in failed[0]["error"]  # the command that resumes

    again = subprocess.run(_cli(inputs, out, *FAST), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "filter: 1 array task(s) submitted" in again.stderr  # only the missing one
    _same_as_local(out, ref)


def _failing_once(tmp_path: Path, job_name: str, index: int) -> Path:
    """A PYTHONPATH whose sitecustomize makes the first attempt of array task INDEX of JOB_NAME exit 3."""
    hook, flag = tmp_path / "fail-once", tmp_path / "failed-once"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, pathlib, sys\n"
        f"flag = pathlib.Path({str(flag)!r})\n"
        f"if (os.environ.get('SLURM_JOB_NAME') == {job_name!r}\n"
        f"        and os.environ.get('SLURM_ARRAY_TASK_ID') == '{index}' and not flag.exists()):\n"
        "    flag.touch()\n"
        "    print('first attempt fails', file=sys.stderr)\n"
        "    sys.exit(3)\n"
    )
    return hook


def test_a_failing_task_is_retried_then_reported_with_its_log(slurm_cluster, tmp_path, monkeypatch):
    from oreline.config import SlurmConfig
    from oreline.data.pipeline.perplexity_cutoffs import task_sample

    hook = _failing_once(tmp_path, "oreline-retry", 0)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    )
    # a task function of oreline's own (the only kind Slurm runs): a sample of no files
    jobs = [([], str(tmp_path / f"sample-{i}.json"), 5) for i in range(3)]
    # packs of two: the failing job's pack is resubmitted, and its retry skips nothing it finished
    ex = SlurmExecutor(SlurmConfig(max_retries=1, poll_s=0.3, tasks_per_job=2), work=tmp_path / "w")
    assert ex.map(task_sample, jobs, label="retry") == [task_sample(*job) for job in jobs]
    logs = sorted((tmp_path / "w" / "slurm" / "retry-0" / "logs").glob("*.out"))
    assert len(logs) == 3  # packs 0 and 1, then pack 0 again

    ex = SlurmExecutor(SlurmConfig(max_retries=0, poll_s=0.3), work=tmp_path / "w")
    missing = ([str(tmp_path / "missing.parquet")], str(tmp_path / "never.json"), 5)
    [crashed] = ex.map(task_sample, [missing], label="fail")
    assert isinstance(crashed, TaskCrashed) and crashed.args == missing
    log = Path(crashed.error.split("log: ")[1].split(";")[0])
    assert "FileNotFoundError" in log.read_text() and "re-run the command" in crashed.error
    assert queued([crashed.error.split()[3].split("_")[0]]) == {}


def test_arrays_are_split_below_max_array_size():
    assert array_chunks(range(7), 3) == [(0, [0, 1, 2]), (3, [0, 1, 2]), (6, [0])]
    assert array_chunks([1, 2, 9], 1001) == [(1, [0, 1, 8])]
    assert array_spec([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"


def _wait_for(job_ids: list[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while queued(job_ids) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not queued(job_ids), f"jobs {job_ids} still queued after {timeout} s"


def _detached(inputs: list[str], out: Path, *overrides: str, env=None) -> dict[str, list[str]]:
    """Run `oreline data --executor slurm --detach` and return its jobs (it does not wait for them)."""
    proc = subprocess.run(
        [*_cli(inputs, out, *overrides), "--detach"], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "submitted: " in proc.stderr
    return json.loads((out / "work" / "slurm" / "chain.json").read_text())["jobs"]


# the detached chain without MinHash: its global job then runs the exact-dedup stages only (the
# MinHash stages on Slurm are the synchronous test's above), which keeps this test's job count small
EXACT = ["data.dedup.minhash=false"]


@pytest.fixture(scope="module")
def local_exact(local_ref, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local-exact") / "out"
    run_data(local_ref[0], out, load_config(None, EXACT), workers=1)
    return out


@pytest.mark.slow
def test_detached_chain_stops_before_dedup_when_a_task_fails_and_the_resubmission_completes_it(
    slurm_cluster, local_ref, local_exact, tmp_path
):
    inputs, ref = local_ref[0], local_exact
    out = tmp_path / "slurm"
    # one filter task at a time, no retry: the cancelled index fails for good
    env, flag = _holding(tmp_path, 1, "before")
    jobs = _detached(inputs, out, "data.slurm.throttle=1", "data.slurm.max_retries=0", *EXACT, *FAST, env=env)
    assert not (out / "stats.json").exists()  # the driver did not wait for the chain
    assert sorted(jobs) == ["dedup", "filter", "merge", "write"]
    twice = subprocess.run([*_cli(inputs, out, *EXACT), "--detach"], capture_output=True, text=True)
    assert twice.returncode != 0 and "still in the queue" in " ".join(
        twice.stderr.split()
    )  # one chain at a time
    beside = subprocess.run(  # nor a run of another executor beside the chain's jobs
        [sys.executable, "-m", "oreline", "data", *inputs, "--out", str(out), *EXACT],
        capture_output=True,
        text=True,
    )
    assert beside.returncode != 0 and "still in the queue" in " ".join(beside.stderr.split())
    victim = _cancel_when_held(flag, 1)
    assert victim == f"{jobs['filter'][0]}_1"
    _wait_for([i for ids in jobs.values() for i in ids])
    # the chain stopped before the dedup job: it never ran (no log), nor did the write array
    assert not list((out / "work" / "slurm" / "dedup-0" / "logs").glob("*")), "the dedup job ran"
    assert not (out / "work" / "dedup" / "DONE").exists() and not (out / "docs").exists()
    assert not (out / "_SUCCESS").exists()
    stats = json.loads((out / "stats.json").read_text())  # the merge job ran and listed the failure
    [failed] = [e for e in stats["errors"] if "Slurm array task" in e["error"]]
    assert failed["file"] == inputs[1] and victim in failed["error"], stats["errors"]
    log = failed["error"].split("log: ")[1].split(";")[0]
    assert Path(log).is_file() and "CANCELLED" in Path(log).read_text()
    assert f"before the dedup job {jobs['dedup'][0]}" in failed["error"]
    assert f"re-run `oreline data {inputs[0]}" in failed["error"]  # the command that resumes

    again = _detached(inputs, out, *EXACT, *FAST)  # only the missing filter task is submitted
    assert len(list((out / "work" / "slurm" / "filter-1").glob("jobs.json"))) == 1
    _wait_for([i for ids in again.values() for i in ids])
    assert len(list((out / "work" / "slurm" / "filter-1" / "logs").glob("*.out"))) == 1
    _same_as_local(out, ref)


@pytest.mark.slow
def test_a_task_cancelled_after_its_work_holds_the_dedup_job_back_and_stats_say_it_never_started(
    slurm_cluster, local_ref, local_exact, tmp_path
):
    """afterok judges the task's end, not its work: a filter task killed on its way out (its marker
    written) still keeps the dedup job from running. stats.json must say that, not that the dedup
    job failed, and the re-run submits the dedup job without a filter task."""
    inputs, ref = local_ref[0], local_exact
    out = tmp_path / "slurm"
    env, flag = _holding(tmp_path, 1, "after")
    jobs = _detached(inputs, out, "data.slurm.max_retries=0", *EXACT, *FAST, env=env)
    assert _cancel_when_held(flag, 1) == f"{jobs['filter'][0]}_1"
    _wait_for([i for ids in jobs.values() for i in ids])
    assert not list((out / "work" / "slurm" / "dedup-0" / "logs").glob("*")), "the dedup job ran"
    assert not (out / "_SUCCESS").exists()
    errors = json.loads((out / "stats.json").read_text())["errors"]
    assert not [e for e in errors if "Slurm array task" in e["error"]], errors  # every task did its work
    [held] = [e["error"] for e in errors if "the dedup job" in e["error"]]
    assert f"the dedup job {jobs['dedup'][0]} never started" in held and "failed" not in held, held
    assert f"re-run `oreline data {inputs[0]}" in held

    again = _detached(inputs, out, *EXACT, *FAST)
    assert "filter" not in again and sorted(again) == ["dedup", "merge", "write"], again
    _wait_for([i for ids in again.values() for i in ids])
    _same_as_local(out, ref)


def test_detach_without_the_slurm_executor_is_refused_before_anything_is_written(samples, tmp_path):
    from oreline.errors import ConfigError

    with pytest.raises(ConfigError, match="--executor slurm"):
        run_data(
            [str(samples / "web-archives" / INPUTS[2])],
            tmp_path / "out",
            load_config(None, ["data.slurm.detach=true"]),
        )
    assert not (tmp_path / "out").exists()


def test_a_folder_with_a_detached_chain_is_not_written_where_its_queue_cannot_be_checked(
    samples, tmp_path, monkeypatch
):
    """A detached chain's jobs write the folder without holding its lock: a run of any executor
    checks the chain's jobs first, and where squeue is missing it refuses, saying what to do."""
    from oreline.data.pipeline.phases import DATA_NAMES
    from oreline.errors import ClusterError
    from oreline.outdir import claim_folder

    out = tmp_path / "out"
    claim_folder(out, "data", "oreline data", reserved=DATA_NAMES.fullmatch)  # as the chain's driver did
    (out / "work" / "slurm").mkdir(parents=True)
    (out / "work" / "slurm" / "chain.json").write_text(json.dumps({"job_ids": ["4242"], "jobs": {}}))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no Slurm client here
    with pytest.raises(ClusterError, match=r"detached Slurm chain \(jobs 4242\)") as err:
        run_data([str(samples / "web-archives" / INPUTS[2])], out, load_config(), workers=1)
    assert "delete " + str(out / "work" / "slurm" / "chain.json") in str(err.value)
    assert not (out / "docs").exists()
