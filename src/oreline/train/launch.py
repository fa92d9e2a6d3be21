"""Launch scripts for clusters: an sbatch script for Slurm, or per-node torchrun commands.

The Slurm script starts one task per node; each task runs torchrun with a c10d rendezvous on the
first node of the allocation, so every rank finds its peers without a shared file. NCCL settings
the seed article discusses are written out with a comment saying when to set them, disabled by
default where the default is right for most clusters.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from oreline.config import load_config

# (variable, value, enabled by default, when to set it)
NCCL_SETTINGS: list[tuple[str, str, bool, str]] = [
    (
        "NCCL_ASYNC_ERROR_HANDLING",
        "1",
        True,
        "turn a hung collective (dead peer) into an error instead of a silent hang; keep it on",
    ),
    (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "1",
        True,
        "the same switch under the name newer PyTorch releases read",
    ),
    (
        "NCCL_SOCKET_TIMEOUT",
        "600000",
        False,
        "raise (ms) when bootstrap over slow or congested Ethernet times out during init",
    ),
    (
        "NCCL_IB_DISABLE",
        "1",
        False,
        "set only on clusters WITHOUT InfiniBand/RoCE, or to diagnose an IB fault: forces TCP sockets (much slower)",
    ),
    (
        "NCCL_SOCKET_IFNAME",
        "eth0",
        False,
        "pin the interface NCCL uses for sockets when nodes have several (docker0, lo, ...) and it picks the wrong one",
    ),
    (
        "NCCL_SOCKET_NTHREADS",
        "4",
        False,
        "more socket threads per connection: helps TCP-only clusters (with NCCL_NSOCKS_PERTHREAD; product <= 64)",
    ),
    (
        "NCCL_NSOCKS_PERTHREAD",
        "4",
        False,
        "sockets per helper thread; raise together with NCCL_SOCKET_NTHREADS on TCP-only clusters",
    ),
    (
        "NCCL_DEBUG",
        "WARN",
        True,
        "INFO prints the topology and transport chosen per ring: set it when a job is slow or fails at init",
    ),
]


def slurm_script(
    config: Path,
    nodes: int,
    gpus_per_node: int,
    partition: str | None = None,
    job_name: str | None = None,
    time_limit: str = "48:00:00",
    port: int = 29500,
) -> str:
    """The text of an sbatch script running `oreline train -c CONFIG` on nodes × gpus_per_node."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be at least 1")
    cfg = load_config(config)
    name = job_name or f"oreline-{cfg.run.name}"
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1          # one torchrun per node; it starts the GPU processes",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        f"#SBATCH --cpus-per-task={8 * gpus_per_node}",
        f"#SBATCH --time={time_limit}",
        "#SBATCH --output=%x-%j.out",
        # SIGTERM 120 s before the time limit: the ranks checkpoint after their current step and exit
        # (oreline.train.shutdown); the next job resumes. (USR1 would kill torchrun: it does not handle it.)
        "#SBATCH --signal=TERM@120            # checkpoint and stop before the time limit; the next job resumes",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [
        "",
        "set -euo pipefail",
        "",
        "# Rendezvous on the first node of the allocation.",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={port}",
        "export MASTER_ADDR MASTER_PORT",
        "",
        "# NCCL settings (the seed article's list). Uncomment the ones your cluster needs.",
    ]
    for var, value, enabled, why in NCCL_SETTINGS:
        lines.append(f"# {why}")
        lines.append(("" if enabled else "# ") + f"export {var}={value}")
    lines += [
        "",
        "# Check the environment before spending the allocation (versions, devices, port, clocks).",
        "srun --ntasks-per-node=1 oreline doctor env --distributed || exit 1",
        "",
        "# How long torchrun lets the ranks finish a step and write a checkpoint after SIGTERM before",
        "# it SIGKILLs them (its default is 30 s); keep it below the --signal lead time above.",
        "export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=100",
        "",
        "# --resume auto (the default) continues from the newest valid checkpoint, so a requeued",
        "# or resubmitted job picks up where the last one stopped.",
        "srun --kill-on-bad-exit=1 torchrun \\",
        f"  --nnodes={nodes} --nproc_per_node={gpus_per_node} \\",
        '  --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \\',
        f"  -m oreline train -c {shlex.quote(str(config))}",
        "",
    ]
    return "\n".join(lines)


def torchrun_commands(config: Path, nodes: int, gpus_per_node: int, master: str) -> list[str]:
    """One torchrun command per node, for clusters without Slurm."""
    host, _, port = master.partition(":")
    port = port or "29500"
    return [
        f"torchrun --nnodes={nodes} --nproc_per_node={gpus_per_node} --node_rank={rank} "
        f"--rdzv_id=oreline --rdzv_backend=c10d --rdzv_endpoint={host}:{port} "
        f"-m oreline train -c {shlex.quote(str(config))}"
        for rank in range(nodes)
    ]


def slurm_cli(config: Path, nodes: int, gpus_per_node: int, partition: str | None, out: Path | None) -> None:
    text = slurm_script(config, nodes, gpus_per_node, partition)
    if out is None:
        print(text, end="")
    else:
        out.write_text(text)
        out.chmod(0o755)
        print(f"wrote {out}: submit with `sbatch {out}`")


def torchrun_cli(config: Path, nodes: int, gpus_per_node: int, master: str) -> None:
    for rank, cmd in enumerate(torchrun_commands(config, nodes, gpus_per_node, master)):
        print(f"# node {rank}")
        print(cmd)
