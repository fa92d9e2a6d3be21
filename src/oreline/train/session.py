"""A training run's set-up (`setup_run`), its progress (`TrainState`) and its start record.

`setup_run(cfg, info, say)` does everything before the first step, in this order: the global
batch arithmetic and the schedule are checked (errors before anything is loaded), the CPU
allocator is tuned, the tokenizer and the train/val token shards are opened (the loader refuses
shards of another tokenizer), the model is built from the seed, activation checkpointing and
regional compilation are applied, the model is wrapped for DDP/FSDP2 and the optimizer built
after wrapping, config.toml and fingerprint.json are written into the run directory, the
device's peak FLOPs are looked up (GPU table) or measured (CPU), and the plan is printed:
fingerprints, parameters, FLOPs per token, the global batch, sampled learning rates, the peak.
The global batch arithmetic is `oreline.train.batch`; the speed and memory switches applied here
are `oreline.train.performance`.

`TrainState` is the progress that is not a tensor (step, tokens, lr multiplier, counters); the
checkpoint meta holds it (oreline.train.recovery).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from oreline.config import Config, canonical_json, expand, fingerprint, to_toml
from oreline.errors import ConfigError, InputError
from oreline.io import write_atomic, write_json_atomic
from oreline.model.kernels.matmul import resolve_backend
from oreline.model.kernels.select import kernels_for, resolve_attention, resolve_choice
from oreline.runs import RunDir
from oreline.train import dist
from oreline.train.batch import describe_batch, global_batch
from oreline.train.monitor import cpu_native_bf16, device_peak_flops, model_matmul_shapes
from oreline.train.optim import build_optimizer, schedule_samples, warmup_steps
from oreline.train.performance import compile_blocks, enable_activation_checkpointing, set_cpu_allocator


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
    # the fp32 product backend of the CPU kernels ("onednn" | "blas"; None: plain nn.Linear) and how
    # it was decided (this machine's cache, the config, a checkpoint's record): logged, recorded
    cpu_matmul: str | None = None
    cpu_matmul_source: str = ""
    # train.init_from's lineage (oreline.train.init_from): set on a fresh start from weights, carried
    # on from the checkpoint by a resume; in the start record and every checkpoint's meta.json
    lineage: dict | None = None
    # precision=fp8: the projections torchao computes in fp8, and what runs after each optimizer
    # step (FSDP2 + tensorwise: the weights' fp8 scales for the next all-gather)
    fp8_layers: tuple[str, ...] = ()
    after_optimizer_step: Any = None
    val_loaders: dict[str, Any] = field(default_factory=dict)  # source name → its val split's loader
    unvalidated: dict[str, str] = field(default_factory=dict)  # source name → why it has no val loss

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


def _fingerprints(cfg: Config, tokenizer_fp: str, data_fp: str) -> dict[str, str]:
    cfg_fp = fingerprint(cfg)
    combined = hashlib.sha256(
        canonical_json({"config": cfg_fp, "tokenizer": tokenizer_fp, "data": data_fp}).encode()
    ).hexdigest()
    return {"config": cfg_fp, "tokenizer": tokenizer_fp, "data": data_fp, "train": combined}


def setup_run(cfg: Config, info: dist.DistInfo, say: Any) -> Setup:
    """Tokenizer, loaders, model, optimizer, fingerprints and device peak; prints the plan."""
    from oreline.model.presets import check_training_memory, flops_per_token, resolve_model_args
    from oreline.model.scoring import token_byte_lengths
    from oreline.tokens.loader import TokenLoader
    from oreline.tokens.mixture import MixtureLoader
    from oreline.tokens.train_bpe import load_tokenizer

    tc = cfg.train
    run = RunDir.for_config(cfg)
    tokenizer_dir = Path(expand(tc.tokenizer)) if tc.tokenizer else run.tokenizer
    sources = mixture_sources(cfg, run)
    tokens_dir = sources[0].tokens
    device = info.device
    batch = global_batch(cfg, info.world_size)
    warmup_steps(tc)  # schedule errors (warmup ≥ steps, min_lr > lr) before anything is loaded

    if device.type == "cpu" and tc.cpu_allocator != "default":
        tuned = set_cpu_allocator(tc.cpu_allocator)
        say(f"CPU allocator: {tuned}" if tuned else "CPU allocator: not glibc, left as it is")
    cpu_matmul, cpu_matmul_source = None, ""
    cuda_picked = None
    kernel_choice = kernels_choice(tc, device)
    if kernel_choice == "cpu":
        # "auto": this machine's decision, not one measured under today's load; every rank takes rank 0's
        cpu_matmul, cpu_matmul_source = dist.from_main(
            resolve_backend(tc.cpu_matmul) if info.is_main else None
        )
        say(f"kernels: cpu; fp32 matmuls: {cpu_matmul} ({cpu_matmul_source})")
    elif kernel_choice == "cuda":  # auto on CUDA: the RMSNorm / RoPE measured fastest on this GPU
        from oreline.model.kernels import cuda_choice
        from oreline.model.kernels.select import gpu_name

        # rank 0's record for every rank: nodes whose caches differ must still compute alike
        cuda_picked, source = dist.from_main(cuda_choice.choice(gpu_name(device)) if info.is_main else None)
        say(f"kernels: RMSNorm {cuda_picked['rms_norm']}, RoPE {cuda_picked['rope']} ({source})")
    else:
        say(f"kernels: reference ({tc.kernels})")

    autocast_dtype = None
    if tc.precision == "fp8":
        check_fp8_support(device, tc.fp8_emulate)
        autocast_dtype = torch.bfloat16
    elif tc.precision == "bf16":
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

    def val_loader_of(folder: Path) -> TokenLoader:
        return TokenLoader(
            folder,
            split="val",
            seq_len=tc.seq_len,
            micro_batch=tc.micro_batch,
            seed=tc.seed,
            rank=info.rank,
            world_size=info.world_size,
            tokenizer_fingerprint=tokenizer.fingerprint,
            doc_mask=tc.doc_mask,
        )

    if tc.tokens and tc.sources:
        say(
            f"[yellow]note[/]: train.tokens={tc.tokens} is set: the run trains on that one folder, not on the "
            f"{len(tc.sources)} [[train.sources]] of the config (unset train.tokens to train on the mixture)"
        )
    loader = MixtureLoader(
        sources,
        tc.phases if not tc.tokens else [],
        seq_len=tc.seq_len,
        micro_batch=tc.micro_batch,
        seed=tc.seed,
        rank=info.rank,
        world_size=info.world_size,
        global_sequences=int(batch["sequences"]),
        tokenizer_fingerprint=tokenizer.fingerprint,
        doc_mask=tc.doc_mask,
    )
    loader.check_budget(tc.steps * int(batch["sequences"]))  # max_epochs, before anything is built
    # each source's val split: its own validation loss (the first one is the run's `val_loader`); a
    # source without one (a few documents, none drawn for validation) is trained on, not validated
    val_loaders = {}
    unvalidated: dict[str, str] = {}  # source name → why it has no validation loss of its own
    for src in sources:
        val_tokens = _val_tokens(src.tokens)
        if len(sources) > 1 and val_tokens <= tc.seq_len:  # not one sequence of seq_len + 1 tokens
            unvalidated[src.name] = (
                "no validation split"
                if not val_tokens
                else f"a validation split of {val_tokens:,} tokens, fewer than seq_len + 1 = {tc.seq_len + 1}"
            )
            say(
                f"[yellow]note[/]: source {src.name!r} ({src.tokens}) has {unvalidated[src.name]}: no "
                "validation loss of its own (raise tokenize.val_sequences or val_fraction and re-run "
                "oreline tokenize for one)"
            )
            continue
        val_loaders[src.name] = val_loader_of(src.tokens)
    if not val_loaders:
        raise InputError(
            f"no source of the mixture has a validation split ({', '.join(str(s.tokens) for s in sources)})",
            "raise tokenize.val_fraction and re-run oreline tokenize",
        )
    val_loader = next(iter(val_loaders.values()))
    args = resolve_model_args(cfg.model, tokenizer.vocab_size)
    if args.vocab_size < tokenizer.vocab_size:
        raise ConfigError(
            f"model.vocab_size={args.vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}",
            "unset model.vocab_size (it is taken from the tokenizer)",
        )
    for each in (loader, *val_loaders.values()):
        each.check_fits(args.vocab_size, tokenizer.bos_id, tokenizer.eos_id, "the model")
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
        "bf16" if tc.precision == "fp8" else tc.precision,  # fp8 keeps bf16's weights and activations
        tc.activation_checkpointing,
        dist.shard_count(tc, info.world_size),
        device,
        grad_sync_per_step=tc.fsdp_grad_sync == "step" and tc.grad_accum > 1,
        checkpoint_every=tc.activation_checkpointing_every,
        loss_chunk_tokens=tc.loss_chunk_tokens if loss_choice(tc, device) == "chunked" else None,
        reduce_dtype=tc.reduce_dtype,
    )
    say_tf32(tc, device, say)

    attention = resolve_attention(tc.attention, device, tc.doc_mask)
    if attention == "flex" and device.type != "cuda":
        raise ConfigError(
            f"train.attention=flex cannot train on {device.type}: FlexAttention has no backward there (torch "
            f"{torch.__version__.split('+')[0]})",
            "set train.attention=auto or sdpa (the dense document mask)",
        )
    if tc.doc_mask:
        say(f"document masking: {'FlexAttention block mask' if attention == 'flex' else 'dense SDPA mask'}")
    kernels = with_loss(
        kernels_for(kernel_choice, device, cpu_matmul or "blas", attention, cuda_picked),
        tc,
        device,
        cpu_matmul or "blas",
    )
    loss = loss_choice(tc, device)
    say(
        f"loss: {loss} ({tc.loss_chunk_tokens} tokens per chunk of logits)"
        if loss == "chunked"
        else f"loss: {loss}"
    )
    model, train_model = build_model(args, kernels, tc, info)
    fp8_layers: tuple[str, ...] = ()
    after_step = None
    if tc.precision == "fp8":
        from oreline.train import float8

        fp8_layers = tuple(n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear")
        say(
            f"precision: fp8 ({tc.fp8_recipe}{', emulated' if tc.fp8_emulate else ''}) in "
            f"{len(fp8_layers)} of {7 * args.n_layers} block projections, bf16 elsewhere"
            + ("" if fp8_layers else ": none is large enough for fp8 to pay off, so this runs as bf16")
        )
        if fp8_layers and float8_all_gather(tc, info):
            after_step = partial(float8.precompute_scales, model)
    optimizer = build_optimizer(
        model, tc.optim, device
    )  # after wrapping: FSDP2 turns parameters into DTensor shards

    fps = _fingerprints(cfg, tokenizer.fingerprint, loader.data_fingerprint)
    if info.is_main:
        run.root.mkdir(parents=True, exist_ok=True)
        write_atomic(run.root / "config.toml", to_toml(cfg))
        fp_path = run.root / "fingerprint.json"
        try:  # the run's own file (RunDir.claim); one cut short by a kill is rewritten
            existing = json.loads(fp_path.read_text())
        except (OSError, ValueError):
            existing = {}
        write_json_atomic(fp_path, {**(existing if isinstance(existing, dict) else {}), **fps})

    fpt = flops_per_token(args, tc.seq_len)
    shapes = tuple(model_matmul_shapes(args, tc.micro_batch * tc.seq_len))
    # fp8's MFU is against the bf16 peak (torchtitan's convention): the gain shows as MFU above bf16's
    peak, peak_source = device_peak_flops(device, "bf16" if tc.precision == "fp8" else tc.precision, shapes)

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
        val_loaders=val_loaders,
        unvalidated=unvalidated,
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
        cpu_matmul=cpu_matmul,
        cpu_matmul_source=cpu_matmul_source,
        fp8_layers=fp8_layers,
        after_optimizer_step=after_step,
    )


def check_fp8_support(device: torch.device, emulate: bool) -> None:
    from oreline.train.float8 import check_support

    check_support(device, emulate)


def kernels_choice(tc: Any, device: torch.device) -> str:
    """train.kernels resolved for this device and precision. fp8 swaps the blocks' nn.Linear
    projections for torchao's Float8Linear, which the CPU set's stacked q/k/v product would bypass:
    "auto" then takes the reference, an explicit "cpu" is refused."""
    choice = resolve_choice(tc.kernels, device)
    if tc.precision != "fp8" or choice != "cpu":
        return choice
    if tc.kernels == "cpu":
        raise ConfigError(
            "train.kernels=cpu cannot run with train.precision=fp8 (its stacked q/k/v product bypasses "
            "the fp8 projections)",
            "set train.kernels=auto or reference",
        )
    return "reference"


def float8_all_gather(tc: Any, info: dist.DistInfo) -> bool:
    """Whether FSDP2 all-gathers fp8 weights: tensorwise under FSDP/HSDP (torchao's fp8 all-gather
    is tensorwise only)."""
    fsdp = tc.parallel in ("fsdp", "hsdp") and (info.distributed or torch.distributed.is_initialized())
    return fsdp and tc.fp8_recipe == "tensorwise"


def _val_tokens(folder: Path) -> int:
    from oreline.tokens.tokenize import read_manifest

    return sum(sh["tokens"] for sh in read_manifest(folder)["shards"] if sh["split"] == "val")


def source_folder(tokens: str, run: RunDir) -> Path:
    """A source's token folder: `{samples}`, `~` and `{run}` (the run folder) expanded."""
    return Path(expand(tokens.replace("{run}", str(run.root))))


