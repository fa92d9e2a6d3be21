"""One optimizer step on the device: `StepRunner.train_step(n, batch) -> StepResult`.

What a step computes (oreline.train.loop says when it runs and what happens around it):
forward + backward of every micro-batch, the loss normalised by the target count of the whole
global batch (`forward_backward`); the global grad norm, clipped; the loss and grad norm made
equal on every rank; the stability verdict (`DeviceJudge`); the optimizer update, masked on the
device when the verdict says skip, or when a rollback is pending (`frozen`: every step from an
anomalous one until the loop reads it changes nothing, so the later rollback is an immediate one).

Contract: `train_step` reads nothing from the device on the host (with the fused AdamW kernels;
`optim.fused=false` reads the verdict, one read per step). Its `StepResult` holds 0-d device
tensors; the loop keeps it until a step that reads anyway, which reads every pending step's
`pack`ed vector in one transfer, and `StepResult.unpack` turns each row into the same named
fields as host values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from oreline import compat
from oreline.config import Config
from oreline.model.scoring import loss_breakdown
from oreline.train import comm_timing, dist
from oreline.train.batch import GlobalBatch
from oreline.train.optim import warmup_steps
from oreline.train.session import Setup, TrainState, _nullcontext
from oreline.train.stability import KINDS, DeviceJudge, StabilityMonitor


@dataclass
class StepResult:
    """One step's values and verdict: 0-d device tensors from `train_step`; host values (floats,
    bools, the verdict's name) once `unpack` has read them.

    applied: the update reached the weights; clipped: the pre-clip grad norm exceeded the clip;
    kind, z, mean, std: the stability verdict (DeviceJudge.judge: z, mean and std of the spiking
    value, 0 otherwise); sums: the global loss breakdown (oreline.model.scoring.loss_breakdown).
    """

    loss: Any
    grad_norm: Any
    applied: Any
    clipped: Any
    kind: Any
    z: Any
    mean: Any
    std: Any
    sums: Any

    def pack(self) -> torch.Tensor:
        """The step as one float64 device vector, so that settling many steps is one transfer."""
        head = [self.loss, self.grad_norm, self.applied, self.clipped, self.kind, self.z, self.mean, self.std]
        return torch.cat([torch.stack([v.double() for v in head]), self.sums])

    @classmethod
    def unpack(cls, row: list[float]) -> StepResult:
        """The host values of a `pack`ed vector that was read (the layout lives here and in `pack`)."""
        loss, grad_norm, applied, clipped, kind, z, mean, std = row[:8]
        return cls(loss, grad_norm, applied > 0, bool(clipped), KINDS[int(kind)], z, mean, std, row[8:])


def global_loss(sums: torch.Tensor) -> torch.Tensor:
    """Σ CE / Σ targets from a loss breakdown, summed as `breakdown_means` sums it (NaN or inf
    without targets: non-finite, so the verdict catches it)."""
    return (sums[0] + sums[2] + sums[4]) / (sums[1] + sums[3] + sums[5])


def debug_loss_factor(cfg: Config, n: int, state: TrainState) -> float:
    """The loss factor the debug injections ask for at step n (1.0 without one). Each applies once,
    the first time step n is reached, not again after a rollback (`state.debug_injected`)."""
    debug = cfg.train.debug
    factor = 1.0
    spike_at = debug.inject_spike_at_step
    for at, f in (
        (debug.inject_nan_at_step, math.nan),
        # a spike on spike_steps steps in a row from inject_spike_at_step (a storm when > 1)
        (
            n if spike_at is not None and spike_at <= n < spike_at + debug.spike_steps else None,
            debug.spike_factor,
        ),
    ):
        if at == n and n not in state.debug_injected:
            factor *= f
            state.debug_injected.append(n)
    return factor


class StepRunner:
    """The device state that lasts from step to step: the judge's window, the pending-rollback
    mask, how the optimizer skips an update. `after_rollback` resets it to the host monitor's."""

    def __init__(self, cfg: Config, s: Setup, info: dist.DistInfo, stability: StabilityMonitor):
        self.cfg, self.s, self.info = cfg, s, info
        self.judge = DeviceJudge(cfg.train.stability, s.device)
        self.judge.load(stability)
        self.frozen = torch.zeros((), dtype=torch.bool, device=s.device)  # a rollback is pending
        # the fused AdamW kernels skip a step on the device (found_inf); the others need the verdict on the host
        self.skip_on_device = compat.fused_adamw_skip() if s.optimizer.defaults.get("fused") else None
        self.checked_unused = False
        # the window judges steps after the lr warmup only (warmup_steps, or warmup_ratio × steps)
        self.warmup = warmup_steps(cfg.train)
        # anomalies roll back (train.stability.action): the steps until the read then freeze
        self.rolls_back = cfg.train.stability.enabled and cfg.train.stability.action == "rollback"

    def after_rollback(self, stability: StabilityMonitor) -> None:
        """The rollback restored the checkpoint's window and weights: nothing is pending any more."""
        self.judge.load(stability)
        self.frozen = torch.zeros((), dtype=torch.bool, device=self.s.device)

    def train_step(self, n: int, batch: GlobalBatch, loss_factor: float, rollback_ready: bool) -> StepResult:
        """Step n on `batch`: forward/backward, clip, judge, update or mask (module docstring).
        `rollback_ready`: a verdict will be rolled back, so this and later steps freeze until the read."""
        tc, s, info, stab = self.cfg.train, self.s, self.info, self.cfg.train.stability
        sums = forward_backward(
            s.train_model,
            batch.micro_batches,
            batch.n_targets,
            info,
            s.autocast,
            s.tokenizer.bos_id,
            s.tokenizer.eos_id,
            loss_factor,
            sync_every_micro_batch=tc.fsdp_grad_sync == "micro_batch",
        )
        with comm_timing.COMM.span():
            dist.all_reduce_sum(sums)
        if info.distributed and not self.checked_unused:  # DDP would fail a step later, naming nothing
            dist.check_unused_parameters(s.model, s.train_model)
            self.checked_unused = True
        loss = global_loss(sums)
        max_norm = tc.optim.grad_clip if tc.optim.grad_clip > 0 else math.inf
        grad_norm = dist.clip_grad_norm(s.model.parameters(), max_norm)  # pre-clip, global over ranks
        clipped = torch.isfinite(grad_norm) & (grad_norm > max_norm)

        # the verdict, on the device and before the optimizer sees anything (the same on every rank)
        with comm_timing.COMM.span():
            loss, grad_norm = dist.agree_on_step(loss, grad_norm)
        verdict = self.judge.judge(loss, grad_norm)  # [kind, z, mean, std]
        applied = verdict[0] == 0
        if stab.enabled and stab.action == "log":
            applied = applied | (verdict[0] >= 2)  # spikes step anyway; a NaN never does
        if rollback_ready:  # this step and every one after it until the read are no-ops
            self.frozen = self.frozen | (verdict[0] != 0)
            applied = applied & ~self.frozen
        if self.skip_on_device is not None:  # the kernels leave weights, moments and step count as they are
            self.skip_on_device(s.optimizer, ~applied)
            s.optimizer.step()
        elif bool(applied):  # optim.fused=false (or no found_inf in this torch): one host read per step
            s.optimizer.step()
        if s.after_optimizer_step is not None:  # fp8 + FSDP2: the weights' scales for the next all-gather
            s.after_optimizer_step()
        # the window observes every step after warmup, a skipped one too (oreline.train.stability),
        # but none whose rollback is pending: the rollback restores the checkpoint's window
        joins = ~self.frozen if rollback_ready else torch.ones((), dtype=torch.bool, device=s.device)
        self.judge.accept(loss, grad_norm, joins & (n > self.warmup))
        s.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss, grad_norm, applied, clipped, *verdict.unbind(), sums)


