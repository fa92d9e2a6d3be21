"""The pieces a training run is built from: set-up, batch arithmetic, performance switches.

`setup_run(cfg, info, say)` does everything before the first step, in this order: the global
batch arithmetic and the schedule are checked (errors before anything is loaded), the CPU
allocator is tuned, the tokenizer and the train/val token shards are opened (the loader refuses
shards of another tokenizer), the model is built from the seed, activation checkpointing and
regional compilation are applied, the model is wrapped for DDP/FSDP2 and the optimizer built
after wrapping, config.toml and fingerprint.json are written into the run directory, the
device's peak FLOPs are looked up (GPU table) or measured (CPU), and the plan is printed:
fingerprints, parameters, FLOPs per token, the global batch, sampled learning rates, the peak.

`TrainState` is the progress that is not a tensor (step, tokens, lr multiplier, counters); the
checkpoint meta holds it (oreline.train.recovery).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from oreline.config import Config, canonical_json, expand, fingerprint, to_toml
from oreline.errors import ConfigError, TrainingError
from oreline.io import write_json_atomic
from oreline.model.matmul import (
    cpu_matmul_backend,
    describe_backend,
    machine_choice,
    pin_auto_choice,
    set_cpu_matmul_backend,
)
from oreline.runs import RunDir
from oreline.train import dist
from oreline.train.monitor import cpu_native_bf16, device_peak_flops, model_matmul_shapes
from oreline.train.optim import build_optimizer, schedule_samples, warmup_steps


@dataclass
class TrainState:
    """Everything about progress that is not a tensor; saved in the checkpoint meta."""

    step: int = 0
    tokens_seen: int = 0
    lr_multiplier: float = 1.0
    skipped_steps: int = 0
    rollbacks: int = 0
    debug_injected: list[int] = field(default_factory=list)
    # train losses since the last evaluation (its record's train_loss) and the last one: in the
    # checkpoint, so an evaluation a resumed run completes reports what the uninterrupted run would
    loss_sum: float = 0.0
    loss_count: int = 0
    last_loss: float | None = None


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
        t = torch.as_tensor(x, dtype=torch.long)
        if device.type == "cuda":  # a copy from pageable memory may wait for the stream; from pinned, never
            t = t.pin_memory()
        return t.to(device=device, non_blocking=True)

    return _Batch(move(batch.input_ids), move(batch.labels), move(getattr(batch, "doc_ids", None)))


@dataclass
class _Batch:
    input_ids: torch.Tensor
    labels: torch.Tensor
    doc_ids: torch.Tensor | None


def global_batch(cfg: Config, world: int) -> dict[str, int | None]:
    """The global batch arithmetic; a TrainingError when it contradicts train.global_batch_tokens."""
    tc = cfg.train
    sequences = tc.micro_batch * tc.grad_accum * world
    tokens = sequences * tc.seq_len
    b = {
        "micro": tc.micro_batch,
        "accum": tc.grad_accum,
        "world": world,
        "seq_len": tc.seq_len,
        "sequences": sequences,
        "tokens": tokens,
        "configured_tokens": tc.global_batch_tokens,
    }
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
    return (
        f"global batch = micro {b['micro']} × accum {b['accum']} × world {b['world']} = "
        f"{b['sequences']:,} sequences = {b['tokens']:,} tokens"
    )


def check_batch_tokens(
    batches: list[_Batch], b: dict[str, int | None], info: dist.DistInfo, step: int
) -> int:
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
    combined = hashlib.sha256(
        canonical_json({"config": cfg_fp, "tokenizer": tokenizer_fp, "data": data_fp}).encode()
    ).hexdigest()
    return {"config": cfg_fp, "tokenizer": tokenizer_fp, "data": data_fp, "train": combined}


def setup_run(cfg: Config, info: dist.DistInfo, say: Any) -> Setup:
    """Tokenizer, loaders, model, optimizer, fingerprints and device peak; prints the plan."""
    from oreline.model.llama import Llama
    from oreline.model.presets import check_training_memory, flops_per_token, resolve_model_args
    from oreline.model.scoring import token_byte_lengths
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
    if device.type == "cpu":
        set_cpu_matmul_backend(tc.cpu_matmul)
        if tc.cpu_matmul == "auto":  # this machine's decision, not one measured under today's load; rank 0's
            pin_auto_choice(*dist.from_main(machine_choice() if info.is_main else None))
        say(f"CPU fp32 matmuls: {describe_backend()}")

    autocast_dtype = None
    if tc.precision == "bf16":
        autocast_dtype = torch.bfloat16
        native = cpu_native_bf16() if device.type == "cpu" else []
        if device.type == "cpu" and not native:
            say(
                "[yellow]warning:[/] train.precision=bf16 on a CPU without native bf16 (no avx512_bf16 / amx_bf16): "
                "bf16 matmuls are emulated and ran ~20× slower than fp32 on this project's machines; training "
                "will be slow. Use train.precision=fp32 on this CPU."
            )
        elif device.type == "cpu":
            say(
                f"train.precision=bf16 on a CPU with native bf16 ({', '.join(native)}): bf16 autocast can beat fp32 "
                "here; compare the two runs' tokens_per_s in metrics.jsonl"
            )

    tokenizer = load_tokenizer(tokenizer_dir)

    def split_loader(split: str) -> TokenLoader:
        return TokenLoader(
            tokens_dir,
            split=split,
            seq_len=tc.seq_len,
            micro_batch=tc.micro_batch,
            seed=tc.seed,
            rank=info.rank,
            world_size=info.world_size,
            tokenizer_fingerprint=tokenizer.fingerprint,
            doc_mask=tc.doc_mask,
        )

    loader, val_loader = split_loader("train"), split_loader("val")
    args = resolve_model_args(cfg.model, tokenizer.vocab_size)
    if args.vocab_size < tokenizer.vocab_size:
        raise ConfigError(
            f"model.vocab_size={args.vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}",
            "unset model.vocab_size (it is taken from the tokenizer)",
        )
    if tc.seq_len > args.max_seq_len:
        raise ConfigError(
            f"train.seq_len={tc.seq_len} is longer than the model's max_seq_len={args.max_seq_len}",
            "lower train.seq_len or set model.max_seq_len",
        )

    # Refuse before allocating: a model or batch far beyond this machine would be an OOM kill later.
    check_training_memory(
        args,
        tc.micro_batch,
        tc.seq_len,
        tc.precision,
        tc.activation_checkpointing,
        info.world_size if info.sharded else 1,
        device,
    )

    torch.manual_seed(tc.seed)  # the initial weights are a function of the seed
    model = Llama(args).to(device)
    if tc.activation_checkpointing:
        enable_activation_checkpointing(model)
    if tc.compile:
        compile_blocks(model)  # before wrapping, as torchtitan does (compile, then DDP / FSDP2)
    train_model = dist.wrap_model(model, tc, info)
    optimizer = build_optimizer(
        model, tc.optim, device
    )  # after wrapping: FSDP2 turns parameters into DTensor shards

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

    say(
        f"[bold]train[/] run {run.root} on {device} ({info.world_size} process{'es' if info.world_size > 1 else ''})"
    )
    say(
        f"config fingerprint {fps['train'][:16]}… (config {fps['config'][:12]}…, tokenizer "
        f"{fps['tokenizer'][:12]}…, data {fps['data'][:12]}…)"
    )
    say(
        f"model: {model.num_params():,} parameters ({model.num_params(exclude_embedding=True):,} non-embedding), "
        f"{fpt / 1e6:,.1f} MFLOPs/token at seq_len {tc.seq_len}"
    )
    say(describe_batch(batch))
    say(
        "lr schedule ("
        + tc.optim.schedule
        + "): "
        + ", ".join(f"step {st}: {v:.3e}" for st, v in schedule_samples(tc))
    )
    say(f"peak FLOPs: {peak_source}")
    return Setup(
        run=run,
        device=device,
        tokenizer=tokenizer,
        tokens_dir=tokens_dir,
        tokenizer_dir=tokenizer_dir,
        loader=loader,
        val_loader=val_loader,
        args=args,
        model=model,
        train_model=train_model,
        optimizer=optimizer,
        fingerprints=fps,
        batch=batch,
        bytes_per_token=token_byte_lengths(tokenizer),
        flops_per_token=fpt,
        peak_flops=peak,
        peak_source=peak_source,
        autocast_dtype=autocast_dtype,
    )


def start_record(cfg: Config, s: Setup, info: dist.DistInfo, state: TrainState, resumed: Path | None) -> dict:
    return {
        "type": "start",
        "step": state.step,
        "resumed_from": str(resumed) if resumed else None,
        "config_fingerprint": s.fingerprints["train"],
        "config_only_fingerprint": s.fingerprints["config"],
        "tokenizer_fingerprint": s.fingerprints["tokenizer"],
        "data_fingerprint": s.fingerprints["data"],
        "global_batch": s.batch,
        "model": {
            "params": s.model.num_params(),
            "non_embedding_params": s.model.num_params(exclude_embedding=True),
            "flops_per_token": s.flops_per_token,
            "max_seq_len": s.args.max_seq_len,
        },
        "device": str(s.device)
        + (f" ({torch.cuda.get_device_name(s.device)})" if s.device.type == "cuda" else ""),
        "world_size": info.world_size,
        "precision": cfg.train.precision,
        "cpu_matmul": describe_backend() if s.device.type == "cpu" else None,
        "cpu_matmul_backend": cpu_matmul_backend() if s.device.type == "cpu" else None,
        "peak_flops": s.peak_flops,
        "peak_source": s.peak_source,
        "schedule": schedule_samples(cfg.train),
        "total_steps": cfg.train.steps,
    }
