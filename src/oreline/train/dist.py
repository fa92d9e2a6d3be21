"""torchrun initialisation, DDP / FSDP2 wrapping and the collectives the training loop uses.

Launch: `torchrun --standalone --nproc_per_node=N -m oreline train -c CONFIG`, or `oreline train
--nproc N ...`, which re-runs the same command under torchrun (`oreline.train.torchrun`). torchrun sets
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
(https://pytorch.org/docs/stable/elastic/run.html); `init_distributed` reads them, picks the
backend (NCCL on CUDA, gloo on CPU, `train.backend` overrides), binds each process to its local
GPU and gives every collective a timeout (`train.dist_timeout_s`), so a rank whose peer died
fails instead of waiting forever. On one node torchrun's elastic agent notices a dead worker at
once, stops the others and prints `ChildFailedError ... rank: R (local_rank: R) exitcode: -9`.

Data parallelism (`train.parallel`):
- "ddp": DistributedDataParallel. Gradient accumulation runs the first accum-1 micro-batches
  under `no_sync()`, so gradients are all-reduced once per optimizer step. DDP averages over
  ranks; the loop's loss scale `world / global_targets` turns that mean back into the gradient of
  Σ CE / (target tokens of the whole global batch). `train.find_unused_parameters` is off by
  default (it costs an extra graph traversal per step); `check_unused_parameters` runs after the
  first step's backward and stops the run with the names of parameters that got no gradient,
  because DDP would otherwise leave their bucket un-reduced and fail one step later with a
  message about "reduction in the prior iteration".
- "fsdp": FSDP2, `fully_shard` on every transformer block, then on the root (torchtitan's
  recipe). Parameters become DTensor shards (so the optimizer is built after wrapping), forward
  all-gathers a block's weights and backward reduce-scatters its gradients. With
  precision=bf16 or fp8 on CUDA the MixedPrecisionPolicy computes in bf16 and reduces in fp32
  (fp8 with tensorwise scaling all-gathers its Float8Linear weights in fp8: oreline.train.float8); on CPU
  everything stays fp32. Non-final micro-batches run with `set_requires_gradient_sync(False)`.
  `clip_grad_norm_` on DTensor gradients returns the global norm (a replicated DTensor).

Activation checkpointing (oreline.train.performance.enable_activation_checkpointing) is non-reentrant:
the reentrant variant runs a nested backward that makes DDP mark a parameter ready twice
("Expected to mark a variable ready only once") whenever find_unused_parameters=True; with
find_unused_parameters=False it happens to work in torch 2.13 (tests/train/test_distributed.py
shows both).

Communication time (`comm_ms`, `comm_frac`) is measured by `oreline.train.comm_timing`, whose DDP
comm hook and FSDP2 reduce-scatter `wrap_model` installs.
On gloo `wrap_model` also gives FSDP2 `oreline.train.gloo_reduce_scatter` (an in-place all-reduce
instead of gloo's reduce_scatter, which copies its input: one unit's gradients less per rank at
the peak); with `train.profile` the timed reduce-scatter wraps it.
On CPU `wrap_model` turns FSDP2's implicit backward prefetch off (`no_backward_prefetch`: CPU
all-gathers are synchronous, so it overlaps nothing and costs one unit's weights at the peak).

Metrics are logged by rank 0 only; loss, grad norm and tokens are already global (all-reduced),
timings are averaged over ranks with `mean_over_ranks`. `agree_on_step` all-reduces the loss,
grad norm and a non-finite flag on the device before the stability verdict so every rank makes
the same skip / rollback decision without reading a value on the host; `any_rank` ORs a host flag
(a stop request) over ranks through a CPU (gloo) group, so it never waits for the device.

Checkpoints (oreline.train.checkpoint) are written by every rank with DCP, which stores global
shapes, so a run resumes at any world size (model and optimizer resharded) and the loader, whose
state is a position in one global order, continues the same sequence of global batches. RNG
states are saved per rank; a rank that has none (more ranks than at save time) keeps the state
derived from `train.seed` at start-up. Training draws no random numbers after initialisation
(no dropout; the data order is a seeded permutation), so this changes no result.
`oreline.train.checkpoint.resume.check_resume_batch` refuses a resume whose global batch differs
from the checkpoint's.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from oreline.config import TrainConfig
from oreline.errors import ConfigError, DistributedError
from oreline.train.comm_timing import COMM, AllReduceState, timed_allreduce_hook, timed_reduce_scatter
from oreline.train.gloo_reduce_scatter import gloo_reduce_scatter


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    is_main: bool
    parallel: str = "none"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """FSDP/HSDP: every forward is a collective, so every rank must run it (generation too)."""
        return self.distributed and self.parallel in ("fsdp", "hsdp")


_DEVICE = torch.device("cpu")  # where this process's collective tensors live (CUDA for NCCL)
# a gloo group for host flags when the collectives run on NCCL (None: the default group)
_HOST_GROUP: Any = None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(
            f"environment variable {name}={raw!r} is not an integer", "launch with torchrun"
        ) from None


def init_distributed(cfg: TrainConfig) -> DistInfo:
    """Read torchrun's environment; start a process group when WORLD_SIZE > 1."""
    global _DEVICE, _HOST_GROUP
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world == 1:
        return DistInfo(0, 1, 0, device, None, True, cfg.parallel)
    from oreline.train.shutdown import die_with_parent

    die_with_parent()  # also for ranks not started through `python -m oreline` (no-op if already set)
    # `oreline train --nproc N` asked for several processes: DDP unless told otherwise. Decided here,
    # in DistInfo.parallel, never written back to cfg: the recorded config is the one the user gave
    parallel = cfg.parallel
    if parallel == "none" and os.environ.get("ORELINE_LAUNCHED_NPROC"):
        parallel = "ddp"
    if parallel == "none":
        raise ConfigError(
            f"launched with WORLD_SIZE={world} but train.parallel=none",
            "set train.parallel=ddp (or fsdp, hsdp) to train on several processes",
        )
    set_socket_interface(cfg, world)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("train.backend=nccl needs CUDA devices", "use train.backend=gloo on CPU")
    _DEVICE = device if backend == "nccl" else torch.device("cpu")
    COMM.device = _DEVICE
    if not tdist.is_initialized():
        try:
            tdist.init_process_group(
                backend=backend,
                device_id=device if backend == "nccl" else None,
                timeout=datetime.timedelta(seconds=cfg.dist_timeout_s),
            )
        except Exception as exc:  # the message of a failed rendezvous is the useful part
            raise DistributedError(
                f"could not start the {backend} process group (rank {rank}/{world}): {exc}",
                "check MASTER_ADDR/MASTER_PORT and that every rank was launched (oreline doctor env --distributed)",
            ) from exc
    # host flags (stop requests) travel through gloo on the CPU: through NCCL they would be device
    # tensors, and reading one waits for everything queued on the device
    _HOST_GROUP = tdist.new_group(backend="gloo") if backend == "nccl" else None
    return DistInfo(rank, world, local_rank, device, backend, rank == 0, parallel)


SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def route_interface(host: str) -> tuple[str | None, str | None]:
    """(interface, local IPv4 address) this machine reaches `host` through, by the kernel's route
    (a UDP socket connected to it: no packet is sent); (None, None) when `host` does not resolve."""
    import socket

    import psutil

    try:
        ip = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((ip, 9))
            local = probe.getsockname()[0]
    except OSError:
        return None, None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name, local
    return None, local


def set_socket_interface(cfg: TrainConfig, world: int) -> str | None:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME for this rank; returns the interface set, if any.

    `train.socket_ifname` sets both. Otherwise, on a multi-node launch (WORLD_SIZE > LOCAL_WORLD_SIZE)
    a variable left unset gets the interface that routes to the rendezvous host (MASTER_ADDR):
    without it gloo binds to the address the machine's own hostname resolves to, which on many
    images is 127.0.1.1 (the other nodes' connections then never arrive), and NCCL may pick a
    docker or management interface. Variables set by the user are kept. One node: nothing changes.
    """
    if cfg.socket_ifname:
        for var in SOCKET_VARS:
            os.environ[var] = cfg.socket_ifname
        return cfg.socket_ifname
    if world <= _env_int("LOCAL_WORLD_SIZE", world) or all(os.environ.get(v) for v in SOCKET_VARS):
        return None
    name, _ = route_interface(os.environ.get("MASTER_ADDR", ""))
    if name is None or name == "lo":  # a loopback route cannot serve other nodes: leave the defaults
        return None
    for var in SOCKET_VARS:
        os.environ.setdefault(var, name)
    return name


# ---------------------------------------------------------------------------------------------
# collectives


def _active() -> bool:
    return tdist.is_initialized() and tdist.get_world_size() > 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (identity without a process group); returns the tensor."""
    if _active():
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    if _active():
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
        tensor /= tdist.get_world_size()
    return tensor


def mean_over_ranks(values: list[float]) -> list[float]:
    """The mean of each value over ranks (timings for rank 0's log line); identity on one rank."""
    if not _active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_DEVICE)
    return all_reduce_mean(t).cpu().tolist()  # one transfer


