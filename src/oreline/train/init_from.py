"""`train.init_from`: a fresh run that starts from existing weights instead of the seed's draw.

Sources (`read_source`): an oreline checkpoint folder (a full step-N one or a model-only
snapshot) or a run / checkpoints folder (the checkpoint `resolve_checkpoint` picks), a folder
written by `oreline import-hf` (a model-only snapshot), or a Hugging Face Llama folder
(config.json + safetensors, as `oreline export` and `save_pretrained` write).

Checked before a weight is copied, on rank 0 (the verdict is every rank's):
- the model (`check_model`): the shape keys of the source's model and the configured one
  (dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_dim, tie_embeddings) must be equal, and
  every tensor must have the configured shape; the error names the first tensor that differs and
  the model.* values to set. Other differences (rope_theta, rope_scaling, norm_eps) are printed,
  not refused: training on with another RoPE base is how a context is extended.
- the weights (`check_finite`): a NaN or an infinity in any tensor is refused, naming it.
- the tokenizer (`check_tokenizer`): the run's tokenizer fingerprint against the source's
  (meta.json's, the tokenizer an import copied, an export's oreline_export.json); a folder that
  carries none (an HF model not written by oreline) is compared by vocabulary size and
  bos / eos / pad ids.

The weights then replace the seed's init (`load_weights`): one process: `load_state_dict`; DDP,
FSDP2, HSDP: rank 0 alone reads the source and `set_model_state_dict(full_state_dict,
broadcast_from_rank0)` sends each tensor, every rank keeping its copy (DDP) or its shard (FSDP2),
so no other rank ever holds the source. The optimizer and the schedule are fresh (step 0). The
lineage (path, kind, step, sha256 of the weights read, tokenizer fingerprint, and the source's own
lineage) is printed once and goes into the start record and every checkpoint's meta.json; a
resumed run carries it on from its checkpoint.

A resumed run continues from its own checkpoint: init_from applies only when a run starts fresh.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from oreline.config import expand
from oreline.errors import CheckpointError, ConfigError, InputError, OrelineError
from oreline.model.hf_format import (
    args_from_hf_config,
    hf_rename,
    hf_special_ids,
    model_file,
    read_hf_weights,
    read_json,
)
from oreline.model.llama import ModelArgs, check_shapes, expected_shapes
from oreline.train import dist

SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "tie_embeddings")
NUMERIC_KEYS = ("rope_theta", "rope_scaling", "norm_eps")
SOURCES_HINT = (
    "set train.init_from to an oreline checkpoint or run folder, a folder written by `oreline import-hf`, "
    "or a Hugging Face Llama folder (config.json + model.safetensors)"
)


@dataclass
class Source:
    """Weights to start from, with what is known of the model and tokenizer they were made with."""

    path: Path
    kind: str  # "checkpoint" | "import-hf" | "hf"
    state_dict: dict[str, torch.Tensor]
    args: ModelArgs
    step: int | None
    tokenizer_fingerprint: str | None = None
    # an HF folder that carries no fingerprint: what its config.json and tokenizer.json say
    special_ids: dict[str, int | None] = field(default_factory=dict)
    tokenizer_vocab: int | None = None
    lineage: dict | None = None  # the source's own init_from
    origin: str | None = None  # an import's Hugging Face folder


# ---------------------------------------------------------------------------------------------
# reading a source


def read_source(value: str) -> Source:
    """The weights `train.init_from` names (module docstring), fp32, HF-named as oreline's Llama."""
    path = Path(expand(value))
    if not path.is_dir():
        raise InputError(f"train.init_from = {value!r}: {path} is not a folder", SOURCES_HINT)
    if model_file(path / "config.json") and not (path / "meta.json").is_file():
        return _read_hf_folder(path)
    from oreline.tokens.train_bpe import canonical_fingerprint, read_tokenizer_json
    from oreline.train.checkpoint.load import load_model_state, resolve_checkpoint

    ckpt = resolve_checkpoint(path)
    state_dict, args, meta = load_model_state(ckpt)
    fp = meta.get("tokenizer_fingerprint")
    if not fp:  # an import written before imports recorded it: the training form it copied
        for folder in (ckpt / "tokenizer", Path(str(meta.get("tokenizer_dir") or ckpt / "tokenizer"))):
            if model_file(folder / "tokenizer.json"):
                fp = canonical_fingerprint(read_tokenizer_json(folder / "tokenizer.json"))
                break
    return Source(
        path=ckpt,
        kind="import-hf" if meta.get("source") == "import-hf" else "checkpoint",
        state_dict={k: v.to(torch.float32) for k, v in state_dict.items()},
        args=args,
        step=meta.get("step"),
        tokenizer_fingerprint=fp,
        lineage=meta.get("init_from"),
        origin=meta.get("hf_dir"),
    )


