"""A Llama decoder that reads top to bottom: RMSNorm → RoPE → Attention → MLP → Block → Llama.

The architecture is Meta's Llama 2/3 (Touvron et al. 2023, arXiv:2307.09288; Grattafiori et al.
2024, arXiv:2407.21783): pre-norm residual blocks, RMSNorm (Zhang & Sennrich 2019), rotary
position embeddings (Su et al. 2021, arXiv:2104.09864), grouped-query attention (Ainslie et al.
2023, arXiv:2305.13245) and a SwiGLU MLP (Shazeer 2020, arXiv:2002.05202), no biases anywhere.

Parameter names are Hugging Face `LlamaForCausalLM`'s (`model.layers.{i}.self_attn.q_proj.weight`,
...) and RoPE uses HF's rotate-half layout (the two halves of each head are the real and imaginary
parts), so HF export and import are an identity rename table with no q/k permutation (see
`oreline.export.hf`). When `tie_embeddings` is set there is no `lm_head` module at all: the output
projection reuses `model.embed_tokens.weight`, and the state dict has no `lm_head.weight` (as in
HF's own safetensors files of tied models, e.g. Llama-3.2-1B).

Document masking: `forward(input_ids, doc_ids)` makes attention block-diagonal causal, so a token
attends only to earlier tokens of its own document. Positions stay global (0..T-1 across the packed
sequence) on purpose: RoPE makes every attention score a function of the *relative* offset between
query and key only, and within one document the offsets are the same whether positions restart
at the boundary or not, so resetting positions would change nothing but cost a gather.
Two ways compute the same mask (`Kernels.attention`): "sdpa", the reference, builds the dense
(B, 1, T, T) boolean mask for SDPA (O(T²) memory, and SDPA's masked kernels); "flex" builds a
FlexAttention `BlockMask` from the document ids once per forward (shared by every layer) and
calls `flex_attention`, which skips the blocks no query of a tile may see — on CUDA compiled into
one fused kernel; elsewhere eager (unfused, as slow as the dense path: the CPU keeps "sdpa").

Numerics: RMSNorm computes its statistic in fp32 and casts back (as HF does), RoPE tables are fp32,
logits are returned in fp32 whatever the compute dtype.

Kernels: everything here is the plain reference (nn.Linear, autograd through torch ops, one SDPA
call) and nothing is process-wide. The few functions a layer computes with — its projections,
RMSNorm, RoPE, the output logits and loss — are a `Kernels` value passed to the constructor;
oreline.model.kernels.select builds faster ones (fused autograd functions, oneDNN products on
CPU), each tested equal to the reference, with the same parameters and state dict.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oreline.errors import ConfigError
from oreline.model.tied import TiedGradient

IGNORE_INDEX = -100  # labels that count for nothing (padding, masked prompts), as F.cross_entropy

# ---------------------------------------------------------------------------------------------
# configuration


@dataclass
class ModelArgs:
    """Every number that decides the shape and numerics of a Llama. JSON-able via to_dict()."""

    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4
    vocab_size: int = 8192
    ffn_dim: int = 768
    norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    # Llama-3 style: {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    rope_scaling: dict | None = None
    max_seq_len: int = 512
    tie_embeddings: bool = True
    init_std: float = 0.02
    depth_scaled_init: bool = False

    def __post_init__(self) -> None:
        hint = "fix the model section of the config (oreline model info shows the shapes)"
        # Positive first: the divisibility checks below divide by n_heads and n_kv_heads.
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be positive (got {getattr(self, name)})", hint)
        if self.dim % self.n_heads:
            raise ConfigError(
                f"model.dim ({self.dim}) is not divisible by model.n_heads ({self.n_heads})", hint
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_heads ({self.n_heads}) is not a multiple of model.n_kv_heads ({self.n_kv_heads})",
                hint,
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"head_dim = dim / n_heads = {self.head_dim} is odd; RoPE needs an even head_dim", hint
            )
        if self.rope_scaling is not None:
            need = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
            missing = need - set(self.rope_scaling)
            if missing:
                raise ConfigError(
                    f"model.rope_scaling lacks {sorted(missing)}",
                    f"give all of {sorted(need)} or set it to none",
                )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> ModelArgs:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(
                f"model args have unknown keys {sorted(unknown)}", f"valid keys are {sorted(known)}"
            )
        d = dict(d)
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = dict(d["rope_scaling"])
        return cls(**d)


# ---------------------------------------------------------------------------------------------
# RMSNorm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x²) + eps) · weight, the statistic in fp32 (bf16 loses it), as HF."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · weight, with the statistic in fp32 (bf16 loses it)."""

    def __init__(self, dim: int, eps: float, fn: Callable = rms_norm):
        super().__init__()
        self.eps, self.fn = eps, fn
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