def agree_on_step(loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, grad_norm) every rank agrees on, as device tensors: the max over ranks, NaN if any
    rank saw a non-finite value (a rank's own inf stays inf).

    The loss is all-reduced and DDP/FSDP grad norms are global, so ranks normally hold equal
    values already; this makes the stability decision identical by construction (a NaN on one
    rank only, or a last-bit difference at a spike threshold, cannot split the ranks). Nothing is
    read on the host: the all-reduce is queued on the device like the step's other kernels.
    """
    if not _active():
        return loss, grad_norm
    vals = torch.stack([loss.double().reshape(()), grad_norm.double().reshape(())]).to(_DEVICE)
    ok = torch.isfinite(vals)
    t = torch.cat([torch.where(ok, vals, 0.0), (~ok).double()])
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    out = torch.where(t[2:] > 0, torch.where(ok, math.nan, vals), t[:2]).to(loss.device)
    return out[0], out[1]


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on ANY rank (a stop request), through a host collective: no device wait.

    A signal reaches the ranks at different moments (or one rank only), and a rank that stopped
    alone would leave its peers waiting in the next collective. The flag is read with `.numpy()`,
    which works on CPU tensors only: it cannot turn into a device read.
    """
    if not _active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=_HOST_GROUP)
    return bool(t.numpy()[0] > 0)


def from_main(value: Any) -> Any:
    """Rank 0's `value` on every rank (a decision that must not differ between ranks); identity on one rank."""
    if not _active():
        return value
    box = [value]
    tdist.broadcast_object_list(box, src=0, device=_DEVICE)
    return box[0]


def barrier() -> None:
    if _active():
        tdist.barrier()


_ENDED = False  # this process ran as a rank and has torn its process group down


def cleanup(graceful: bool = True) -> None:
    """Tear the process group down. After a normal finish every rank first meets at a barrier:
    a rank that destroys its gloo group while a peer is still inside the last collective (the
    checkpoint's digest gather) can abort at exit ("terminate called without an active exception",
    SIGABRT) after training finished. After an error no barrier: a dead peer would make it hang."""
    global _ENDED
    if tdist.is_initialized():
        if graceful:
            tdist.barrier()
        tdist.destroy_process_group()
        _ENDED = True


def leave(code: int = 0) -> None:
    """End a rank whose process group `cleanup` tore down, without the interpreter's finalization.

    Finalizing after a 2-rank gloo run aborts in C++ now and then even after the barrier in
    `cleanup` ("terminate called without an active exception", SIGABRT, no Python frame on the
    stack: a gloo worker thread still joinable when its owner is destroyed): 1 in 30 runs of a
    2-rank FSDP2 step on 2 loaded cores, once in CI. torchrun then reports a failed job after a
    finished one. By now every file the caller wrote must be closed; logging and the standard
    streams are flushed here, then the process leaves with `code`."""
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_finished() -> bool:
    """Whether this process was a rank whose process group `cleanup` has torn down: the CLI then
    ends it without the interpreter's finalization (`oreline.cli.main`)."""
    return _ENDED


# ---------------------------------------------------------------------------------------------
# wrapping


