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
4. clip the global grad norm (the PRE-clip norm is logged), then the stability decision BEFORE
   the optimizer step: a NaN/inf loss or grad norm never reaches the optimizer; spikes are
   skipped, rolled back (reload the last good checkpoint, lr multiplier × lr_factor, the loader
   moves on past the offending batches) or logged, per `train.stability.action`.
5. metrics every `log_every` steps, full checkpoints every `checkpoint.every`, model-only every
   `checkpoint.model_only_every`, validation loss / bits per byte and greedy generations every
   `eval_every` steps and at the end. A final full checkpoint is written at the end whenever
   checkpointing is on.

Precision: fp32, or bf16 autocast (`train.precision`). On a CPU without native bf16 (no
avx512_bf16 / amx_bf16 flag) bf16 matmuls are emulated and ran ~20× slower than fp32 on this
project's Zen 3 machines, so the run prints a warning saying so and that fp32 is recommended — a
warning, not a refusal: on a CPU with AMX, bf16 autocast trained the demo model ~1.5× faster
than fp32, and the run says that instead. Activation checkpointing recomputes each
block in backward (non-reentrant `torch.utils.checkpoint`); `train.compile` wraps the model in
`torch.compile` block by block (`compile_blocks`: the first step compiles, then ~12% faster).
On CPU the glibc allocator is tuned once (`train.cpu_allocator`, see `tune_cpu_allocator`).

Counting: `tokens_seen` counts the tokens of every step taken, a skipped one included (its data
was consumed); after a rollback it is the checkpoint's count again. After a rollback the steps
from the checkpoint on are done again, so metrics.jsonl holds a `rollback` event followed by
records for steps it already had: the last record of a step is the one that counts.

Resume (`--resume auto|none|PATH`) restores model, optimizer, loader position, RNG state, the
stability window, the lr multiplier and counters, and drops metrics records of steps after the
checkpoint, so an interrupted run continues bit-exactly (on CPU) and its metrics.jsonl reads as
one clean run.

metrics.jsonl record types (`type`): start, train, eval, generation, event, checkpoint, end —
see `MetricsLogger` in oreline.train.monitor and the fields written below.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from oreline.config import Config, canonical_json, expand, fingerprint, to_dict, to_toml
from oreline.errors import ConfigError, TrainingError
from oreline.runs import RunDir, write_json_atomic
from oreline.train import dist
from oreline.train.monitor import (
    MetricsLogger,
    breakdown_means,
    cpu_native_bf16,
    device_peak_flops,
    loss_breakdown,
    memory_stats,
    mfu,
    model_matmul_shapes,
    per_token_cross_entropy,
)
from oreline.train.optim import build_optimizer, lr_at, schedule_samples, set_lr, warmup_steps


@dataclass
class TrainState:
    """Everything about progress that is not a tensor; saved in the checkpoint meta."""

    step: int = 0
    tokens_seen: int = 0
    lr_multiplier: float = 1.0
    skipped_steps: int = 0
    rollbacks: int = 0
    debug_injected: list[int] = field(default_factory=list)


@dataclass
class Setup:
    run: RunDir
    device: torch.device
    tokenizer: Any
    tokens_dir: Path
    tokenizer_dir: Path
    loader: Any
    val_loader: Any
    args: Any
    model: torch.nn.Module  # the plain module: state dicts, generation, evaluation
    train_model: torch.nn.Module  # what the loop calls: `model`, or DDP around it (FSDP2 shards it in place)
    optimizer: torch.optim.Optimizer
    fingerprints: dict[str, str]
    batch: dict[str, int | None]
    bytes_per_token: Any
    flops_per_token: int
    peak_flops: float | None
    peak_source: str
    autocast_dtype: torch.dtype | None

    def autocast(self) -> Any:
        if self.autocast_dtype is None:
            return _nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def train(cfg: Config, resume: str = "auto", allow_config_change: list[str] | None = None,
          console: Console | None = None) -> dict[str, Any]:
    """Train per `cfg`; returns a summary (steps, tokens, seconds, losses, run dir, checkpoint)."""
    info = dist.init_distributed(cfg.train)
    console = console or Console(stderr=True)
    try:
        return _train(cfg, resume, list(allow_config_change or []), info, console)
    finally:
        dist.cleanup()


