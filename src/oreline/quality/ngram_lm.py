"""Estimating a Kneser-Ney n-gram reference LM and writing it as an ARPA file.

Interpolated modified Kneser-Ney (Chen & Goodman 1998, "An Empirical Study of Smoothing
Techniques for Language Modeling", §3–4; the estimate KenLM's lmplz makes, Heafield et al. 2013):

- tokens: lowercased `\\w+` words and single printable punctuation marks, digits mapped to 0 (as
  CCNet); a sentence ends after [.!?] followed by whitespace, or at a blank line; each gets
  <s> … </s> (`oreline.data.filters.words`).
- adjusted counts a(g): raw counts for the highest order and for n-grams starting with <s>,
  otherwise the number of distinct words seen to the left of g (continuation counts).
- discounts per order from counts-of-counts n1..n4 of a: Y = n1/(n1+2 n2), D1 = 1-2Y n2/n1,
  D2 = 2-3Y n3/n2, D3+ = 3-4Y n4/n3.
- p(w|h) = (a(hw) - D(a(hw))) / Σ_x a(hx) + γ(h) p(w|h'), γ(h) = (D1 N1(h·) + D2 N2(h·) +
  D3+ N3+(h·)) / Σ_x a(hx), h' = h without its first word; unigrams interpolate with the uniform
  distribution over the vocabulary plus <unk>.

The ARPA file is read back for scoring by `oreline.data.filters.ngram_scorer` (data side, below
this layer); `oreline.quality.reference_lm` trains a reference folder with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from oreline.data.filters.ngram_scorer import BOS, EOS, UNK
from oreline.errors import ConfigError, InputError
from oreline.io import atomic_open


def _discounts(adjusted: np.ndarray) -> tuple[float, float, float]:
    coc = np.bincount(adjusted[adjusted <= 4].astype(np.int64), minlength=5)
    n1, n2, n3, n4 = (int(coc[k]) for k in (1, 2, 3, 4))  # n-grams whose adjusted count is exactly k
    if not (n1 and n2 and n3 and n4):  # tiny corpora: fall back to absolute discounting
        return 0.5, 1.0, 1.5
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    return tuple(float(min(max(x, 0.01), k)) for x, k in zip(d, (1, 2, 3), strict=True))  # type: ignore[return-value]


def _encode(sents: Iterable[list[str]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Vocabulary (id 0 = <s>, 1 = </s>), the padded id stream and each position's sentence number."""
    vocab: dict[str, int] = {BOS: 0, EOS: 1}
    ids: list[int] = []
    sid: list[int] = []
    counter = iter(range(2, 1 << 62))
    for k, toks in enumerate(sents):
        ids.append(0)
        ids.extend(vocab.setdefault(t, next(counter)) if t not in vocab else vocab[t] for t in toks)
        ids.append(1)
        sid.extend([k] * (len(toks) + 2))
    words = [""] * len(vocab)
    for w, i in vocab.items():
        words[i] = w
    return words, np.array(ids, dtype=np.int64), np.array(sid, dtype=np.int64)


