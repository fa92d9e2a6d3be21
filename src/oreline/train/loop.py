"""train(cfg): the one visible training loop.

Per optimizer step (step N is the N-th; the checkpoint "step N" holds the state after it):

1. lr = lr_at(N - 1) × multiplier — a pure function of the step; the multiplier only changes on
   a rollback and is saved in the checkpoint, so a resumed run uses the same learning rates.
2. data: all `grad_accum` micro-batches of the step are fetched first. Their target tokens
   (labels ≠ -100), summed over micro-batches and ranks, are the step's normaliser, so the loss
   is Σ per-token CE / Σ target tokens of the WHOLE global batch — not a mean of per-micro-batch
   means, which would weight a micro-batch with few targets (many BOS, short documents) as much
   as a full one. The tokens consumed are counted every step; fewer than the stated global batch
   is an error, never a silently smaller batch.
3. forward + backward per micro-batch, `(Σ CE) · world / n_targets_global` each: DDP averages
   gradients over ranks, so the factor `world` turns its mean back into the global sum.
4. clip the global grad norm (the PRE-clip norm is logged), then the stability verdict BEFORE
   the optimizer step: a NaN/inf loss or grad norm never reaches the optimizer; spikes are
   skipped, rolled back (reload the last good checkpoint, lr multiplier × lr_factor, the loader
   moves on past the offending batches) or logged, per `train.stability.action`.
5. metrics every `log_every` steps, full checkpoints every `checkpoint.every`, model-only every
   `checkpoint.model_only_every`, validation loss / bits per byte and greedy generations every
   `eval_every` steps and at the end. A final full checkpoint is written at the end whenever
   checkpointing is on. `oreline.train.schedule.Schedule` holds every such rule.

Steps 2-4 are `StepRunner.train_step` (oreline.train.step), which returns a `StepResult`; the
loop below only says when things happen.

What is read when. A CUDA step is a queue of kernels the host launches ahead of the device;
reading a device value on the host (`.item()`, `float(t)`, `if t:`, a copy to the CPU) waits
until the queue has run dry, and at small models that wait costs more than the step. So an
ordinary step — one that neither logs, evaluates, checkpoints nor stops — reads nothing
(`train.debug.count_host_reads` counts it, tests/train/test_host_reads.py checks it):
- the global target count is all-reduced and stays a device tensor; the loss scale is divided there;
- loss and grad norm stay tensors; `dist.agree_on_step` makes them equal on every rank with a
  device all-reduce; `DeviceJudge` (oreline.train.stability) judges NaN/inf and spikes on the device;
- the verdict masks the update on the device: the fused AdamW kernels take it as `found_inf`
  (the GradScaler mechanism), which leaves weights, both moments and the step count bit for bit
  as they were, exactly a skipped `optimizer.step()`; with `optim.fused=false` the loop reads the
  verdict instead (one read per step);
- each step's `StepResult` (loss, grad norm, applied, clipped, the verdict, the loss breakdown
  sums) waits on the device in `pending`; the next step that logs, evaluates, checkpoints or
  stops (`Schedule.at(n).why`) reads them all in one transfer (`settle`) and runs the host side
  of each verdict in order: the monitor's counters, events and messages, the skip count, the
  train-loss sums;
- a stop request is a host flag, ORed over ranks through a CPU (gloo) collective (`dist.any_rank`);
- timings: step times are host clocks; a step that reads has waited for the device, so the sum
  over a log window is the device's time even though single steps are not; communication spans
  are CUDA events (DDP's comm hook, the loop's own all-reduces) read on logging steps.
  `train.profile` waits for the device after every step and times FSDP2's gradient
  reduce-scatters (through its private API, so only when asked).
A rollback verdict is therefore carried out at the next read, not at its step: the device froze
every update from the anomalous step on, the loader goes back to where that step left it and debug
injections after it are forgotten, so weights, data order, lr and the metrics are those of an
immediate rollback; only the steps in between were computed in vain (at most `log_every` - 1).

Precision: fp32, or bf16 autocast (`train.precision`). On a CPU without native bf16 (no
avx512_bf16 / amx_bf16 flag) bf16 matmuls are emulated and ran ~20× slower than fp32 on this
project's Zen 3 machines, so the run prints a warning saying so and that fp32 is recommended — a
warning, not a refusal: on a CPU with AMX, bf16 autocast trained the demo model ~1.5× faster
than fp32, and the run says that instead. fp8 is bf16 autocast with torchao's Float8Linear
projections (oreline.train.float8): CUDA SM 8.9+ only, unless `train.fp8_emulate`. Activation checkpointing recomputes each
block in backward (non-reentrant `torch.utils.checkpoint`); `train.compile` wraps the model in
`torch.compile` block by block (`compile_blocks`: the first step compiles, then ~12-18% faster;
the blocks keep oneDNN's matmuls where `train.cpu_matmul` picked it). On CPU the glibc allocator
is set once (`train.cpu_allocator`, see oreline.train.performance) and the fp32 matmul library is
chosen (`train.cpu_matmul`, see oreline.model.kernels.matmul).

Counting: `tokens_seen` counts the tokens of every step taken, a skipped one included (its data
was consumed); after a rollback it is the checkpoint's count again. After a rollback the steps
from the checkpoint on are done again, so metrics.jsonl holds a `rollback` event followed by
records for steps it already had: the last record of a step is the one that counts.

Resume (`--resume auto|none|PATH`) restores model, optimizer, loader position, RNG state, the
stability window, the lr multiplier and counters, and drops metrics records of steps after the
checkpoint, so an interrupted run continues bit-exactly (on CPU) and its metrics.jsonl reads as
one clean run. A resumed run first completes what a kill left undone after its checkpoint's step
(evaluation, generations, and at the last step the end record: a run is finished when its end
record is written; `begin`, `evals_after_step`). A fresh start with `train.init_from` loads those
weights in `begin` (oreline.train.init_from); with `train.steps = 0` they are saved as the run's
step-0 model-only snapshot and evaluated. SIGTERM/SIGINT/SIGUSR1 stop every rank after the same step with
a checkpoint and the command that resumes (oreline.train.shutdown, `stop_after_step`).

metrics.jsonl record types (`type`): start, train, eval, generation, event, checkpoint, end —
see `MetricsLogger` in oreline.train.monitor and the fields written below. Data mixtures
(oreline.tokens.mixture): every train record carries `source_tokens` (cumulative tokens per
source name), `source_tokens_interval` (since the previous train record), `source_sequences`,
`source_epochs` and `source_weights` (the phase in effect), all functions of the loader position;
an eval record of a several-source run carries `val_loss_sources` / `val_bpb_sources` (each
source's val split) and its `val_loss` is their total weighted by `val_weights`; the start record
holds the sources and phases, and a mixture changed at resume is an event of kind `phase`.

The set-up before the first step is `oreline.train.session.setup_run`; saving, resuming and
rolling back are in `oreline.train.recovery`; one step on the device is `oreline.train.step`;
what is due when is `oreline.train.schedule`; this module is the loop, its start (`begin`) and
end (`end`), and the host side of the verdicts (`settle`).
"""