def _read_hf_folder(path: Path) -> Source:
    config = read_json(path / "config.json")
    try:
        args = args_from_hf_config(config)
    except (KeyError, TypeError, ValueError) as exc:  # a field missing, or of the wrong type
        raise InputError(
            f"{path / 'config.json'} is not a usable Llama config ({type(exc).__name__}: {exc})", SOURCES_HINT
        ) from None
    raw = read_hf_weights(path)
    raw = {k: v for k, v in raw.items() if not k.endswith("rotary_emb.inv_freq")}  # derived buffers
    inverse = {hf: ours for ours, hf in hf_rename(args).items()}
    state_dict = {inverse.get(k, k): v.to(torch.float32) for k, v in raw.items()}
    record = read_json(path / "oreline_export.json") if model_file(path / "oreline_export.json") else {}
    vocab = None
    if not record.get("tokenizer_fingerprint") and model_file(path / "tokenizer.json"):
        from tokenizers import Tokenizer

        from oreline.tokens.train_bpe import read_tokenizer_json

        try:
            vocab = Tokenizer.from_str(read_tokenizer_json(path / "tokenizer.json")).get_vocab_size()
        except Exception as exc:  # tokenizers raises a bare Exception for JSON that is not a tokenizer
            raise InputError(
                f"{path / 'tokenizer.json'} is not a Hugging Face tokenizer ({str(exc)[:200]})",
                "re-download or re-export the model folder",
            ) from None
    step = record.get("step")
    return Source(
        path=path,
        kind="hf",
        state_dict=state_dict,
        args=args,
        step=step if isinstance(step, int) else None,
        tokenizer_fingerprint=record.get("tokenizer_fingerprint") or None,
        special_ids=hf_special_ids(config),
        tokenizer_vocab=vocab,
    )


# ---------------------------------------------------------------------------------------------
# checks


def check_model(src: Source, args: ModelArgs) -> list[str]:
    """Refuse a source whose model is not the configured one; returns the notes on other differences."""
    differ = [k for k in SHAPE_KEYS if getattr(src.args, k) != getattr(args, k)]
    settings = ", ".join(f"model.{k} = {_toml(getattr(src.args, k))}" for k in differ)
    hint = (
        f"set {settings} (the source's model), or start from weights of this model"
        if differ
        else "start from weights of the configured model"
    )
    try:  # (a tied model's lm_head.weight, stored twice by some HF folders, must equal the embeddings)
        check_shapes(src.state_dict, args, source=f"train.init_from {src.path}")
    except ConfigError as exc:
        raise ConfigError(exc.message, hint) from None
    if differ:  # every tensor fits, yet the heads are cut differently: the same numbers, another model
        want = expected_shapes(args)
        first = next(iter(want))
        raise ConfigError(
            f"train.init_from {src.path}: its model has "
            + ", ".join(f"{k}={getattr(src.args, k)}" for k in differ)
            + f", the config {', '.join(f'{k}={getattr(args, k)}' for k in differ)} (tensors such as {first} "
            "have the same shapes, but they would be read as another model)",
            hint,
        )
    return [
        f"{k} {getattr(src.args, k)} in the source, {getattr(args, k)} in the config (model.{k}): training "
        "goes on with the config's"
        for k in NUMERIC_KEYS
        if getattr(src.args, k) != getattr(args, k)
    ]