def _train(cfg: Config, resume: str, allow: list[str], info: dist.DistInfo, console: Console) -> dict[str, Any]:
    tc, stab = cfg.train, cfg.train.stability
    say = console.print if info.is_main else (lambda *a, **k: None)
    s = setup_run(cfg, info, say)
    from oreline.train.stability import Anomaly, StabilityMonitor

    stability = StabilityMonitor(stab)
    state = TrainState()
    resumed, resume_events = resume_if_asked(cfg, s, state, stability, resume, allow, say)
    dist.barrier()  # every rank has looked at the checkpoints before rank 0 may move them
    if resumed is None and info.is_main:
        moved = move_previous_training(s.run)
        if moved is not None:
            say(f"fresh start: the earlier run's checkpoints, metrics and TensorBoard files moved to {moved}")
    dist.barrier()
    # A fresh start drops every step record an earlier, unresumable attempt left (-1); a resume
    # drops only the records after its checkpoint, so the file reads as one clean run.
    log = MetricsLogger(s.run.metrics, s.run.tensorboard, console if info.is_main else None, enabled=info.is_main,
                        purge_after_step=state.step if resumed is not None else -1)
    log.log(start_record(cfg, s, info, state, resumed))
    for rec in resume_events:
        log.log({**rec, "step": state.step if rec["step"] is None else rec["step"]})

    bos, eos = s.tokenizer.bos_id, s.tokenizer.eos_id
    t_run = time.perf_counter()
    window = {"steps": 0, "seconds": 0.0, "cpu": 0.0, "data": 0.0, "comm": 0.0, "tokens": 0}  # since the last train record
    checked_unused = False
    recent_losses: list[float] = []  # since the last eval record
    final_val = last_loss = None
    # the checkpoint a rollback returns to: the last full one this run wrote or resumed from
    # (never one an earlier, unrelated run left in the folder)
    last_ckpt: Path | None = resumed
    s.train_model.train()
    if state.step >= tc.steps:
        say(f"nothing to do: the checkpoint is at step {state.step} of train.steps={tc.steps} "
            "(raise train.steps and pass --allow-config-change train.steps to train on)")

    while state.step < tc.steps:
        n = state.step + 1
        t0, cpu0 = time.perf_counter(), time.process_time()
        lr = lr_at(state.step, tc, state.lr_multiplier)
        set_lr(s.optimizer, lr)

        # -- data: the whole step's micro-batches first (their target count normalises the loss)
        batches = [to_device(s.loader.next_batch(), s.device) for _ in range(tc.grad_accum)]
        t_data = time.perf_counter() - t0
        tokens_in_step = check_batch_tokens(batches, s.batch, info, n)
        counts = torch.stack([(b.labels != -100).sum() for b in batches]).sum().double().reshape(1)
        t_comm = time.perf_counter()
        n_targets = float(dist.all_reduce_sum(counts)[0])
        comm = time.perf_counter() - t_comm

        # -- debug hooks: applied once, the first time step n is reached (not again after a rollback)
        loss_factor = 1.0
        for at, factor in ((tc.debug.inject_nan_at_step, math.nan), (tc.debug.inject_spike_at_step, tc.debug.spike_factor)):
            if at == n and n not in state.debug_injected:
                loss_factor *= factor
                state.debug_injected.append(n)

        # -- forward and backward of every micro-batch, the loss normalised by the global target count
        sums = forward_backward(s.train_model, batches, n_targets, info, s.autocast, bos, eos, loss_factor)
        t_comm = time.perf_counter()
        dist.all_reduce_sum(sums)
        comm += time.perf_counter() - t_comm + dist.COMM.take()  # + the gradient collectives' span
        if info.distributed and not checked_unused:  # DDP would fail a step later, naming nothing
            dist.check_unused_parameters(s.model, s.train_model)
            checked_unused = True
        parts = breakdown_means(sums)
        loss = parts["loss"] if parts["loss"] is not None else math.nan
        max_norm = tc.optim.grad_clip if tc.optim.grad_clip > 0 else math.inf
        grad_norm = dist.clip_grad_norm(s.model.parameters(), max_norm)  # global over ranks (DDP and FSDP)
        clipped = math.isfinite(grad_norm) and grad_norm > max_norm

        # -- the stability decision, before the optimizer sees anything (the same on every rank)
        loss, grad_norm = dist.agree_on_step(loss, grad_norm)
        anomaly = stability.check(n, loss, grad_norm)
        if anomaly is None and not (math.isfinite(loss) and math.isfinite(grad_norm)):
            anomaly = Anomaly("nonfinite", n, {"loss": loss, "grad_norm": grad_norm})  # monitor disabled
        action = "step"
        if anomaly is not None:
            action = stab.action if stab.enabled else "skip"
            if anomaly.kind == "nonfinite" and action == "log":
                action = "skip"  # logged, but a NaN never reaches the optimizer
        if action == "rollback":
            target = last_ckpt
            if target is None:
                action = "skip"
                log.log(event(n, anomaly, "skip", "no checkpoint to roll back to yet: step skipped instead"))
            else:
                stability.record_rollback(anomaly, where=str(target))  # raises past max_retries
                log.log(event(n, anomaly, "rollback", anomaly.describe()))
                rollback(s, state, stability, target, n, cfg, log)
                s.optimizer.zero_grad(set_to_none=True)
                continue
        if action in ("step", "log"):
            s.optimizer.step()
            stability.accept(loss, grad_norm)
            if action == "log":
                log.log(event(n, anomaly, "log", anomaly.describe() + " (stepped anyway: action=log)"))
        else:  # skip
            stability.record_skip()
            state.skipped_steps += 1
            log.log(event(n, anomaly, "skip", anomaly.describe() + ": optimizer step skipped"))
        s.optimizer.zero_grad(set_to_none=True)
        state.step = n
        state.tokens_seen += tokens_in_step
        if tc.debug.sleep_per_step_s > 0:
            time.sleep(tc.debug.sleep_per_step_s)
        if s.device.type == "cuda":
            torch.cuda.synchronize(s.device)  # honest step times (optimizer.step is asynchronous)
        window["steps"] += 1
        window["seconds"] += time.perf_counter() - t0
        window["cpu"] += time.process_time() - cpu0
        window["data"] += t_data
        window["comm"] += comm
        window["tokens"] += tokens_in_step
        if math.isfinite(loss) and action != "skip":
            recent_losses.append(loss)
            last_loss = loss

        # -- metrics
        if n % tc.log_every == 0 or n == 1 or n == tc.steps:
            if info.distributed:  # timings averaged over ranks (tokens, loss and grad norm are global already)
                window["seconds"], window["data"], window["comm"] = dist.mean_over_ranks(
                    [window["seconds"], window["data"], window["comm"]])
            tps = window["tokens"] / window["seconds"]
            log.log({
                "type": "train", "step": n, "tokens_seen": state.tokens_seen, "tokens_in_step": tokens_in_step,
                "loss": loss, "loss_token": parts["loss_token"], "loss_eos": parts["loss_eos"],
                "loss_bos": parts["loss_bos"], "lr": lr, "grad_norm": grad_norm, "clipped": clipped,
                "tokens_per_s": tps, "mfu": mfu(s.flops_per_token, tps / info.world_size, s.peak_flops),
                "step_ms": 1000 * window["seconds"] / window["steps"],
                # process CPU time (all threads) per step: cpu_ms / step_ms is how many cores were busy
                "cpu_ms": 1000 * window["cpu"] / window["steps"],
                "data_ms": 1000 * window["data"] / window["steps"],
                "data_wait_frac": window["data"] / window["seconds"],
                **memory_stats(s.device),
                "comm_ms": 1000 * window["comm"] / window["steps"] if info.distributed else None,
                "comm_frac": window["comm"] / window["seconds"] if info.distributed else None,
            })
            window = {"steps": 0, "seconds": 0.0, "cpu": 0.0, "data": 0.0, "comm": 0.0, "tokens": 0}

        # -- checkpoints
        ckpt = cfg.checkpoint
        if ckpt.every and (n % ckpt.every == 0 or n == tc.steps):
            last_ckpt = save(cfg, s, state, stability, "full", log)
        elif ckpt.model_only_every and (n % ckpt.model_only_every == 0 or (n == tc.steps and not ckpt.every)):
            save(cfg, s, state, stability, "model_only", log)

        # -- evaluation and generations
        if (tc.eval_every and n % tc.eval_every == 0) or n == tc.steps:
            v = evaluate(s, info, tc.eval_batches, cfg)
            final_val = v["loss"]
            train_loss = sum(recent_losses) / len(recent_losses) if recent_losses else None
            log.log({"type": "eval", "step": n, "val_loss": v["loss"], "val_ppl": v["ppl"], "val_bpb": v["bpb"],
                     "val_loss_token": v["loss_token"], "val_loss_eos": v["loss_eos"],
                     "val_loss_bos": v["loss_bos"], "train_loss": train_loss,
                     "val_targets": v["targets"], "val_batches": v["batches"]})
            recent_losses = []
        gen_due = (tc.generate_every and n % tc.generate_every == 0) or \
            (not tc.generate_every and ((tc.eval_every and n % tc.eval_every == 0) or n == tc.steps))
        if gen_due and (info.is_main or info.sharded) and cfg.eval.prompts:  # FSDP: every rank runs the forward
            for g in generations(s, cfg):
                log.log({"type": "generation", "step": n, "prompt": g["prompt"], "text": g["text"], "mode": g["mode"]})

    if cfg.checkpoint.every or cfg.checkpoint.model_only_every:
        from oreline.train.checkpoint import wait_for_pending_save

        wait_for_pending_save()  # an async save's meta, checksums and rename
    if tc.debug.param_digest:
        dist.write_param_digest(s.model, s.run.root, info.rank)
    seconds = time.perf_counter() - t_run
    log.log({"type": "end", "step": state.step, "tokens_seen": state.tokens_seen, "seconds": seconds,
             "final_val_loss": final_val, "skipped_steps": state.skipped_steps, "rollbacks": state.rollbacks,
             "stability": stability.summary()})
    log.close()
    say(f"[bold]done[/]: {state.step:,} steps, {state.tokens_seen:,} tokens in {seconds:,.1f} s; final val loss "
        + ("—" if final_val is None else f"{final_val:.4f}") + f"; {state.skipped_steps} skipped, "
        f"{state.rollbacks} rollbacks" + (f"; checkpoint {last_ckpt}" if last_ckpt else ""))
    return {"run_dir": str(s.run.root), "step": state.step, "tokens_seen": state.tokens_seen, "seconds": seconds,
            "final_val_loss": final_val, "final_train_loss": last_loss,
            "skipped_steps": state.skipped_steps, "rollbacks": state.rollbacks,
            "checkpoint": str(last_ckpt) if last_ckpt else None, "resumed_from": str(resumed) if resumed else None,
            "config_fingerprint": s.fingerprints["train"]}


