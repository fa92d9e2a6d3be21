"""GGUF export for llama.cpp, written with `gguf` (the llama.cpp project's own Python writer).

llama.cpp's `convert_hf_to_gguf.py` refuses a newly trained BPE tokenizer: it identifies the
pre-tokenizer by hashing the token ids of a test text and knows only published tokenizers. This
writer declares the pre-tokenizer instead. oreline's byte-level BPE splits text with GPT-2's regex
(`ByteLevel(add_prefix_space=False, use_regex=True)`, train_bpe.py), which is llama.cpp's `gpt-2`
pre-tokenizer, and maps bytes to GPT-2's printable symbols, which is llama.cpp's `gpt2` tokenizer
model; vocabulary and merges are copied as they are. Metaspace (SentencePiece-style) tokenizers
are refused: llama.cpp's SentencePiece model merges by token scores, not by BPE merge rank, so it
would not reproduce oreline's ids.

The training format (oreline.tokens.format) travels as llama.cpp's flags: `add_bos_token` true,
`add_eos_token` false, BOS/EOS/pad ids; specials are CONTROL tokens, which llama.cpp never
matches in text unless asked to parse specials, so a literal "<s>" stays text. The context length
is the trained sequence length (train.seq_len), as in the HF export.

Weights, llama.cpp's `llama` architecture: `model.layers.N.self_attn.q_proj.weight` →
`blk.N.attn_q.weight` and so on (GGUF_NAMES). llama.cpp rotates adjacent pairs (GPT-J style) where
oreline and HF rotate halves, so q and k rows are permuted within each head the way the
converter's `LlamaModel.permute` does (first half and second half interleaved): the same attention
scores, a different row order. Llama-3 RoPE scaling is written as `rope_freqs.weight`, the divisor
of each frequency (oreline's own `apply_rope_scaling`). A tied model stores no `output.weight`
(llama.cpp then uses `token_embd.weight`, as HF does).

Types: float32 (bit-identical), float16, bfloat16, q8_0 (gguf's numpy quantizer, bit-exact with
ggml's reference). Norms and rope factors stay float32 (1-D tensors, as the converter keeps them).

benchmarks/clients.py checks the file with llama-cpp-python: tokenization, greedy continuations
and log-probabilities against oreline's own (results in docs/measurements.md).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oreline.errors import ConfigError, DataIntegrityError, InputError
from oreline.export.hf import checkpoint_context, tokenizer_special_ids, trained_context
from oreline.io import open_nofollow, refuse_planted
from oreline.model.llama import ModelArgs, apply_rope_scaling, check_shapes
from oreline.tokens.format import BOS_TOKEN, EOS_TOKEN, convention

GGUF_TYPES = ("float32", "float16", "bfloat16", "q8_0")
PRE_TOKENIZER = "gpt-2"  # llama.cpp's name for GPT-2's split regex, which oreline's byte_level uses
TOKENIZER_MODEL = "gpt2"  # llama.cpp's byte-level BPE
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _gguf():
    try:
        import gguf
    except ImportError as exc:
        raise ConfigError(
            "GGUF export needs the `gguf` package (llama.cpp's writer)",
            "pip install 'oreline[gguf]' (gguf>=0.19)",
        ) from exc
    return gguf


def gguf_name(name: str) -> str:
    """oreline/HF tensor name → llama.cpp tensor name."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    parts = name.split(".", 3)  # model, layers, N, rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_NAMES:
        return f"blk.{parts[2]}.{LAYER_NAMES[parts[3]]}"
    raise ConfigError(f"no GGUF name for tensor {name}", "export a Llama checkpoint written by oreline")


def permute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of q/k from rotate-half order (HF, oreline) to llama.cpp's adjacent-pair order, per head."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `permute_rotary` (used to read a GGUF back)."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_freq_factors(args: ModelArgs) -> torch.Tensor | None:
    """llama.cpp's rope_freqs (each frequency is divided by its factor) for Llama-3 scaling; None without."""
    if not args.rope_scaling:
        return None
    hd = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).double() / hd))
    return (inv_freq / apply_rope_scaling(inv_freq, args.rope_scaling)).float()


