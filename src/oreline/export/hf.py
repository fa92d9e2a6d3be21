"""Hugging Face Llama export and import: safetensors + config.json + tokenizer, no custom code.

oreline's Llama already uses `LlamaForCausalLM`'s parameter names and HF's rotate-half RoPE, so
the weight mapping is the identity (`HF_RENAME`, kept as an explicit table so a future rename is
one line, torchtitan-style). No q/k permutation is needed: that permutation exists only for
Meta's original checkpoints, whose RoPE rotates interleaved pairs instead of halves.

Export (`export_state_dict_hf`) writes, into a temporary sibling folder renamed into place:
  model.safetensors                  or model-0000i-of-0000n.safetensors + model.safetensors.index.json
                                     when the weights exceed max_shard_bytes (HF's sharded layout:
                                     {"metadata": {"total_size": …}, "weight_map": {name: file}})
  config.json                        LlamaForCausalLM; RoPE as `rope_theta` + `rope_scaling`
                                     (rope_type llama3), the keys transformers 4.x reads and 5.x
                                     standardises into `rope_parameters`; max_position_embeddings =
                                     the trained context (train.seq_len of the run, else max_seq_len)
  generation_config.json             bos / eos / pad ids
  tokenizer.json, tokenizer_config.json, special_tokens_map.json   the training tokenizer in its
                                     inference form (oreline.tokens.format): `tokenizer(text)` is
                                     `[BOS] text` as in training, no EOS, no token_type_ids,
                                     model_max_length = the trained context, left padding
  oreline_export.json                provenance: source checkpoint, step, fingerprints, file hashes,
                                     the training format (where BOS/EOS go) and the context
Tied models store no `lm_head.weight` (HF ties it on load from `tie_word_embeddings`).

Import (`import_hf`) reads config.json and the safetensors (sharded or not; `pytorch_model.bin` is
refused because loading it means unpickling), checks every shape against the config, and writes an
oreline model-only snapshot (`model.safetensors` + `meta.json` {"kind": "model_only", "model_args",
"tokenizer_dir"} + `checksums.json`, the layout of `oreline.train.checkpoint`) that
`load_model_state`, eval and export read. Weights are converted to fp32 (oreline trains in fp32).
Architectures the Llama here cannot represent (biases, another activation, another RoPE type, a
head_dim that is not hidden/heads) are refused with the offending key rather than loaded wrongly.
Reading an HF folder (config.json → ModelArgs, the safetensors) is `oreline.model.hf_format`, which
`train.init_from` shares. The import records its tokenizer's fingerprint, so a run started from it
(`train.init_from = OUT`) checks that its tokens were made with that tokenizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from oreline.errors import ConfigError, DataIntegrityError, DiskFull, InputError, disk_full_cause, free_space
from oreline.io import open_regular, write_atomic
from oreline.model.hf_format import (  # noqa: F401  (read_hf_weights, args_from_hf_config: this module's API too)
    args_from_hf_config,
    hf_rename,
    model_file,
    read_hf_weights,
    read_json,
)
from oreline.model.llama import ModelArgs, check_shapes
from oreline.tokens.format import (
    convention,
    inference_tokenizer_config,
    inference_tokenizer_json,
    training_tokenizer_json,
)
from oreline.tokens.train_bpe import canonical_fingerprint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_SPECIAL_IDS = {"pad": 0, "bos": 1, "eos": 2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------------
# export


def hf_config(args: ModelArgs, special_ids: dict[str, int], dtype: str = "float32") -> dict[str, Any]:
    """config.json of a LlamaForCausalLM with these shapes."""
    rope_scaling = None
    if args.rope_scaling:
        rope_scaling = {"rope_type": "llama3", **{k: float(v) for k, v in args.rope_scaling.items()}}
        rope_scaling["original_max_position_embeddings"] = int(
            args.rope_scaling["original_max_position_embeddings"]
        )
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_dim,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "num_hidden_layers": args.n_layers,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": args.max_seq_len,
        "vocab_size": args.vocab_size,
        "tie_word_embeddings": args.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": args.init_std,
        "bos_token_id": special_ids["bos"],
        "eos_token_id": special_ids["eos"],
        "pad_token_id": special_ids["pad"],
        "use_cache": True,
        "torch_dtype": dtype,
    }


def tokenizer_special_ids(tokenizer_dir: Path | None) -> dict[str, int]:
    """Ids of <pad>, <s>, </s> from tokenizer.json's added tokens (oreline's fixed 0/1/2 by default)."""
    ids = dict(DEFAULT_SPECIAL_IDS)
    if tokenizer_dir is None or not model_file(Path(tokenizer_dir) / "tokenizer.json"):
        return ids
    from oreline.tokens.train_bpe import read_tokenizer_json

    # read_tokenizer_json: an empty, binary or cut-short file is an InputError naming it, not a traceback
    added = json.loads(read_tokenizer_json(Path(tokenizer_dir) / "tokenizer.json")).get("added_tokens", [])
    by_content = {t["content"]: t["id"] for t in added}
    for key, token in (("pad", "<pad>"), ("bos", "<s>"), ("eos", "</s>")):
        if token in by_content:
            ids[key] = by_content[token]
    return ids


def trained_context(args: ModelArgs, context_len: int | None) -> int:
    """The context clients are told: the trained sequence length (never above the model's max_seq_len)."""
    if context_len is None:
        return args.max_seq_len
    if not 0 < context_len <= args.max_seq_len:
        raise ConfigError(
            f"context length {context_len} is outside 1..max_seq_len={args.max_seq_len}",
            "pass the train.seq_len the model was trained with",
        )
    return int(context_len)


def checkpoint_context(meta: dict) -> int | None:
    """train.seq_len of the run that wrote a checkpoint (None for imports and bare snapshots)."""
    seq_len = ((meta.get("config") or {}).get("train") or {}).get("seq_len")
    return int(seq_len) if isinstance(seq_len, int) and seq_len > 0 else None


def _copy(src: Path, dst: Path) -> None:
    """A small tokenizer file (checked to be a regular file) copied through the no-follow writer."""
    with open_regular(src) as fh:
        write_atomic(dst, fh.read())


def write_inference_tokenizer(
    tokenizer_dir: Path, out: Path, special: dict[str, int], context: int
) -> list[str]:
    """The training tokenizer, made to encode as the model was trained (oreline.tokens.format): BOS
    prepended by a post-processor, EOS not appended, the trained context, left padding."""
    text = (tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8")
    write_atomic(out / "tokenizer.json", inference_tokenizer_json(text, special["bos"]))
    cfg_path = tokenizer_dir / "tokenizer_config.json"
    cfg = (
        json.loads(cfg_path.read_text(encoding="utf-8"))
        if model_file(cfg_path)
        else {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "clean_up_tokenization_spaces": False,
        }
    )
    cfg = inference_tokenizer_config(cfg, context)
    write_atomic(out / "tokenizer_config.json", json.dumps(cfg, indent=2, ensure_ascii=False))
    written = ["tokenizer.json", "tokenizer_config.json"]
    if model_file(tokenizer_dir / "special_tokens_map.json"):
        _copy(tokenizer_dir / "special_tokens_map.json", out / "special_tokens_map.json")
        written.append("special_tokens_map.json")
    return written


def _shard(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Greedy, in order: a shard closes when the next tensor would pass the limit (a tensor larger
    than the limit gets a shard of its own, as in HF's `split_torch_state_dict_into_shards`)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


@contextlib.contextmanager
def _removed_on_failure(out_dir: Path, command: str) -> Iterator[None]:
    """Whatever stops an export or import removes the folder it was being written in
    (`_temp_sibling`; a full disk left `.tmp-DIR-<pid>/` behind for good), and a full disk is one
    DiskFull naming the folder and the fix instead of a traceback."""
    try:
        yield
    except BaseException as exc:
        shutil.rmtree(_temp_path(out_dir), ignore_errors=True)
        full = disk_full_cause(exc)
        if full is None:
            raise
        free = free_space(out_dir.parent)
        what = Path(full.filename).name if full.filename else "the output"
        raise DiskFull(
            f"no space left on the device of {out_dir} while writing {what} ({free}); the partial "
            f"output was removed and {out_dir} is as it was",
            f"free space there or pass another --out, then run the same `{command}` command again",
        ) from None


def _temp_path(out_dir: Path) -> Path:
    """Where a command writes `out_dir` before it replaces it (one per process)."""
    return out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"


def _temp_sibling(out_dir: Path) -> Path:
    tmp = _temp_path(out_dir)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


# The names each kind writes (relative to its folder): what replacing an earlier output may delete,
# never a list read from the folder (a planted marker or oreline_export.json could name anything).
EXPORT_NAMES = re.compile(
    r"model\.safetensors|model-\d{5}-of-\d{5}\.safetensors|model\.safetensors\.index\.json|config\.json|"
    r"generation_config\.json|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|oreline_export\.json"
)
IMPORT_NAMES = re.compile(
    r"model\.safetensors|meta\.json|checksums\.json|tokenizer(/(tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json))?"
)


def _legacy_export(folder: Path) -> bool:
    """An export written before `.oreline-owner` existed: its oreline_export.json says so."""
    try:
        return (
            json.loads((folder / "oreline_export.json").read_text(encoding="utf-8")).get("format")
            == "hf-llama"
        )
    except (OSError, ValueError, AttributeError):
        return False


def _legacy_import(folder: Path) -> bool:
    """An import written before `.oreline-owner` existed: its meta.json says so."""
    try:
        return json.loads((folder / "meta.json").read_text(encoding="utf-8")).get("source") == "import-hf"
    except (OSError, ValueError, AttributeError):
        return False


def _publish(tmp: Path, out_dir: Path, kind: str, command: str) -> None:
    """Replace out_dir by tmp, only if out_dir is empty or an earlier output of the same kind that
    holds nothing but names that kind writes (`oreline.outdir.publish_folder`)."""
    from oreline.outdir import publish_folder

    if kind == "export-hf":
        publish_folder(tmp, out_dir, kind, command, EXPORT_NAMES, legacy=_legacy_export)
    else:
        publish_folder(tmp, out_dir, kind, command, IMPORT_NAMES, legacy=_legacy_import)


def _file_hashes(folder: Path) -> dict[str, dict[str, Any]]:
    import xxhash

    out = {}
    for p in sorted(folder.iterdir()):
        if p.is_file():
            h = xxhash.xxh3_128()
            with open(p, "rb") as fh:
                while chunk := fh.read(8 << 20):
                    h.update(chunk)
            out[p.name] = {"bytes": p.stat().st_size, "xxh3_128": h.hexdigest()}
    return out


def export_state_dict_hf(
    state_dict: dict[str, torch.Tensor],
    args: ModelArgs,
    tokenizer_dir: Path | None,
    out_dir: Path,
    max_shard_bytes: int = 2_000_000_000,
    dtype: str = "float32",
    provenance: dict | None = None,
    context_len: int | None = None,
) -> dict[str, Any]:
    """Write an HF Llama folder from an oreline state dict. Returns a summary (files, bytes, shards).

    `context_len`: the sequence length the model was trained on (max_position_embeddings and the
    tokenizer's model_max_length); None: the model's max_seq_len.
    """
    with _removed_on_failure(Path(out_dir), "oreline export"):
        return _write_hf(
            state_dict, args, tokenizer_dir, out_dir, max_shard_bytes, dtype, provenance, context_len
        )


def _write_hf(
    state_dict: dict[str, torch.Tensor],
    args: ModelArgs,
    tokenizer_dir: Path | None,
    out_dir: Path,
    max_shard_bytes: int,
    dtype: str,
    provenance: dict | None,
    context_len: int | None,
) -> dict[str, Any]:
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise ConfigError(f"unknown export dtype {dtype!r}", f"use one of {', '.join(DTYPES)}")
    out_dir = Path(out_dir)
    sd = dict(state_dict)
    if args.tie_embeddings:
        sd.pop("lm_head.weight", None)  # checked equal to the embeddings by check_shapes below
    check_shapes(state_dict, args, source="export")
    for name, t in sd.items():  # a diverged checkpoint must not become a published model
        if not torch.isfinite(t).all():
            raise DataIntegrityError(
                f"export: tensor {name} holds NaN or inf values",
                "export an earlier checkpoint (oreline checkpoint ls RUN_DIR)",
            )
    rename = hf_rename(args)
    # contiguous, unshared copies: safetensors refuses tensors that share storage
    tensors = {rename[k]: sd[k].detach().to("cpu", DTYPES[dtype], copy=True).contiguous() for k in rename}
    special = tokenizer_special_ids(tokenizer_dir)
    context = trained_context(args, context_len)

    tmp = _temp_sibling(out_dir)
    shards = _shard(tensors, max_shard_bytes)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(tmp / "model.safetensors"), metadata=meta)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / name), metadata=meta)
            weight_map |= {k: name for k in shard}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        write_atomic(tmp / "model.safetensors.index.json", json.dumps(index, indent=2))
    config = hf_config(args, special, dtype) | {"max_position_embeddings": context}
    write_atomic(tmp / "config.json", json.dumps(config, indent=2))
    gen = {"bos_token_id": special["bos"], "eos_token_id": special["eos"], "pad_token_id": special["pad"]}
    write_atomic(tmp / "generation_config.json", json.dumps(gen, indent=2))

    copied = []
    if tokenizer_dir is not None:
        tokenizer_dir = Path(tokenizer_dir)
        if not model_file(tokenizer_dir / "tokenizer.json"):
            shutil.rmtree(tmp)
            raise InputError(
                f"tokenizer folder {tokenizer_dir} has no tokenizer.json",
                "pass the folder written by `oreline tokenizer train`",
            )
        copied = write_inference_tokenizer(tokenizer_dir, tmp, special, context)
    files = _file_hashes(tmp)
    record = {
        "format": "hf-llama",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model_args": args.to_dict(),
        "dtype": dtype,
        "tokenizer_dir": str(tokenizer_dir) if tokenizer_dir else None,
        "special_token_ids": special,
        "context_len": context,
        "training_format": convention(special["bos"], special["eos"]),
        "files": files,
        **(provenance or {}),
    }
    write_atomic(tmp / "oreline_export.json", json.dumps(record, indent=2))
    _publish(tmp, out_dir, "export-hf", "oreline export")
    return {
        "out_dir": str(out_dir),
        "shards": len(shards),
        "weight_bytes": total,
        "tensors": len(tensors),
        "tokenizer_files": copied,
        "files": sorted(files),
        "context_len": context,
    }


def _resolve_tokenizer_dir(value: str | None, checkpoint: Path) -> Path | None:
    """meta.json's tokenizer_dir: as written, else relative to the run directory of the checkpoint."""
    if not value:
        return None
    for cand in (Path(value), checkpoint.parent.parent / value, checkpoint / value):
        if (cand / "tokenizer.json").is_file():
            return cand
    return None


def export_hf(
    checkpoint: Path, out_dir: Path, console=None, max_shard_bytes: int | None = None, dtype: str = "float32"
) -> dict[str, Any]:
    """`oreline export CHECKPOINT --out DIR`: a checkpoint (full, model-only, or a run's latest) → HF folder."""
    from oreline.train.checkpoint.load import load_model_state, resolve_checkpoint

    checkpoint = resolve_checkpoint(Path(checkpoint))
    state_dict, args, meta = load_model_state(checkpoint)
    tokenizer_dir = _resolve_tokenizer_dir(meta.get("tokenizer_dir"), checkpoint)
    if max_shard_bytes is None:
        max_shard_bytes = int(
            ((meta.get("config") or {}).get("export") or {}).get("max_shard_bytes", 2_000_000_000)
        )
    provenance = {
        "source_checkpoint": str(checkpoint),
        "step": meta.get("step"),
        **{
            k: meta[k]
            for k in ("config_fingerprint", "tokenizer_fingerprint", "data_fingerprint")
            if k in meta
        },
    }
    summary = export_state_dict_hf(
        state_dict,
        args,
        tokenizer_dir,
        out_dir,
        max_shard_bytes,
        dtype,
        provenance,
        context_len=checkpoint_context(meta),
    )
    if console is not None:
        console.print(
            f"exported {checkpoint} (step {meta.get('step')}) → {out_dir}: {summary['tensors']} tensors, "
            f"{summary['weight_bytes'] / 2**20:.1f} MiB in {summary['shards']} shard(s)"
        )
        if tokenizer_dir is None:
            console.print(
                f"[yellow]no tokenizer found (meta tokenizer_dir={meta.get('tokenizer_dir')!r}): "
                "the export holds weights and config only; copy tokenizer.json next to them[/]"
            )
        else:
            console.print(
                f"tokenizer: {', '.join(summary['tokenizer_files'])} from {tokenizer_dir}; it encodes "
                f"<s> text (no </s>) as training did, context {summary['context_len']}"
            )
        console.print(f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(out_dir)!r})")
    return summary


