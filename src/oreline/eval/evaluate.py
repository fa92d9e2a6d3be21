"""Validation loss, perplexity, bits per byte and generation samples, in training and from a checkpoint.

Validation loss: the mean cross entropy (nats) over every target of `max_batches` batches of the
validation shards, in the loader's fixed order (the same batches every time), split like the
training loss into ordinary tokens, EOS targets and the token after BOS
(`oreline.train.monitor.loss_breakdown`). Perplexity is exp(loss).

Bits per byte (the tokenizer-independent measure of Gao et al. 2020, The Pile, §4; also used by
Chinchilla and the LLaMA data-mixing work) = Σ CE nats / ln 2 / Σ UTF-8 bytes of the target
tokens' text. The bytes of a token come from its vocabulary entry: byte-level BPE symbols map
back to bytes through GPT-2's byte↔unicode table (one symbol = one byte, so a token that is half
of a multi-byte character is still counted exactly); SentencePiece-style `▁` is one space byte and
`<0xXX>` byte-fallback tokens one byte. Special tokens (BOS, EOS, pad) have 0 bytes: predicting
EOS still costs bits, which the per-byte figure then charges to the document's text.

Generations: for each prompt, `[BOS] + encode(prompt)` (the training format, oreline.tokens.format;
the result states it as `training_format`) is continued greedily (argmax; identical
to HF generate(do_sample=False)) and/or by sampling with temperature and top-k from a seeded
generator, so both are reproducible.

`oreline eval CHECKPOINT` loads a model through `oreline.train.checkpoint.load_model_state`,
uses the run's tokenizer and validation shards (or `--data`), and writes all of the above as JSON
to `<run>/eval/eval-step-N.json` (or `--out`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oreline.errors import CheckpointError, InputError
from oreline.train.monitor import breakdown_means, loss_breakdown

# ---------------------------------------------------------------------------------------------
# bytes per token


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (Radford et al. 2019, encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def token_byte_lengths(tokenizer: Any) -> np.ndarray:
    """UTF-8 byte length of every id's text, shape (tokenizer.vocab_size,); specials and padding 0."""
    hf = tokenizer.hf
    out = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    specials = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id}
    if getattr(tokenizer, "unk_id", None) is not None:
        specials.add(tokenizer.unk_id)
    byte_level = type(hf.pre_tokenizer).__name__ == "ByteLevel"
    table = _gpt2_unicode_to_byte() if byte_level else {}
    for i in range(hf.get_vocab_size()):
        if i in specials:
            continue
        tok = hf.id_to_token(i)
        if tok is None:
            continue
        if byte_level:
            out[i] = sum(1 for ch in tok if ch in table)
        elif len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
            out[i] = 1
        else:
            out[i] = len(tok.replace("▁", " ").encode("utf-8"))
    return out


# ---------------------------------------------------------------------------------------------
# validation loss


def _as_long(x: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.long).to(device, non_blocking=True)


