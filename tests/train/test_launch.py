"""The generated Slurm script is valid bash and holds the rendezvous and NCCL settings."""

from __future__ import annotations

import os
import subprocess
import sys

from oreline.config import PACKAGE_CONFIGS
from oreline.train.launch import NCCL_SETTINGS, slurm_script, torchrun_commands

DEMO = PACKAGE_CONFIGS / "demo.toml"


def test_slurm_script_is_valid_bash_with_rendezvous_and_nccl(tmp_path):
    text = slurm_script(DEMO, nodes=4, gpus_per_node=8, partition="gpu")
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert "#SBATCH --nodes=4" in text
    assert "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --partition=gpu" in text
    assert "--nnodes=4 --nproc_per_node=8" in text
    assert '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"' in text
    assert "scontrol show hostnames" in text
    assert f"-m oreline train -c {DEMO}" in text
    for var, _value, enabled, why in NCCL_SETTINGS:
        assert why in text
        assert (f"\nexport {var}=" in text) == enabled
        assert f"export {var}=" in text
    assert "NCCL_IB_DISABLE" in text and "NCCL_SOCKET_TIMEOUT" in text


def test_torchrun_commands_one_per_node():
    cmds = torchrun_commands(DEMO, nodes=2, gpus_per_node=4, master="node0:29400")
    assert len(cmds) == 2
    assert "--node_rank=0" in cmds[0] and "--node_rank=1" in cmds[1]
    assert all("--rdzv_endpoint=node0:29400" in c for c in cmds)


def test_cli_writes_script(tmp_path):
    out = tmp_path / "run.sbatch"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "oreline",
            "launch",
            "slurm",
            "-c",
            str(DEMO),
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["bash", "-n", str(out)], check=True)


def _config(tmp_path, train: str = "") -> object:
    path = tmp_path / "c.toml"
    path.write_text(f'[run]\nname = "x"\nruns_dir = "{tmp_path}"\n[train]\n{train}\n')
    return path


def test_slurm_script_sets_socket_interfaces_current_nccl_names_and_fabric(tmp_path, monkeypatch):
    for var in list(__import__("os").environ):
        if var.startswith(("NCCL_", "TORCH_NCCL_", "FI_", "UCX_", "GLOO_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("FI_PROVIDER", "efa")  # a fabric setting of the writer's environment
    text = slurm_script(_config(tmp_path, 'socket_ifname = "ib0"'), nodes=2, gpus_per_node=8)
    assert "export GLOO_SOCKET_IFNAME=ib0" in text and "export NCCL_SOCKET_IFNAME=ib0" in text
    assert "ip -4 -o addr show dev ib0" in text  # the head node's address on that interface
    assert "\nexport TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in text
    assert "NCCL_ASYNC_ERROR_HANDLING=1" not in text.replace("TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "")
    assert "\nexport FI_PROVIDER=efa" in text and "# export FI_EFA_USE_DEVICE_RDMA=1" in text
    assert "# export NCCL_IB_HCA=" in text
    cpu = slurm_script(_config(tmp_path), nodes=2, gpus_per_node=0)
    assert "NCCL" not in cpu and "FI_PROVIDER" not in cpu
    assert "each rank takes the interface that routes to MASTER_ADDR" in cpu


def test_slurm_script_rendezvous_address_is_not_loopback(tmp_path):
    """The script's MASTER_ADDR lines, run in bash on this host (whose name resolves to loopback
    in many containers): an address other nodes can reach, or the head node's name at worst."""
    text = slurm_script(_config(tmp_path), nodes=2, gpus_per_node=0)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("HEAD_NODE="))
    end = next(i for i, line in enumerate(lines) if line.startswith("export MASTER_ADDR"))
    snippet = "\n".join(
        ["set -euo pipefail", "HEAD_NODE=$(hostname)", *lines[start + 1 : end], 'echo "$MASTER_ADDR"']
    )
    addr = subprocess.run(["bash", "-c", snippet], check=True, capture_output=True, text=True).stdout.strip()
    assert addr and not addr.startswith("127."), addr
    # an allocation of one node rendezvous on loopback: its own routable address may not answer
    # itself (a container, a firewall), and no other node needs to reach it
    one = subprocess.run(
        ["bash", "-c", snippet],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_JOB_NUM_NODES": "1"},
    ).stdout.strip()
    assert one == "127.0.0.1", one
