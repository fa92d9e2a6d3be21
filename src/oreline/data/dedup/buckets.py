"""LSH buckets: one key per (document, band), and the candidate pairs of documents sharing a key.

Band b of a signature is its entries [b·rows, (b+1)·rows); its key is a uint64 hash of them
(`band_keys`). Documents with equal keys in any band are candidates (`bucket_pairs`). Both the
single-process `lsh_candidates` and the staged plan's bucket jobs (`staged.buckets.bucket_job`, one per
(band, key range)) call `bucket_pairs` on the documents of one bucket, so they emit the same pairs.

Memory of a bucket job: 24 bytes per (document, band) in its key range (key, row, id partition)
plus 24 bytes per emitted pair.
"""

from __future__ import annotations

import numpy as np

from oreline.data.dedup.shingles import ROLL, splitmix

MAX_ALL_PAIRS = 32  # a bucket up to this size yields all its pairs; a larger one a connected O(m) set


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(N, bands) uint64: one key per document and band (a hash of its `rows` signature entries)."""
    out = np.empty((len(sig), bands), dtype=np.uint64)
    for band in range(bands):
        block = sig[:, band * rows : (band + 1) * rows].astype(np.uint64)
        key = np.zeros(len(sig), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for j in range(rows):
                key = splitmix(key * ROLL + block[:, j])
        out[:, band] = key
    return out


def key_range(keys: np.ndarray, ranges: int) -> np.ndarray:
    """Which of `ranges` equal slices of the uint64 key space each key falls in (keys are uniform)."""
    return ((keys >> np.uint64(32)) * np.uint64(ranges)) >> np.uint64(32)


def bucket_pairs(keys: np.ndarray, rows: np.ndarray, max_all_pairs: int = MAX_ALL_PAIRS) -> np.ndarray:
    """Candidate pairs (P, 2) int64, i < j, of `rows` sharing a key (one band), not deduplicated.

    A bucket of m ≤ max_all_pairs documents yields all m(m-1)/2 pairs; a larger one (boilerplate)
    yields its first member (lowest row) paired with each other and each member with the next,
    which keeps it connected with O(m) pairs (members that verify against neither are then missed,
    a documented trade-off against quadratic blow-up).
    """
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
    sizes = np.diff(np.append(starts, len(sk)))
    out = []
    for s, m in zip(starts[sizes > 1], sizes[sizes > 1], strict=True):
        members = np.sort(rows[order[s : s + m]])
        if m <= max_all_pairs:
            i, j = np.triu_indices(m, k=1)
        else:
            i = np.concatenate((np.zeros(m - 1, dtype=np.int64), np.arange(m - 1)))
            j = np.concatenate((np.arange(1, m), np.arange(1, m)))
        out.append(np.stack((members[i], members[j]), axis=1))
    return np.concatenate(out).astype(np.int64) if out else np.empty((0, 2), dtype=np.int64)


def lsh_candidates(
    signatures: np.ndarray,
    bands: int,
    rows: int,
    active: np.ndarray | None = None,
    band_range: tuple[int, int] | None = None,
    max_all_pairs: int = MAX_ALL_PAIRS,
) -> np.ndarray:
    """Unique candidate pairs (P, 2) int64, i < j, of rows sharing a band bucket (one process).

    `active` (bool mask) restricts bucketing to some rows (exact-duplicate survivors with shingles).
    """
    idx = np.arange(len(signatures)) if active is None else np.flatnonzero(active)
    lo, hi = band_range or (0, bands)
    keys = band_keys(signatures[idx], bands, rows)
    out = [bucket_pairs(keys[:, band], idx, max_all_pairs) for band in range(lo, hi)]
    out = [p for p in out if len(p)]
    if not out:
        return np.empty((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(out), axis=0)
