"""torchrun initialisation, model wrapping and the few collectives the training loop uses.

A first, minimal version: world size 1 needs no process group (every helper is then the
identity), DDP wraps the model when `train.parallel = "ddp"`. torchrun sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT (https://pytorch.org/docs/stable/elastic/run.html);
`init_distributed` reads them, picks the backend (NCCL on CUDA, gloo on CPU unless
`train.backend` says otherwise) and binds each process to its local GPU.

The loop's distributed touch points are: the loader's rank/world_size (each rank reads its
slice of one global order), `all_reduce_sum` of the step's target-token count and loss sums
(so the loss is normalised by the tokens of the whole global batch), and rank-0-only logging.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn

from oreline.config import TrainConfig
from oreline.errors import ConfigError, DistributedError


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    is_main: bool

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"environment variable {name}={raw!r} is not an integer", "launch with torchrun") from None


def init_distributed(cfg: TrainConfig) -> DistInfo:
    """Read torchrun's environment; start a process group when WORLD_SIZE > 1."""
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world == 1:
        return DistInfo(0, 1, 0, device, None, True)
    if cfg.parallel == "none":
        raise ConfigError(
            f"launched with WORLD_SIZE={world} but train.parallel=none",
            "set train.parallel=ddp (or fsdp) to train on several processes",
        )
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("train.backend=nccl needs CUDA devices", "use train.backend=gloo on CPU")
    if not tdist.is_initialized():
        try:
            tdist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
        except Exception as exc:  # the message of a failed rendezvous is the useful part
            raise DistributedError(
                f"could not start the {backend} process group (rank {rank}/{world}): {exc}",
                "check MASTER_ADDR/MASTER_PORT and that every rank was launched (oreline doctor env --distributed)",
            ) from exc
    return DistInfo(rank, world, local_rank, device, backend, rank == 0)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (identity without a process group); returns the tensor."""
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
        tensor /= tdist.get_world_size()
    return tensor


def barrier() -> None:
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.barrier()


def wrap_model(model: nn.Module, cfg: TrainConfig, info: DistInfo) -> nn.Module:
    """Identity at world size 1; DistributedDataParallel when train.parallel = ddp."""
    if not info.distributed:
        return model
    if cfg.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [info.local_rank] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    raise ConfigError(
        f"train.parallel={cfg.parallel} is not implemented in this version",
        "use train.parallel=ddp",
    )


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module under DDP and torch.compile wrappers (for saving and generation)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def cleanup() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()


def launch_torchrun(nproc: int, argv: list[str]) -> int:
    """Re-run this oreline command under torchrun with `nproc` processes; its exit code.

    `argv` is the command line after the program name; `--nproc N` is removed so the children
    do not launch again, and `train.parallel=ddp` is added when no parallel mode is given.
    """
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
    if not any(a.startswith("train.parallel=") for a in args):
        args.append("train.parallel=ddp")
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    cmd += ["--standalone", f"--nproc_per_node={nproc}", "-m", "oreline", *args]
    return subprocess.call(cmd)