# ---------------------------------------------------------------------------------------------
# set-up


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def to_device(batch: Any, device: torch.device) -> Any:
    """The loader's batch with long tensors on the training device (doc_ids may be None)."""
    def move(x: Any) -> torch.Tensor | None:
        if x is None:
            return None
        return torch.as_tensor(x).to(device=device, dtype=torch.long, non_blocking=True)

    return _Batch(move(batch.input_ids), move(batch.labels), move(getattr(batch, "doc_ids", None)))


@dataclass
class _Batch:
    input_ids: torch.Tensor
    labels: torch.Tensor
    doc_ids: torch.Tensor | None


def forward_backward(model: torch.nn.Module, batches: list[Any], n_targets: float, info: dist.DistInfo,
                     autocast: Any, bos_id: int, eos_id: int, loss_factor: float = 1.0) -> torch.Tensor:
    """Backward of Σ CE / n_targets over all micro-batches; returns this rank's loss_breakdown sums.

    n_targets is the target count of the whole global step (all micro-batches, all ranks). Each
    micro-batch contributes (Σ its per-token CE) · world / n_targets: gradients accumulate over
    micro-batches by addition and DDP averages over ranks, so the `world` factor makes the result
    exactly ∇ (Σ CE over the global batch / n_targets). DDP synchronises only on the last micro-batch.
    """
    sums = None
    scale = info.world_size / max(n_targets, 1.0)
    for i, b in enumerate(batches):
        last = i == len(batches) - 1
        with dist.sync_context(model, last) if info.distributed else _nullcontext():
            with autocast():
                logits = model(b.input_ids, b.doc_ids)  # (B, T, V) fp32
            per_token = per_token_cross_entropy(logits, b.labels)  # (B, T), 0 where ignored
            if loss_factor != 1.0:
                per_token = per_token * loss_factor
            (per_token.sum() * scale).backward()
        part = loss_breakdown(per_token, b.input_ids, b.labels, bos_id, eos_id)
        sums = part if sums is None else sums + part
        del logits, per_token
    return sums