@torch.no_grad()
def validation_loss(model: torch.nn.Module, loader_or_batches: Any, bos_id: int | None, eos_id: int | None,
                    max_batches: int, bytes_per_token: np.ndarray | torch.Tensor | None,
                    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    autocast_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """loss, ppl, bpb and the token / EOS / after-BOS parts over up to `max_batches` batches.

    `loader_or_batches`: a TokenLoader of the validation split (its `iter_eval_batches`) or any
    iterable of batches with `input_ids`, `labels` and `doc_ids`. `all_reduce` sums the totals over
    ranks when each rank evaluated its own slice.
    """
    device = next(model.parameters()).device
    batches: Iterable = (loader_or_batches.iter_eval_batches(max_batches)
                         if hasattr(loader_or_batches, "iter_eval_batches") else loader_or_batches)
    bpt = None if bytes_per_token is None else torch.as_tensor(bytes_per_token, dtype=torch.float64, device=device)
    sums = torch.zeros(len(("sum_token", "n_token", "sum_eos", "n_eos", "sum_bos", "n_bos")), dtype=torch.float64,
                       device=device)
    n_bytes = torch.zeros((), dtype=torch.float64, device=device)
    n_batches = 0
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        for batch in batches:
            if n_batches >= max_batches:
                break
            ids, labels = _as_long(batch.input_ids, device), _as_long(batch.labels, device)
            doc_ids = None if getattr(batch, "doc_ids", None) is None else _as_long(batch.doc_ids, device)
            with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
                per_token = model(ids, doc_ids, labels=labels)  # (B, T) fp32 CE
            sums += loss_breakdown(per_token, ids, labels, bos_id, eos_id)
            if bpt is not None:
                valid = labels != -100
                n_bytes += bpt[labels.clamp(min=0)][valid].sum()
            n_batches += 1
    finally:
        model.train(was_training)
    if all_reduce is not None:
        packed = all_reduce(torch.cat([sums, n_bytes[None]]))
        sums, n_bytes = packed[:-1], packed[-1]
    parts = breakdown_means(sums)
    total_nats = float(sums[0] + sums[2] + sums[4])
    loss = parts["loss"]
    return {
        "loss": loss,
        "ppl": math.exp(loss) if loss is not None and loss < 700 else None,
        "bpb": total_nats / math.log(2) / float(n_bytes) if bpt is not None and float(n_bytes) > 0 else None,
        "loss_token": parts["loss_token"],
        "loss_eos": parts["loss_eos"],
        "loss_bos": parts["loss_bos"],
        "targets": parts["n_targets"],
        "bytes": int(n_bytes) if bpt is not None else None,
        "batches": n_batches,
        "seconds": time.perf_counter() - t0,
    }


# ---------------------------------------------------------------------------------------------
# generations


def generate_samples(model: torch.nn.Module, tokenizer: Any, prompts: list[str], max_new_tokens: int,
                     greedy: bool = True, temperature: float = 0.8, top_k: int | None = 50,
                     seed: int = 0) -> list[dict[str, Any]]:
    """Continue each prompt from `[BOS] + encode(prompt)`; one dict per prompt (prompt, text, mode, tokens, ids)."""
    from oreline.model.llama import generate
    from oreline.tokens.format import prompt_ids

    device = next(model.parameters()).device
    out = []
    for i, prompt in enumerate(prompts):
        ids = prompt_ids(tokenizer, prompt)  # the training format: what every exported client feeds too
        if greedy:
            new = generate(model, ids, max_new_tokens, temperature=0.0, eos_id=tokenizer.eos_id)
        else:
            gen = torch.Generator(device=device).manual_seed(seed + i)
            new = generate(model, ids, max_new_tokens, temperature=temperature, top_k=top_k,
                           eos_id=tokenizer.eos_id, generator=gen)
        ended = bool(new) and new[-1] == tokenizer.eos_id
        out.append({"prompt": prompt, "text": tokenizer.decode(new), "mode": "greedy" if greedy else "sampled",
                    "tokens": len(new), "ended_with_eos": ended, "ids": new})
    return out


# ---------------------------------------------------------------------------------------------
# oreline eval


def _read_prompts(path: Path | None, default: list[str]) -> list[str]:
    if path is None:
        return list(default)
    if not Path(path).is_file():
        raise InputError(f"prompt file {path} not found", "pass a text file with one prompt per line")
    prompts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise InputError(f"prompt file {path} holds no prompts", "write one prompt per line")
    return prompts


def _run_dir_of(ckpt: Path) -> Path:
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def evaluate_cli(checkpoint: Path, data: Path | None = None, prompts: Path | None = None, out: Path | None = None,
                 batches: int | None = None, console: Any = None) -> dict[str, Any]:
    """`oreline eval`: validation metrics and generations of one checkpoint, written as JSON."""
    from oreline.config import config_from_dict
    from oreline.model.llama import Llama, ModelArgs
    from oreline.tokens.format import convention
    from oreline.tokens.loader import TokenLoader
    from oreline.tokens.train_bpe import load_tokenizer
    from oreline.train.checkpoint import load_model_state, resolve_checkpoint

    ckpt = resolve_checkpoint(Path(checkpoint))
    state_dict, args, meta = load_model_state(ckpt)
    if isinstance(args, dict):
        args = ModelArgs.from_dict(args)
    if "config" not in meta:
        raise CheckpointError(f"{ckpt}: meta has no config", "evaluate a checkpoint written by oreline train")
    cfg = config_from_dict(meta["config"], source=f"{ckpt}/meta.json")
    tok_dir = Path(meta.get("tokenizer_dir") or (_run_dir_of(ckpt) / "tokenizer"))
    tokenizer = load_tokenizer(tok_dir)
    if meta.get("tokenizer_fingerprint") and meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise CheckpointError(f"{ckpt} was trained with tokenizer {meta['tokenizer_fingerprint'][:12]}…, "
                              f"{tok_dir} holds {tokenizer.fingerprint[:12]}…",
                              "restore the tokenizer folder the run was trained with")
    tokens_dir = Path(data) if data is not None else Path(meta.get("tokens_dir") or (_run_dir_of(ckpt) / "tokens"))
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    model = Llama(args)
    model.load_state_dict(state_dict, strict=True)
    model.to(device)

    n_batches = batches if batches is not None else cfg.eval.batches
    val = TokenLoader(tokens_dir, split="val", seq_len=cfg.train.seq_len, micro_batch=cfg.train.micro_batch,
                      seed=cfg.train.seed, tokenizer_fingerprint=tokenizer.fingerprint, doc_mask=cfg.train.doc_mask)
    metrics = validation_loss(model, val, tokenizer.bos_id, tokenizer.eos_id, n_batches, token_byte_lengths(tokenizer))
    prompt_list = _read_prompts(prompts, cfg.eval.prompts)
    gens = generate_samples(model, tokenizer, prompt_list, cfg.eval.max_new_tokens, greedy=True)
    gens += generate_samples(model, tokenizer, prompt_list, cfg.eval.max_new_tokens, greedy=False,
                             temperature=cfg.eval.temperature, top_k=cfg.eval.top_k, seed=cfg.train.seed)
    step = int(meta.get("step", 0))
    result = {
        "checkpoint": str(ckpt), "step": step, "tokens_seen": meta.get("tokens_seen"),
        "tokens_dir": str(tokens_dir), "tokenizer_fingerprint": tokenizer.fingerprint,
        "data_fingerprint": getattr(val, "data_fingerprint", None),
        "val_loss": metrics["loss"], "val_ppl": metrics["ppl"], "val_bpb": metrics["bpb"],
        "val_loss_token": metrics["loss_token"], "val_loss_eos": metrics["loss_eos"],
        "val_loss_bos": metrics["loss_bos"], "val_targets": metrics["targets"], "val_bytes": metrics["bytes"],
        "val_batches": metrics["batches"], "generations": gens,
        "training_format": convention(tokenizer.bos_id, tokenizer.eos_id),
    }
    out_path = Path(out) if out is not None else _run_dir_of(ckpt) / "eval" / f"eval-step-{step}.json"
    from oreline.runs import write_json_atomic

    write_json_atomic(out_path, result)
    if console is not None:
        _print_result(result, out_path, console)
    return result


def _print_result(r: dict[str, Any], path: Path, console: Any) -> None:
    from rich.markup import escape

    from oreline.tokens.format import describe

    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    console.print(f"[bold]eval[/] {escape(r['checkpoint'])} (step {r['step']}): val loss {f(r['val_loss'], '.4f')} | "
                  f"ppl {f(r['val_ppl'], ',.2f')} | bpb {f(r['val_bpb'], '.4f')} | token {f(r['val_loss_token'], '.3f')} "
                  f"eos {f(r['val_loss_eos'], '.3f')} after-BOS {f(r['val_loss_bos'], '.3f')} "
                  f"over {r['val_targets']:,} targets in {r['val_batches']} batches", highlight=False)
    if r.get("training_format"):
        console.print(f"  format: {escape(describe(r['training_format']))}", highlight=False)
    for g in r["generations"]:
        console.print(f"  [dim]{g['mode']}[/] {escape(repr(g['prompt']))} → {escape(repr(g['text']))}", highlight=False)
    console.print(f"written to {escape(str(path))}")


def load_eval(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))