def gguf_tokenizer(tokenizer_dir: Path, n_vocab: int) -> dict[str, Any]:
    """Token strings, types and merges of an oreline byte-level tokenizer, padded to the embedding rows."""
    gguf = _gguf()
    path = Path(tokenizer_dir) / "tokenizer.json"
    obj = json.loads(path.read_text(encoding="utf-8"))
    model, pre = obj.get("model") or {}, obj.get("pre_tokenizer") or {}
    if (
        model.get("type") != "BPE"
        or pre.get("type") != "ByteLevel"
        or pre.get("add_prefix_space")
        or not pre.get("use_regex", True)
        or obj.get("normalizer")
        or model.get("continuing_subword_prefix")
    ):
        raise ConfigError(
            f"{path} is not a plain byte-level BPE (pre-tokenizer {pre.get('type')}, model "
            f"{model.get('type')}); llama.cpp would not tokenize it as oreline does",
            "train the tokenizer with tokenizer.pre_tokenizer = 'byte_level' for a GGUF export, "
            "or use the Hugging Face export",
        )
    vocab: dict[str, int] = model["vocab"]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))) or len(by_id) > n_vocab:
        raise DataIntegrityError(
            f"{path}: vocabulary ids are not 0..{len(by_id) - 1} within {n_vocab} embedding rows",
            "retrain the tokenizer with `oreline tokenizer train`",
        )
    specials = {t["content"] for t in obj.get("added_tokens", []) if t.get("special")}
    tokens = [tok for tok, _ in by_id] + [f"[PAD{i}]" for i in range(len(by_id), n_vocab)]
    types = [gguf.TokenType.CONTROL if tok in specials else gguf.TokenType.NORMAL for tok, _ in by_id]
    types += [gguf.TokenType.UNUSED] * (n_vocab - len(by_id))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"tokens": tokens, "types": types, "merges": merges}


