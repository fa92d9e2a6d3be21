"""`oreline train --nproc N`: the same command re-run under torchrun on this machine.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for every child
(https://pytorch.org/docs/stable/elastic/run.html), which `oreline.train.dist.init_distributed`
reads. Launch scripts for clusters (an sbatch script, per-node torchrun commands) are
`oreline.train.launch`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

from oreline.train.shutdown import STOP_GRACE_S, set_parent_death_signal


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc_per_node=N -m oreline ARGV` with this
    interpreter; `--nproc N` / `--nproc=N` are dropped from `argv` (the children must not launch again)."""
    args: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = i + 1 < len(argv)
            continue
        if a.startswith("--nproc="):
            continue
        args.append(a)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "oreline",
        *args,
    ]


def launch_torchrun(nproc: int, argv: list[str]) -> int:
    """Re-run this oreline command under torchrun with `nproc` processes; its exit code.

    `argv` is the command line after the program name; `--nproc N` is removed so the children
    do not launch again. The children get ORELINE_LAUNCHED_NPROC, which makes a config that says
    train.parallel=none train with DDP (a config or override naming ddp/fsdp is kept).
    torchrun is run as `python -m torch.distributed.run` from this interpreter, so the children
    use the same environment as the parent whatever `torchrun` is first on PATH. torchrun sets
    OMP_NUM_THREADS=1 in the children unless it is set (cores would be oversubscribed otherwise).

    Lifetime (oreline.train.shutdown): the torchrun agent gets a parent-death SIGKILL, so it cannot
    outlive this process (and its ranks, which set their own, cannot outlive it), and runs in a
    process group of its own, so a terminal's Ctrl-C reaches it once — from here — and not twice
    (torchrun would abort its graceful shutdown on the second). SIGTERM and SIGINT received here
    are passed on; torchrun passes them to every rank, which stops at the next step with a
    checkpoint. The exit code is then 128 + the signal, as if the signal had ended this process.
    """
    cmd = torchrun_command(nproc, argv)
    env = {**os.environ, "ORELINE_LAUNCHED_NPROC": str(nproc)}
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(STOP_GRACE_S))
    me = os.getpid()

    def arm() -> None:  # in the child, before exec: die with this process (or now, if it is already gone)
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != me:
            os.kill(os.getpid(), signal.SIGKILL)

    # process_group=0: a group of its own in this session (the terminal's signals go to the foreground
    # group, this process's, only); preexec_fn is safe here, no thread has been started yet
    proc = subprocess.Popen(cmd, env=env, preexec_fn=arm, process_group=0)  # noqa: PLW1509
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received and rc != 0:
        return 128 + received[0]
    return rc