def forward_backward(
    model: torch.nn.Module,
    batches: list[Any],
    n_targets: float | torch.Tensor,
    info: dist.DistInfo,
    autocast: Any,
    bos_id: int,
    eos_id: int,
    loss_factor: float = 1.0,
    sync_every_micro_batch: bool = True,
) -> torch.Tensor:
    """Backward of Σ CE / n_targets over all micro-batches; returns this rank's loss_breakdown sums.

    n_targets is the target count of the whole global step (all micro-batches, all ranks). Each
    micro-batch contributes (Σ its per-token CE) · world / n_targets: gradients accumulate over
    micro-batches by addition and DDP averages over ranks, so the `world` factor makes the result
    exactly ∇ (Σ CE over the global batch / n_targets). DDP synchronises only on the last micro-batch;
    FSDP2 reduce-scatters after every micro-batch unless `sync_every_micro_batch` is off
    (dist.sync_context says why).
    The loop passes n_targets as the all-reduced device tensor (reading it would wait for the device);
    the scale is then computed there, in float64 as from a Python float, and multiplied in the loss's
    dtype, as a Python float scale would be.
    """
    sums = None
    if isinstance(n_targets, torch.Tensor):
        scale: Any = info.world_size / n_targets.double().clamp(min=1.0)
    else:
        scale = info.world_size / max(n_targets, 1.0)
    for i, b in enumerate(batches):
        last = i == len(batches) - 1
        sync = dist.sync_context(model, last, sync_every_micro_batch) if info.distributed else _nullcontext()
        with sync:
            with autocast():  # (B, T) CE, 0 where ignored; the logits never materialise (kernels)
                per_token = model(b.input_ids, b.doc_ids, labels=b.labels)
            if loss_factor != 1.0:
                per_token = per_token * loss_factor
            total = per_token.sum()
            (total * (scale.to(total.dtype) if isinstance(scale, torch.Tensor) else scale)).backward()
        part = loss_breakdown(per_token, b.input_ids, b.labels, bos_id, eos_id)
        sums = part if sums is None else sums + part
        del per_token
    return sums