def export_state_dict_gguf(
    state_dict: dict[str, torch.Tensor],
    args: ModelArgs,
    tokenizer_dir: Path | None,
    out_file: Path,
    dtype: str = "float32",
    context_len: int | None = None,
    name: str = "oreline",
    provenance: dict | None = None,
) -> dict[str, Any]:
    """Write one GGUF file (atomically: a temporary sibling renamed into place). Returns a summary."""
    gguf = _gguf()
    if dtype not in GGUF_TYPES:
        raise ConfigError(f"unknown GGUF type {dtype!r}", f"use one of {', '.join(GGUF_TYPES)}")
    out_file = Path(out_file)
    if out_file.suffix != ".gguf":
        raise InputError(
            f"--out {out_file} does not end in .gguf", "name the output file, e.g. --out model.gguf"
        )
    if out_file.is_dir():
        raise InputError(f"{out_file} is a folder", "name a file for the GGUF export")
    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        raise InputError(
            f"no tokenizer.json for the GGUF export (tokenizer folder {tokenizer_dir})",
            "restore the run's tokenizer folder: llama.cpp needs the vocabulary inside the GGUF",
        )
    sd = dict(state_dict)
    if args.tie_embeddings:
        sd.pop("lm_head.weight", None)
    check_shapes(state_dict, args, source="GGUF export")
    for key, t in sd.items():
        if not torch.isfinite(t).all():
            raise DataIntegrityError(
                f"GGUF export: tensor {key} holds NaN or inf values",
                "export an earlier checkpoint (oreline checkpoint ls RUN_DIR)",
            )
    context = trained_context(args, context_len)
    special = tokenizer_special_ids(tokenizer_dir)
    vocab = gguf_tokenizer(Path(tokenizer_dir), args.vocab_size)
    qtype = {
        "float32": gguf.GGMLQuantizationType.F32,
        "float16": gguf.GGMLQuantizationType.F16,
        "bfloat16": gguf.GGMLQuantizationType.BF16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
    }[dtype]
    ftype = {
        "float32": gguf.LlamaFileType.ALL_F32,
        "float16": gguf.LlamaFileType.MOSTLY_F16,
        "bfloat16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[dtype]

    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(f".tmp-{out_file.name}-{os.getpid()}")
    refuse_planted(out_file)
    open_nofollow(tmp).close()  # a file of ours at the temporary name (never a link) that the writer fills
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(name)
    writer.add_file_type(int(ftype))
    writer.add_context_length(context)
    writer.add_embedding_length(args.dim)
    writer.add_block_count(args.n_layers)
    writer.add_feed_forward_length(args.ffn_dim)
    writer.add_head_count(args.n_heads)
    writer.add_head_count_kv(args.n_kv_heads)
    writer.add_rope_dimension_count(args.head_dim)
    writer.add_rope_freq_base(float(args.rope_theta))
    writer.add_layer_norm_rms_eps(float(args.norm_eps))
    writer.add_vocab_size(args.vocab_size)
    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(special["bos"])
    writer.add_eos_token_id(special["eos"])
    writer.add_pad_token_id(special["pad"])
    writer.add_add_bos_token(True)  # the training format: [BOS] text
    writer.add_add_eos_token(False)
    writer.add_string("oreline.training_format", json.dumps(convention(special["bos"], special["eos"])))
    if provenance:
        writer.add_string("oreline.provenance", json.dumps(provenance, default=str))

    written = {}
    for key, t in sd.items():
        w = t.detach().to("cpu", torch.float32)
        if key.endswith("q_proj.weight"):
            w = permute_rotary(w, args.n_heads)
        elif key.endswith("k_proj.weight"):
            w = permute_rotary(w, args.n_kv_heads)
        data = w.contiguous().numpy()
        if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(key), data.astype(np.float32, copy=False))
            written[gguf_name(key)] = "F32"
        elif qtype == gguf.GGMLQuantizationType.Q8_0 and data.shape[-1] % 32:
            # q8_0 blocks are 32 values along a row; the converter falls back to f16 the same way
            writer.add_tensor(gguf_name(key), data.astype(np.float16))
            written[gguf_name(key)] = "F16"
        else:
            writer.add_tensor(gguf_name(key), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            written[gguf_name(key)] = qtype.name
    factors = rope_freq_factors(args)
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors.numpy())
        written["rope_freqs.weight"] = "F32"
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, out_file)
    return {
        "out_file": str(out_file),
        "bytes": out_file.stat().st_size,
        "tensors": written,
        "context_len": context,
        "dtype": dtype,
        "pre_tokenizer": PRE_TOKENIZER,
        "vocab": len(vocab["tokens"]),
    }


