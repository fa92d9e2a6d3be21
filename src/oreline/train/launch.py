"""Launch scripts for clusters: an sbatch script for Slurm, or per-node torchrun commands.

The Slurm script starts one task per node; each task runs torchrun with a c10d rendezvous on the
first node of the allocation, so every rank finds its peers without a shared file. NCCL settings
the seed article discusses are written out with a comment saying when to set them, disabled by
default where the default is right for most clusters.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from oreline.config import Config, load_config, resolve_config_path
from oreline.errors import ConfigError
from oreline.job_inputs import pin_args
from oreline.slurm_script import check_partition, check_time, checked, directive, shell_word, write_script
from oreline.slurm_script import job_name as job_name_of

# (variable, value, enabled by default, when to set it)
NCCL_SETTINGS: list[tuple[str, str, bool, str]] = [
    (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "1",
        True,
        "turn a hung collective (dead peer) into an error instead of a silent hang; keep it on "
        "(the name PyTorch reads since 2.2; NCCL_ASYNC_ERROR_HANDLING is the deprecated one)",
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

# Fabric settings, by fabric: written commented out; uncomment the block of yours (README, "Multi-node").
FABRIC_SETTINGS: dict[str, list[tuple[str, str, str]]] = {
    "InfiniBand / RoCE": [
        (
            "NCCL_IB_HCA",
            "mlx5",
            "the HCAs NCCL may use (prefix list; ^ excludes), when some ports are not for training",
        ),
        ("NCCL_IB_GID_INDEX", "3", "RoCE v2: the GID index of the RoCE v2 address (show_gids lists them)"),
    ],
    "AWS EFA (aws-ofi-nccl plugin)": [
        ("FI_PROVIDER", "efa", "libfabric provider: EFA"),
        ("FI_EFA_USE_DEVICE_RDMA", "1", "GPUDirect RDMA over EFA (p4d/p5 instances)"),
        ("FI_EFA_FORK_SAFE", "1", "the data loader forks worker processes: make libfabric fork-safe"),
    ],
}
# Variables passed through from the environment the script is written in (prefixes): fabric and
# collective settings exported there reach every rank even on clusters whose sbatch exports nothing.
PASS_THROUGH_PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_", "UCX_", "GLOO_")


def fabric_lines(gpu: bool, socket_ifname: str | None, environ: dict[str, str] | None = None) -> list[str]:
    """The environment lines of the sbatch script: the sockets' interface, collective and fabric settings."""
    import os

    env = dict(os.environ if environ is None else environ)
    lines = ["# The interface the collectives' sockets use (gloo" + (", NCCL" if gpu else "") + ")."]
    ifvars = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if gpu else ("GLOO_SOCKET_IFNAME",)
    if socket_ifname:
        lines += [f"export {var}={shlex.quote(socket_ifname)}  # train.socket_ifname" for var in ifvars]
    else:
        lines.append(
            "# Unset here: each rank takes the interface that routes to MASTER_ADDR (train.socket_ifname pins one)."
        )
    passed = {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(PASS_THROUGH_PREFIXES) and (gpu or k.startswith("GLOO_"))
    }
    if socket_ifname:
        passed = {k: v for k, v in passed.items() if k not in ifvars}
    if passed:
        lines.append("# Passed through from the environment this script was written in:")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in passed.items()]
    if not gpu:
        return lines
    lines += ["", "# NCCL settings (the seed article's list). Uncomment the ones your cluster needs."]
    for var, value, enabled, why in NCCL_SETTINGS:
        if var in passed:
            continue
        lines.append(f"# {why}")
        lines.append(("" if enabled else "# ") + f"export {var}={value}")
    for fabric, settings in FABRIC_SETTINGS.items():
        lines.append(f"# {fabric}:")
        for var, value, why in settings:
            if var not in passed:
                lines.append(f"# export {var}={value}  # {why}")
    return lines


