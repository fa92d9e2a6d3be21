"""Scoring downstream tasks (oreline.model.tasks) the way lm-eval 0.4 does, so the numbers agree item for item.

Both the training loop (train.eval_tasks) and `oreline eval --tasks` use it, so it sits in the model
layer, below both.

- Encoding (lm-eval's `_encode_pair`): trailing whitespace of the context moves to the front of the
  continuation; `whole = [BOS] + encode(context + continuation)`, `ctx = [BOS] + encode(context)`
  (the prompt format of oreline.tokens.format, which is also what an exported tokenizer gives
  lm-eval's HFLM), and the continuation tokens are `whole[len(ctx):]` — a split by count, as lm-eval
  does, even where the merge across the boundary differs.
- Truncation: `(ctx + cont)[-(L + 1):][:-1]` is fed, L the trained context (the run's
  train.seq_len; an export's max_position_embeddings, which is what HFLM reads), so a long context
  loses its left end (BOS first), exactly as lm-eval's `_loglikelihood_tokens`. A continuation
  longer than L (lm-eval refuses it with an assertion) is scored on its last L tokens.
- Log-likelihood of a continuation: the exact sum (math.fsum) of its tokens' fp32 log_softmax values,
  and whether greedy decoding reproduces it (argmax at every position). Exact, so the result does
  not depend on summation order and stays within the per-token fp32 rounding of a float64
  computation (lm-eval with softmax_dtype=float64); lm-eval's default fp32 sum differs from it by
  up to an ulp of the total (1.2e-4 nats at -2,000).
- Multiple choice: `acc` = argmax of the summed log-likelihoods is gold (ties: the first); `acc_norm`
  = argmax of log-likelihood / the choice's length in characters (lm-eval's `acc_norm`:
  `len(choice)`, not bytes; for partial-scoring tasks, the context's length, as lm-eval does).
  Cloze: `acc` = greedy exact match (lm-eval's lambada `acc`); acc_norm is the same number.
- Centred accuracy: (acc − chance) / (1 − chance), chance = mean 1/choices (0 for cloze); the
  CORE-style score is the mean of the centred accuracies over the tasks (DCLM's CORE, Li et al. 2024).

Items are sorted by length and packed into batches of at most `max_tokens` padded tokens
(right padding: a causal model's earlier positions never see it). Ranks score `items[rank::world]`
and `all_reduce` sums the counts, so every rank gets the totals.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from oreline.model.tasks import Task
from oreline.tokens.format import prompt_ids

SUM_KEYS = ("items", "acc", "acc_norm", "chance")


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's `_encode_pair` with a BOS-adding tokenizer."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = prompt_ids(tokenizer, context + continuation)
    ctx = prompt_ids(tokenizer, context)
    return ctx, whole[len(ctx) :]


def _model_inputs(ctx: Sequence[int], cont: Sequence[int], context_len: int) -> tuple[list[int], int]:
    """The fed tokens (left-truncated to the trained context) and how many of the last positions score."""
    inp = (list(ctx) + list(cont))[-(context_len + 1) :][:-1]
    return inp, len(cont)


@torch.no_grad()
def loglikelihoods(
    model: torch.nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    context_len: int,
    max_tokens: int | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> list[tuple[float, bool]]:
    """(summed log-likelihood, greedy) of every (context ids, continuation ids) request, in order."""
    if not requests:
        return []
    device = next(model.parameters()).device
    vocab = int(getattr(getattr(model, "args", None), "vocab_size", 0) or 32000)
    # padded tokens per batch: the (B, T, vocab) fp32 logits stay near 128 MiB
    budget = max_tokens or max(256, min(16384, 2**25 // max(vocab, 1)))
    prepared = [_model_inputs(c, x, context_len) for c, x in requests]
    order = sorted(range(len(prepared)), key=lambda i: -len(prepared[i][0]))
    out: list[tuple[float, bool]] = [(0.0, True)] * len(prepared)
    was_training = model.training
    model.eval()
    try:
        start = 0
        while start < len(order):
            longest = len(prepared[order[start]][0])
            size = max(1, budget // max(longest, 1))
            batch = order[start : start + size]
            start += len(batch)
            ids = torch.zeros(len(batch), longest, dtype=torch.long)
            # the target of position t is the fed token t + 1; spans: (row, request, first, end) of
            # each scored continuation in its row
            targets = torch.zeros(len(batch), longest, dtype=torch.long)
            spans = []
            for row, i in enumerate(batch):
                inp, n_cont = prepared[i]
                n = len(inp)
                ids[row, :n] = torch.as_tensor(inp, dtype=torch.long)
                # lm-eval asserts a continuation fits the context; oreline scores the part that fits
                n_cont = min(n_cont, n)
                if n_cont == 0:  # the continuation merged into the context's last token: (0.0, True)
                    continue
                targets[row, n - n_cont : n] = torch.as_tensor(
                    list(requests[i][1])[-n_cont:], dtype=torch.long
                )
                spans.append((row, i, n - n_cont, n))
            with torch.autocast(
                device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
            ):
                logits = model(ids.to(device))
            # one log_softmax over the batch (rows are independent, so each row's values are those of
            # a forward of that request alone)
            logp = torch.log_softmax(logits.float(), dim=-1)
            targets = targets.to(logp.device)
            token_lp = logp.gather(-1, targets[..., None])[..., 0].cpu()
            hits = (logp.argmax(-1) == targets).cpu()
            for row, i, first, end in spans:
                # the exact sum of the fp32 token log-probabilities (math.fsum, correctly rounded): a
                # float32 sum rounds at every add (lm-eval's default was one ulp off, 1.2e-4 nats at -2,000)
                out[i] = (math.fsum(token_lp[row, first:end].tolist()), bool(hits[row, first:end].all()))
    finally:
        model.train(was_training)
    return out


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):  # the first of equal values, as numpy's argmax
        if v > values[best]:
            best = i
    return best


def score_task(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    context_len: int,
    max_items: int | None = None,
    rank: int = 0,
    world: int = 1,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """Metrics of one task (`task_metrics`) over its first `max_items` items, plus this rank's per-item results."""
    t0 = time.perf_counter()
    items = task.items[:max_items] if max_items else task.items
    mine = list(range(rank, len(items), world))
    requests, owner = [], []
    for idx in mine:
        for ctx, cont in items[idx].pairs:
            requests.append(encode_pair(tokenizer, ctx, cont))
            owner.append(idx)
    results = loglikelihoods(model, requests, context_len, max_tokens, autocast_dtype)
    per_item: list[dict[str, Any]] = []
    sums = torch.zeros(len(SUM_KEYS), dtype=torch.float64)
    k = 0
    for idx in mine:
        item = items[idx]
        got = results[k : k + len(item.pairs)]
        k += len(item.pairs)
        lls = [r[0] for r in got]
        if task.kind == "cloze":
            acc = acc_norm = float(got[0][1])
            pred = pred_norm = 0
        else:
            pred = _argmax(lls)
            pred_norm = _argmax([ll / n for ll, n in zip(lls, item.norm_len, strict=True)])
            acc, acc_norm = float(pred == item.gold), float(pred_norm == item.gold)
        chance = 0.0 if task.kind == "cloze" else 1.0 / len(item.pairs)
        sums += torch.tensor([1.0, acc, acc_norm, chance], dtype=torch.float64)
        per_item.append(
            {
                "task": task.name,
                "index": idx,
                "gold": item.gold,
                "loglikelihoods": lls,
                "greedy": [r[1] for r in got],
                "pred": pred,
                "pred_norm": pred_norm,
                "acc": acc,
                "acc_norm": acc_norm,
                "continuation_tokens": [len(requests[j][1]) for j in range(k - len(item.pairs), k)],
            }
        )
    if all_reduce is not None:
        dev = next(model.parameters()).device
        sums = all_reduce(sums.to(dev)).cpu()
    return {
        **task_metrics(sums),
        "per_item": per_item,
        "skipped": task.skipped,
        "seconds": time.perf_counter() - t0,
    }


def task_metrics(sums: torch.Tensor | Sequence[float]) -> dict[str, Any]:
    """items, acc, acc_norm, centered and chance from summed (items, acc, acc_norm, chance)."""
    n, acc, acc_norm, chance = (float(x) for x in sums)
    if n == 0:
        return {"items": 0, "acc": None, "acc_norm": None, "centered": None, "chance": None}
    acc, acc_norm, chance = acc / n, acc_norm / n, chance / n
    return {
        "items": int(n),
        "acc": acc,
        "acc_norm": acc_norm,
        "centered": (acc - chance) / (1.0 - chance),
        "chance": chance,
    }


def core_score(tasks: dict[str, dict[str, Any]]) -> float | None:
    """The CORE-style mean of the centred accuracies (None when no task was scored)."""
    vals = [m["centered"] for m in tasks.values() if m.get("centered") is not None]
    return sum(vals) / len(vals) if vals else None