def export_gguf(checkpoint: Path, out_file: Path, dtype: str = "float32", console=None) -> dict[str, Any]:
    """`oreline export CHECKPOINT --format gguf --out FILE.gguf`."""
    from oreline.export.hf import _resolve_tokenizer_dir
    from oreline.train.checkpoint.load import load_model_state, resolve_checkpoint

    checkpoint = resolve_checkpoint(Path(checkpoint))
    state_dict, args, meta = load_model_state(checkpoint)
    tokenizer_dir = _resolve_tokenizer_dir(meta.get("tokenizer_dir"), checkpoint)
    provenance = {
        "source_checkpoint": str(checkpoint),
        "step": meta.get("step"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{
            k: meta[k]
            for k in ("config_fingerprint", "tokenizer_fingerprint", "data_fingerprint")
            if k in meta
        },
    }
    summary = export_state_dict_gguf(
        state_dict, args, tokenizer_dir, out_file, dtype, checkpoint_context(meta), provenance=provenance
    )
    if console is not None:
        console.print(
            f"exported {checkpoint} (step {meta.get('step')}) → {out_file}: {len(summary['tensors'])} tensors "
            f"({dtype}), {summary['bytes'] / 2**20:.1f} MiB, context {summary['context_len']}, "
            f"pre-tokenizer {PRE_TOKENIZER}, adds {BOS_TOKEN} (not {EOS_TOKEN})"
        )
        console.print(
            f"load it with llama_cpp.Llama(model_path={str(out_file)!r}) or llama-cli -m {out_file}"
        )
    return summary


# Bounds of read_gguf_metadata. gguf's GGUFReader parses every metadata array item by item in
# Python: a 60M-item array took minutes and 3.8 GB. Real files hold a vocabulary of at most a few
# hundred thousand strings and a few dozen keys.
GGUF_MAX_KEYS = 1 << 16
GGUF_MAX_STRING_BYTES = 1 << 20  # one key or string value
GGUF_MAX_ARRAY_ITEMS = 1 << 22  # items of one string array (fixed-size items are skipped unread)
_GGUF_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


def read_gguf_metadata(path: Path, wanted=lambda key: True) -> dict[str, Any]:
    """The metadata of a GGUF file whose key passes `wanted`, read in bounded memory and time.

    Opens only a regular file (oreline.io.open_regular: a FIFO would block); scalars and strings
    are read; arrays of fixed-size items are skipped by seeking and returned only as their length
    when wanted (("array", n)); string arrays are walked, refused past GGUF_MAX_ARRAY_ITEMS.
    DataIntegrityError names what is out of bounds or truncated."""
    import struct

    from oreline.io import open_regular

    def bad(what: str) -> DataIntegrityError:
        return DataIntegrityError(f"{path}: {what}", "re-export the file (oreline export --format gguf)")

    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size

        def read(n: int) -> bytes:
            if fh.tell() + n > size:
                raise bad(f"truncated (needs {n:,} bytes at offset {fh.tell():,} of {size:,})")
            return fh.read(n)

        def unpack(fmt: str) -> Any:
            return struct.unpack(fmt, read(struct.calcsize(fmt)))[0]

        def string() -> str:
            n = unpack("<Q")
            if n > GGUF_MAX_STRING_BYTES:
                raise bad(f"a string of {n:,} bytes (more than {GGUF_MAX_STRING_BYTES:,})")
            return read(n).decode("utf-8", "replace")

        def skip(n: int) -> None:
            if fh.tell() + n > size:
                raise bad(f"truncated (an array of {n:,} bytes at offset {fh.tell():,} of {size:,})")
            fh.seek(n, 1)

        def value(kind: int, keep: bool) -> Any:
            if kind in _GGUF_SCALARS:
                return unpack(_GGUF_SCALARS[kind])
            if kind == 8:
                return string()
            if kind != 9:
                raise bad(f"unknown metadata value type {kind}")
            item, count = unpack("<I"), unpack("<Q")
            if item in _GGUF_SCALARS:
                skip(count * struct.calcsize(_GGUF_SCALARS[item]))
                return ("array", count)
            if count > GGUF_MAX_ARRAY_ITEMS:
                raise bad(f"a metadata array of {count:,} items (more than {GGUF_MAX_ARRAY_ITEMS:,})")
            if item == 8:
                items = [string() for _ in range(count)]
                return items if keep else ("array", count)
            raise bad(f"a metadata array of type {item} (nested arrays are not read)")

        if read(4) != b"GGUF":
            raise bad("not a GGUF file (no GGUF magic)")
        version = unpack("<I")
        if version not in (2, 3):
            raise bad(f"GGUF version {version} (this reader knows 2 and 3)")
        _tensors, n_keys = unpack("<Q"), unpack("<Q")
        if n_keys > GGUF_MAX_KEYS:
            raise bad(f"{n_keys:,} metadata keys (more than {GGUF_MAX_KEYS:,})")
        meta: dict[str, Any] = {}
        for _ in range(n_keys):
            key = string()
            keep = wanted(key)
            got = value(unpack("<I"), keep)
            if keep:
                meta[key] = got
        return meta


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metadata, tensors) of a GGUF file via gguf's reader: metadata as Python values, tensors as
    numpy arrays in oreline's row-major shapes (quantized ones dequantized to float32). The
    metadata is walked by read_gguf_metadata first, so a hostile file fails fast, not in gguf's
    item-by-item parse."""
    gguf = _gguf()
    read_gguf_metadata(path, lambda key: False)
    reader = gguf.GGUFReader(str(path))
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = field.contents()
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            arr = np.asarray(t.data).reshape(shape)
        else:
            arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
        tensors[t.name] = arr
    return meta, tensors