def check_finite(src: Source) -> None:
    """Refuse a source holding a NaN or an infinity (ConfigError naming the first such tensor, in
    name order): every step of a run started from it would be non-finite, skipped by the stability
    guard, and the run would end with exit 0 and a checkpoint of the same non-finite weights."""
    for name in sorted(src.state_dict):
        tensor = src.state_dict[name]
        finite = torch.isfinite(tensor)
        if bool(finite.all()):
            continue
        bad = int((~finite).sum())
        first = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
        value = float(tensor[first]) if first else float(tensor)
        raise ConfigError(
            f"train.init_from {src.path}: tensor {name} {tuple(tensor.shape)} holds {bad:,} non-finite "
            f"value(s) ({value} at index {list(first)}); training from it would skip every step",
            "start from a checkpoint taken before the weights diverged (or another source)",
        )


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_tokenizer(src: Source, tokenizer: Any) -> str:
    """Refuse a source made with another tokenizer; returns how it was compared."""
    if src.tokenizer_fingerprint:
        if src.tokenizer_fingerprint != tokenizer.fingerprint:
            raise ConfigError(
                f"train.init_from {src.path} was trained with tokenizer {src.tokenizer_fingerprint[:12]}…, this "
                f"run's tokenizer {tokenizer.dir} is {tokenizer.fingerprint[:12]}…",
                "tokenize the data with the source's tokenizer (train.tokenizer and train.tokens of its run, or "
                "the tokenizer/ folder an import holds), or start from weights trained with this tokenizer",
            )
        return f"tokenizer fingerprint {tokenizer.fingerprint[:12]}… matches"
    problems = []
    if src.tokenizer_vocab is not None and src.tokenizer_vocab != tokenizer.trained_vocab_size:
        problems.append(
            f"its tokenizer.json has {src.tokenizer_vocab} tokens, this run's {tokenizer.trained_vocab_size}"
        )
    ours = {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id}
    for key, want in ours.items():
        got = src.special_ids.get(key)
        if got is not None and got != want:
            problems.append(f"its {key} id is {got}, this run's {want}")
    if problems:
        raise ConfigError(
            f"train.init_from {src.path} was made with another tokenizer: " + "; ".join(problems),
            "tokenize the data with the source's tokenizer (import it first: oreline import-hf DIR --out IMP, "
            "then train.tokenizer = IMP/tokenizer), or start from weights made with this run's tokenizer",
        )
    return "no tokenizer fingerprint in the source: vocabulary size and bos/eos/pad ids match"


# ---------------------------------------------------------------------------------------------
# loading


def weights_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors in name order (name, dtype, shape, bytes): the weights' identity,
    whatever file layout held them."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def load_weights(model: torch.nn.Module, state_dict: dict[str, torch.Tensor] | None) -> None:
    """Copy the source's weights into the built model: in place on one process; with a process
    group, rank 0's `state_dict` is broadcast and every rank keeps what it holds of each tensor
    (its whole copy under DDP, its shard under FSDP2). The other ranks pass None."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
        set_model_state_dict(model, dict(state_dict or {}), options=options)
        return
    assert state_dict is not None
    with torch.no_grad():
        model.load_state_dict(state_dict, strict=True)


def start_from_weights(value: str, s: Any, info: dist.DistInfo, say: Any) -> dict:
    """Read, check and load `train.init_from` into the run's model; returns the lineage record.

    Rank 0 reads and checks; its verdict (the lineage, or the error) is every rank's, so a refusal
    ends every rank with the same message instead of leaving the others waiting in the broadcast.
    """
    src, verdict, refused = None, None, None
    if info.is_main:
        try:
            src = read_source(value)
            notes = check_model(src, s.args)
            check_finite(src)
            compared = check_tokenizer(src, s.tokenizer)
            verdict = {
                "lineage": {
                    "path": str(src.path.resolve()),
                    "kind": src.kind,
                    "step": src.step,
                    "weights_sha256": weights_sha256(src.state_dict),
                    "tokenizer_fingerprint": src.tokenizer_fingerprint,
                    "tokenizer_check": compared,
                    "model_args": src.args.to_dict(),
                    "source_init_from": src.lineage,
                    "imported_from": src.origin,
                },
                "notes": notes,
            }
        except OrelineError as exc:
            refused = exc
            verdict = {"error": [type(exc).__name__, exc.message, exc.hint]}
        except Exception as exc:  # a torn file, an unreadable folder: still every rank's verdict
            refused = CheckpointError(
                f"train.init_from {value}: cannot read it ({type(exc).__name__}: {exc})",
                "check that the folder is complete and readable, or point train.init_from at another one",
            )
            refused.__cause__ = exc
            verdict = {"error": [type(refused).__name__, refused.message, refused.hint]}
    verdict = dist.from_main(verdict)
    if refused is not None:
        raise refused
    if "error" in verdict:
        kind, message, hint = verdict["error"]
        error = {"InputError": InputError, "CheckpointError": CheckpointError}.get(kind, ConfigError)
        refusal = error(message, hint)
        refusal.show = False  # rank 0 prints it (oreline.cli)
        raise refusal
    state_dict = None
    if src is not None:
        state_dict = dict(src.state_dict)
        if s.args.tie_embeddings:
            state_dict.pop("lm_head.weight", None)  # (checked equal to the embedding table)
    load_weights(s.model, state_dict)
    lineage = verdict["lineage"]
    for note in verdict["notes"]:
        say(f"[yellow]note[/]: train.init_from: {note}")
    say(
        f"init_from {lineage['path']} ({lineage['kind']}"
        + (f", step {lineage['step']}" if lineage["step"] is not None else "")
        + f"): weights sha256 {lineage['weights_sha256'][:16]}…; {lineage['tokenizer_check']}; "
        "fresh optimizer and schedule from step 0"
    )
    return lineage
