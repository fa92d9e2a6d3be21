"""Scoring a model on token batches: loss breakdown, validation loss, perplexity, bits per byte,
generation samples. The training loop (evaluation steps) and `oreline eval` both use these, so they
sit in the model layer, below both.

Validation loss: the mean cross entropy (nats) over every target of `max_batches` batches of the
validation shards, in the loader's fixed order (the same batches every time), split like the
training loss into ordinary tokens, EOS targets and the token after BOS
(`loss_breakdown`, sums and counts, so micro-batches and ranks add up exactly). Perplexity is exp(loss).

Loss breakdown. A packed sequence holds documents `[BOS] t1 … tn [EOS]` back to back, and the
loader sets targets equal to BOS to -100 (BOS is never predicted). Every other target falls in
one of three classes, judged in this order:
- `eos`: the target is EOS — how well the model knows where a document ends;
- `bos`: the input is BOS, i.e. the first token of a document, predicted from nothing but the
  document boundary — the highest-entropy position, often 2-3× the mean loss;
- `token`: everything else, the ordinary language-modelling loss.
`loss_breakdown` returns sums and counts (not means), so micro-batches and ranks add up exactly.

Bits per byte (the tokenizer-independent measure of Gao et al. 2020, The Pile, §4; also used by
Chinchilla and the LLaMA data-mixing work) = Σ CE nats / ln 2 / Σ UTF-8 bytes of the target
tokens' text. The bytes of a token come from its vocabulary entry: byte-level BPE symbols map
back to bytes through GPT-2's byte↔unicode table (one symbol = one byte, so a token that is half
of a multi-byte character is still counted exactly); SentencePiece-style `▁` is one space byte and
`<0xXX>` byte-fallback tokens one byte. Special tokens (BOS, EOS, pad) have 0 bytes: predicting
EOS still costs bits, which the per-byte figure then charges to the document's text.

Generations: for each prompt, `[BOS] + encode(prompt)` (the training format, oreline.tokens.format;
`oreline eval` states it as `training_format`) is continued greedily (argmax; identical
to HF generate(do_sample=False)) and/or by sampling with temperature and top-k from a seeded
generator, so both are reproducible.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from oreline.model.llama import generate
from oreline.tokens.format import prompt_ids

# ---------------------------------------------------------------------------------------------
# loss breakdown

BREAKDOWN_KEYS = ("sum_token", "n_token", "sum_eos", "n_eos", "sum_bos", "n_bos")


def loss_breakdown(
    per_token_loss: torch.Tensor,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    bos_id: int | None,
    eos_id: int | None,
) -> torch.Tensor:
    """Sums and counts of the per-target loss by class: a float64 tensor ordered as BREAKDOWN_KEYS.

    per_token_loss, input_ids, labels: (B, T); targets with label -100 are ignored (their loss
    is whatever cross_entropy(reduction="none") left there, normally 0).
    """
    loss = per_token_loss.detach().double()
    valid = labels != -100
    is_eos = valid & (labels == eos_id) if eos_id is not None else torch.zeros_like(valid)
    is_bos = valid & ~is_eos & (input_ids == bos_id) if bos_id is not None else torch.zeros_like(valid)
    is_tok = valid & ~is_eos & ~is_bos
    parts = []
    for mask in (is_tok, is_eos, is_bos):
        parts.append(torch.where(mask, loss, 0.0).sum())
        parts.append(mask.sum().double())
    return torch.stack(parts)


def breakdown_means(sums: torch.Tensor | list[float]) -> dict[str, float | None]:
    """loss (all targets), loss_token, loss_eos, loss_bos and n_targets from a breakdown tensor."""
    v = [float(x) for x in sums]
    st, nt, se, ne, sb, nb = v
    n = nt + ne + nb
    return {
        "loss": (st + se + sb) / n if n else None,
        "loss_token": st / nt if nt else None,
        "loss_eos": se / ne if ne else None,
        "loss_bos": sb / nb if nb else None,
        "n_targets": int(n),
    }


# ---------------------------------------------------------------------------------------------
# bytes per token


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (Radford et al. 2019, encoder.py)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
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
def validation_loss(
    model: torch.nn.Module,
    loader_or_batches: Any,
    bos_id: int | None,
    eos_id: int | None,
    max_batches: int | None,
    bytes_per_token: np.ndarray | torch.Tensor | None,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """loss, ppl, bpb and the token / EOS / after-BOS parts over up to `max_batches` batches (None: all).

    `loader_or_batches`: a TokenLoader of the validation split (its `iter_eval_batches`) or any
    iterable of batches with `input_ids`, `labels` and `doc_ids`. `all_reduce` sums the totals over
    ranks when each rank evaluated its own slice.
    """
    device = next(model.parameters()).device
    batches: Iterable = (
        loader_or_batches.iter_eval_batches(max_batches)
        if hasattr(loader_or_batches, "iter_eval_batches")
        else loader_or_batches
    )
    bpt = (
        None
        if bytes_per_token is None
        else torch.as_tensor(bytes_per_token, dtype=torch.float64, device=device)
    )
    sums = torch.zeros(
        len(("sum_token", "n_token", "sum_eos", "n_eos", "sum_bos", "n_bos")),
        dtype=torch.float64,
        device=device,
    )
    n_bytes = torch.zeros((), dtype=torch.float64, device=device)
    n_batches = 0
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        for batch in batches:
            if max_batches is not None and n_batches >= max_batches:
                break
            ids, labels = _as_long(batch.input_ids, device), _as_long(batch.labels, device)
            doc_ids = None if getattr(batch, "doc_ids", None) is None else _as_long(batch.doc_ids, device)
            with torch.autocast(
                device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
            ):
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


def generate_samples(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[str],
    max_new_tokens: int,
    greedy: bool = True,
    temperature: float = 0.8,
    top_k: int | None = 50,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Continue each prompt from `[BOS] + encode(prompt)`; one dict per prompt (prompt, text, mode, tokens, ids)."""
    device = next(model.parameters()).device
    out = []
    for i, prompt in enumerate(prompts):
        ids = prompt_ids(tokenizer, prompt)  # the training format: what every exported client feeds too
        if greedy:
            new = generate(model, ids, max_new_tokens, temperature=0.0, eos_id=tokenizer.eos_id)
        else:
            gen = torch.Generator(device=device).manual_seed(seed + i)
            new = generate(
                model,
                ids,
                max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                eos_id=tokenizer.eos_id,
                generator=gen,
            )
        ended = bool(new) and new[-1] == tokenizer.eos_id
        out.append(
            {
                "prompt": prompt,
                "text": tokenizer.decode(new),
                "mode": "greedy" if greedy else "sampled",
                "tokens": len(new),
                "ended_with_eos": ended,
                "ids": new,
            }
        )
    return out
