"""How a training process ends when it is told to: with its launcher, or at a step boundary.

Three situations this module answers:

- **Ranks outlive their launcher.** torchrun starts every rank in a session of its own
  (`start_new_session=True` in torch.distributed.elastic's SubprocessHandler), so a SIGKILL of
  the launcher's process group — what a terminal, a CI runner or a job scheduler sends — never
  reaches the ranks: they trained on, and a relaunch then shared the run folder with them.
  `die_with_parent()` asks the kernel to SIGKILL this process when its parent dies
  (`prctl(PR_SET_PDEATHSIG)`, Linux). Every rank calls it as the first thing `python -m oreline`
  does, so it holds whatever started the rank (`oreline train --nproc`, torchrun, srun → torchrun);
  `oreline train --nproc` sets the same signal on the torchrun agent it starts
  (`oreline.train.torchrun.launch_torchrun`), so the chain launcher → agent → ranks holds at every
  link. The race: a parent that dies between fork and the prctl call leaves the child already
  re-parented, and the death signal never comes; so after the call the parent is compared with
  the one seen first, and the process exits when they differ. SIGKILL, not SIGTERM: a launcher
  that dies without passing a signal on was killed (SIGKILL cannot be caught), and a stop that
  writes a checkpoint while a relaunch may already be starting in the same folder is the fault
  itself; the run resumes from its last periodic checkpoint.

- **SIGTERM must not kill a run without a checkpoint** (exit −15). `StopRequests.install()` turns
  SIGTERM and SIGINT into a flag; the loop ORs it over ranks once per step (`dist.any_rank`, a
  host all-reduce through a CPU gloo group, so it never waits for the device and the training
  step stays free of host reads), and every rank then stops after the same step: a full
  checkpoint at that step, a message with the command that resumes, and `TrainingStopped`, whose
  exit code is 128 + the signal (143 for TERM, 130 for INT, as a shell reports a process killed
  by them). A second SIGINT while the first is pending acts at once (KeyboardInterrupt): Ctrl-C
  twice stops without waiting for the step; repeated SIGTERMs are one request (a service manager
  or Slurm may signal every process of the job, and torchrun passes it on to the ranks again).
  torchrun passes SIGTERM/SIGINT on to every rank and waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (default 30) before it SIGKILLs
  them; `oreline train --nproc` raises that wait to `STOP_GRACE_S` unless it is set, because a
  step plus a checkpoint of a large model can take longer than 30 s.

- **The time limit or a preemption notice on Slurm.** SIGUSR1 is a stop request too,
  with the outcome "requeue": the sbatch script of `oreline launch slurm` asks Slurm for USR1
  some minutes before the time limit (`--signal=USR1@LEAD`, delivered to every process of the
  job's steps; torchrun's agent runs with USR1 ignored, so only the ranks act on it). The ranks
  stop after the same step with a full checkpoint, exactly as on SIGTERM; rank 0 then writes the
  file named by ORELINE_REQUEUE_FILE (set by the script), and the script, once the step has
  ended, runs `scontrol requeue` on its own job: the requeued job starts the same command, which
  resumes from that checkpoint (`--resume auto`). A preemption that sends SIGTERM (GraceTime)
  stops the same way; Slurm's PreemptMode=REQUEUE then requeues the job itself, and a `scancel`
  stops it for good, to be resumed by submitting the script again.

  Slurm sends that USR1 once, up to 60 s earlier than asked (its event resolution), so with a
  short --time it can come while a rank is still starting. Two things keep it from being lost:
  a rank records a USR1 from its first line of Python on (`catch_early_stops`; the script starts
  torchrun with USR1 ignored, and that disposition is what the ranks inherit, so a USR1 before
  the loop's handler was dropped, and the job ran into its time limit and ended TIMEOUT, not
  requeued); and rank 0 reads the job's end time from Slurm at start (`slurm_deadline`) and stops
  for a requeue by itself at end − lead should no USR1 have come by then (one that reached only
  the environment check of the script's first step, say).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from oreline.errors import TrainingError

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
STOP_GRACE_S = 600  # what `oreline train --nproc` gives torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT

_FIRST_PARENT: int | None = None  # the parent pid seen first (recorded before any heavy import)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig) for the calling process; False where unavailable (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def record_parent() -> int:
    """Remember the parent pid as early as possible (the reference for `die_with_parent`'s race check)."""
    global _FIRST_PARENT
    if _FIRST_PARENT is None:
        _FIRST_PARENT = os.getppid()
    return _FIRST_PARENT


def die_with_parent() -> bool:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone.

    Called for every process that torchrun started, and by every rank of a multi-process run:
    a rank alone in its session is otherwise reached by nothing when its launcher is killed.
    Returns whether the death signal is set.
    """
    first = record_parent()
    ok = set_parent_death_signal(signal.SIGKILL)
    if ok and (os.getppid() != first or first == 1):
        # the parent died before the death signal was armed: it will never come
        sys.stderr.write(
            f"oreline: the launcher (pid {first}) is gone; this rank (pid {os.getpid()}) exits\n"
        )
        os._exit(1)
    return ok


def launched_as_rank() -> bool:
    """Started by torchrun: the processes that must not orphan. (Other launchers' ranks set the death
    signal in `init_distributed`; a single `oreline train` may outlive its shell on purpose: nohup.)"""
    return "TORCHELASTIC_RUN_ID" in os.environ


# ---------------------------------------------------------------------------------------------
# stop requests


class TrainingStopped(TrainingError):
    """The run stopped on a signal after writing a checkpoint; `exit_code` is 128 + the signal."""

    def __init__(self, message: str, hint: str, signum: int, show: bool = True):
        super().__init__(message, hint)
        self.exit_code = 128 + int(signum)
        self.show = show  # printed by rank 0 only


REQUEUE_FILE_ENV = "ORELINE_REQUEUE_FILE"  # set by the sbatch script of `oreline launch slurm`
SIGNAL_LEAD_ENV = "ORELINE_SIGNAL_LEAD_S"  # set by the same script: its `--signal=USR1@LEAD`

_EARLY_STOPS: list[int] = []  # the stop signals a rank received before StopRequests was installed


def catch_early_stops() -> None:
    """Record SIGUSR1 from now on, for `StopRequests.install` to act on.

    Called first thing in a rank (before torch is imported): Slurm's time-limit USR1 comes once,
    and while the rank builds its model and loads a checkpoint it would otherwise meet the
    disposition the rank inherited: ignored under the script of `oreline launch slurm` (the
    notice was lost and the job ran into its time limit), fatal under a bare torchrun."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: _EARLY_STOPS.append(signum))


def slurm_deadline(env: dict[str, str] | None = None) -> tuple[float | None, str]:
    """When this Slurm job should stop for a requeue without waiting for USR1: its end time less
    the script's signal lead (epoch seconds), and a line saying so; None outside a job of
    `oreline launch slurm`, and None with the reason when Slurm does not say when the job ends."""
    env = os.environ if env is None else env
    job, lead = env.get("SLURM_JOB_ID"), env.get(SIGNAL_LEAD_ENV)
    if not job or not lead:
        return None, ""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return (
            None,
            f"`scontrol show job {job}` failed ({e}): only Slurm's USR1 stops this job before its time limit",
        )
    end = end_time(out)
    if end is None:
        return None, f"Slurm gives no end time for job {job} (no time limit?): no stop before one"
    deadline = end - float(lead)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deadline))
    return deadline, (
        f"Slurm job {job} ends at {time.strftime('%H:%M:%S', time.localtime(end))}: the run stops for a "
        f"requeue at {stamp} ({lead} s before) if Slurm's USR1 has not come by then"
    )