def estimate_kneser_ney(sents: Iterable[list[str]], order: int = 3) -> dict[str, Any]:
    """Interpolated modified Kneser-Ney, vectorized over n-gram keys.

    An n-gram is one int64 key: its word ids packed in `bits` bits each, first word highest, so
    sorted keys group n-grams by context and `key >> bits` is the context, `key & mask` the suffix.
    Returns {"order", "words", "bits", "discounts", "keys": [per order], "log10p": [...], "log10b": [...]}.
    """
    words, seq, sid = _encode(sents)
    if len(words) <= 2:
        raise InputError(
            "no text to train the reference model on", "pass trusted .txt/.zip/JSONL/Parquet text"
        )
    bits = max(1, int(len(words) - 1).bit_length())
    if bits * order > 63:
        raise ConfigError(
            f"a {order}-gram model over {len(words):,} words does not fit 64-bit keys", "lower the order"
        )
    keys, raw = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    key = np.zeros(len(seq), dtype=np.int64)
    for n in range(1, order + 1):
        m = len(seq) - n + 1
        key = (key[:m] << bits) | seq[n - 1 :]
        valid = sid[:m] == sid[n - 1 :]  # n-grams never cross sentences
        k, c = np.unique(key[valid], return_counts=True)
        keys.append(k)
        raw.append(c)
    adjusted = [None] * (order + 1)
    adjusted[order] = raw[order]
    for n in range(order - 1, 0, -1):
        suffix, left = np.unique(keys[n + 1] & ((1 << (n * bits)) - 1), return_counts=True)
        pos = np.searchsorted(suffix, keys[n])
        found = (pos < len(suffix)) & (suffix[np.minimum(pos, len(suffix) - 1)] == keys[n])
        cont = np.where(found, left[np.minimum(pos, len(suffix) - 1)], 0)
        starts_bos = (keys[n] >> ((n - 1) * bits)) == 0
        adjusted[n] = np.where(starts_bos, raw[n], cont)  # nothing precedes <s>: raw counts
    uniform = 1.0 / len(words)  # every word but <s>, plus <unk>
    discounts, log10p, log10b = {}, [None] * (order + 1), [None] * (order + 1)
    prob = [None] * (order + 1)
    gammas = [None] * (order + 1)  # (context keys, gamma) of order n
    for n in range(1, order + 1):
        a = adjusted[n].astype(np.float64)
        if n == 1:
            a[keys[1] == 0] = 0.0  # <s> is never predicted
        d = _discounts(adjusted[n][a > 0])
        discounts[n] = d
        disc = np.where(a == 0, 0.0, np.where(a == 1, d[0], np.where(a == 2, d[1], d[2])))
        ctx = keys[n] >> bits
        uctx, inv = np.unique(ctx, return_inverse=True)
        total = np.bincount(inv, weights=a)
        gamma = np.bincount(inv, weights=disc) / total
        gammas[n] = (uctx, gamma)
        if n == 1:
            lower = uniform
        else:
            lower = prob[n - 1][np.searchsorted(keys[n - 1], keys[n] & ((1 << ((n - 1) * bits)) - 1))]
        prob[n] = (a - disc) / total[inv] + gamma[inv] * lower
    for n in range(1, order + 1):
        with np.errstate(divide="ignore"):
            log10p[n] = np.log10(prob[n])
        if n == 1:
            log10p[1][keys[1] == 0] = -99.0
        b = np.zeros(len(keys[n]))
        if n < order:
            uctx, gamma = gammas[n + 1]
            pos = np.searchsorted(uctx, keys[n])
            hit = (pos < len(uctx)) & (uctx[np.minimum(pos, len(uctx) - 1)] == keys[n])
            b[hit] = np.log10(gamma[pos[hit]])
        log10b[n] = b
    unk = float(np.log10(gammas[1][1][0] * uniform))
    return {
        "order": order,
        "words": words,
        "bits": bits,
        "discounts": discounts,
        "keys": keys,
        "log10p": log10p,
        "log10b": log10b,
        "unk_log10p": unk,
    }


def write_arpa(model: dict[str, Any], path: str | Path) -> None:
    """ARPA text: \\data\\ counts, then one section per order of `log10p  gram  [log10 backoff]`."""
    order, words, bits = model["order"], np.array(model["words"], dtype=object), model["bits"]
    mask = (1 << bits) - 1
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write("\\data\\\n")
        for n in range(1, order + 1):
            fh.write(f"ngram {n}={len(model['keys'][n]) + (n == 1)}\n")
        for n in range(1, order + 1):
            fh.write(f"\n\\{n}-grams:\n")
            keys = model["keys"][n]
            cols = [words[(keys >> ((n - 1 - j) * bits)) & mask] for j in range(n)]
            grams = cols[0] if n == 1 else [" ".join(t) for t in zip(*cols, strict=True)]
            if n == 1:
                fh.write(f"{model['unk_log10p']:.6f}\t{UNK}\n")
            for gram, p, b in zip(
                grams, model["log10p"][n].tolist(), model["log10b"][n].tolist(), strict=True
            ):
                fh.write(f"{p:.6f}\t{gram}\t{b:.6f}\n" if b != 0.0 else f"{p:.6f}\t{gram}\n")
        fh.write("\n\\end\\\n")