# ---------------------------------------------------------------------------------------------
# RoPE


def apply_rope_scaling(inv_freq: torch.Tensor, scaling: Mapping) -> torch.Tensor:
    """Llama-3.1 frequency scaling (Meta's `apply_scaling`, HF `_compute_llama3_parameters`).

    Wavelengths shorter than original_len / high_freq_factor are kept, those longer than
    original_len / low_freq_factor are divided by `factor`, and the band in between is a smooth
    interpolation of the two, so long contexts reuse low frequencies without disturbing local ones.
    """
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(
    args: ModelArgs, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (max_seq_len, head_dim), fp32, in HF's rotate-half layout."""
    hd = args.head_dim
    inv_freq = 1.0 / (
        args.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd)
    )
    if args.rope_scaling is not None:
        inv_freq = apply_rope_scaling(inv_freq, args.rope_scaling)
    pos = torch.arange(args.max_seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)  # (S, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (S, hd): both halves share a frequency
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) → (−x2, x1) over the last dim: the rotation by 90° in HF's layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, T, H, hd) by position; cos/sin are (T, hd). Computed in fp32, cast back."""
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# projections, the output loss, and the Kernels a model computes with


def projection(in_features: int, out_features: int) -> nn.Linear:
    """A bias-free projection (every matrix of a Llama is one)."""
    return nn.Linear(in_features, out_features, bias=False)


