"""The generated Slurm script is valid bash and holds the rendezvous and NCCL settings."""

from __future__ import annotations

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