def global_batch(cfg: Config, world: int) -> dict[str, int | None]:
    """The global batch arithmetic; a TrainingError when it contradicts train.global_batch_tokens."""
    tc = cfg.train
    sequences = tc.micro_batch * tc.grad_accum * world
    tokens = sequences * tc.seq_len
    b = {"micro": tc.micro_batch, "accum": tc.grad_accum, "world": world, "seq_len": tc.seq_len,
         "sequences": sequences, "tokens": tokens, "configured_tokens": tc.global_batch_tokens}
    if tc.global_batch_tokens is not None and tc.global_batch_tokens != tokens:
        need = tc.global_batch_tokens / (tc.micro_batch * world * tc.seq_len)
        raise TrainingError(
            f"global batch = micro {tc.micro_batch} × accum {tc.grad_accum} × world {world} × seq_len {tc.seq_len} "
            f"= {tokens:,} tokens, but train.global_batch_tokens = {tc.global_batch_tokens:,}",
            f"set train.grad_accum={need:g} (if whole), change train.micro_batch / seq_len / the number of "
            "processes, or unset train.global_batch_tokens",
        )
    return b


def describe_batch(b: dict[str, int | None]) -> str:
    return (f"global batch = micro {b['micro']} × accum {b['accum']} × world {b['world']} = "
            f"{b['sequences']:,} sequences = {b['tokens']:,} tokens")