def token_cross_entropy(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy (…) in fp32 nats of the logits h·Wᵀ against `labels`, 0 where a
    label is IGNORE_INDEX."""
    logits = F.linear(h, weight).float()
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none", ignore_index=IGNORE_INDEX
    )
    # a copy, not a view (B·T floats against the (B·T, vocab) logits): FSDP2 warns on every run
    # when a unit's forward returns a view, since an in-place op on it would skip its all-gather
    return loss.view(labels.shape).clone()


def separate_projections(x: torch.Tensor, projections: Sequence[nn.Module]) -> list[torch.Tensor]:
    """x through each projection in turn (Attention's q, k and v read the same input)."""
    return [p(x) for p in projections]


@dataclass(frozen=True)
class Kernels:
    """The functions a Llama's layers compute with; the defaults are this module's reference.

    oreline.model.kernels.select builds other sets (fused RMSNorm/RoPE autograd functions, oneDNN
    products, the output projection fused with the loss) and tests/model/kernels holds each equal
    to these. `projection` makes every Linear (it must be an nn.Linear without bias, so the state
    dict is the same whichever set built the model).
    """

    name: str = "reference"
    projection: Callable[[int, int], nn.Linear] = projection
    # several projections of one input (q, k, v): the CPU set makes them one product
    projections: Callable[[torch.Tensor, Sequence[nn.Module]], list[torch.Tensor]] = separate_projections
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm
    rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rope
    logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.linear
    token_loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = token_cross_entropy
    # document masking: "sdpa" (a dense boolean mask) or "flex" (FlexAttention's BlockMask)
    attention: str = "sdpa"


REFERENCE = Kernels()


# ---------------------------------------------------------------------------------------------
# FlexAttention (document masking with a block-sparse mask)


def doc_block_mask(doc_ids: torch.Tensor) -> Any:
    """FlexAttention BlockMask for doc_ids (B, T): query q sees key k iff k ≤ q and both lie in
    one document — the dense path's `same_doc & causal`, kept as (B, 1, ⌈T/128⌉, ⌈T/128⌉) block
    indices, so the kernel never visits a tile that is all masked."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = doc_ids.shape

    def causal_same_doc(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (q >= kv) & (doc_ids[b, q] == doc_ids[b, kv])

    # on CUDA the mask's (B, T, T) evaluation is compiled (torchtitan's practice: eager it
    # materialises every score position); a CPU builds it eagerly
    cuda = doc_ids.device.type == "cuda" and not torch.compiler.is_compiling()
    return create_block_mask(causal_same_doc, B, None, T, T, device=doc_ids.device, _compile=cuda)


@functools.cache
def _compiled_flex() -> Callable:
    """One torch.compile of flex_attention for the process (a pure function: compiling it once
    only spares recompilation; dynamo keys its graphs on shapes and dtypes)."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    return torch.compile(flex, dynamic=False)


def flex_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, gqa: bool
) -> torch.Tensor:
    """flex_attention of (B, heads, T, hd) q/k/v under `block_mask`. On CUDA outside a compiled
    region it goes through one torch.compile of flex_attention (eager flex_attention is an unfused
    O(T²) reference); inside a compiled block dynamo compiles it with the block."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    if torch.compiler.is_compiling():  # inside a compiled block: compiled with it
        return flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    if q.device.type != "cuda":
        with warnings.catch_warnings():  # eager off CUDA: the unfused reference, on purpose
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    return _compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=gqa)


# ---------------------------------------------------------------------------------------------
# attention and MLP


class LayerKV:
    """One layer's keys and values (B, n_kv_heads, S, hd) of the tokens seen so far (generate)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class Attention(nn.Module):
    """Grouped-query causal self-attention through F.scaled_dot_product_attention."""

    def __init__(self, args: ModelArgs, kernels: Kernels = REFERENCE):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.rope, self.project = kernels.rope, kernels.projections
        self.q_proj = kernels.projection(args.dim, args.n_heads * args.head_dim)
        self.k_proj = kernels.projection(args.dim, args.n_kv_heads * args.head_dim)
        self.v_proj = kernels.projection(args.dim, args.n_kv_heads * args.head_dim)
        self.o_proj = kernels.projection(args.n_heads * args.head_dim, args.dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
        kv: LayerKV | None = None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.project(x, (self.q_proj, self.k_proj, self.v_proj))
        q = q.view(B, T, self.n_heads, self.head_dim)  # (B, T, n_heads, hd)
        k = k.view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, n_kv_heads, hd)
        v = v.view(B, T, self.n_kv_heads, self.head_dim)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
        if kv is not None:
            k, v = kv.extend(k, v)  # (B, n_kv_heads, S, hd): the cached tokens, then these T
        gqa = self.n_kv_heads != self.n_heads  # kv head j serves query heads j·rep … (j+1)·rep−1, as HF
        if mask is not None and not isinstance(mask, torch.Tensor):  # a FlexAttention BlockMask
            y = flex_attention(q, k, v, mask, gqa)
        elif mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # (B or 1, 1, T, S) boolean, True where attention is allowed
            if gqa:
                # CUDA's flash kernel (which has GQA) takes no mask, and the memory-efficient one
                # (which takes masks) has no GQA: repeating kv keeps masked attention off the
                # O(T²)-memory math fallback.
                rep = self.n_heads // self.n_kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, dim)
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) · up(x))."""

    def __init__(self, args: ModelArgs, kernels: Kernels = REFERENCE):
        super().__init__()
        self.gate_proj = kernels.projection(args.dim, args.ffn_dim)
        self.up_proj = kernels.projection(args.dim, args.ffn_dim)
        self.down_proj = kernels.projection(args.ffn_dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, args: ModelArgs, kernels: Kernels = REFERENCE):
        super().__init__()
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps, kernels.rms_norm)
        self.self_attn = Attention(args, kernels)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps, kernels.rms_norm)
        self.mlp = MLP(args, kernels)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
        kv: LayerKV | None = None,
    ) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv)
        return h + self.mlp(self.post_attention_layernorm(h))


# ---------------------------------------------------------------------------------------------
# the model


class Decoder(nn.Module):
    """HF's `LlamaModel`: embeddings, the blocks, the final norm (`model.*` parameter names)."""

    def __init__(self, args: ModelArgs, kernels: Kernels = REFERENCE):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, kernels) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, kernels.rms_norm)


