"""Training jobs on a real Slurm cluster (scripts/local-slurm.sh; CI starts it), with the sbatch script
`oreline launch slurm --gpus-per-node 0 --nproc-per-node 2 --submit` writes and submits.

- a 2-process gloo job runs to the end (the reference);
- the same job, signalled with USR1 mid-run (what `--signal=USR1@LEAD` sends before the time
  limit: `scancel --signal=USR1` reaches the same processes the same way), stops after a step with
  a checkpoint, requeues itself (`scontrol requeue`) and resumes; then cancelled (`scancel`: SIGTERM)
  it stops with a checkpoint again, and the script submitted again resumes and ends. Its per-step
  losses, grad norms, learning rates and final weights equal the reference's bit for bit.
- an allocation that contradicts the config's global batch is refused before anything is submitted.

The runs use the prose token shards and the debug preset of tests/train (test_kill_resume_train).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oreline.errors import TrainingError
from oreline.train.launch import slurm_script

_spec = importlib.util.spec_from_file_location(
    "oreline_test_kill_resume", Path(__file__).parent / "test_kill_resume_train.py"
)
kr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kr)

TIMEOUT = 400


def submit(cfg: Path, folder: Path, time_limit: str = "15", signal_lead: int = 120) -> tuple[str, Path]:
    """`oreline launch slurm ... --submit` in `folder` (the job's submit folder); (job id, script)."""
    script = folder / f"{cfg.stem}.sbatch"
    proc = subprocess.run(
        [sys.executable, "-m", "oreline", "launch", "slurm", "-c", str(cfg), "--gpus-per-node", "0"]
        + ["--nproc-per-node", "2", "--cpus-per-task", "2", "--time", time_limit]
        + ["--signal-lead", str(signal_lead), "--out", str(script), "--submit"],
        cwd=folder,
        env=kr.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = proc.stdout.strip().splitlines()[-1]
    assert job.isdigit(), proc.stdout
    return job, script


def sbatch(script: Path, folder: Path, *options: str) -> str:
    """`sbatch --parsable [options] script` from `folder`; the job id."""
    return subprocess.run(
        ["sbatch", "--parsable", *options, str(script)],
        cwd=folder,
        env=kr.env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def job_info(job: str) -> dict[str, str]:
    proc = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    return dict(kv.split("=", 1) for kv in proc.stdout.split() if "=" in kv)


def accounting(job: str) -> list[str] | None:
    """`sacct` lines of every run of the job (a requeue included), or None on a cluster without accounting."""
    proc = subprocess.run(
        ["sacct", "-j", job, "--duplicates", "-X", "-o", "JobID,JobName,State,ExitCode,Start,End"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.splitlines() if proc.returncode == 0 else None


def wait(cond, what: str, logs: list[Path], timeout: float = TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(
        f"timed out waiting for {what}: " + "\n".join(p.read_text()[-3000:] for p in logs if p.exists())
    )


def gone(job: str) -> bool:
    return job_info(job).get("JobState") in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", None)


def events(run: Path, kind: str) -> list[dict]:
    return [r for r in kr.records(run) if r.get("type") == "event" and r.get("kind") == kind]


class Reference:
    """The uninterrupted 2-process job of kr.SETTINGS, submitted once and compared against by both
    requeue tests (each used to submit the same job for itself). Its end state is kept when it is
    first seen: Slurm forgets a finished job MinJobAge (600 s) later, and the second test may end
    after that."""

    def __init__(self, folder: Path, prose_tokens: dict[str, Path]):
        cfg = kr.write_config(folder / "ref.toml", folder / "ref", prose_tokens)
        self.job, _ = submit(cfg, folder)
        self.run = folder / "ref" / "r"
        self.log = folder / f"oreline-r-{self.job}.out"
        self.state: str | None = None

    def ended(self) -> bool:
        if self.state is None and gone(self.job):
            self.state = job_info(self.job).get("JobState") or "forgotten by Slurm before it was seen ending"
        return self.state is not None


@pytest.fixture(scope="module")
def reference(slurm_cluster, prose_tokens, tmp_path_factory):
    """The uninterrupted reference job, submitted when the first test asks for it (before that test
    submits its own job, so the two run alongside); cancelled at the end if still running."""
    ref = Reference(tmp_path_factory.mktemp("slurm-reference"), prose_tokens)
    try:
        yield ref
    finally:
        if not ref.ended():
            subprocess.run(["scancel", ref.job], check=False)


@pytest.mark.slurm
@pytest.mark.slow
def test_requeued_then_cancelled_and_resubmitted_job_equals_an_uninterrupted_one(
    slurm_cluster, prose_tokens, reference, tmp_path
):
    cfg = kr.write_config(tmp_path / "job.toml", tmp_path / "job", prose_tokens)
    run = tmp_path / "job" / "r"
    job, script = submit(cfg, tmp_path)  # the uninterrupted reference runs alongside (fixture)
    logs = [tmp_path / f"oreline-r-{job}.out", reference.log]
    print(f"submitted script ({script}):\n{script.read_text()}")

    # 1. USR1 (the time-limit notice): checkpoint at the next step boundary, requeue, resume
    wait(lambda: kr.has(run, "train", 5), "step 5", logs)
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    wait(lambda: events(run, "stopped"), "the USR1 stop", logs)
    [stop1] = events(run, "stopped")
    assert stop1["values"]["signal"] == "SIGUSR1", stop1
    at1 = stop1["step"]
    assert (run / "checkpoints" / f"step-{at1:08d}").is_dir()
    wait(lambda: job_info(job).get("Restarts") == "1", "the requeue", logs)
    wait(lambda: kr.has(run, "train", at1 + 3), f"step {at1 + 3} of the requeued job", logs)
    [resume1] = events(run, "resume")
    assert resume1["step"] == at1, resume1

    # 2. scancel (SIGTERM): checkpoint at the next step boundary, the job ends; resubmission resumes
    subprocess.run(["scancel", job], check=True)
    wait(lambda: gone(job), "the cancelled job to end", logs)
    stop2 = events(run, "stopped")[-1]
    assert stop2["values"]["signal"] == "SIGTERM" and stop2["step"] > at1, stop2
    assert job_info(job)["JobState"] == "CANCELLED"
    assert f"resume with: sbatch {script}" in logs[0].read_text()
    again = sbatch(script, tmp_path)
    logs.append(tmp_path / f"oreline-r-{again}.out")
    wait(lambda: gone(again) and reference.ended(), "the resubmitted and the reference jobs to end", logs)
    assert job_info(again)["JobState"] == reference.state == "COMPLETED", logs[-1].read_text()[-3000:]
    assert [r["step"] for r in events(run, "resume")] == [at1, stop2["step"]]

    kr.assert_identical(reference.run, run)
    losses = {r["step"]: r["loss"] for r in kr.records(run) if r.get("type") == "train"}
    print("per-step losses (requeued + cancelled + resubmitted == uninterrupted):", json.dumps(losses))
    print(f"USR1 stop after step {at1} (requeued), scancel stop after step {stop2['step']} (resubmitted)")
    acct = accounting(job)
    if acct is not None:  # the cluster keeps accounting (CI's does: ORELINE_SLURM_ACCOUNTING=1)
        others = (accounting(again) or [])[2:] + (accounting(reference.job) or [])[2:]
        print("sacct (the job, its resubmission, the reference):\n" + "\n".join(acct + others))
        assert [line.split()[2].rstrip("+") for line in acct[2:]] == ["REQUEUED", "CANCELLED"], acct
    print(
        "scontrol show job:",
        {k: job_info(job).get(k) for k in ("JobState", "Restarts", "Requeue", "ExitCode")},
    )
    assert not list(tmp_path.glob(".oreline-requeue-*"))


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_at_its_time_limit_stops_on_slurms_own_usr1_requeues_and_finishes(
    slurm_cluster, prose_tokens, reference, tmp_path
):
    """No scancel here: Slurm itself sends USR1 `--signal-lead` seconds before the job's 2-minute
    `--time` (up to 60 s earlier: its event resolution; it came while a rank was starting in one CI
    run, and was lost then), and rank 0 stops at end - lead by itself should it not have come. Each step
    sleeps 6 s, so the 16 steps cannot finish inside one allocation: the job stops after a step with
    a checkpoint, requeues itself, resumes, and ends COMPLETED with the same losses, grad norms and
    weights as an uninterrupted reference (a requeued job that gets USR1 again just repeats this)."""
    cfg = kr.write_config(
        tmp_path / "job.toml", tmp_path / "job", prose_tokens, train__debug__sleep_per_step_s=6.0
    )
    run = tmp_path / "job" / "r"
    job, _ = submit(cfg, tmp_path, time_limit="2", signal_lead=50)  # the reference: alongside (fixture)
    logs = [tmp_path / f"oreline-r-{job}.out", reference.log]
    wait(lambda: gone(job) and reference.ended(), "the job and the reference to end", logs, timeout=600)
    assert job_info(job)["JobState"] == reference.state == "COMPLETED", logs[0].read_text()[-3000:]
    stops, resumes = events(run, "stopped"), events(run, "resume")
    assert int(job_info(job)["Restarts"]) == len(stops) >= 1, (job_info(job), stops)
    # Slurm's USR1 (up to 60 s before end - lead), or rank 0's own deadline when the USR1 was missed
    assert all(
        e["values"]["signal"] == "SIGUSR1" or e["values"]["signal"].startswith("the time limit")
        for e in stops
    )
    # every stop was resumed from its own step, and the first came before the end, so the job trained
    # on after a requeue; a later USR1 may land on the last step (a loaded machine: 6 s + per step),
    # and then the requeued job only finishes the final evaluation
    assert [r["step"] for r in resumes] == [e["step"] for e in stops] and stops[0]["step"] < kr.STEPS
    assert logs[0].read_text().count("written before the time limit; requeueing job") == len(stops)
    kr.assert_identical(reference.run, run)
    print(
        f"Slurm's time limit stopped the job after steps {[e['step'] for e in stops]} "
        f"(by {[e['values']['signal'] for e in stops]}); it requeued and finished"
    )
    assert not list(tmp_path.glob(".oreline-requeue-*"))


def test_an_allocation_that_contradicts_the_global_batch_is_refused(prose_tokens, tmp_path):
    # 4 sequences of 64 tokens per micro-batch, no accumulation: 2 processes make 512 tokens
    cfg = kr.write_config(
        tmp_path / "c.toml", tmp_path / "runs", prose_tokens, train__global_batch_tokens=512
    )
    assert "global batch = micro 4 × accum 1 × 1 node(s) × 2 process(es)" in slurm_script(
        cfg, nodes=1, gpus_per_node=0, nproc_per_node=2
    )
    with pytest.raises(TrainingError) as err:
        slurm_script(cfg, nodes=2, gpus_per_node=0, nproc_per_node=2)
    assert "micro 4 × accum 1 × world 4 × seq_len 64 = 1,024 tokens" in str(err.value)
    assert "train.global_batch_tokens = 512" in str(err.value)
    cli = subprocess.run(
        [sys.executable, "-m", "oreline", "launch", "slurm", "-c", str(cfg), "--gpus-per-node", "0"]
        + ["--nodes", "2", "--nproc-per-node", "2", "--submit", "--out", str(tmp_path / "s.sbatch")],
        capture_output=True,
        text=True,
        env=kr.env(),
    )
    assert cli.returncode != 0 and "1,024 tokens" in cli.stderr + cli.stdout
    assert not (tmp_path / "s.sbatch").exists()  # nothing written, nothing submitted


def test_cpu_job_script_fits_the_allocation(prose_tokens, tmp_path):
    cfg = kr.write_config(tmp_path / "c.toml", tmp_path / "runs", prose_tokens)
    cpu = slurm_script(cfg, nodes=2, gpus_per_node=0, nproc_per_node=3, cpus_per_task=12)
    assert "--gpus-per-node" not in cpu and "NCCL" not in cpu and "gloo" in cpu
    assert "#SBATCH --cpus-per-task=12" in cpu and "--nnodes=2 --nproc_per_node=3" in cpu
    assert "THREADS=$((CPUS / 3))" in cpu and "train.parallel=ddp" in cpu
    assert "#SBATCH --signal=USR1@120" in cpu and "scontrol requeue" in cpu
    whole = slurm_script(cfg, nodes=1, gpus_per_node=4)
    assert "#SBATCH --exclusive" in whole and "--cpus-per-task" not in whole
    assert "#SBATCH --gpus-per-node=4" in whole and "--nproc_per_node=4" in whole
    for text in (cpu, whole):
        path = tmp_path / "s.sbatch"
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)


def _usr1_after_step(cfg: Path, run: Path, tmp_path: Path, job: str, step: int) -> tuple[str, Path]:
    """`oreline train` as a Slurm job's rank runs it (SLURM_JOB_ID, the batch script's requeue
    file), sent USR1 once step `step`'s train record is written; checks that it stopped for a
    requeue (exit 128 + USR1). Returns (its output, the requeue file)."""
    flag, log = tmp_path / f".oreline-requeue-{job}", tmp_path / f"log-{job}"
    env = {**kr.env(), "ORELINE_REQUEUE_FILE": str(flag), "SLURM_JOB_ID": job}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oreline", "train", "-c", str(cfg)], env=env, stdout=out, stderr=out
        )
    assert kr.wait_for(proc, lambda: kr.has(run, "train", step), timeout=300), log.read_text()[-3000:]
    os.kill(proc.pid, signal.SIGUSR1)
    assert proc.wait(timeout=300) == 128 + signal.SIGUSR1, log.read_text()[-3000:]
    return log.read_text(), flag


def _relaunch(cfg: Path) -> None:
    """The requeued job's launch: it resumes and finishes."""
    resumed = subprocess.run(
        [sys.executable, "-m", "oreline", "train", "-c", str(cfg)],
        env=kr.env(),
        capture_output=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]


@pytest.mark.slow
def test_sigusr1_stops_at_a_step_boundary_and_asks_the_script_to_requeue(prose_tokens, tmp_path):
    """The training loop's own part, without Slurm: USR1 → checkpoint at the next step boundary, exit
    128 + 10, the requeue file for the batch script; the relaunch resumes from that checkpoint."""
    cfg = kr.write_config(tmp_path / "c.toml", tmp_path / "runs", prose_tokens)
    run = tmp_path / "runs" / "r"
    log, flag = _usr1_after_step(cfg, run, tmp_path, "4242", 5)
    [stop] = events(run, "stopped")
    ckpt = run / "checkpoints" / f"step-{stop['step']:08d}"
    assert stop["values"]["signal"] == "SIGUSR1" and ckpt.is_dir()
    assert flag.read_text().strip() == str(ckpt)
    assert "the batch script requeues Slurm job 4242" in log
    _relaunch(cfg)
    assert [r["step"] for r in events(run, "resume")] == [stop["step"]]
    assert [r["step"] for r in kr.records(run) if r["type"] == "train"] == list(range(1, kr.STEPS + 1))


def test_a_usr1_during_the_final_evaluation_stops_before_what_is_left_and_the_relaunch_does_it(
    prose_tokens, tmp_path
):
    """After the last step there is no step boundary: a USR1 (Slurm's time-limit notice, or rank 0's
    own deadline) that came during the final evaluation waited for the downstream tasks and the
    generations, and a job whose final evaluation is long ran into its limit (TIMEOUT, no requeue).
    Now it stops after the part in progress (the validation here, made ~1 s long) for a requeue;
    the relaunch does only what is left: the generations and the end record, once."""
    # 256 validation sequences: the final evaluation is a window the signal is sure to hit
    cfg = kr.write_config(tmp_path / "c.toml", tmp_path / "runs", prose_tokens, train__eval_sequences=256)
    run = tmp_path / "runs" / "r"
    _, flag = _usr1_after_step(cfg, run, tmp_path, "4244", kr.STEPS)
    last = ("eval", "generation", "end")
    at_last = [r["type"] for r in kr.records(run) if r.get("step") == kr.STEPS]
    assert [t for t in at_last if t in last] == ["eval"], at_last
    [stop] = events(run, "stopped")
    assert stop["step"] == kr.STEPS and stop["values"]["signal"] == "SIGUSR1"
    assert flag.read_text().strip() == str(run / "checkpoints" / f"step-{kr.STEPS:08d}")
    _relaunch(cfg)
    at_last = [r["type"] for r in kr.records(run) if r.get("step") == kr.STEPS]
    assert [t for t in at_last if t in last] == list(last), at_last
    assert [r["step"] for r in kr.records(run) if r["type"] == "train"] == list(range(1, kr.STEPS + 1))


def _caught(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (sig - 1) & 1)


def _torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return True  # gone: nothing more to see


def test_a_usr1_while_a_rank_starts_is_kept_and_stops_the_run_after_its_first_step(prose_tokens, tmp_path):
    """The script starts torchrun with USR1 ignored, and its ranks inherit that: Slurm's one
    time-limit USR1 (sent up to 60 s early) that came while a rank was still starting was dropped,
    and the job ran into its time limit (TIMEOUT, not requeued). A rank now records USR1 from its
    first line on: sent before torch is even loaded, it stops the run after step 1 for a requeue."""
    from oreline.train.torchrun import torchrun_command

    cfg = kr.write_config(tmp_path / "c.toml", tmp_path / "runs", prose_tokens)
    run, log = tmp_path / "runs" / "r", tmp_path / "log"
    flag = tmp_path / ".oreline-requeue-4243"
    env = {**kr.env(), "ORELINE_REQUEUE_FILE": str(flag), "SLURM_JOB_ID": "4243"}
    with open(log, "ab") as out:  # as the script starts it: `trap "" USR1; exec torchrun ...`
        agent = subprocess.Popen(
            torchrun_command(1, ["train", "-c", str(cfg)]),
            env=env,
            stdout=out,
            stderr=out,
            preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN),  # noqa: PLW1509
        )
    try:
        rank, end = None, time.monotonic() + 120
        while rank is None and time.monotonic() < end and agent.poll() is None:
            children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
            rank = next((int(c) for c in children if _caught(int(c), signal.SIGUSR1)), None)
            time.sleep(0.005)
        assert rank is not None, "no rank with a USR1 handler: " + log.read_text()[-3000:]
        assert not _torch_loaded(rank), "the rank had loaded torch before it caught USR1"
        os.kill(rank, signal.SIGUSR1)  # while it starts: before the loop, its handler, even torch
        assert agent.wait(timeout=300) != 0, log.read_text()[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
    [stop] = events(run, "stopped")
    assert stop["step"] == 1 and stop["values"]["signal"] == "SIGUSR1", stop
    assert flag.read_text().strip() == str(run / "checkpoints" / "step-00000001")


@pytest.mark.slurm
def test_rank_0_reads_the_jobs_end_time_and_stops_at_end_less_the_lead_without_usr1(slurm_cluster, tmp_path):
    """The stop that does not depend on the USR1 arriving: inside a real job with --time=3 and a
    lead of 50 s, rank 0's deadline is the job's start + 180 - 50 s; a StopRequests past its
    deadline asks for a requeue stop, named as the time limit."""
    from oreline.train.shutdown import StopRequests

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, time\nfrom oreline.train.shutdown import slurm_deadline\n"
        "d, line = slurm_deadline()\nprint(json.dumps({'now': time.time(), 'deadline': d, 'line': line}))\n"
    )
    script = tmp_path / "probe.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --time=3\nexport ORELINE_SIGNAL_LEAD_S=50\n{sys.executable} {probe}\n"
    )
    job = sbatch(script, tmp_path, "-o", str(tmp_path / "probe.out"))
    wait(lambda: gone(job), "the probe job to end", [tmp_path / "probe.out"], timeout=120)
    got = json.loads((tmp_path / "probe.out").read_text().strip().splitlines()[-1])
    # the job started at most a few seconds before the probe read the clock (Slurm's times are whole seconds)
    assert 120 <= got["deadline"] - got["now"] <= 131, got
    assert f"Slurm job {job} ends at" in got["line"] and "(50 s before)" in got["line"], got

    stops = StopRequests(deadline=time.time() + 3600)
    assert not stops.requested()
    stops.deadline = time.time() - 1
    assert stops.requested() and stops.requeue and stops.signum == signal.SIGUSR1
    assert stops.cause.startswith("the time limit")