def check_batch_tokens(batches: list[_Batch], b: dict[str, int | None], info: dist.DistInfo, step: int) -> int:
    """Tokens this rank consumed; a shortfall against the stated batch stops the run. Returns global tokens."""
    local = sum(int(x.input_ids.numel()) for x in batches)
    want = int(b["micro"]) * int(b["accum"]) * int(b["seq_len"])
    if local != want:
        shapes = ", ".join(str(tuple(x.input_ids.shape)) for x in batches)
        raise TrainingError(
            f"step {step}: rank {info.rank} got {local:,} tokens ({shapes}) instead of micro {b['micro']} × accum "
            f"{b['accum']} × seq_len {b['seq_len']} = {want:,}",
            "the token loader returned short batches: check the token shards (oreline tokenize) hold enough data",
        )
    return local * info.world_size


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each block's activations in backward (non-reentrant torch.utils.checkpoint).

    The block's `forward` is replaced on the instance, so parameter names (and checkpoints, and
    the HF export) stay exactly as without it.
    """
    from torch.utils.checkpoint import checkpoint

    for block in model.model.layers:
        inner = block.forward

        @functools.wraps(inner)
        def forward(*args: Any, _inner: Any = inner, **kwargs: Any) -> torch.Tensor:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward


def compile_blocks(model: torch.nn.Module) -> None:
    """torch.compile each transformer block (regional compilation) instead of the whole model.

    The blocks are identical, so one compiled graph serves them all: the first step compiled in
    ~19 s instead of ~2 min for the whole demo model on this loaded machine, and steps ran as fast
    (672-701 ms vs 727-741 ms of CPU time, 1 thread, with the tuned allocator; eager 758-830 ms).
    Elementwise work (RMSNorm, RoPE, SiLU·up, residual adds) is fused; the output head and the
    loss stay eager. See PyTorch's "regional compilation" recipe.
    """
    for block in model.model.layers:
        block.compile()


def tune_cpu_allocator() -> str | None:
    """glibc only: keep freed large blocks in the heap for reuse instead of unmapping them.

    A CPU step allocates tens of MB per activation (the demo's logits alone are 64 MB). glibc
    serves blocks above M_MMAP_THRESHOLD (dynamic, at most 32 MB) with mmap and unmaps them on
    free, so every step the kernel zero-fills the same pages again; page faults were ~13% of a
    demo step here (measured in process CPU time, 1 thread: 940 → 815 ms). Raising the mmap and
    trim thresholds keeps those blocks mapped, which is what the jemalloc/tcmalloc swap of
    PyTorch's CPU performance-tuning guide achieves, without preloading a library. The cost: the
    process keeps its peak heap (RSS does not shrink after a step). Returns what was set, or None.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None  # not glibc (macOS, musl): nothing to tune
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    if mallopt(m_mmap_threshold, 1 << 30) != 1 or mallopt(m_trim_threshold, (1 << 31) - 1) != 1:
        return None
    return "glibc mallopt: M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=2 GiB"


def _fingerprints(cfg: Config, tokenizer_fp: str, data_fp: str) -> dict[str, str]:
    cfg_fp = fingerprint(cfg)
    combined = hashlib.sha256(canonical_json({"config": cfg_fp, "tokenizer": tokenizer_fp, "data": data_fp}).encode()).hexdigest()
    return {"config": cfg_fp, "tokenizer": tokenizer_fp, "data": data_fp, "train": combined}


def setup_run(cfg: Config, info: dist.DistInfo, say: Any) -> Setup:
    """Tokenizer, loaders, model, optimizer, fingerprints and device peak; prints the plan."""
    from oreline.eval.evaluate import token_byte_lengths
    from oreline.model.llama import Llama
    from oreline.model.presets import flops_per_token, resolve_model_args
    from oreline.tokens.loader import TokenLoader
    from oreline.tokens.train_bpe import load_tokenizer

    tc = cfg.train
    run = RunDir.for_config(cfg)
    tokenizer_dir = Path(expand(tc.tokenizer)) if tc.tokenizer else run.tokenizer
    tokens_dir = Path(expand(tc.tokens)) if tc.tokens else run.tokens
    device = info.device
    batch = global_batch(cfg, info.world_size)
    warmup_steps(tc)  # schedule errors (warmup ≥ steps, min_lr > lr) before anything is loaded

    if device.type == "cpu" and tc.cpu_allocator == "tuned":
        tuned = tune_cpu_allocator()
        say(f"CPU allocator: {tuned}" if tuned else "CPU allocator: not glibc, left as it is")

    autocast_dtype = None
    if tc.precision == "bf16":
        autocast_dtype = torch.bfloat16
        native = cpu_native_bf16() if device.type == "cpu" else []
        if device.type == "cpu" and not native:
            say("[yellow]warning:[/] train.precision=bf16 on a CPU without native bf16 (no avx512_bf16 / amx_bf16): "
                "bf16 matmuls are emulated and ran ~20× slower than fp32 on this project's machines; training "
                "will be slow. Use train.precision=fp32 on this CPU.")
        elif device.type == "cpu":
            say(f"train.precision=bf16 on a CPU with native bf16 ({', '.join(native)}): bf16 autocast can beat fp32 "
                "here; compare the two runs' tokens_per_s in metrics.jsonl")

    tokenizer = load_tokenizer(tokenizer_dir)
    loader = TokenLoader(tokens_dir, split="train", seq_len=tc.seq_len, micro_batch=tc.micro_batch, seed=tc.seed,
                         rank=info.rank, world_size=info.world_size, tokenizer_fingerprint=tokenizer.fingerprint,
                         doc_mask=tc.doc_mask)
    val_loader = TokenLoader(tokens_dir, split="val", seq_len=tc.seq_len, micro_batch=tc.micro_batch, seed=tc.seed,
                             rank=info.rank, world_size=info.world_size, tokenizer_fingerprint=tokenizer.fingerprint,
                             doc_mask=tc.doc_mask)
    args = resolve_model_args(cfg.model, tokenizer.vocab_size)
    if args.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"model.vocab_size={args.vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}",
                          "unset model.vocab_size (it is taken from the tokenizer)")
    if tc.seq_len > args.max_seq_len:
        raise ConfigError(f"train.seq_len={tc.seq_len} is longer than the model's max_seq_len={args.max_seq_len}",
                          "lower train.seq_len or set model.max_seq_len")

    torch.manual_seed(tc.seed)  # the initial weights are a function of the seed
    model = Llama(args).to(device)
    if tc.activation_checkpointing:
        enable_activation_checkpointing(model)
    if tc.compile:
        compile_blocks(model)  # before wrapping, as torchtitan does (compile, then DDP / FSDP2)
    train_model = dist.wrap_model(model, tc, info)
    optimizer = build_optimizer(model, tc.optim, device)  # after wrapping: FSDP2 turns parameters into DTensor shards

    fps = _fingerprints(cfg, tokenizer.fingerprint, loader.data_fingerprint)
    if info.is_main:
        run.root.mkdir(parents=True, exist_ok=True)
        (run.root / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
        fp_path = run.root / "fingerprint.json"
        existing = json.loads(fp_path.read_text()) if fp_path.is_file() else {}
        write_json_atomic(fp_path, {**existing, **fps})

    fpt = flops_per_token(args, tc.seq_len)
    shapes = tuple(model_matmul_shapes(args, tc.micro_batch * tc.seq_len))
    peak, peak_source = device_peak_flops(device, tc.precision, shapes)

    say(f"[bold]train[/] run {run.root} on {device} ({info.world_size} process{'es' if info.world_size > 1 else ''})")
    say(f"config fingerprint {fps['train'][:16]}… (config {fps['config'][:12]}…, tokenizer "
        f"{fps['tokenizer'][:12]}…, data {fps['data'][:12]}…)")
    say(f"model: {model.num_params():,} parameters ({model.num_params(exclude_embedding=True):,} non-embedding), "
        f"{fpt / 1e6:,.1f} MFLOPs/token at seq_len {tc.seq_len}")
    say(describe_batch(batch))
    say("lr schedule (" + tc.optim.schedule + "): " + ", ".join(f"step {st}: {v:.3e}" for st, v in schedule_samples(tc)))
    say(f"peak FLOPs: {peak_source}")
    return Setup(run=run, device=device, tokenizer=tokenizer, tokens_dir=tokens_dir, tokenizer_dir=tokenizer_dir,
                 loader=loader, val_loader=val_loader, args=args, model=model, train_model=train_model,
                 optimizer=optimizer, fingerprints=fps, batch=batch,
                 bytes_per_token=token_byte_lengths(tokenizer), flops_per_token=fpt, peak_flops=peak,
                 peak_source=peak_source, autocast_dtype=autocast_dtype)


def start_record(cfg: Config, s: Setup, info: dist.DistInfo, state: TrainState, resumed: Path | None) -> dict:
    return {
        "type": "start", "step": state.step, "resumed_from": str(resumed) if resumed else None,
        "config_fingerprint": s.fingerprints["train"], "config_only_fingerprint": s.fingerprints["config"],
        "tokenizer_fingerprint": s.fingerprints["tokenizer"], "data_fingerprint": s.fingerprints["data"],
        "global_batch": s.batch,
        "model": {"params": s.model.num_params(), "non_embedding_params": s.model.num_params(exclude_embedding=True),
                  "flops_per_token": s.flops_per_token, "max_seq_len": s.args.max_seq_len},
        "device": str(s.device) + (f" ({torch.cuda.get_device_name(s.device)})" if s.device.type == "cuda" else ""),
        "world_size": info.world_size, "precision": cfg.train.precision,
        "peak_flops": s.peak_flops, "peak_source": s.peak_source,
        "schedule": schedule_samples(cfg.train), "total_steps": cfg.train.steps,
    }


# ---------------------------------------------------------------------------------------------
# checkpoints: save, resume, rollback


def checkpoint_meta(cfg: Config, s: Setup, state: TrainState, stability: Any) -> dict[str, Any]:
    return {  # RNG states, world size and optimizer hyperparameters are added by save_checkpoint
        "step": state.step, "tokens_seen": state.tokens_seen, "lr_multiplier": state.lr_multiplier,
        "skipped_steps": state.skipped_steps, "rollbacks": state.rollbacks,
        "debug_injected": list(state.debug_injected),
        "loader": s.loader.state_dict(), "stability": stability.state_dict(),
        "config": to_dict(cfg), "config_fingerprint": s.fingerprints["train"],
        "tokenizer_fingerprint": s.fingerprints["tokenizer"], "data_fingerprint": s.fingerprints["data"],
        "model_args": s.args.to_dict(), "tokenizer_dir": str(s.tokenizer_dir.resolve()),
        "tokens_dir": str(s.tokens_dir.resolve()),
    }


def save(cfg: Config, s: Setup, state: TrainState, stability: Any, kind: str, log: MetricsLogger) -> Path:
    from oreline.train.checkpoint import dir_bytes, save_checkpoint

    t0 = time.perf_counter()
    path = save_checkpoint(s.run.checkpoints, state.step, s.model, s.optimizer,
                           checkpoint_meta(cfg, s, state, stability), kind=kind, cfg=cfg.checkpoint)
    log.log({"type": "checkpoint", "step": state.step, "path": str(path), "kind": kind,
             "seconds": time.perf_counter() - t0, "bytes": dir_bytes(path)})
    return Path(path)


def move_previous_training(run: RunDir) -> Path | None:
    """A fresh start must not mix with what an earlier run left: move it to <run>/previous/<time>/.

    Left in place, an old step-N checkpoint would be the one a later `--resume auto` (or a
    rollback) picks, and old metrics would interleave with the new run's. Nothing is deleted.
    """
    old = [p for p in (run.checkpoints, run.metrics, run.tensorboard) if p.exists()]
    if not old:
        return None
    import shutil

    dest = run.root / "previous" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    dest.mkdir(parents=True)
    for path in old:
        shutil.move(str(path), str(dest / path.name))
    return dest


def _restore(meta: dict, s: Setup, state: TrainState) -> None:
    state.step = int(meta["step"])
    state.tokens_seen = int(meta["tokens_seen"])
    state.lr_multiplier = float(meta.get("lr_multiplier", 1.0))
    state.skipped_steps = int(meta.get("skipped_steps", 0))
    state.rollbacks = int(meta.get("rollbacks", 0))
    state.debug_injected = list(meta.get("debug_injected", []))


def resume_if_asked(cfg: Config, s: Setup, state: TrainState, stability: Any, resume: str, allow: list[str],
                    say: Any) -> tuple[Path | None, list[dict]]:
    """Load the checkpoint `resume` names (auto: the newest valid one).

    Returns (path or None when starting fresh, event records to log: invalid checkpoints passed
    over, the resume itself with the config keys that were allowed to differ).
    """
    if resume == "none":
        return None, []
    from oreline.train.checkpoint import check_resume_compatible, find_resumable, load_checkpoint, read_meta

    events: list[dict] = []
    if resume == "auto":
        if not s.run.checkpoints.is_dir():
            return None, []
        skipped: list = []
        path = find_resumable(s.run.checkpoints, console=_Say(say), skipped=skipped)
        for bad, problems in skipped:
            events.append({"type": "event", "step": None, "kind": "checkpoint_invalid",
                           "values": {"path": str(bad), "problems": list(problems)}, "action": "skipped",
                           "message": f"checkpoint {bad} is invalid ({'; '.join(problems)}): not resumed from"})
        if path is None:
            return None, events
    else:
        path = Path(resume)
    # Compatibility first, from meta.json alone: a changed model must fail with the keys, not
    # with a tensor shape error half-way through loading.
    changed = check_resume_compatible(read_meta(path) or {}, to_dict(cfg), allow, fingerprints=s.fingerprints,
                                      model_args=s.args.to_dict())
    dist.check_resume_batch(read_meta(path) or {}, s.batch, allow)  # same global batch at any world size
    meta = load_checkpoint(path, s.model, s.optimizer)  # also restores this rank's RNG states
    _restore(meta, s, state)
    s.loader.load_state_dict(meta["loader"])
    stability.load_state_dict(meta.get("stability", {}))
    say(f"resumed from {path} at step {state.step} ({state.tokens_seen:,} tokens seen)"
        + (f"; allowed config changes: {', '.join(changed)}" if changed else ""))
    events.append({"type": "event", "step": state.step, "kind": "resume",
                   "values": {"path": str(path), "tokens_seen": state.tokens_seen, "allowed_changes": changed},
                   "action": "resume", "message": f"resumed from {path} at step {state.step}"})
    return Path(path), events


class _Say:
    """A console-like object (print) for helpers that report, bound to rank-0 printing."""

    def __init__(self, say: Any):
        self.print = say


def rollback(s: Setup, state: TrainState, stability: Any, target: Path, failed_step: int, cfg: Config,
             log: MetricsLogger) -> None:
    """Reload `target`, scale the lr multiplier, and move the loader past the offending batches.

    The loader is NOT rewound: it stands after the failed step's batches, and skips
    `skip_batches` more steps' worth, so neither the offending data nor its neighbours are
    replayed (PaLM §5.1 skipped the ~200-500 batches around a spike).
    """
    from oreline.train.checkpoint import load_checkpoint

    stab = cfg.train.stability
    multiplier = state.lr_multiplier * stab.lr_factor
    injected = list(state.debug_injected)
    skipped, rollbacks = state.skipped_steps, state.rollbacks + 1
    meta = load_checkpoint(target, s.model, s.optimizer)
    _restore(meta, s, state)
    state.lr_multiplier, state.rollbacks, state.skipped_steps = multiplier, rollbacks, skipped
    state.debug_injected = sorted(set(injected) | set(state.debug_injected))
    stability.restore_window(meta.get("stability", {}))
    for _ in range(stab.skip_batches * cfg.train.grad_accum):
        s.loader.next_batch()
    log.log({"type": "event", "step": state.step, "kind": "rollback",
             "values": {"failed_step": failed_step, "to_step": state.step, "lr_multiplier": multiplier,
                        "skipped_batches": stab.skip_batches, "checkpoint": str(target)},
             "action": "rollback",
             "message": f"rolled back to {target} (step {state.step}) after step {failed_step}; lr × {multiplier:.3g}, "
                        f"data moved on by {stab.skip_batches} step(s) past the failed one"})


def event(step: int, anomaly: Any, action: str, message: str) -> dict[str, Any]:
    return {"type": "event", "step": step, "kind": anomaly.kind, "values": dict(anomaly.values),
            "z": getattr(anomaly, "z", None), "action": action, "message": message}


# ---------------------------------------------------------------------------------------------
# evaluation inside training


def _eager(cfg: Config) -> Any:
    """Evaluation and generation run the compiled blocks eagerly: eval mode and every new prompt
    length would otherwise each cost a recompilation (tens of seconds on CPU) for a few batches."""
    return torch.compiler.set_stance("force_eager") if cfg.train.compile else _nullcontext()


def evaluate(s: Setup, info: dist.DistInfo, batches: int, cfg: Config) -> dict[str, Any]:
    from oreline.eval.evaluate import validation_loss

    with _eager(cfg):
        return validation_loss(s.model, s.val_loader, s.tokenizer.bos_id, s.tokenizer.eos_id, batches,
                               s.bytes_per_token, all_reduce=dist.all_reduce_sum if info.distributed else None,
                               autocast_dtype=s.autocast_dtype)


def generations(s: Setup, cfg: Config) -> list[dict[str, Any]]:
    from oreline.eval.evaluate import generate_samples

    with _eager(cfg):
        return generate_samples(s.model, s.tokenizer, cfg.eval.prompts, cfg.eval.max_new_tokens, greedy=True)