def mixture_sources(cfg: Config, run: RunDir) -> list[Any]:
    """`[[train.sources]]`, or the one-source mixture "main" of train.tokens (default <run dir>/tokens)."""
    from oreline.tokens.mixture import LEGACY_NAME, Source

    tc = cfg.train
    if tc.sources and not tc.tokens:
        sources = [Source(s.name, source_folder(s.tokens, run), s.weight, s.max_epochs) for s in tc.sources]
        missing = [s for s in sources if not (s.tokens / "manifest.json").is_file()]
        if missing:
            # the demo config (also the default one) names oreline run's per-set folders: a run
            # tokenized by hand into <run>/tokens has none of them
            raise InputError(
                "train.sources names token folders that do not exist: "
                + ", ".join(f"{s.name} → {s.tokens}" for s in missing),
                "tokenize each source into its folder (`oreline run` makes {run}/tokens-web and "
                "{run}/tokens-extra), or train on one folder with train.tokens=FOLDER",
            )
        return sources
    return [Source(LEGACY_NAME, Path(expand(tc.tokens)) if tc.tokens else run.tokens, 1.0)]


def loss_choice(tc: Any, device: torch.device) -> str:
    """ "full" or "chunked": what `train.loss` means on `device`. auto is full everywhere for now:
    on a CPU the kernels' fused loss ran faster (benchmarks/chunked_loss.py); on CUDA the chunked
    loss costs one more head product in backward and no GPU has measured it yet (gpu_check's
    "levers" row), so a default GPU run keeps the loss the 1b MFU was measured with. Chunked is
    the choice where the (tokens × vocab) logits limit the micro-batch (a 128k vocabulary)."""
    del device  # the decision will be per device once a GPU measurement exists
    return "full" if tc.loss == "auto" else tc.loss