from __future__ import annotations

import functools
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from oreline.config import Config
from oreline.errors import ShardDamaged, TrainingError
from oreline.model.scoring import breakdown_means
from oreline.train import dist
from oreline.train.batch import GlobalBatch, next_global_batch
from oreline.train.host_reads import StepReads
from oreline.train.monitor import MetricsLogger, TimingWindow, memory_stats, mfu_fields
from oreline.train.optim import lr_at, set_lr, warmup_steps
from oreline.train.param_digest import write_param_digest
from oreline.train.recovery import move_previous_training, resume_if_asked, rollback, save
from oreline.train.schedule import Schedule
from oreline.train.session import Setup, TrainState, _nullcontext, setup_run, start_record
from oreline.train.shutdown import (
    StopRequests,
    TrainingStopped,
    ask_for_requeue,
    resume_command,
    slurm_deadline,
)
from oreline.train.stability import StabilityMonitor
from oreline.train.step import StepResult, StepRunner, debug_loss_factor


def train(
    cfg: Config,
    resume: str = "auto",
    allow_config_change: list[str] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train per `cfg`; returns a summary (steps, tokens, seconds, losses, run dir, checkpoint)."""
    info = dist.init_distributed(cfg.train)
    console = console or Console(stderr=True)
    stops = StopRequests().install()
    if info.is_main:  # one query, not one per rank: the scheduler answers every rank of a large job
        stops.deadline, line = slurm_deadline()
        if line:
            console.print(line)
    lock = None
    created = failed = False
    try:
        if info.is_main:  # one writer per run folder: rank 0 holds its lock for the run's life
            from oreline.outdir import FolderLock
            from oreline.runs import RunDir

            run = RunDir.for_config(cfg)
            created = not run.root.exists()
            run.claim("oreline train")  # never a folder of the user's files
            lock = FolderLock(run.root, "oreline train").acquire()
        summary = _train(cfg, resume, list(allow_config_change or []), info, console, stops)
    except TrainingStopped:
        dist.cleanup()  # every rank stopped after the same step and met in the checkpoint's last barrier
        raise
    except BaseException:
        failed = True
        dist.cleanup(graceful=False)
        raise
    finally:
        stops.uninstall()
        if lock is not None:
            lock.release()
        if created and failed:  # a refused start leaves no empty folder holding the marker alone
            run.remove_if_only_marker()
    dist.cleanup()
    return summary


def _train(
    cfg: Config, resume: str, allow: list[str], info: dist.DistInfo, console: Console, stops: StopRequests
) -> dict[str, Any]:
    from oreline.train.trackers import check_destinations

    tc = cfg.train
    say = console.print if info.is_main else (lambda *a, **k: None)
    check_destinations(cfg)  # tracker servers, on every rank (same config, same environment): before any work
    s = setup_run(cfg, info, say)
    state, stability, schedule = TrainState(), StabilityMonitor(tc.stability), Schedule(cfg)
    if tc.eval_tasks:  # a task name that does not resolve fails now, not at the first evaluation
        _eval_tasks(tuple(tc.eval_tasks))
    resumed, log, final_val = begin(cfg, s, info, state, stability, schedule, resume, allow, console, say)
    if log is None:  # the checkpoint's run had finished: nothing to do
        return {**summary(s, state, resumed, resumed, 0.0, final_val), "finished_before": True}
    # the checkpoint a rollback returns to: the last full one this run wrote or resumed from
    # (never one an earlier, unrelated run left in the folder)
    last_ckpt: Path | None = resumed
    t_run = time.perf_counter()
    s.train_model.train()
    runner = StepRunner(cfg, s, info, stability)
    if tc.steps == 0 and resumed is None:  # init_from, 0 steps: the source's weights as this run's step 0
        last_ckpt = save(
            cfg, s, state, stability, "model_only", log
        )  # (the loop, and its rollbacks, never run)
        final_val = evals_after_step(cfg, s, info, state, log, schedule, 0, {})
    window, reads = TimingWindow(), StepReads(tc.debug.count_host_reads)
    pending: list[Pending] = []  # the steps since the last read, oldest first
    try:
        while not schedule.finished(state.step):
            n = state.step + 1
            reads.start()
            window.start_step()
            lr = lr_at(state.step, tc, state.lr_multiplier)
            set_lr(s.optimizer, lr)
            batch = next_global_batch(s.loader, s.device, s.batch, info, n)
            rollback_ready = runner.rolls_back and last_ckpt is not None
            result = runner.train_step(n, batch, debug_loss_factor(cfg, n, state), rollback_ready)
            pending.append(Pending(n, result, lr, rollback_ready, s.loader.state_dict()))
            state.step, state.tokens_seen = n, state.tokens_seen + batch.tokens
            if tc.debug.sleep_per_step_s > 0:
                time.sleep(tc.debug.sleep_per_step_s)

            # a stop request (SIGTERM/SIGINT on any rank) is a host flag ORed over ranks
            due = schedule.at(n, stop=dist.any_rank(stops.requested()))
            if due.why:  # one transfer: every verdict and value since the last read
                last = settle(pending, cfg, s, state, stability, log, last_ckpt)
                if last is None:  # rolled back: the loop goes on from the checkpoint's step
                    runner.after_rollback(stability)
                    reads.stop(n, [*due.why, "rollback"])
                    continue
            elif tc.profile and s.device.type == "cuda":
                torch.cuda.synchronize(s.device)  # train.profile: honest per-step times
            window.end_step(batch.data_seconds, batch.tokens)  # after a read, the device has caught up
            if due.log:
                record = train_record(n, s, info, state, last, lr, batch, window.take(info))
                log.log({**record, **mixture_fields(s, n - previous_log_step(schedule, n))})
            if due.full_checkpoint:
                last_ckpt = save(cfg, s, state, stability, "full", log)
            elif due.model_only_checkpoint:
                save(cfg, s, state, stability, "model_only", log)
            # the step's evaluation, if due, is left to the resumed run (it completes the checkpoint's step first)
            if due.stop:
                stop_after_step(
                    cfg, s, state, stability, log, info, stops, last_ckpt if due.full_checkpoint else None
                )
            saved = last_ckpt if due.full_checkpoint else None
            stop_here = functools.partial(stop_after_step, cfg, s, state, stability, log, info, stops, saved)
            v = evals_after_step(
                cfg, s, info, state, log, schedule, n, {}, functools.partial(stop_if_asked, stops, stop_here)
            )
            final_val = v if v is not None else final_val
            reads.stop(n, due.why)
    except ShardDamaged as exc:  # a token shard changed under the run: which checkpoints it concerns
        from oreline.train.shard_damage import damage_error

        raise damage_error(exc, s.run.checkpoints, state.step + 1) from None
    finally:
        reads.abandon()  # a stop or an error inside a step leaves its counter active

    seconds = end(cfg, s, info, state, stability, log, reads, schedule.keeps_weights, t_run, final_val)
    say(
        f"[bold]done[/]: {state.step:,} steps, {state.tokens_seen:,} tokens in {seconds:,.1f} s; final val loss "
        + ("—" if final_val is None else f"{final_val:.4f}")
        + f"; {state.skipped_steps} skipped, {state.rollbacks} rollbacks"
        + (f"; checkpoint {last_ckpt}" if last_ckpt else "")
        + ("" if schedule.keeps_weights else "; no weights kept (checkpoint.every = 0, model_only_every = 0)")
    )
    return summary(s, state, resumed, last_ckpt, seconds, final_val)


def begin(
    cfg: Config,
    s: Setup,
    info: dist.DistInfo,
    state: TrainState,
    stability: StabilityMonitor,
    schedule: Schedule,
    resume: str,
    allow: list[str],
    console: Console,
    say: Any,
) -> tuple[Path | None, MetricsLogger | None, float | None]:
    """Resume or start fresh, open the metrics and complete what a kill left undone of the
    checkpoint's step. Returns (the checkpoint resumed from, the logger, the last validation loss);
    no logger when the checkpoint's run had finished (it says so and what to change)."""
    tc = cfg.train
    resumed, resume_events = resume_if_asked(cfg, s, state, stability, resume, allow, say)
    if resumed is None and tc.init_from:  # a fresh start from existing weights (a resume has its own)
        from oreline.train.init_from import start_from_weights

        s.lineage = start_from_weights(tc.init_from, s, info, say)
    dist.barrier()  # every rank has looked at the checkpoints before rank 0 may move them
    if resumed is None and info.is_main:
        moved = move_previous_training(s.run)
        if moved is not None:
            say(f"fresh start: the earlier run's checkpoints, metrics and TensorBoard files moved to {moved}")
    dist.barrier()
    # What the records of the checkpoint's step already hold (rank 0 reads, every rank acts on it:
    # evaluation is a collective): a kill after the checkpoint but before the step's evaluation,
    # generations or, at the last step, the end record leaves them to this launch.
    done = dist.from_main(
        records_at_step(s.run.metrics, state.step) if resumed is not None and info.is_main else {}
    )
    if resumed is not None and done.get("end") and schedule.finished(state.step):
        say(
            f"nothing to do: the run finished at step {state.step} (its end record is in {s.run.metrics}); "
            f"to train on, raise train.steps (now {tc.steps}) and pass --allow-config-change train.steps"
        )
        if info.is_main:  # a tracker that missed the end is not something a relaunch can finish
            from oreline.train.trackers import incomplete, read_reports

            for name in incomplete(read_reports(s.run.root)):
                say(
                    f"[yellow]warning[/]: tracker {name}'s run lacks records or was not finished (see "
                    f"{s.run.root / 'trackers.json'}): `oreline trackers sync {s.run.root}` sends it "
                    "what metrics.jsonl holds and finishes it"
                )
        return resumed, None, done.get("val_loss")
    # A fresh start drops every step record an earlier, unresumable attempt left (-1); a resume
    # drops only the records after its checkpoint, so the file reads as one clean run.
    purge = state.step if resumed is not None else -1
    log = MetricsLogger(
        s.run.metrics,
        s.run.tensorboard,
        console if info.is_main else None,
        enabled=info.is_main,
        purge_after_step=purge,
        trackers=open_run_trackers(cfg, s, resumed, state.step, purge, say) if info.is_main else None,
        flush_s=tc.tracker_flush_s,
    )
    log.log(start_record(cfg, s, info, state, resumed))
    if not schedule.keeps_weights:
        say(
            "[yellow]note[/]: checkpoint.every = 0 and checkpoint.model_only_every = 0: this run keeps no "
            "weights when it ends (a stop still writes a checkpoint); set checkpoint.model_only_every = "
            f"{tc.steps} to keep the final model"
        )
    for rec in resume_events:
        log.log({**rec, "step": state.step if rec["step"] is None else rec["step"]})
    final_val = done.get("val_loss")
    if resumed is not None and state.step > 0:  # what the kill left undone of the checkpoint's step
        v = evals_after_step(cfg, s, info, state, log, schedule, state.step, done)
        final_val = v if v is not None else final_val
        if schedule.finished(state.step):
            say(
                f"the checkpoint is at step {state.step} of train.steps={tc.steps}: completed what the run had "
                "left to do after it (final evaluation, generations, end record)"
            )
    return resumed, log, final_val


def open_run_trackers(
    cfg: Config, s: Setup, resumed: Path | None, step: int, purge: int, say: Any = None
) -> Any:
    """The run's experiment trackers (train.trackers), continuing the runs the checkpoint names;
    `say` gets one line per tracker: where it sends the run."""
    from rich.markup import escape as rich_escape

    from oreline.config import command_line_keys, to_dict
    from oreline.train.checkpoint.format import read_meta
    from oreline.train.trackers import destinations, open_trackers

    command_line = command_line_keys(cfg)
    for name, where in destinations(
        cfg.train.trackers, s.run.root, cfg.train, command_line, s.run.tensorboard
    ).items():
        if say is not None:  # (the line holds config strings: printed as text, never as rich markup)
            say(f"tracker {name}: {rich_escape(where)}")
    saved = (read_meta(resumed) or {}).get("trackers") if resumed is not None else None
    return open_trackers(
        cfg.train.trackers,
        s.run.root,
        cfg.train,
        saved if isinstance(saved, dict) else None,
        step if resumed is not None else None,
        config=to_dict(cfg),
        tensorboard_dir=s.run.tensorboard,
        purge_after_step=purge,
        command_line=command_line,
    )


def train_record(
    n: int,
    s: Setup,
    info: dist.DistInfo,
    state: TrainState,
    last: StepResult,
    lr: float,
    batch: GlobalBatch,
    times: dict[str, float | None],
) -> dict[str, Any]:
    """Step n's `train` record: the last step's values (settled) and the window's timings."""
    parts = breakdown_means(last.sums)
    return {
        "type": "train",
        "step": n,
        "tokens_seen": state.tokens_seen,
        "tokens_in_step": batch.tokens,
        "loss": last.loss,
        "loss_token": parts["loss_token"],
        "loss_eos": parts["loss_eos"],
        "loss_bos": parts["loss_bos"],
        "lr": lr,
        "grad_norm": last.grad_norm,
        "clipped": last.clipped,
        "tokens_per_s": times["tokens_per_s"],
        **mfu_fields(s.flops_per_token, times["tokens_per_s"] / info.world_size, s.peak_flops),
        **{k: times[k] for k in ("step_ms", "cpu_ms", "data_ms", "data_wait_frac")},
        **memory_stats(s.device),
        "comm_ms": times["comm_ms"],
        "comm_frac": times["comm_frac"],
    }


def previous_log_step(schedule: Schedule, n: int) -> int:
    """The last step before n with a train record (0: none)."""
    m = n - 1
    while m > 0 and not schedule.log(m):
        m -= 1
    return m


def mixture_fields(s: Setup, steps: int) -> dict[str, Any]:
    """Per-source accounting of a train record (oreline.tokens.mixture): cumulative tokens and
    sequences per source, the tokens of the last `steps` steps, epochs, and the weights in effect.

    All of it is a function of the loader position, so a resumed run logs what the uninterrupted
    one did."""
    loader = s.loader
    now = loader.consumed
    before = max(0, now - steps * int(s.batch["sequences"]))
    tokens, earlier = loader.source_tokens(now), loader.source_tokens(before)
    return {
        "source_tokens": tokens,
        "source_tokens_interval": {k: v - earlier.get(k, 0) for k, v in tokens.items()},
        "source_sequences": loader.source_sequences(now),
        "source_epochs": loader.source_epochs(now),
        "source_weights": loader.weights(max(0, now - 1)),
    }


def end(
    cfg: Config,
    s: Setup,
    info: dist.DistInfo,
    state: TrainState,
    stability: StabilityMonitor,
    log: MetricsLogger,
    reads: StepReads,
    keeps_weights: bool,
    t_run: float,
    final_val: float | None,
) -> float:
    """Wait for the last checkpoint, write the debug files and the end record (a run is finished
    when its end record is written); returns the run's seconds."""
    if keeps_weights:  # checkpoints are on: the last one may still be an async save in flight
        from oreline.train.checkpoint.async_save import wait_for_pending_save

        wait_for_pending_save()  # an async save's meta, checksums and rename
    if cfg.train.debug.param_digest:
        write_param_digest(s.model, s.run.root, info.rank)
    reads.write(s.run.root, info.rank)
    seconds = time.perf_counter() - t_run
    log.log(
        {
            "type": "end",
            "step": state.step,
            "tokens_seen": state.tokens_seen,
            "seconds": seconds,
            "final_val_loss": final_val,
            "skipped_steps": state.skipped_steps,
            "rollbacks": state.rollbacks,
            "stability": stability.summary(),
        }
    )
    log.close()
    return seconds


def summary(
    s: Setup,
    state: TrainState,
    resumed: Path | None,
    checkpoint: Path | None,
    seconds: float,
    final_val: float | None,
) -> dict[str, Any]:
    """What `train` returns."""
    return {
        "run_dir": str(s.run.root),
        "step": state.step,
        "tokens_seen": state.tokens_seen,
        "seconds": seconds,
        "final_val_loss": final_val,
        "final_train_loss": state.last_loss,
        "skipped_steps": state.skipped_steps,
        "rollbacks": state.rollbacks,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "resumed_from": str(resumed) if resumed else None,
        "config_fingerprint": s.fingerprints["train"],
    }


def records_at_step(metrics: Path, step: int) -> dict[str, Any]:
    """What metrics.jsonl holds for `step`: {"eval": bool, "val_loss", "generations": set of prompts, "end": bool}."""
    import json

    out: dict[str, Any] = {
        "eval": False,
        "val_loss": None,
        "generations": set(),
        "end": False,
        "tasks": False,
    }
    if not Path(metrics).is_file():
        return out
    for line in Path(metrics).read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line a kill cut short
        if not isinstance(rec, dict) or rec.get("step") != step:
            continue
        if rec.get("type") == "eval":
            out["eval"], out["val_loss"] = True, rec.get("val_loss")
        elif rec.get("type") == "generation":
            out["generations"].add(rec.get("prompt"))
        elif rec.get("type") == "tasks":
            out["tasks"] = True
        elif rec.get("type") == "end":
            out["end"] = True
    return out


def evals_after_step(
    cfg: Config,
    s: Setup,
    info: dist.DistInfo,
    state: TrainState,
    log: MetricsLogger,
    schedule: Schedule,
    n: int,
    done: dict[str, Any],
    between: Callable[[], None] = lambda: None,
) -> float | None:
    """Validation loss and greedy generations due after step n, less what `done` says was logged;
    `between` runs after each part that ran (it may end the run: a stop request).

    Returns the validation loss when an evaluation ran. The train loss of the eval record is the
    mean since the previous evaluation; its running sum is part of the checkpoint, so an
    evaluation completed by a resumed run reports what the uninterrupted run would have.
    """
    val = None
    if schedule.eval(n) and done.get("eval"):
        state.loss_sum, state.loss_count = 0.0, 0  # logged before the kill; the next mean starts here
    elif schedule.eval(n):
        v = evaluate_sources(s, info, cfg.train.eval_sequences, cfg)
        val = v["loss"]
        train_loss = state.loss_sum / state.loss_count if state.loss_count else None
        log.log(
            {
                "type": "eval",
                "step": n,
                "val_loss": v["loss"],
                "val_ppl": v["ppl"],
                "val_bpb": v["bpb"],
                "val_loss_token": v["loss_token"],
                "val_loss_eos": v["loss_eos"],
                "val_loss_bos": v["loss_bos"],
                "train_loss": train_loss,
                "val_targets": v["targets"],
                "val_batches": v["batches"],
                "val_sequences": v["sequences"],
                "val_tokens": v["tokens"],
                **v.get("per_source", {}),
            }
        )
        state.loss_sum, state.loss_count = 0.0, 0
        between()
    if schedule.tasks(n) and not done.get("tasks"):
        log.log(downstream_record(s, info, cfg, n, state.tokens_seen))
        between()
    prompts = [p for p in cfg.eval.prompts if p not in done.get("generations", ())]
    if (
        schedule.generate(n) and (info.is_main or info.sharded) and prompts
    ):  # FSDP: every rank runs the forward
        for g in generations(s, cfg, prompts):
            log.log(
                {"type": "generation", "step": n, "prompt": g["prompt"], "text": g["text"], "mode": g["mode"]}
            )
    return val


def stop_if_asked(stops: StopRequests, stop: Callable[[], None]) -> None:
    """Between the parts of a step's evaluation: a stop asked for meanwhile ends the run before the
    next part (the final step's evaluation, downstream tasks and generations can take minutes, and
    there is no step boundary after them: Slurm's time-limit notice waited for all of them and the
    job ran into its limit). The resumed run does what is left (`begin`, from the metrics' record).
    A collective: every rank calls it at the same points."""
    if dist.any_rank(stops.requested()):
        stop()  # stop_after_step: the step's checkpoint, the event record, TrainingStopped


def stop_after_step(
    cfg: Config,
    s: Setup,
    state: TrainState,
    stability: Any,
    log: MetricsLogger,
    info: dist.DistInfo,
    stops: StopRequests,
    saved: Path | None,
) -> None:
    """End the run on a stop request: a full checkpoint of this step (unless one was just written),
    an event record, the command that resumes, and TrainingStopped (exit code 128 + the signal)."""
    from oreline.train.checkpoint.async_save import wait_for_pending_save

    # the signal may have reached another rank only: this one then exits as if it had had SIGTERM
    signum = stops.signum or signal.SIGTERM
    path = saved or save(cfg, s, state, stability, "full", log)
    wait_for_pending_save()
    command = resume_command()
    what = stops.cause
    log.log(
        {
            "type": "event",
            "step": state.step,
            "kind": "stopped",
            "values": {"signal": what, "checkpoint": str(path)},
            "action": "stop",
            "message": f"stopped by {what} after step {state.step}; checkpoint {path}",
        }
    )
    log.close()
    hint = f"resume with: {command}"
    if stops.requeue and info.is_main:  # SIGUSR1: Slurm's time-limit notice; the batch script requeues
        job = ask_for_requeue(path)
        if job is not None:
            hint = f"the batch script requeues Slurm job {job}, which resumes from this checkpoint"
    raise TrainingStopped(
        f"stopped by {what} after step {state.step} of {cfg.train.steps}; checkpoint {path}",
        hint,
        int(signum),
        show=info.is_main,
    )


# ---------------------------------------------------------------------------------------------
# the host side of the verdicts


@dataclass
class Pending:
    """A step taken whose `StepResult` is still on the device, with what the host knew then: its
    lr, whether a rollback had a checkpoint, the loader position after it."""

    step: int
    result: StepResult
    lr: float
    rollback_ready: bool
    loader_after: dict


def settle(
    pending: list[Pending],
    cfg: Config,
    s: Setup,
    state: TrainState,
    stability: StabilityMonitor,
    log: MetricsLogger,
    last_ckpt: Path | None,
) -> StepResult | None:
    """Read the pending steps' values in one transfer and do what the host does with each verdict.

    For each step in order: the stability monitor's counters and anomaly log, the skip / log
    events, the skipped-step count and the train-loss sums. The device already applied or
    masked each update (it reached the same decision). A rollback verdict is carried out here:
    the device froze every update from that step on, so the steps after it changed nothing; the
    loader goes back to where that step left it and debug injections after it are forgotten, so
    the rollback is the one an immediate read would have made, only later. Returns the last
    step's result, or None after a rollback.
    """
    stab = cfg.train.stability
    rows = torch.stack([p.result.pack() for p in pending]).tolist()  # the one device → host transfer
    steps = list(pending)
    pending.clear()
    r = None
    for p, row in zip(steps, rows, strict=True):
        r = StepResult.unpack(row)
        anomaly = stability.record_verdict(p.step, r.loss, r.grad_norm, r.kind, r.z, r.mean, r.std)
        action = "step"
        if anomaly is not None:
            action = stab.action if stab.enabled else "skip"
            if anomaly.kind == "nonfinite" and action == "log":
                action = "skip"  # logged, but a NaN never reaches the optimizer
        if action == "rollback" and not p.rollback_ready:
            action = "skip"
            log.log(event(p.step, anomaly, "skip", "no checkpoint to roll back to yet: step skipped instead"))
        elif action == "rollback":
            assert last_ckpt is not None
            stability.record_rollback(anomaly, where=str(last_ckpt))  # raises past max_retries
            log.log(event(p.step, anomaly, "rollback", anomaly.describe()))
            roll_back_from(p, cfg, s, state, stability, log, last_ckpt)
            return None
        if (action != "skip") != r.applied:  # the device and the host judged alike, or nothing holds
            raise TrainingError(
                f"step {p.step}: the device {'applied' if r.applied else 'skipped'} the update, the host says {action}",
                "report this as an oreline bug (oreline.train.loop.settle), with the run's metrics.jsonl",
            )
        observe = p.step > warmup_steps(cfg.train)  # as the device's window did (judge.accept)
        if action in ("step", "log"):
            stability.accept(r.loss, r.grad_norm, observe)
            if action == "log":
                log.log(event(p.step, anomaly, "log", anomaly.describe() + " (stepped anyway: action=log)"))
        else:  # skip
            if observe:
                stability.observe(r.loss, r.grad_norm)
            storm = stability.record_skip() and stab.enabled
            state.skipped_steps += 1
            log.log(event(p.step, anomaly, "skip", anomaly.describe() + ": optimizer step skipped"))
            if storm:  # skipping did not end it: roll back with a lower lr, or stop saying why
                if last_ckpt is None:
                    raise stability.storm_error(
                        anomaly, "no full checkpoint to roll back to (checkpoint.every)"
                    )
                if stability.retries_in_a_row >= stab.max_retries:
                    raise stability.storm_error(
                        anomaly,
                        f"{stability.retries_in_a_row} rollbacks to {last_ckpt} with lr × {stab.lr_factor} "
                        f"did not end it (train.stability.max_retries = {stab.max_retries})",
                    )
                stability.record_rollback(anomaly, where=str(last_ckpt))
                log.log(
                    event(
                        p.step,
                        anomaly,
                        "rollback",
                        f"{stability.consecutive_skips} steps in a row skipped: {anomaly.describe()}",
                    )
                )
                stability.consecutive_skips = 0
                roll_back_from(p, cfg, s, state, stability, log, last_ckpt)
                return None
        if math.isfinite(r.loss) and action != "skip":
            state.loss_sum += r.loss
            state.loss_count += 1
            state.last_loss = r.loss
    return r


def roll_back_from(
    p: Pending,
    cfg: Config,
    s: Setup,
    state: TrainState,
    stability: StabilityMonitor,
    log: MetricsLogger,
    last_ckpt: Path,
) -> None:
    """Roll back for step p's verdict: the loader moves on from where p left it (past the offending
    batches), debug injections after p are forgotten, the rest is `recovery.rollback`."""
    s.loader.load_state_dict(p.loader_after)
    state.debug_injected = [at for at in state.debug_injected if at <= p.step]
    rollback(s, state, stability, last_ckpt, p.step, cfg, log)


def event(step: int, anomaly: Any, action: str, message: str) -> dict[str, Any]:
    return {
        "type": "event",
        "step": step,
        "kind": anomaly.kind,
        "values": dict(anomaly.values),
        "z": getattr(anomaly, "z", None),
        "action": action,
        "message": message,
    }


# ---------------------------------------------------------------------------------------------
# evaluation inside training


def _eager(cfg: Config) -> Any:
    """Evaluation and generation run the compiled blocks eagerly: eval mode and every new prompt
    length would otherwise each cost a recompilation (tens of seconds on CPU) for a few batches."""
    return torch.compiler.set_stance("force_eager") if cfg.train.compile else _nullcontext()


def evaluate_sources(s: Setup, info: dist.DistInfo, sequences: int, cfg: Config) -> dict[str, Any]:
    """Validation of a mixture: each source's val split on its own (its first `sequences` sequences) and their total
    weighted by the mixture's weights now (a source of weight 0 counts 0; the weights of the sources
    with a val split, renormalised); one source: `evaluate`."""
    loaders = getattr(s, "val_loaders", None) or {}
    if len(getattr(s.loader, "loaders", ())) <= 1:
        return evaluate(s, info, sequences, cfg)
    each = {name: evaluate(s, info, sequences, cfg, loader) for name, loader in loaders.items()}
    weights = s.loader.weights(max(0, s.loader.consumed - 1))
    total = sum(weights.get(n, 0.0) for n in each)
    if total <= 0:  # no validated source is drawn now: their plain mean
        weights, total = dict.fromkeys(each, 1.0), float(len(each))

    def weighted(key: str) -> float | None:
        parts = [(weights.get(n, 0.0) / total, v[key]) for n, v in each.items()]
        if any(x is None for w, x in parts if w > 0):
            return None
        return sum(w * x for w, x in parts if w > 0)

    out: dict[str, Any] = {k: weighted(k) for k in ("loss", "bpb", "loss_token", "loss_eos", "loss_bos")}
    out["ppl"] = math.exp(out["loss"]) if out["loss"] is not None and out["loss"] < 700 else None
    out["targets"] = sum(v["targets"] for v in each.values())
    out["batches"] = sum(v["batches"] for v in each.values())
    out["sequences"] = sum(v["sequences"] for v in each.values())
    out["tokens"] = sum(v["tokens"] for v in each.values())
    out["per_source"] = {
        "val_loss_sources": {n: v["loss"] for n, v in each.items()},
        "val_bpb_sources": {n: v["bpb"] for n, v in each.items()},
        "val_weights": {n: weights.get(n, 0.0) / total for n in each},
    }
    return out


def evaluate(
    s: Setup, info: dist.DistInfo, sequences: int, cfg: Config, loader: Any = None
) -> dict[str, Any]:
    """Validation over the first `sequences` sequences of the val split (train.eval_sequences),
    the token-weighted mean over exactly that set whatever micro_batch, grad_accum and world size
    (TokenLoader.iter_eval_set); "batches" counts this rank's forwards. `loader`: a mixture
    source's val split (default: the run's)"""
    from oreline.model.scoring import validation_loss

    val = s.val_loader if loader is None else loader
    n = val.eval_set_size(sequences)
    with _eager(cfg):
        v = validation_loss(
            s.model,
            val.iter_eval_set(sequences),
            s.tokenizer.bos_id,
            s.tokenizer.eos_id,
            None,
            s.bytes_per_token,
            all_reduce=dist.all_reduce_sum if info.distributed else None,
            autocast_dtype=s.autocast_dtype,
        )
    return {**v, "sequences": n, "tokens": n * cfg.train.seq_len}


@functools.cache
def _eval_tasks(spec: tuple[str, ...]) -> list[Any]:
    """The tasks of train.eval_tasks, read once per process (the same items at every evaluation)."""
    from oreline.model.tasks import resolve_tasks

    return resolve_tasks(list(spec))


def downstream_record(s: Setup, info: dist.DistInfo, cfg: Config, n: int, tokens_seen: int) -> dict[str, Any]:
    """The `tasks` record of step n: per task items, acc, acc_norm, centered, chance (dicts by task
    name, so each task is its own tracker curve) and the CORE-style mean. Each rank scores every
    world-th item of the first train.eval_tasks_max_items; the counts are summed over ranks. FSDP2:
    the model is gathered once (dist.gathered), so the ranks' different numbers of forwards need no
    collective."""
    from oreline.model.downstream import core_score, score_task

    t0 = time.perf_counter()
    per: dict[str, dict[str, Any]] = {}
    with _eager(cfg), dist.gathered(s.model):
        for task in _eval_tasks(tuple(cfg.train.eval_tasks)):
            r = score_task(
                s.model,
                s.tokenizer,
                task,
                cfg.train.seq_len,
                max_items=cfg.train.eval_tasks_max_items,
                rank=info.rank,
                world=info.world_size,
                all_reduce=dist.all_reduce_sum if info.distributed else None,
                autocast_dtype=s.autocast_dtype,
            )
            per[task.name] = r
    rec: dict[str, Any] = {"type": "tasks", "step": n, "tokens_seen": tokens_seen}
    for key in ("acc", "acc_norm", "centered", "chance", "items"):
        rec[key] = {name: r[key] for name, r in per.items()}
    rec["core"] = core_score(per)
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def generations(s: Setup, cfg: Config, prompts: list[str] | None = None) -> list[dict[str, Any]]:
    from oreline.model.scoring import generate_samples

    # FSDP/HSDP: the model is gathered once for all prompts, not once per generated token
    with _eager(cfg), dist.gathered(s.model):
        return generate_samples(
            s.model,
            s.tokenizer,
            cfg.eval.prompts if prompts is None else prompts,
            cfg.eval.max_new_tokens,
            greedy=True,
        )