class OutputHead(nn.Linear):
    """The untied output projection: a bias-free nn.Linear (state dict `lm_head.weight`) whose call
    applies `fn(h, self.weight, *args)`, the model's logits or fused loss kernel.

    The output is computed through this module's own call, not by reading its weight from outside,
    so module hooks see it: FSDP2 gathers the weight of the final norm + output head unit in the
    pre-forward hooks of the modules that run (oreline.train.dist.wrap_model)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, h: torch.Tensor, fn: Callable = F.linear, *args: torch.Tensor) -> torch.Tensor:
        return fn(h, self.weight, *args)


class Llama(nn.Module):
    """Llama causal LM. forward(input_ids (B, T), doc_ids=None) -> fp32 logits (B, T, vocab).

    `kernels` (default: the reference) are the functions its layers compute with; the parameters
    and the state dict are the same for every choice."""

    def __init__(self, args: ModelArgs, kernels: Kernels = REFERENCE):
        super().__init__()
        self.args = args
        self.kernels = kernels
        # The layers' own default initialisers draw from the global RNG here and are overwritten by
        # init_weights: their draws are undone, so init_weights starts from the caller's RNG state
        # exactly as a meta-device model initialised later with the same seed does.
        with torch.random.fork_rng(devices=[]):
            self.model = Decoder(args, kernels)
            self.lm_head = None if args.tie_embeddings else OutputHead(args.dim, args.vocab_size)
        # tied: called in backward once the final norm's and the output projection's backward have
        # run, after which backward reads neither of them nor the table (model/tied.py); FSDP2's
        # root unit (the table and the final norm) frees its gathered parameters there
        self.after_tied_output_backward: Callable[[], None] | None = None
        cos, sin = rope_tables(args)
        # Not persistent: derived from args, never part of a checkpoint or an HF export.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()
        check_shapes(self, args)

    @property
    def output_weight(self) -> torch.Tensor:
        """(vocab, dim) weight of the output projection (the embedding table when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        cache: list[LayerKV] | None = None,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for every position, or — with `labels` (B, T) — the per-token cross entropy (B, T)
        in fp32 nats (0 where the label is -100; `kernels.token_loss`, which may never materialise
        the logits: oreline.model.kernels.cross_entropy saved ~12% of a CPU training step).
        `cache` (one LayerKV per layer, generate's) continues a sequence: these tokens sit at
        positions len(cache)…, and the cache grows by them."""
        B, T = input_ids.shape
        start = len(cache[0]) if cache else 0
        if start + input_ids.shape[1] > self.args.max_seq_len:
            raise ConfigError(
                f"sequence of {start + T} tokens is longer than model.max_seq_len={self.args.max_seq_len}",
                "shorten train.seq_len or raise model.max_seq_len",
            )
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]  # (T, hd)
        mask = None
        dev = input_ids.device
        if doc_ids is not None and start:
            raise ConfigError("doc_ids cannot be combined with a KV cache", "pass one of them")
        if doc_ids is not None and self.kernels.attention == "flex":
            mask = doc_block_mask(doc_ids)  # once per forward: every layer shares it
        elif doc_ids is not None:  # block-diagonal causal: same document and not in the future
            causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
            same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
            mask = (same_doc & causal)[:, None]  # (B, 1, T, T)
        elif start:  # query i sits at position start + i and sees keys 0 … start + i
            mask = (
                torch.arange(start + T, device=dev)[None, :] <= start + torch.arange(T, device=dev)[:, None]
            )
            mask = mask[None, None]  # (1, 1, T, start + T)
        table = self.model.embed_tokens.weight
        # tied and differentiated: one full-size gradient of the table in backward, not two (model/tied.py)
        tie = (
            TiedGradient(self.after_tied_output_backward)
            if self.lm_head is None and table.requires_grad and torch.is_grad_enabled()
            else None
        )
        h = tie.embedding(input_ids, table) if tie else self.model.embed_tokens(input_ids)  # (B, T, dim)
        for i, block in enumerate(self.model.layers):
            h = block(h, cos, sin, mask, cache[i] if cache else None)
        h = self.model.norm(tie.output_input(h) if tie else h)
        if labels is not None:
            return self._output(h, tie, self.kernels.token_loss, labels)  # (B, T)
        logits = self._output(h, tie, self.kernels.logits)  # (B, T, vocab)
        return logits.float()

    def _output(
        self, h: torch.Tensor, tie: TiedGradient | None, fn: Callable, *args: torch.Tensor
    ) -> torch.Tensor:
        if self.lm_head is None:  # tied: the embedding table, which FSDP keeps in the root unit
            table = self.model.embed_tokens.weight
            return fn(h, tie.head_weight(table) if tie else table, *args)
        return self.lm_head(h, fn, *args)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """normal(0, init_std) for every matrix, ones for norms, recomputed RoPE tables.

        With `depth_scaled_init` the projections that write into the residual stream (o_proj,
        down_proj) get std / sqrt(2·n_layers), GPT-2's rule (Radford et al. 2019) that keeps the
        residual variance from growing with depth: each block adds two such outputs.

        The values are drawn on the CPU from `generator` (default: the global CPU generator), one
        full matrix at a time in module order, whatever device or sharding the parameters have:
        a parameter sharded by FSDP2 (a DTensor) keeps its own rows of the full draw, so a
        meta-device model wrapped with FSDP2, `to_empty()`-ed and initialised with a generator
        seeded with s holds exactly the weights of `torch.manual_seed(s); Llama(args)`, and no
        rank ever holds more than one full matrix (the largest: the embedding table). Parameters
        still on the meta device are skipped (a model built under `torch.device("meta")`).
        Rebuilds the non-persistent RoPE buffers too (they are empty after `to_empty()`).
        """
        a = self.args
        gen = generator if generator is not None else torch.default_generator
        out_std = a.init_std / math.sqrt(2 * a.n_layers) if a.depth_scaled_init else a.init_std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                std = out_std if name.endswith(("o_proj", "down_proj")) else a.init_std
                _normal_from(module.weight, std, gen)
            elif isinstance(module, RMSNorm) and not module.weight.is_meta:
                module.reset_parameters()
        if self.rope_cos.device.type != "meta":
            cos, sin = rope_tables(a, device=self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def num_params(self, exclude_embedding: bool = False) -> int:
        """Parameters (shared tensors once). exclude_embedding drops the input embedding table
        (a lookup, no FLOPs); an untied lm_head is counted either way."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.model.embed_tokens.weight.numel() if exclude_embedding else n


def _normal_from(param: torch.Tensor, std: float, gen: torch.Generator) -> None:
    """Fill `param` with its part of one normal(0, std) draw of its full shape from the CPU `gen`."""
    if param.is_meta:
        return
    if type(param.data) is torch.Tensor and param.device.type == "cpu" and param.dtype == torch.float32:
        param.normal_(mean=0.0, std=std, generator=gen)  # the same numbers as the full draw below
        return
    full = torch.empty(param.shape, dtype=torch.float32).normal_(mean=0.0, std=std, generator=gen)
    if hasattr(param, "to_local"):  # a DTensor shard (FSDP2): this rank's rows of the full draw
        local = param.to_local()
        local.copy_(local_part(full, param.device_mesh, param.placements))
    else:
        param.copy_(full)


def local_part(full: torch.Tensor, mesh: object, placements: Sequence[object]) -> torch.Tensor:
    """This rank's part of `full` under DTensor `placements` on `mesh` (Shard(d): torch.chunk's
    split along d, what DTensor and FSDP2 hold; Replicate: all of it), computed without any
    collective."""
    coord = mesh.get_coordinate()  # type: ignore[attr-defined]
    part = full
    for mesh_dim, placement in enumerate(placements):
        dim = getattr(placement, "dim", None)
        if dim is None:  # Replicate
            continue
        chunks = torch.chunk(part, mesh.size(mesh_dim), dim=dim)  # type: ignore[attr-defined]
        i = coord[mesh_dim]
        part = chunks[i] if i < len(chunks) else part.narrow(dim, 0, 0)
    return part


# ---------------------------------------------------------------------------------------------
# shapes


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """HF-named weight → shape for these args (what a state dict must hold, no more, no less)."""
    hd, d = args.head_dim, args.dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (args.vocab_size, d)}
    for i in range(args.n_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (args.n_heads * hd, d),
            p + "self_attn.k_proj.weight": (args.n_kv_heads * hd, d),
            p + "self_attn.v_proj.weight": (args.n_kv_heads * hd, d),
            p + "self_attn.o_proj.weight": (d, args.n_heads * hd),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (args.ffn_dim, d),
            p + "mlp.up_proj.weight": (args.ffn_dim, d),
            p + "mlp.down_proj.weight": (d, args.ffn_dim),
        }
    shapes["model.norm.weight"] = (d,)
    if not args.tie_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, d)
    return shapes