def check_allocation(cfg: Config, nodes: int, nproc_per_node: int) -> dict[str, Any]:
    """The global batch on nodes × processes (session.global_batch's arithmetic); a TrainingError when
    it contradicts train.global_batch_tokens or the batch of the run's last checkpoint (which the
    job would resume). Checked on the login node, before the job waits in the queue and spends its
    allocation."""
    from oreline.runs import RunDir
    from oreline.train.batch import global_batch
    from oreline.train.checkpoint.format import read_latest, read_meta
    from oreline.train.checkpoint.resume import check_resume_batch

    world = nodes * nproc_per_node
    batch = global_batch(cfg, world)
    root = RunDir.for_config(cfg).root / "checkpoints"
    name = read_latest(root) if root.is_dir() else None
    meta = read_meta(root / name) if name else None
    if meta is not None:  # the job resumes this checkpoint (--resume auto): its batch must match
        check_resume_batch(meta, batch, [])
    return batch


def slurm_script(
    config: Path,
    nodes: int,
    gpus_per_node: int,
    partition: str | None = None,
    job_name: str | None = None,
    time_limit: str = "48:00:00",
    port: int = 29500,
    nproc_per_node: int | None = None,
    cpus_per_task: int | None = None,
    signal_lead_s: int = 120,
    output: str = "%x-%j.out",
    script_path: Path | None = None,
) -> str:
    """The text of an sbatch script running `oreline train -c CONFIG` on nodes × processes, pinned to
    CONFIG's bytes as they are now (`--config-sha256`: a job that starts after the file changed stops).

    gpus_per_node = 0 is a CPU job: gloo, `nproc_per_node` processes per node (default 1). The
    allocation is checked against the config first (`check_allocation`)."""
    if nodes < 1 or gpus_per_node < 0:
        raise ConfigError(
            f"--nodes {nodes} --gpus-per-node {gpus_per_node}", "ask for at least 1 node and 0 or more GPUs"
        )
    nproc = nproc_per_node or gpus_per_node or 1
    if gpus_per_node and nproc != gpus_per_node:
        raise ConfigError(
            f"--nproc-per-node {nproc} with --gpus-per-node {gpus_per_node}",
            "run one process per GPU (leave --nproc-per-node out), or use --gpus-per-node 0 for a CPU job",
        )
    if cpus_per_task is not None and cpus_per_task < nproc:
        raise ConfigError(
            f"--cpus-per-task {cpus_per_task} is fewer than the {nproc} processes per node",
            f"ask for at least {nproc} CPUs (or leave it out: the job then takes whole nodes)",
        )
    config = Path(config).resolve()  # the job may start in another folder
    # the job trains on the config as it is now: every rank's `oreline train` is pinned to the sha256
    # of these bytes and refuses the file once it changed (oreline.job_inputs)
    pin = pin_args(resolve_config_path(config).read_bytes())
    cfg = load_config(config, sha256=pin[1])
    batch = check_allocation(cfg, nodes, nproc)
    # every value reaching the script is checked: #SBATCH values are plain tokens, shell words quoted
    name = job_name or job_name_of("oreline", cfg.run.name)
    checked(check_time, time_limit, "--time")
    if partition:
        checked(check_partition, partition, "--partition")
    gpu = gpus_per_node > 0
    nodes, nproc, port, signal_lead_s = int(nodes), int(nproc), int(port), int(signal_lead_s)
    lines = [
        "#!/usr/bin/env bash",
        directive("--job-name", name, "--job-name"),
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1          # one torchrun per node; it starts the training processes",
    ]
    if gpu:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    lines.append(
        f"#SBATCH --cpus-per-task={int(cpus_per_task)}"
        if cpus_per_task
        else "#SBATCH --exclusive                  # whole nodes: the CPUs per process follow the node's count"
    )
    lines += [
        directive("--time", time_limit, "--time"),
        directive("--output", output, "the log file name"),
        "#SBATCH --open-mode=append           # a requeued job appends to its log",
        "#SBATCH --requeue                    # the job may be requeued (by itself on USR1, or by preemption)",
        # USR1 to every process of the job's steps LEAD seconds before the time limit: the ranks stop
        # after the step in flight with a checkpoint (oreline.train.shutdown), then the job requeues.
        f"#SBATCH --signal=USR1@{signal_lead_s}            # checkpoint at the next step boundary, then requeue",
    ]
    if partition:
        lines.append(directive("--partition", partition, "--partition"))
    python = shell_word(sys.executable, "the Python executable")
    lines += [
        "",
        "set -euo pipefail",
        f"# global batch = micro {batch['micro']} × accum {batch['accum']} × {nodes} node(s) × {nproc} process(es)"
        f" × seq_len {batch['seq_len']} = {batch['tokens']:,} tokens (checked when this script was written)",
        f'if [ "${{SLURM_JOB_NUM_NODES:-{nodes}}}" != {nodes} ]; then',
        f'  echo "oreline: this script was written for {nodes} node(s), the job has $SLURM_JOB_NUM_NODES:'
        f' write it again with oreline launch slurm --nodes $SLURM_JOB_NUM_NODES" >&2',
        "  exit 1",
        "fi",
        f"PYTHON={python}",
        "",
        "# Rendezvous on the first node of the allocation (this shell runs there), by address: a node",
        "# may resolve its own name to 127.0.1.1 (/etc/hosts), which the other nodes cannot reach.",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        *(
            [  # the head node's address on the configured interface
                f"MASTER_ADDR=$(ip -4 -o addr show dev {shlex.quote(cfg.train.socket_ifname)} 2>/dev/null"
                " | awk '{split($4, a, \"/\"); print a[1]; exit}' || true)"
            ]
            if cfg.train.socket_ifname
            else ["MASTER_ADDR="]
        ),
        '[ -n "$MASTER_ADDR" ] || MASTER_ADDR=$(getent ahostsv4 "$HEAD_NODE" | awk \'$1 !~ /^127\\./ {print $1; exit}\' || true)',
        "[ -n \"$MASTER_ADDR\" ] || MASTER_ADDR=$(hostname -I 2>/dev/null | awk '{print $1}' || true)",
        "MASTER_ADDR=${MASTER_ADDR:-$HEAD_NODE}",
        "# one node: every rank is on this host, and loopback always answers (a node's own routable",
        "# address may be firewalled or, in a container, not reachable from itself)",
        'if [ "${SLURM_JOB_NUM_NODES:-}" = 1 ]; then MASTER_ADDR=127.0.0.1; fi',
        f"MASTER_PORT=$(({port} + ${{SLURM_JOB_ID:-0}} % 1000))  # two jobs sharing a node meet on two ports",
        "export MASTER_ADDR MASTER_PORT",
        "",
    ]
    if not gpu:
        lines.append(
            "# A CPU job: the processes talk over gloo (train.backend = auto picks it without CUDA)."
        )
    lines += fabric_lines(gpu, cfg.train.socket_ifname)
    lines += [
        "",
        "# Threads per process: the CPUs Slurm gave this node's task, shared by its processes.",
        "CPUS=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-$(nproc)}}",
        f"THREADS=$((CPUS / {nproc}))",
        'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$((THREADS > 0 ? THREADS : 1))}"',
        "",
        "# Check the environment before spending the allocation (versions, devices, port, clocks).",
        "# (with USR1 ignored: a time-limit notice that comes this early must not fail the job; rank 0",
        "# stops at the job's end time less the lead by itself, ORELINE_SIGNAL_LEAD_S)",
        'srun --ntasks-per-node=1 bash -c \'trap "" USR1; exec "$@"\' doctor "$PYTHON" -m oreline doctor env --distributed || exit 1',
        "",
        "# How long torchrun lets the ranks finish a step and write a checkpoint after SIGTERM before",
        f"# it SIGKILLs them (its default is 30 s); keep it below the --signal lead time ({signal_lead_s} s).",
        f"export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={max(10, signal_lead_s - 20)}",
        "",
        "# Rank 0 writes this file when the ranks stopped for the time limit (USR1, or end - lead): requeue then.",
        'export ORELINE_REQUEUE_FILE="${SLURM_SUBMIT_DIR:-$PWD}/.oreline-requeue-$SLURM_JOB_ID"',
        f"export ORELINE_SIGNAL_LEAD_S={signal_lead_s}",
        'rm -f "$ORELINE_REQUEUE_FILE"',
    ]
    if script_path is not None:  # what a stop (scancel, SIGTERM) names as the command that resumes
        lines.append(
            f"export ORELINE_RESUME_COMMAND={shlex.quote('sbatch ' + shell_word(script_path, '--out'))}"
        )
    lines += [
        "# USR1 meant for the ranks must not end this shell (scancel --full -s USR1 signals it too)",
        "trap 'echo \"oreline: USR1 reached the batch shell; the ranks act on it\" >&2' USR1",
        "",
        "# --resume auto (the default) continues from the newest valid checkpoint, so a requeued",
        "# or resubmitted job picks up where the last one stopped. torchrun runs with USR1 ignored (its",
        "# default action would end it and, with it, the ranks); the ranks install their own handler.",
        "set +e",
        'srun --kill-on-bad-exit=1 bash -c \'trap "" USR1; exec "$@"\' torchrun \\',
        '  "$PYTHON" -m torch.distributed.run \\',
        f"  --nnodes={nodes} --nproc_per_node={nproc} \\",
        '  --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \\',
        f"  -m oreline train -c {shell_word(config, '--config')} {shlex.join(pin)}"
        # several processes and parallel = none: DDP, as `oreline train --nproc N` does
        + (" train.parallel=ddp" if nodes * nproc > 1 and cfg.train.parallel == "none" else ""),
        "rc=$?",
        "set -e",
        'if [ -e "$ORELINE_REQUEUE_FILE" ]; then',
        '  echo "oreline: checkpoint $(cat "$ORELINE_REQUEUE_FILE") written before the time limit; requeueing job $SLURM_JOB_ID" >&2',
        '  rm -f "$ORELINE_REQUEUE_FILE"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "  exit 0",
        "fi",
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def torchrun_commands(config: Path, nodes: int, gpus_per_node: int, master: str) -> list[str]:
    """One torchrun command per node, for clusters without Slurm."""
    host, _, port = master.partition(":")
    port = port or "29500"
    return [
        f"torchrun --nnodes={nodes} --nproc_per_node={gpus_per_node} --node_rank={rank} "
        f"--rdzv_id=oreline --rdzv_backend=c10d --rdzv_endpoint={shell_word(f'{host}:{port}', '--master')} "
        f"-m oreline train -c {shell_word(config, '--config')}"
        for rank in range(nodes)
    ]


def slurm_cli(
    config: Path,
    nodes: int,
    gpus_per_node: int,
    partition: str | None,
    out: Path | None,
    submit: bool = False,
    **options: Any,
) -> str | None:
    """Write (or print) the sbatch script; with `submit`, sbatch it and print the job id (returned)."""
    if out is None and not submit:
        print(slurm_script(config, nodes, gpus_per_node, partition, **options), end="")
        return None
    if out is None:
        out = Path(f"oreline-{load_config(config).run.name}.sbatch")
    out = out.resolve()
    text = slurm_script(config, nodes, gpus_per_node, partition, script_path=out, **options)
    write_script(out, text)
    if not submit:
        print(f"wrote {out}: submit with `sbatch {out}`")
        return None
    from oreline.executors.slurm import submit as sbatch

    job = sbatch(text)  # the text itself, on stdin: not the file, which could change in between
    print(f"wrote {out}; submitted as Slurm job {job}", file=sys.stderr)
    print(job)  # alone on stdout, for scripts: JOB=$(oreline launch slurm ... --submit)
    return job


def torchrun_cli(config: Path, nodes: int, gpus_per_node: int, master: str) -> None:
    for rank, cmd in enumerate(torchrun_commands(config, nodes, gpus_per_node, master)):
        print(f"# node {rank}")
        print(cmd)
