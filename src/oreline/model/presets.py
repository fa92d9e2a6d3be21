"""Named model sizes, the config → ModelArgs resolution, parameter/FLOP/memory arithmetic.

MLP width (Meta's reference `FeedForward`, llama/model.py of Llama 2 and Llama 3):

    hidden = int(2 · (4 · dim) / 3)
    hidden = int(ffn_multiplier · hidden)              # when a multiplier is given
    ffn_dim = multiple_of · ceil(hidden / multiple_of)

Llama-2-7B: dim 4096, multiple_of 256 → 10922 → 11008. Llama-3-8B: multiplier 1.3, multiple_of 1024
→ int(14198.6) = 14198 → 14336. Llama-3.2-1B: dim 2048, multiplier 1.5, multiple_of 256 → 8192.
(Truncations happen in that order; a single ceil over multiplier · 8/3 · dim gives the same
values for these shapes but not for every shape.) Llama-2-7B does NOT tie its output projection to
the embedding table; Llama-3.2-1B/3B do.

FLOPs per token (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B):

    flops_per_token = 6 · N + 12 · n_layers · dim · seq_len

N is the non-embedding parameter count *plus the lm-head matmul* (vocab · dim, counted even when
tied: the lookup is free, the output projection is not). The factor 6 is forward (2) + backward
(4) per weight per token. The second term is the attention score and value matmuls (QKᵀ and AV,
2 · 2 · T · dim per layer forward, ×3 with backward), counted over the full T×T square as PaLM
does, without halving for the causal mask — the convention MFU figures are quoted in.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from oreline.config import ModelConfig
from oreline.errors import ConfigError
from oreline.model.llama import Llama, ModelArgs, check_shapes, expected_shapes

__all__ = [
    "PRESETS",
    "resolve_model_args",
    "llama_ffn_dim",
    "count_params",
    "flops_per_token",
    "memory_estimate",
    "training_memory",
    "check_training_memory",
    "largest_fsdp_unit",
    "check_model_memory",
    "model_memory",
    "rope_bytes",
    "selective_values",
    "checkpointing_mode",
    "print_model_info",
    "check_shapes",
    "expected_shapes",
]

# Fields of ModelArgs plus ffn_multiplier / multiple_of (the MLP width rule) when ffn_dim is absent.
# Llama 3.2's RoPE scaling (HF config of Llama-3.2-1B and -3B): the same for both presets below
LLAMA32_ROPE_SCALING = {
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


PRESETS: dict[str, dict[str, Any]] = {
    # Tiny: unit tests and smoke runs, trains in seconds.
    "debug": dict(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=512,
        multiple_of=32,
        max_seq_len=256,
        tie_embeddings=False,
        rope_theta=10_000.0,
        norm_eps=1e-5,
    ),
    # The CPU demo: ~5.2M parameters (3.1M non-embedding) with an 8192 vocabulary, minutes on 2 cores.
    "demo": dict(
        dim=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=4,
        vocab_size=8192,
        multiple_of=256,
        max_seq_len=512,
        tie_embeddings=True,
        rope_theta=10_000.0,
        norm_eps=1e-5,
    ),
    # GPT-3 Small width/depth with GQA and a 4·dim MLP: ~128M parameters.
    "125m": dict(
        dim=768,
        n_layers=12,
        n_heads=12,
        n_kv_heads=4,
        vocab_size=32_000,
        ffn_multiplier=1.5,
        multiple_of=256,
        max_seq_len=2048,
        tie_embeddings=True,
        rope_theta=10_000.0,
        norm_eps=1e-5,
    ),
    # Llama-3.2-1B's shape (HF config), trained context 8192 with its Llama-3 RoPE scaling.
    "1b": dict(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128_256,
        ffn_multiplier=1.5,
        multiple_of=256,
        max_seq_len=8192,
        tie_embeddings=True,
        rope_theta=500_000.0,
        norm_eps=1e-5,
        rope_scaling=LLAMA32_ROPE_SCALING,
    ),
    # Llama-3.2-3B's shape (HF config): the largest preset whose bf16/fp8 training state fits one
    # 80 GB GPU under FSDP2 (16 bytes/param ≈ 51 GB), where fp8's GEMMs are large enough to gain
    # (benchmarks/gpu_check.py's fp8 rows).
    "3b": dict(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        vocab_size=128_256,
        ffn_dim=8192,
        max_seq_len=8192,
        tie_embeddings=True,
        rope_theta=500_000.0,
        norm_eps=1e-5,
        rope_scaling=LLAMA32_ROPE_SCALING,
    ),
    "llama2-7b": dict(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=32,
        vocab_size=32_000,
        multiple_of=256,
        max_seq_len=4096,
        tie_embeddings=False,
        rope_theta=10_000.0,
        norm_eps=1e-5,
    ),
    "llama3-8b": dict(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128_256,
        ffn_multiplier=1.3,
        multiple_of=1024,
        max_seq_len=8192,
        tie_embeddings=False,
        rope_theta=500_000.0,
        norm_eps=1e-5,
    ),
}

_RULE_KEYS = ("ffn_multiplier", "multiple_of")


def llama_ffn_dim(dim: int, multiple_of: int = 256, ffn_multiplier: float | None = None) -> int:
    """Meta's MLP width rule (see the module docstring)."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_multiplier is not None:
        hidden = int(ffn_multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


def resolve_model_args(cfg_model: ModelConfig, vocab_size: int | None = None) -> ModelArgs:
    """Preset, then every explicit (non-None) field of the config section on top.

    vocab_size: the explicit `model.vocab_size` wins, else the tokenizer's padded size passed in
    here, else the preset's. ffn_dim: explicit, else the Llama rule from (possibly overridden)
    ffn_multiplier / multiple_of.
    """
    spec: dict[str, Any] = {}
    if cfg_model.preset is not None:
        if cfg_model.preset not in PRESETS:
            raise ConfigError(
                f"unknown model.preset {cfg_model.preset!r}",
                f"use one of {', '.join(PRESETS)} or set it to none",
            )
        spec.update(PRESETS[cfg_model.preset])
    explicit = {k: v for k, v in cfg_model.model_dump().items() if k != "preset" and v is not None}
    if "vocab_size" not in explicit and vocab_size is not None:
        explicit["vocab_size"] = vocab_size
    spec.update(explicit)
    if "ffn_dim" not in spec:
        if "dim" not in spec:
            raise ConfigError(
                "model section has no preset and no dim",
                "set model.preset (e.g. demo) or model.dim and friends",
            )
        spec["ffn_dim"] = llama_ffn_dim(
            spec["dim"], int(spec.get("multiple_of", 256)), spec.get("ffn_multiplier")
        )
    for key in _RULE_KEYS:
        spec.pop(key, None)
    missing = [k for k in ("dim", "n_layers", "n_heads", "vocab_size") if k not in spec]
    if missing:
        raise ConfigError(
            f"model section leaves {', '.join('model.' + m for m in missing)} unset",
            "set them or pick a preset",
        )
    spec.setdefault("n_kv_heads", spec["n_heads"])
    return ModelArgs(**spec)


# ---------------------------------------------------------------------------------------------
# arithmetic


def count_params(args: ModelArgs) -> dict[str, int]:
    """Parameter counts from the shapes alone (no model built): embedding, non-embedding, total."""
    shapes = expected_shapes(args)
    total = sum(math.prod(s) for s in shapes.values())
    embedding = args.vocab_size * args.dim
    return {"embedding": embedding, "non_embedding": total - embedding, "total": total}


def flops_per_token(args: ModelArgs, seq_len: int) -> int:
    """6·N + 12·n_layers·dim·seq_len, N = non-embedding parameters + the lm-head matmul."""
    n = count_params(args)["non_embedding"] + (args.vocab_size * args.dim if args.tie_embeddings else 0)
    return 6 * n + 12 * args.n_layers * args.dim * seq_len


def memory_estimate(args: ModelArgs) -> dict[str, dict[str, int]]:
    """Bytes of weights, gradients and AdamW state (two fp32 moments), activations excluded.

    fp32: weights, grads and moments all fp32 (16 bytes/param). bf16: bf16 weights and grads with
    fp32 moments and an fp32 master copy of the weights (the usual mixed-precision layout,
    16 bytes/param; FSDP2 MixedPrecisionPolicy keeps fp32 sharded params and casts for compute).
    """
    n = count_params(args)["total"]
    fp32 = {"weights": 4 * n, "grads": 4 * n, "adamw_state": 8 * n}
    bf16 = {"weights": 2 * n, "grads": 2 * n, "adamw_state": 8 * n, "master_weights": 4 * n}
    fp32["total"] = sum(fp32.values())
    bf16["total"] = sum(bf16.values())
    return {"fp32": fp32, "bf16": bf16}


def training_memory(
    args: ModelArgs,
    micro_batch: int,
    seq_len: int,
    precision: str = "fp32",
    activation_checkpointing: bool | str = False,
    shards: int = 1,
    grad_sync_per_step: bool = False,
    checkpoint_every: int = 1,
    loss_chunk_tokens: int | None = None,
    reduce_dtype: str = "fp32",
) -> dict[str, int]:
    """Bytes one rank needs to train, estimated from the shapes alone (nothing is allocated).

    state: weights + grads + AdamW (memory_estimate), divided by `shards` under FSDP.
    gathered (FSDP, shards > 1): what FSDP2 holds unsharded on top of the shards — two transformer
    blocks' parameters (the one computing and the one prefetched) and the output head's (kept
    gathered from forward to backward), in the compute dtype, plus the largest unit's
    (largest_fsdp_unit) unsharded gradient twice at its reduce-scatter: the gradient itself, in the
    compute dtype, and FSDP2's copy of it, the reduce-scatter input, in `reduce_dtype`
    (train.reduce_dtype).
    accum_grads (FSDP with `grad_sync_per_step`, train.fsdp_grad_sync="step" and grad_accum > 1):
    the whole model's unsharded fp32 gradients, kept between micro-batches (32 GB at 8B).
    activations: what autograd keeps per token and layer — the two norm inputs and outputs, the
    attention output and its projection input (6·dim), k and v (2·kv_dim), and the MLP's w1, w3,
    SiLU and product outputs (4·ffn_dim) — in the activation dtype (2 bytes under bf16 autocast).
    With activation checkpointing ("full", or true) a checkpointed layer keeps only its input (dim),
    plus one layer's full set while it is recomputed; "selective" keeps its input and its products'
    and attention's outputs (5·dim + 2·kv_dim + 2·ffn_dim: q, k, v, attention, o, gate, up, down),
    plus the rest of one layer while it is recomputed. `checkpoint_every` = N checkpoints every N-th
    layer only (the others keep everything). logits: one fp32 (tokens × vocab) buffer, all the
    fused loss of the CPU kernels keeps (oreline.model.kernels.cross_entropy; the reference loss
    keeps more); with `loss_chunk_tokens` (train.loss = "chunked") one chunk's rows only.
    batch: the loader's int64 rows plus inputs and labels. rope: the cos and sin tables, fp32
    (max_seq_len × head_dim each, rope_bytes), built whatever train.seq_len is. Temporaries, the
    allocator's slack and the framework itself come on top, so this is a floor: a run that exceeds
    it cannot fit.
    """
    tokens = micro_batch * seq_len
    act_bytes = 2 if precision == "bf16" else 4
    kv_dim = args.n_kv_heads * args.head_dim
    per_layer = 6 * args.dim + 2 * kv_dim + 4 * args.ffn_dim  # values kept per token and layer
    mode = checkpointing_mode(activation_checkpointing)
    checkpointed = 0 if mode == "none" else -(-args.n_layers // max(1, checkpoint_every))
    kept = selective_values(args) if mode == "selective" else args.dim
    recomputed = (per_layer - kept + args.dim) if checkpointed else 0  # one layer's, during its backward
    per_token = checkpointed * kept + (args.n_layers - checkpointed) * per_layer + recomputed
    activations = per_token * tokens * act_bytes
    n = count_params(args)["total"]
    block, head = _block_params(args), _head_params(args)
    gathered, accum_grads = 0, 0
    if shards > 1:
        # FSDP2 (torch 2.13, foreach_reduce) copies a unit's unsharded gradients into its
        # reduce-scatter input (torch._chunk_cat, which refuses an output that overlaps its
        # inputs) and frees them only after the copy: the largest unit's gradient exists twice at
        # that moment, once in the compute dtype and once in the reduction's (docs/measurements.md,
        # "the input released by the op": the tied table's gradient and its copy, 2 × 98 MB at 125m).
        reduce_bytes = 2 if reduce_dtype == "bf16" else 4
        gathered = act_bytes * (2 * block + head) + (act_bytes + reduce_bytes) * largest_fsdp_unit(args)
        if grad_sync_per_step:
            accum_grads = 4 * n
    out = {
        "state": memory_estimate(args)[precision]["total"] // max(1, shards),
        "gathered": gathered,
        "accum_grads": accum_grads,
        "activations": activations,
        "logits": min(tokens, loss_chunk_tokens or tokens) * args.vocab_size * 4,
        "batch": 3 * (tokens + micro_batch) * 8,
        "rope": rope_bytes(args),
        "per_layer_values": per_layer,
        "activation_values": per_token,
        "tokens": tokens,
        "act_bytes": act_bytes,
    }
    out["total"] = (
        out["state"]
        + out["gathered"]
        + out["accum_grads"]
        + out["activations"]
        + out["logits"]
        + out["batch"]
        + out["rope"]
    )
    return out


def _block_params(args: ModelArgs) -> int:
    return sum(math.prod(v) for k, v in expected_shapes(args).items() if k.startswith("model.layers.0."))


def _head_params(args: ModelArgs) -> int:
    return args.vocab_size * args.dim + args.dim  # the output projection and the final norm


def largest_fsdp_unit(args: ModelArgs) -> int:
    """Parameters of the largest FSDP2 unit of oreline.train.dist.fsdp_units' layout: a
    transformer block, or the output head with the final norm (with tied embeddings the root unit,
    the table and the final norm; untied, the embedding's own unit is one norm smaller)."""
    return max(_block_params(args), _head_params(args))


def checkpointing_mode(value: bool | str) -> str:
    """ "none", "full" or "selective" from train.activation_checkpointing (a bool before "selective")."""
    if isinstance(value, bool):
        return "full" if value else "none"
    return value


def selective_values(args: ModelArgs) -> int:
    """Values per token a layer keeps under selective activation checkpointing: its input and the
    outputs of its products and attention (q, k, v, attention, o, gate, up, down)."""
    kv_dim = args.n_kv_heads * args.head_dim
    return 5 * args.dim + 2 * kv_dim + 2 * args.ffn_dim


def rope_bytes(args: ModelArgs) -> int:
    """Bytes of the model's RoPE tables: cos and sin, fp32, max_seq_len × head_dim each (a
    model.max_seq_len of 10^12 would be terabytes, whatever the sequences trained on)."""
    return 2 * args.max_seq_len * args.head_dim * 4


def model_memory(args: ModelArgs) -> dict[str, int]:
    """Bytes a built fp32 model holds (eval, scoring): weights plus the RoPE tables."""
    out = {"weights": 4 * count_params(args)["total"], "rope": rope_bytes(args)}
    out["total"] = out["weights"] + out["rope"]
    return out


def check_model_memory(args: ModelArgs, device: torch.device, source: str) -> dict[str, int]:
    """Refuse (ConfigError) to build a model whose weights and RoPE tables alone exceed the memory
    free on `device`, before allocating: model arguments read from a file (a checkpoint's meta.json,
    a reference.json) are the file's word, and a forged max_seq_len or vocab_size would otherwise
    be an allocation of terabytes. `source` names the file the arguments came from."""
    need = model_memory(args)
    have, where = available_memory(device)
    if need["total"] <= have:
        return need
    raise ConfigError(
        f"{source}: the model it describes needs at least {_gib(need['total'])}, more than the "
        f"{_gib(have)} {where}: weights {count_params(args)['total']:,} parameters × 4 bytes = "
        f"{_gib(need['weights'])} (dim={args.dim}, n_layers={args.n_layers}, ffn_dim={args.ffn_dim}, "
        f"vocab_size={args.vocab_size}); RoPE tables 2 × max_seq_len {args.max_seq_len:,} × head_dim "
        f"{args.head_dim} × 4 bytes = {_gib(need['rope'])}",
        "check that file's model_args (a damaged or foreign file), or run on a machine with more memory",
    )


def available_memory(device: torch.device, local_ranks: int = 1) -> tuple[int, str]:
    """(bytes free for one rank, where they were measured): the GPU's free memory, or the host's
    available RAM (psutil) shared by the ranks on this host."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, f"free on {torch.cuda.get_device_name(device)} ({device})"
    import psutil

    avail = psutil.virtual_memory().available
    share = f", shared by {local_ranks} ranks on this host" if local_ranks > 1 else ""
    return avail // max(1, local_ranks), f"available RAM (psutil{share})"


def check_training_memory(
    args: ModelArgs,
    micro_batch: int,
    seq_len: int,
    precision: str,
    activation_checkpointing: bool | str,
    shards: int,
    device: torch.device,
    local_ranks: int | None = None,
    grad_sync_per_step: bool = False,
    checkpoint_every: int = 1,
    loss_chunk_tokens: int | None = None,
    reduce_dtype: str = "fp32",
) -> dict[str, int]:
    """Refuse (ConfigError, with the arithmetic) a run whose memory floor exceeds what is free,
    before anything is allocated: a typo like model.dim=10**6 or train.micro_batch=10**9 would
    otherwise end in an out-of-memory kill, or in swapping, minutes later. local_ranks: processes
    sharing this host's RAM (None: torchrun's LOCAL_WORLD_SIZE, else 1)."""
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    need = training_memory(
        args,
        micro_batch,
        seq_len,
        precision,
        activation_checkpointing,
        shards,
        grad_sync_per_step,
        checkpoint_every=checkpoint_every,
        loss_chunk_tokens=loss_chunk_tokens,
        reduce_dtype=reduce_dtype,
    )
    have, where = available_memory(device, local_ranks)
    if need["total"] <= have:
        return need
    n = count_params(args)["total"]
    per_param = memory_estimate(args)[precision]["total"] // max(1, n)
    sharded = f" / {shards} FSDP shards" if shards > 1 else ""
    layers = (
        f"{need['activation_values']:,} values kept per token over {args.n_layers} layers "
        f"(train.activation_checkpointing={checkpointing_mode(activation_checkpointing)}, every {checkpoint_every})"
        if checkpointing_mode(activation_checkpointing) != "none"
        else f"{args.n_layers} layers × {need['per_layer_values']:,} values"
    )
    rows = need["logits"] // (4 * args.vocab_size)
    raise ConfigError(
        f"training needs at least {_gib(need['total'])} per rank, more than the {_gib(have)} {where}: "
        f"weights, grads and AdamW {n:,} parameters × {per_param} bytes{sharded} = {_gib(need['state'])} "
        f"(model.dim={args.dim}, n_layers={args.n_layers}, ffn_dim={args.ffn_dim}, vocab_size={args.vocab_size}); "
        f"activations {need['tokens']:,} tokens (train.micro_batch={micro_batch} × train.seq_len={seq_len}) × "
        f"{layers} × {need['act_bytes']} bytes = {_gib(need['activations'])}; "
        f"logits {rows:,} tokens × {args.vocab_size:,} vocabulary × 4 bytes = {_gib(need['logits'])}; "
        f"batch {_gib(need['batch'])}; RoPE tables 2 × model.max_seq_len={args.max_seq_len:,} × head_dim "
        f"{args.head_dim} × 4 bytes = {_gib(need['rope'])}"
        + (
            f"; FSDP2's gathered units and the largest unit's gradient with its reduce-scatter copy {_gib(need['gathered'])}"
            if need["gathered"]
            else ""
        )
        + (
            f"; unsharded fp32 gradients kept between micro-batches (train.fsdp_grad_sync=step) "
            f"{n:,} × 4 bytes = {_gib(need['accum_grads'])}"
            if need["accum_grads"]
            else ""
        ),
        ("set train.fsdp_grad_sync=micro_batch, " if need["accum_grads"] else "")
        + "lower model.max_seq_len (it need not exceed train.seq_len), lower train.micro_batch (raise train.grad_accum to keep the global batch), pick a smaller model "
        "(model.preset, model.dim, model.n_layers), set train.activation_checkpointing=selective or full, "
        "or train.loss=chunked",
    )


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}" if suffix else f"{n:.0f}{unit}"
        n /= 1000
    return f"{n:.3g}E{unit}"


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def args_for_spec(spec: str) -> tuple[ModelArgs, str]:
    """A preset name or a TOML config path → (ModelArgs, where they came from)."""
    if spec in PRESETS:
        return resolve_model_args(ModelConfig(preset=spec)), f"preset {spec}"
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        from oreline.config import expand, load_config
        from oreline.runs import RunDir

        cfg = load_config(path)
        # the vocabulary comes from the run's tokenizer when one was trained already
        tok_dir = (
            Path(expand(cfg.train.tokenizer)) if cfg.train.tokenizer else RunDir.for_config(cfg).tokenizer
        )
        vocab, where = None, ""
        if cfg.model.vocab_size is None and (tok_dir / "tokenizer.json").is_file():
            from oreline.tokens.train_bpe import load_tokenizer

            vocab = load_tokenizer(tok_dir).vocab_size
            where = f", vocab from {tok_dir}"
        return resolve_model_args(cfg.model, vocab), f"config {path} (model.preset={cfg.model.preset}{where})"
    raise ConfigError(
        f"{spec!r} is neither a preset nor a config file", f"use one of {', '.join(PRESETS)} or a TOML path"
    )


DEFAULT_INFO_SEQ_LEN = 2048  # `oreline model info PRESET` without --seq-len


def print_model_info(spec: str, seq_len: int | None = None, console=None) -> dict:
    """`oreline model info`: counts, FLOPs, every weight's shape, memory. Returns the figures.

    `seq_len` None: a config's own train.seq_len (the FLOPs its training does per token), a
    preset's DEFAULT_INFO_SEQ_LEN; the line names where the length came from."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    args, source = args_for_spec(spec)
    where = "--seq-len"
    if seq_len is None:
        seq_len, where = DEFAULT_INFO_SEQ_LEN, "the default; --seq-len sets another"
        if spec not in PRESETS:  # a config (args_for_spec refused anything else)
            from oreline.config import load_config

            seq_len, where = load_config(Path(spec)).train.seq_len, "the config's train.seq_len"
    with torch.device("meta"):  # shapes only: a 8B model costs nothing here
        model = Llama(args)
    counts = count_params(args)
    assert counts["total"] == model.num_params(), "analytic count disagrees with the built model"
    flops = flops_per_token(args, seq_len)
    memory = memory_estimate(args)

    console.print(
        f"[bold]{source}[/]: dim {args.dim}, {args.n_layers} layers, {args.n_heads} heads "
        f"({args.n_kv_heads} kv, head_dim {args.head_dim}), ffn {args.ffn_dim}, vocab {args.vocab_size}, "
        f"max_seq_len {args.max_seq_len}, tied={args.tie_embeddings}, rope_theta {args.rope_theta:g}"
        + (f", rope_scaling {args.rope_scaling}" if args.rope_scaling else "")
    )
    console.print(
        f"parameters: embedding {counts['embedding']:,} · non-embedding {counts['non_embedding']:,} · "
        f"total {counts['total']:,} ({_human(counts['total'])})"
    )
    console.print(
        f"FLOPs per token at seq_len {seq_len} ({where}): {flops:,} ({_human(flops, 'FLOP')}; training, "
        "fwd+bwd)"
    )

    table = Table(title="weights", show_lines=False)
    table.add_column("tensor")
    table.add_column("shape", justify="right")
    table.add_column("params", justify="right")
    shapes = expected_shapes(args)
    for name, shape in shapes.items():
        if args.n_layers > 2 and name.startswith("model.layers.") and not name.startswith("model.layers.0."):
            continue  # every block has the same shapes: show block 0 and say so
        table.add_row(name, " × ".join(map(str, shape)), f"{math.prod(shape):,}")
    if args.n_layers > 2:
        table.add_row(f"(model.layers.1 … {args.n_layers - 1}: same as model.layers.0)", "", "")
    console.print(table)

    mem = Table(title="memory (weights + grads + AdamW, activations excluded)")
    mem.add_column("precision")
    for col in ("weights", "grads", "adamw_state", "master_weights", "total"):
        mem.add_column(col, justify="right")
    for prec, parts in memory.items():
        mem.add_row(
            prec,
            *(
                _gib(parts[c]) if c in parts else "-"
                for c in ("weights", "grads", "adamw_state", "master_weights", "total")
            ),
        )
    console.print(mem)
    return {
        "args": args.to_dict(),
        "params": counts,
        "flops_per_token": flops,
        "seq_len": seq_len,
        "memory": memory,
        "shapes": {k: list(v) for k, v in shapes.items()},
    }