def check_shapes(
    model_or_state_dict: nn.Module | Mapping[str, torch.Tensor], args: ModelArgs, source: str = "model"
) -> None:
    """Raise ConfigError naming the first missing, unexpected or mis-shaped tensor.

    A tied model's state dict may carry `lm_head.weight` only if it equals the embedding table
    (HF checkpoints of tied models sometimes store it twice); anything else must match
    `expected_shapes(args)` exactly.
    """
    sd = (
        model_or_state_dict.state_dict()
        if isinstance(model_or_state_dict, nn.Module)
        else model_or_state_dict
    )
    want = expected_shapes(args)
    hint = "the weights and the model config disagree: use the config the weights were made with"
    for name, tensor in sd.items():
        shape = tuple(tensor.shape)
        if name == "lm_head.weight" and args.tie_embeddings:
            if shape != want["model.embed_tokens.weight"]:
                raise ConfigError(
                    f"{source}: tensor {name} has shape {shape}, tied embeddings need "
                    f"{want['model.embed_tokens.weight']}",
                    hint,
                )
            emb = sd.get("model.embed_tokens.weight")
            plain = type(tensor) is torch.Tensor and type(emb) is torch.Tensor and not tensor.is_meta
            if plain and tensor.data_ptr() != emb.data_ptr() and not torch.equal(tensor, emb):
                raise ConfigError(
                    f"{source}: tensor {name} differs from model.embed_tokens.weight but "
                    "tie_embeddings=True would drop it",
                    "set model.tie_embeddings=false for these weights",
                )
            continue
        if name not in want:
            raise ConfigError(
                f"{source}: unexpected tensor {name} {shape} for a {args.n_layers}-layer model "
                f"(tie_embeddings={args.tie_embeddings})",
                hint,
            )
        if shape != want[name]:
            raise ConfigError(
                f"{source}: tensor {name} has shape {shape}, the config expects {want[name]}", hint
            )
    missing = [n for n in want if n not in sd]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConfigError(f"{source}: tensor {missing[0]}{more} is missing", hint)