def with_loss(kernels: Any, tc: Any, device: torch.device, backend: str) -> Any:
    """`kernels` with the token loss `train.loss` asks for (the chunked one replaces the kernels' own)."""
    from oreline.model.kernels.select import with_chunked_loss

    if loss_choice(tc, device) != "chunked":
        return kernels
    return with_chunked_loss(kernels, tc.loss_chunk_tokens, backend)


def build_model(
    args: Any, kernels: Any, tc: Any, info: dist.DistInfo
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(model, train_model): the Llama built on the meta device, wrapped, then materialised on the
    device and initialised from `train.seed`.

    Nothing of the model is allocated before wrapping: under FSDP/HSDP each rank then allocates
    only its shards (`to_empty`), and `init_weights` fills each shard with its rows of the full
    draw, one matrix at a time, so a rank never holds the whole model, and the weights are those
    of `torch.manual_seed(seed); Llama(args)` in one process whatever the sharding
    (tests/train/test_meta_init.py). DDP broadcasts rank 0's weights when it wraps, so there the
    model is materialised and initialised first. Activation checkpointing and regional
    compilation come before wrapping, as torchtitan does (compile, then DDP / FSDP2).
    """
    from oreline.model.llama import Llama

    torch.manual_seed(tc.seed)  # anything drawn later from the global generator starts from the seed too
    gen = torch.Generator().manual_seed(tc.seed)  # the initial weights are a function of the seed
    with torch.device("meta"):
        model = Llama(args, kernels)
    if tc.precision == "fp8":  # before AC, compile and FSDP2, as torchtitan converts
        from oreline.train import float8

        float8.convert(
            model,
            tc.fp8_recipe,
            tc.fp8_emulate,
            fsdp=float8_all_gather(tc, info),
            size_filter=tc.fp8_filter == "auto",
        )
    enable_activation_checkpointing(model, tc.activation_checkpointing, tc.activation_checkpointing_every)
    if tc.compile:
        compile_blocks(model)
    fsdp = tc.parallel in ("fsdp", "hsdp") and (info.distributed or torch.distributed.is_initialized())
    if not fsdp:  # one process, or DDP
        model.to_empty(device=info.device)
        model.init_weights(gen)
        return model, dist.wrap_model(model, tc, info)
    train_model = dist.wrap_model(model, tc, info)
    model.to_empty(device=info.device)
    model.init_weights(gen)
    return model, train_model


def say_tf32(tc: Any, device: torch.device, say: Any) -> str | None:
    """CUDA + precision=fp32: TF32 matmuls unless train.tf32=false, and a warning that fp32 on a GPU
    is the slow path; returns what was set (None off CUDA, where nothing changes)."""
    if device.type != "cuda" or tc.precision != "fp32":
        return None
    torch.set_float32_matmul_precision("high" if tc.tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tc.tf32
    what = (
        "TF32 matmuls (train.tf32=true: fp32 storage, 10-bit mantissa products)"
        if tc.tf32
        else "full fp32 matmuls (train.tf32=false)"
    )
    say(
        f"[yellow]warning:[/] train.precision=fp32 on a GPU: {what}; bf16 (train.precision=bf16) runs "
        "the tensor cores at full rate and halves activation memory"
    )
    return what


def start_record(cfg: Config, s: Setup, info: dist.DistInfo, state: TrainState, resumed: Path | None) -> dict:
    return {
        "type": "start",
        "step": state.step,
        "resumed_from": str(resumed) if resumed else None,
        "init_from": s.lineage,
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
        "parallel": info.parallel,  # the launch's choice (--nproc N: ddp); the config keeps what was given
        "precision": cfg.train.precision,
        "kernels": cfg.train.kernels,
        "attention": s.model.kernels.attention if cfg.train.doc_mask else None,
        "cpu_matmul": f"{s.cpu_matmul} ({s.cpu_matmul_source})" if s.cpu_matmul else None,
        "cpu_matmul_backend": s.cpu_matmul,
        "peak_flops": s.peak_flops,
        "peak_source": s.peak_source,
        "schedule": schedule_samples(cfg.train),
        "total_steps": cfg.train.steps,
        "mixture": {
            "sources": {
                n: {"tokens": str(ld.dir), "sequences": ld.num_sequences, "weight": float(w)}
                for (n, ld), w in zip(
                    s.loader.loaders.items(), [src.weight for src in s.loader.sources.values()], strict=True
                )
            },
            "phases": [ph.to_json() for ph in s.loader.mixture.phases],
            "unvalidated": s.unvalidated,
        },
    }
