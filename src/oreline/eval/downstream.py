"""`oreline eval CHECKPOINT --tasks core|arc_easy,piqa,...`: downstream accuracy, written as JSON and a table.

The model is a checkpoint (a run, a checkpoint folder, an `oreline import-hf` snapshot) or an exported
Hugging Face folder (config.json + safetensors + tokenizer.json, what `oreline export` writes); the
tasks come from oreline.model.tasks and are scored by oreline.model.downstream (lm-eval's way).

`--out FILE.json` gets `{"tasks": {NAME: {"items", "acc", "acc_norm", "centered", "chance"}},
"core": mean centred, ...}` (the interface outside checks read; extra keys beside those); the per-item
results go to FILE.items.jsonl beside it. Without --out: <run>/eval/tasks-step-N.json (a checkpoint),
EXPORT.tasks.json beside an exported folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from oreline.errors import CheckpointError, InputError
from oreline.model.downstream import core_score, score_task
from oreline.model.tasks import resolve_tasks


def _is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and not (path / "meta.json").is_file()


def load_scoring_model(path: Path, tokenizer_dir: Path | None = None, seq_len: int | None = None) -> dict:
    """{"model", "tokenizer", "context_len", "step", "source"} for a checkpoint or an exported HF folder.

    The context is the trained one: an export's max_position_embeddings (what lm-eval's HFLM reads),
    a run's train.seq_len, else the model's max_seq_len; `seq_len` overrides it.
    """
    from oreline.eval.evaluate import _tokenizer_dir
    from oreline.model.hf_format import args_from_hf_config, hf_rename, read_hf_weights, read_json
    from oreline.model.llama import Llama, ModelArgs, check_shapes
    from oreline.model.presets import check_model_memory
    from oreline.tokens.train_bpe import load_tokenizer

    path = Path(path)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if _is_hf_folder(path):
        args = args_from_hf_config(read_json(path / "config.json"))
        # config.json is the folder's word: the model it describes (a forged max_position_embeddings'
        # RoPE tables) must fit before any weight is read or any table built, as for `oreline eval`
        check_model_memory(args, device, f"{path / 'config.json'}")
        raw = {k: v for k, v in read_hf_weights(path).items() if not k.endswith("rotary_emb.inv_freq")}
        inverse = {hf: ours for ours, hf in hf_rename(args).items()}
        state_dict = {inverse.get(k, k): v.to(torch.float32) for k, v in raw.items()}
        tokenizer = load_tokenizer(Path(tokenizer_dir) if tokenizer_dir else path)
        context, step, source = args.max_seq_len, None, str(path)
    else:
        from oreline.train.checkpoint.load import load_model_state, resolve_checkpoint

        ckpt = resolve_checkpoint(path)
        state_dict, args, meta = load_model_state(ckpt)
        if isinstance(args, dict):
            args = ModelArgs.from_dict(args)
        check_model_memory(args, device, f"{ckpt}/meta.json")  # before the fp32 copy and the model
        state_dict = {k: v.to(torch.float32) for k, v in state_dict.items()}
        tokenizer = load_tokenizer(_tokenizer_dir(ckpt, meta, tokenizer_dir))
        if meta.get("tokenizer_fingerprint") and meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
            raise CheckpointError(
                f"{ckpt} was trained with tokenizer {meta['tokenizer_fingerprint'][:12]}…, "
                f"the tokenizer found holds {tokenizer.fingerprint[:12]}…",
                "pass --tokenizer DIR, the tokenizer folder the run was trained with",
            )
        trained = (meta.get("config") or {}).get("train", {}).get("seq_len")
        context, step, source = int(trained or args.max_seq_len), int(meta.get("step", 0)), str(ckpt)
        path = ckpt
    context = seq_len or context
    if not 0 < context <= args.max_seq_len:
        raise InputError(
            f"--seq-len {context} is outside 1..{args.max_seq_len}, the model's max_seq_len",
            f"pass --seq-len {args.max_seq_len} or less",
        )
    check_shapes(state_dict, args, source=str(path))
    model = Llama(args)
    model.load_state_dict(state_dict, strict=True)
    model.to(device).eval()
    return {
        "model": model,
        "tokenizer": tokenizer,
        "context_len": context,
        "step": step,
        "source": source,
        "kind": "hf" if _is_hf_folder(Path(source)) else "checkpoint",
    }


def run_tasks(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks_spec: str | list[str],
    context_len: int,
    max_items: int | None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """({"tasks": {...}, "core": ...}, per-item rows) for a loaded model."""
    tasks = resolve_tasks(tasks_spec)
    summary: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    for task in tasks:
        r = score_task(model, tokenizer, task, context_len, max_items=max_items)
        summary[task.name] = {k: r[k] for k in ("items", "acc", "acc_norm", "centered", "chance")}
        extra[task.name] = {
            "kind": task.kind,
            "source": task.source,
            "skipped": r["skipped"],
            "seconds": round(r["seconds"], 3),
        }
        rows += r["per_item"]
    return {"tasks": summary, "core": core_score(summary), "task_info": extra}, rows


def downstream_cli(
    checkpoint: Path,
    tasks: str,
    out: Path | None = None,
    max_items: int | None = None,
    console: Any = None,
    seq_len: int | None = None,
    tokenizer_dir: Path | None = None,
) -> dict[str, Any]:
    from oreline.io import real_folder, write_atomic, write_json_atomic

    loaded = load_scoring_model(Path(checkpoint), tokenizer_dir, seq_len)
    result, rows = run_tasks(loaded["model"], loaded["tokenizer"], tasks, loaded["context_len"], max_items)
    result.update(
        {
            "checkpoint": loaded["source"],
            "step": loaded["step"],
            "context_len": loaded["context_len"],
            "max_items": max_items,
            "scoring": "lm-eval 0.4 loglikelihood: summed log-likelihood; acc_norm by characters; "
            "cloze = greedy exact match; centered = (acc - chance) / (1 - chance); core = mean centered",
        }
    )
    if out is None:
        base = Path(loaded["source"])
        if loaded["kind"] == "hf":  # an export folder stays as exported: the result goes beside it
            out = base.parent / f"{base.name}.tasks.json"
        else:
            run_dir = base.parent.parent if base.parent.name == "checkpoints" else base.parent
            out = run_dir / "eval" / f"tasks-step-{loaded['step'] or 0}.json"
            real_folder(out.parent, root=run_dir)  # eval/ of the run, marked or not, is never a link
    out = Path(out)
    write_json_atomic(out, result)
    items_path = out.with_name(out.stem + ".items.jsonl")
    write_atomic(items_path, "".join(json.dumps(r) + "\n" for r in rows))
    if console is not None:
        print_table(result, console)
        console.print(f"written to {out} (per item: {items_path.name})", highlight=False)
    return result


def print_table(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"downstream tasks (CORE {_fmt(result.get('core'))})")
    for col in ("task", "items", "acc", "acc_norm", "chance", "centered"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for name, m in result["tasks"].items():
        table.add_row(
            name, str(m["items"]), _fmt(m["acc"]), _fmt(m["acc_norm"]), _fmt(m["chance"]), _fmt(m["centered"])
        )
    console.print(table)


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"