# ---------------------------------------------------------------------------------------------
# generation


@torch.no_grad()
def generate(
    model: Llama,
    input_ids: torch.Tensor | list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> list[int]:
    """Continue a prompt; returns the NEW tokens only (an eos_id, when produced, is the last one).

    temperature 0 is greedy (argmax, token-identical to HF `generate(do_sample=False)`); otherwise
    logits / temperature are sampled, restricted to the top_k most likely tokens when top_k is set,
    with `generator` (CPU or CUDA) for reproducible draws. With `use_cache` each step feeds one
    token against cached keys/values; without, it re-runs the whole context (same tokens, slower).
    Past max_seq_len the context slides: the last max_seq_len tokens are re-run from position 0,
    cache or not, so both paths see exactly the same inputs.
    """
    core = getattr(model, "_orig_mod", model)  # torch.compile wraps the module
    was_training = core.training
    core.eval()
    max_len = core.args.max_seq_len
    device = next(core.parameters()).device
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.shape[0] != 1:
        raise ConfigError(
            f"generate takes one prompt, got a batch of {ids.shape[0]}", "call it once per prompt"
        )
    out: list[int] = []
    cache: list[LayerKV] | None = None
    try:
        for _ in range(max_new_tokens):
            if cache is not None and len(cache[0]) < max_len:
                logits = core(ids[:, -1:], cache=cache)[0, -1]  # (vocab,): only the newest token
            else:  # first step, no cache, or a full window: run the last max_len tokens
                cache = [LayerKV() for _ in core.model.layers] if use_cache else None
                logits = core(ids[:, -max_len:], cache=cache)[0, -1]
            if temperature <= 0.0:
                nxt = int(torch.argmax(logits))
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.numel():
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, dim=-1)
                if generator is not None:  # sample where the generator lives (CPU or CUDA)
                    probs = probs.to(generator.device)
                nxt = int(torch.multinomial(probs, 1, generator=generator))
            out.append(nxt)
            if eos_id is not None and nxt == eos_id:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
    finally:
        core.train(was_training)
    return out
