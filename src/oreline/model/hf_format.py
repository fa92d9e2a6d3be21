"""Reading a Hugging Face Llama folder: config.json → ModelArgs, the safetensors → a state dict.

Shared by `oreline import-hf` (oreline.export.hf) and `train.init_from` (oreline.train.init_from),
which both start from an HF folder. oreline's Llama uses `LlamaForCausalLM`'s parameter names and
HF's rotate-half RoPE, so the weight mapping is the identity (`hf_rename`). Only regular files are
read (`model_file`), weights only from safetensors (never unpickled), and architectures this
Llama cannot represent are refused with the offending key.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import torch

from oreline.errors import ConfigError, InputError
from oreline.model.llama import ModelArgs, expected_shapes


def hf_rename(args: ModelArgs) -> dict[str, str]:
    """oreline tensor name → HF tensor name. The identity, by construction of oreline.model.llama."""
    return {name: name for name in expected_shapes(args)}


# ---------------------------------------------------------------------------------------------
# files read from a model folder


def model_file(path: Path) -> Path | None:
    """`path` when it is a regular file, None when there is nothing at that name; anything else is
    refused. A symbolic link in a model folder can name any file on the machine (tokenizer.json ->
    ~/.ssh/id_ed25519): followed, that file would be copied into the import and into every export
    of it. A FIFO or device would block the read or never end. The one link accepted is the Hugging
    Face hub cache's own: snapshots/REV/NAME -> ../../blobs/HASH, a regular file in that cache's blobs/."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode) or (stat.S_ISLNK(st.st_mode) and _hub_cache_blob(path)):
        return path
    what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
    raise InputError(
        f"{path} is {what}; oreline reads only regular files from a model folder (a link could name any file "
        "on this machine, which would then be copied into the import and its exports)",
        "copy the real file in its place (cp --dereference), or download the model with "
        "`huggingface-cli download REPO --local-dir DIR`, which writes regular files",
    )


def _hub_cache_blob(path: Path) -> bool:
    """A link of the Hugging Face hub cache: models--ORG--NAME/snapshots/REV/NAME -> ../../blobs/HASH,
    where blobs/ is a real folder and HASH a regular file in it (checked without following any other link)."""
    from pathlib import PurePosixPath

    target = PurePosixPath(os.readlink(path))
    if len(target.parts) != 4 or target.parts[:3] != ("..", "..", "blobs"):
        return False
    snapshot = Path(os.path.realpath(path.parent))  # the link's ../.. is taken from where it really is
    if snapshot.parent.name != "snapshots":
        return False
    blobs = snapshot.parent.parent / "blobs"
    try:
        return stat.S_ISDIR(os.lstat(blobs).st_mode) and stat.S_ISREG(
            os.lstat(blobs / target.parts[3]).st_mode
        )
    except OSError:
        return False


def args_from_hf_config(cfg: dict[str, Any]) -> ModelArgs:
    """ModelArgs from a LlamaForCausalLM config.json; refuses what this Llama cannot represent."""
    hint = "only Llama-architecture checkpoints (LlamaForCausalLM) without biases can be imported"
    if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in (cfg.get("architectures") or []):
        raise ConfigError(
            f"config.json describes {cfg.get('model_type') or cfg.get('architectures')}, not a Llama", hint
        )
    for key, ok in (
        ("attention_bias", False),
        ("mlp_bias", False),
        ("hidden_act", "silu"),
        ("pretraining_tp", 1),
    ):
        if cfg.get(key, ok) != ok:
            raise ConfigError(
                f"config.json has {key}={cfg[key]!r}; oreline's Llama supports {key}={ok!r} only", hint
            )
    n_heads = cfg["num_attention_heads"]
    if cfg.get("head_dim") not in (None, cfg["hidden_size"] // n_heads):
        raise ConfigError(
            f"config.json head_dim={cfg['head_dim']} differs from hidden_size / num_attention_heads", hint
        )
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10_000.0)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
        scaling = {k: float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor")}
        scaling["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
    elif rope_type != "default":
        raise ConfigError(
            f"config.json uses RoPE type {rope_type!r}", "oreline supports default and llama3 RoPE only"
        )
    return ModelArgs(
        dim=cfg["hidden_size"],
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        vocab_size=cfg["vocab_size"],
        ffn_dim=cfg["intermediate_size"],
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_seq_len=cfg.get("max_position_embeddings", 2048),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        init_std=float(cfg.get("initializer_range", 0.02)),
    )


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF folder: model.safetensors, or the shards its index names."""
    from safetensors.torch import load_file

    index = hf_dir / "model.safetensors.index.json"
    if model_file(index):
        from oreline.outdir import safe_child

        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise InputError(f"{index} has no weight_map object", "re-download or re-export the model")
        files = sorted(set(map(str, weight_map.values())))
        for name in files:  # the index names files to open: they must stay in the model folder
            safe_child(hf_dir, name, f"{index} weight_map")
    elif model_file(hf_dir / "model.safetensors"):
        files = ["model.safetensors"]
    elif any(hf_dir.glob("*.bin")):
        raise InputError(
            f"{hf_dir} holds pickled *.bin weights only; oreline never unpickles",
            "convert them first: AutoModelForCausalLM.from_pretrained(d).save_pretrained(d2)",
        )
    else:
        raise InputError(
            f"{hf_dir} has no model.safetensors or model.safetensors.index.json",
            "pass a folder written by save_pretrained or oreline export",
        )
    sd: dict[str, torch.Tensor] = {}
    for name in files:
        if not model_file(hf_dir / name):
            raise InputError(
                f"shard {name} named by the index is missing from {hf_dir}", "re-download or re-export it"
            )
        try:
            sd.update(load_file(str(hf_dir / name)))
        except Exception as exc:  # SafetensorError, OSError: another format renamed, a truncated file
            raise InputError(
                f"{hf_dir / name} is not a readable safetensors file ({type(exc).__name__}: {str(exc)[:200]})",
                "re-download or re-export the model; oreline reads weights only from safetensors files",
            ) from None
    return sd


def read_json(path: Path) -> dict:
    """A JSON object file of an imported folder, or an InputError naming it."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(
            f"{path} is not readable JSON ({type(exc).__name__}: {str(exc)[:200]})",
            "re-download or re-export the model folder",
        ) from None
    if not isinstance(found, dict):
        raise InputError(
            f"{path} holds a JSON {type(found).__name__}, not an object", "re-download or re-export it"
        )
    return found


def hf_special_ids(cfg: dict[str, Any]) -> dict[str, int | None]:
    """bos / eos / pad ids a config.json names (the first of a list; None when absent)."""
    out: dict[str, int | None] = {}
    for key in ("bos", "eos", "pad"):
        value = cfg.get(f"{key}_token_id")
        if isinstance(value, list):
            value = value[0] if value else None
        out[key] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return out