def wrap_model(model: nn.Module, cfg: TrainConfig, info: DistInfo) -> nn.Module:
    """Identity at world size 1; DDP or FSDP2 per train.parallel. Build the optimizer AFTER this call.

    FSDP2 shards `model` in place (its parameters become DTensors) and returns it; DDP returns a
    wrapper around it. Either way `model` stays the module to save, evaluate and generate with.
    FSDP2 also applies at world size 1 when the caller started a process group itself
    (benchmarks/gpu_check.py: one GPU with FSDP2's bf16 mixed precision, as each rank of a job runs).
    """
    one_rank_fsdp = info.parallel in ("fsdp", "hsdp") and tdist.is_initialized()
    if not info.distributed and not one_rank_fsdp:
        return model
    if info.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [info.local_rank] if info.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model, device_ids=ids, find_unused_parameters=cfg.find_unused_parameters
        )
        low = torch.bfloat16 if cfg.reduce_dtype == "bf16" else None
        ddp.register_comm_hook(AllReduceState(COMM, low), timed_allreduce_hook)
        return ddp
    if info.parallel in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = device_mesh(cfg, info)
        reduce = torch.bfloat16 if cfg.reduce_dtype == "bf16" else torch.float32
        if info.device.type == "cuda" and cfg.precision in ("bf16", "fp8"):  # fp8: bf16 outside its GEMMs
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
        else:  # fp32 compute (CPU: bf16 matmuls are ~20× slower); the reduction as asked
            mp = MixedPrecisionPolicy(reduce_dtype=None if reduce == torch.float32 else reduce)
        units = fsdp_units(model)
        for unit, reshard in units:
            fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp)  # the root: buffers, and the tied embedding + norm
        if getattr(model, "lm_head", True) is None:
            # tied: backward reads the root's gathered parameters only in its first steps (output
            # projection, final norm): freed there, not at the end of backward (model/tied.py;
            # 98 MB at 125m on every rank, whatever the world size, through the blocks' backward)
            model.after_tied_output_backward = model.reshard
        if info.device.type == "cpu":
            no_backward_prefetch(model)
        # gloo: all-reduce in place, without gloo's full-size copy of each unit's gradients
        # (oreline.train.gloo_reduce_scatter; NCCL reduces in place itself)
        comm = gloo_reduce_scatter() if info.backend == "gloo" else None
        # the timed reduce-scatter waits for each collective: a profiling tool, not the default path
        if cfg.profile:
            comm = timed_reduce_scatter(comm)
        if comm is not None:  # None: a torch outside the tested range (oreline.compat): FSDP2's own, untimed
            for m in model.modules():
                if hasattr(m, "set_custom_reduce_scatter"):
                    m.set_custom_reduce_scatter(comm)
        return model
    raise ConfigError(f"train.parallel={info.parallel!r} is unknown", "use train.parallel=ddp, fsdp or hsdp")


def no_backward_prefetch(model: nn.Module) -> None:
    """Turn off FSDP2's implicit backward prefetch on every unit of `model` (CPU ranks).

    By default each unit's pre-backward all-gathers the unit that backward reaches next, so that on
    a GPU the collective (on its own stream) overlaps this unit's gradient computation. On CPU there
    are no streams: every all-gather runs to completion on the calling thread, so prefetching
    overlaps nothing and only moves the next unit's all-gather buffer to before this unit's
    gradients exist, one unit's unsharded weights more at the peak of the blocks' backward (34.6 MB
    at 125m, whatever the world size; docs/measurements.md). The same collectives run in the same
    order either way: the gathered values, and so the results, are the same.

    FSDP2 reads an empty prefetch list as "the default", so each unit is given itself: by the time
    its prefetch runs its own pre-backward has gathered it, and FSDP2's unshard of a gathered unit
    returns at once."""
    for module in model.modules():
        if hasattr(module, "set_modules_to_backward_prefetch"):
            module.set_modules_to_backward_prefetch([module])


def fsdp_units(model: nn.Module) -> list[tuple[Any, bool]]:
    """FSDP2 units below the root, in forward order, each with whether it reshards after forward
    (torchtitan's distributed/fsdp.py layout).

    - the embedding table, a unit of its own (resharded: backward needs it only at the very end);
    - every transformer block; the last one is not resharded after forward, since backward
      starts with it and would gather it again at once;
    - the final norm + output head, one unit, not resharded after forward (the same reason).
    With tied embeddings the table is also the output projection: it and the final norm stay in
    the root unit, which FSDP2 keeps gathered from forward to backward.
    """
    blocks = list(model.model.layers)
    units: list[tuple[Any, bool]] = []
    untied = getattr(model, "lm_head", None) is not None
    if untied:
        units.append((model.model.embed_tokens, True))
    units += [(block, i < len(blocks) - 1) for i, block in enumerate(blocks)]
    if untied:
        units.append(([model.model.norm, model.lm_head], False))
    return units


