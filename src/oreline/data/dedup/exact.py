"""Exact duplicates: documents whose exact key (`shingles.exact_key`) equals an earlier-ranked one's.

The key is xxh3-128 of the lowercased, whitespace-collapsed text; within a group of equal keys the
document of lowest rank survives (rank: see `minhash`, step 6). Exact duplicates are removed before
LSH, so near-duplicate search runs over the survivors only. Equal keys mean equal shingle sets and
so equal signatures and band keys: a group never straddles two LSH buckets.

Memory: the single-process `exact_duplicates` holds 16 bytes of key and 8 of rank per document;
the staged plan (`staged.exact.exact_job`) holds one hash partition of keys and sort fields at a time.
"""

from __future__ import annotations

import numpy as np


def exact_duplicates(exact: np.ndarray, rank: np.ndarray) -> dict[int, int]:
    """{row: survivor_row} for rows whose exact key (N, 2) equals an earlier-ranked row's."""
    if len(exact) == 0:
        return {}
    order = np.lexsort((rank, exact[:, 1], exact[:, 0]))  # by key, then rank: survivor first in group
    ek = exact[order]
    new_group = np.concatenate(([True], np.any(ek[1:] != ek[:-1], axis=1)))
    group_first = order[np.maximum.accumulate(np.where(new_group, np.arange(len(order)), 0))]
    dup = ~new_group
    return dict(zip(order[dup].tolist(), group_first[dup].tolist(), strict=True))