# ---------------------------------------------------------------------------------------------
# import


def _source_step(hf_dir: Path) -> tuple[int | None, str | None]:
    """The training step of an HF folder's weights and the file that says it: an oreline export's
    `oreline_export.json`, a transformers Trainer checkpoint's `trainer_state.json`; (None, None)
    when neither does (an import is not a model of step 0: that is a fresh initialisation)."""
    for name, key in (("oreline_export.json", "step"), ("trainer_state.json", "global_step")):
        if not model_file(hf_dir / name):
            continue
        try:
            value = read_json(hf_dir / name).get(key)
        except (InputError, AttributeError):  # not JSON, or not an object: no step from it
            continue
        if type(value) is int and value >= 0:
            return value, name
    return None, None


def import_hf(hf_dir: Path, out: Path, console=None) -> dict[str, torch.Tensor]:
    """`oreline import-hf DIR --out OUT`: HF Llama folder → oreline model-only snapshot. Returns the weights."""
    with _removed_on_failure(Path(out), "oreline import-hf"):
        return _import_hf(hf_dir, out, console)


def _import_hf(hf_dir: Path, out: Path, console=None) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    from oreline.train.checkpoint.format import FORMAT_VERSION, write_checksums

    hf_dir, out = Path(hf_dir), Path(out)
    if not model_file(hf_dir / "config.json"):
        raise InputError(f"{hf_dir} has no config.json", "pass a Hugging Face model folder")
    config = read_json(hf_dir / "config.json")
    try:
        args = args_from_hf_config(config)
    except (KeyError, TypeError, ValueError) as exc:  # a field missing, or of the wrong type
        raise InputError(
            f"{hf_dir / 'config.json'} is not a usable Llama config ({type(exc).__name__}: {exc})",
            "pass a folder written by save_pretrained or oreline export",
        ) from None
    raw = read_hf_weights(hf_dir)
    # Old HF checkpoints carry the RoPE inverse frequencies as buffers; they are derived, not weights.
    raw = {k: v for k, v in raw.items() if not k.endswith("rotary_emb.inv_freq")}
    inverse = {hf: ours for ours, hf in hf_rename(args).items()}
    sd = {inverse.get(k, k): v.to(torch.float32) for k, v in raw.items()}
    check_shapes(sd, args, source=f"import {hf_dir}")
    if args.tie_embeddings:
        sd.pop("lm_head.weight", None)
    present = [name for name in TOKENIZER_FILES if model_file(hf_dir / name)]  # a link is refused here

    step, step_from = _source_step(hf_dir)
    tmp = _temp_sibling(out)
    save_file(
        {k: v.contiguous() for k, v in sd.items()},
        str(tmp / "model.safetensors"),
        metadata={"format": "pt", **({"step": str(step)} if step is not None else {})},
    )
    tokenizer_dir, tokenizer_fingerprint = None, None
    if "tokenizer.json" in present:
        (tmp / "tokenizer").mkdir()
        for name in present:
            _copy(hf_dir / name, tmp / "tokenizer" / name)
        # oreline encodes without specials and adds BOS/EOS itself: back to the training tokenizer
        # (and its fingerprint) by dropping the BOS post-processor an oreline export carries.
        text = (hf_dir / "tokenizer.json").read_text(encoding="utf-8")
        training = training_tokenizer_json(text)
        write_atomic(tmp / "tokenizer" / "tokenizer.json", training)
        tokenizer_fingerprint = canonical_fingerprint(training)  # what a run tokenized with it records
        tokenizer_dir = str((out / "tokenizer").resolve())
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": "model_only",
        "step": step,  # the training step of the weights, where the folder says it; None: unknown
        "step_from": step_from,
        "model_args": args.to_dict(),
        "tokenizer_dir": tokenizer_dir,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "source": "import-hf",
        "hf_dir": str(hf_dir.resolve()),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch_version": torch.__version__,
    }
    write_atomic(tmp / "meta.json", json.dumps(meta, indent=2))
    write_checksums(tmp)
    _publish(tmp, out, "import-hf", "oreline import-hf")
    if console is not None:
        n = sum(v.numel() for v in sd.values())
        console.print(
            f"imported {hf_dir} → {out}: {len(sd)} tensors, {n:,} parameters, "
            f"dim {args.dim} × {args.n_layers} layers, vocab {args.vocab_size}, tied={args.tie_embeddings}, "
            + (f"step {step:,} (from {step_from})" if step is not None else "training step unknown")
            + ("" if tokenizer_dir else " (no tokenizer.json found: weights only)")
        )
    return sd