def end_time(scontrol_show_job: str) -> float | None:
    """The EndTime of `scontrol show job -o` output as epoch seconds (Slurm prints it in local time)."""
    for field in scontrol_show_job.split():
        if field.startswith("EndTime="):
            try:
                return time.mktime(time.strptime(field.split("=", 1)[1], "%Y-%m-%dT%H:%M:%S"))
            except ValueError:  # Unknown, None: a job without a time limit
                return None
    return None


class StopRequests:
    """SIGTERM / SIGINT / SIGUSR1 as a flag the loop reads at step boundaries."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    REQUEUE = (signal.SIGUSR1,)  # Slurm's notice before the time limit: stop, then requeue the job

    def __init__(self, deadline: float | None = None) -> None:
        self.signum: int | None = None
        self.deadline = deadline  # epoch seconds: a requeue stop without USR1 (`slurm_deadline`)
        self.at_deadline = False  # the stop came from the deadline, not from a signal
        self._previous: dict[int, Any] = {}

    def install(self) -> StopRequests:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread (a test's worker thread)
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if _EARLY_STOPS:  # a USR1 during start-up (catch_early_stops)
            self.signum = self.signum or _EARLY_STOPS[0]
            _EARLY_STOPS.clear()
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        # No printing here: the handler runs between two bytecodes of whatever the main thread was
        # doing, possibly inside a write to the same stream. The loop says it at the step boundary.
        if self.signum is not None and signum == signal.SIGINT == self.signum:
            self.uninstall()  # Ctrl-C twice: what it would have done without us (KeyboardInterrupt)
            signal.raise_signal(signum)
            return
        # Repeated SIGTERMs are one request: systemd, or Slurm with cgroup process tracking, signal
        # every process of the job, and torchrun then passes the same signal on to the ranks again.
        self.signum = self.signum or signum

    def requested(self) -> bool:
        """Whether a stop was asked for. A method, not a property: past the deadline the call itself
        records the stop (as if Slurm's USR1 had come), so each call is a look at the clock."""
        if self.signum is None and self.deadline is not None and time.time() >= self.deadline:
            self.signum, self.at_deadline = signal.SIGUSR1, True  # as if Slurm's USR1 had come
        return self.signum is not None

    @property
    def cause(self) -> str:
        """What asked for the stop, as the stop's event and message name it."""
        if self.at_deadline:
            return "the time limit (the job's end time less the signal lead)"
        return signal_name(self.signum) if self.signum else "a signal to another rank"

    @property
    def requeue(self) -> bool:
        """The stop asks for the job to be requeued (it will resume from the stop's checkpoint)."""
        return self.signum in self.REQUEUE

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


def signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name if signum else "a signal"
    except ValueError:
        return f"signal {signum}"


def resume_command(argv: list[str] | None = None, env: dict[str, str] | None = None) -> str:
    """The command that resumes this run: the one that started it, without `--resume`.

    `--resume auto` is the default, so dropping an explicit `--resume PATH` makes the relaunch take
    the newest checkpoint (the one just written) instead of the old one PATH named. In a job of
    `oreline launch slurm` it is the script's `sbatch` command (ORELINE_RESUME_COMMAND). Under
    `oreline train --nproc N` the ranks see ORELINE_LAUNCHED_NPROC and add `--nproc N` back;
    under torchrun started by hand the torchrun part is named, since its options are not known here.
    """
    env = os.environ if env is None else env
    if env.get("ORELINE_RESUME_COMMAND"):  # set by the sbatch script of `oreline launch slurm`
        return env["ORELINE_RESUME_COMMAND"]
    argv = list(sys.argv[1:] if argv is None else argv)
    args: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--resume":
            skip = True
            continue
        if a.startswith("--resume="):
            continue
        args.append(a)
    command = "oreline " + shlex.join(args)
    nproc = env.get("ORELINE_LAUNCHED_NPROC")
    if nproc:
        return f"{command} --nproc {nproc}"
    world = env.get("WORLD_SIZE")
    if world and world != "1":
        return f"torchrun <the same options> -m {command}"
    return command


def ask_for_requeue(checkpoint: Any, env: dict[str, str] | None = None) -> str | None:
    """Tell the sbatch script that the ranks stopped for a requeue (rank 0, after the checkpoint).

    Writes the file ORELINE_REQUEUE_FILE names (the checkpoint's path in it); the script requeues
    the job when it finds it. Returns the job that will be requeued, or None outside such a script."""
    env = os.environ if env is None else env
    target = env.get(REQUEUE_FILE_ENV)
    if not target:
        return None
    from pathlib import Path

    from oreline.io import write_atomic

    write_atomic(Path(target), f"{checkpoint}\n")
    return env.get("SLURM_JOB_ID", "?")
