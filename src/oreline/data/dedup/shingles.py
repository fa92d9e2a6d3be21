"""Text keys for deduplication: the exact-duplicate key, word shingles and their Jaccard similarity.

The signatures (`minhash.py`), exact duplicates (`exact.py`) and verification (`verify.py`) all
build on these, so they live below them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import xxhash

ROLL = np.uint64(0x100000001B3)  # FNV prime as the rolling-hash base of word n-grams
TextSource = Callable[[set[str]], Iterator[tuple[str, str]]]  # ids -> (id, text) of those ids


def exact_key(text: str) -> tuple[int, int]:
    """xxh3-128 of lowercased, whitespace-collapsed text, as (high, low) 64-bit halves."""
    h = xxhash.xxh3_128_intdigest(" ".join(text.lower().split()).encode("utf-8", "surrogatepass"))
    return h >> 64, h & 0xFFFFFFFFFFFFFFFF


def splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a bijection on uint64 that spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def shingles(text: str, n: int = 5) -> np.ndarray:
    """Sorted unique uint64 hashes of the word n-grams of lowercased text (one shingle if < n words)."""
    words = text.lower().split()
    if not words:
        return np.empty(0, dtype=np.uint64)
    wh = np.fromiter(
        (xxhash.xxh3_64_intdigest(w.encode("utf-8", "surrogatepass")) for w in words),
        dtype=np.uint64,
        count=len(words),
    )
    m = max(1, len(words) - n + 1)
    h = wh[:m].copy()
    with np.errstate(over="ignore"):
        for k in range(1, min(n, len(words))):
            h = h * ROLL + wh[k : k + m]
    return np.unique(splitmix(h))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique shingle-hash sets (exact verification, tests, benchmarks)."""
    inter = np.intersect1d(a, b, assume_unique=True).size
    union = a.size + b.size - inter
    return inter / union if union else 1.0