def hsdp_shape(cfg: TrainConfig, world: int, local_world: int) -> tuple[int, int]:
    """(replicas, shards) of the HSDP mesh: `train.hsdp_shard_size` ranks (default: one node's,
    LOCAL_WORLD_SIZE) hold one copy of the model between them; the copies are replicated."""
    shard = cfg.hsdp_shard_size or local_world
    if shard < 1 or world % shard:
        raise ConfigError(
            f"train.parallel=hsdp: {world} ranks cannot be split into groups of {shard} "
            f"({'train.hsdp_shard_size' if cfg.hsdp_shard_size else 'the ranks per node'})",
            "set train.hsdp_shard_size to a divisor of the number of ranks (e.g. the GPUs per node)",
        )
    return world // shard, shard


def device_mesh(cfg: TrainConfig, info: DistInfo) -> Any:
    """FSDP2's mesh: 1-D over every rank ("fsdp"), or 2-D (replicate, shard) for "hsdp", whose
    shard dimension is the ranks of one node (consecutive ranks, as torchrun numbers a node's)."""
    from torch.distributed.device_mesh import init_device_mesh

    if cfg.parallel == "hsdp":
        shape = hsdp_shape(cfg, info.world_size, _env_int("LOCAL_WORLD_SIZE", info.world_size))
        return init_device_mesh(info.device.type, shape, mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(info.device.type, (info.world_size,))


def shard_count(cfg: TrainConfig, world: int) -> int:
    """Into how many shards each rank's model state is split (1: DDP, or a single process)."""
    if world <= 1 or cfg.parallel not in ("fsdp", "hsdp"):
        return 1
    if cfg.parallel == "hsdp":
        return hsdp_shape(cfg, world, _env_int("LOCAL_WORLD_SIZE", world))[1]
    return world


def sync_context(model: nn.Module, last: bool, every_micro_batch: bool = True) -> Any:
    """Context for one micro-batch. DDP reduces gradients on the last micro-batch only (its
    accumulated gradients are as large as the model whether reduced or not). FSDP2 reduce-scatters
    after every micro-batch by default: deferring it (`every_micro_batch=False`,
    train.fsdp_grad_sync="step") keeps the whole model's unsharded gradients on every rank between
    micro-batches (32 GB per rank at 8B), which sharding exists to avoid."""
    if hasattr(model, "no_sync"):  # DDP
        return contextlib.nullcontext() if last else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(last or every_micro_batch)
    return contextlib.nullcontext()


@contextlib.contextmanager
def gathered(model: nn.Module) -> Any:
    """FSDP2: all-gather every unit's parameters once and keep them for the body (generation);
    a plain or DDP model passes through.

    Generation runs one forward per new token: with the units resharding after each forward, every
    token would all-gather the whole model again (n_tokens × the model's size in traffic). Here
    each unit is gathered once and resharded at the end; the body holds the full parameters (in
    FSDP2's compute dtype) for its duration. Every rank must enter it (it is a collective)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    policy = {}  # each unit's own reshard_after_forward, restored at the end
    for unit, reshard in fsdp_units(model):
        for u in unit if isinstance(unit, list) else [unit]:
            policy[id(u)] = reshard
    try:
        for unit in units:
            if unit is not model:
                unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        yield
    finally:
        for unit in units:
            unit.reshard()
            if unit is not model:
                unit.set_reshard_after_forward(policy.get(id(unit), True), recurse=False)


def check_unused_parameters(model: nn.Module, train_model: nn.Module) -> None:
    """After the first step's backward: parameters DDP never saw a gradient for stop the run (by name)."""
    if not hasattr(train_model, "no_sync") or getattr(train_model, "find_unused_parameters", True):
        return
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if unused:
        shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
        raise DistributedError(
            f"DDP: {len(unused)} parameter(s) received no gradient in the first step: {shown}",
            "set train.find_unused_parameters=true (or remove the parameters the forward does not use)",
        )


def clip_grad_norm(parameters: Any, max_norm: float) -> torch.Tensor:
    """Clip to the global norm over all ranks' gradients (DTensor-aware); returns the pre-clip norm
    as a tensor on the device (a NaN norm turns the gradients NaN: the step's verdict masks them)."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a replicated DTensor holding the global norm
        norm = norm.full_tensor()
    return norm


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module under DDP and torch.compile wrappers (for saving and generation)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner
