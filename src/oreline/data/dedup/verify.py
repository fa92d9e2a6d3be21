"""Verification of near-duplicate candidates: the true Jaccard of their shingle sets, or the estimate.

MinHash with 128 permutations estimates a pair's Jaccard with standard error sqrt(J(1-J)/128),
0.035 at J = 0.8, so verifying LSH candidates with the estimate keeps and drops pairs within about
±0.1 of the threshold by chance (benchmarks/dedup_quality.py: precision 0.916, recall 0.917 on
planted pairs that include a level at the threshold; 1.000 / 1.000 with this module). Here a
candidate pair is verified with the exact Jaccard of the two documents' shingle-hash sets (the
same `shingles` function as the signatures: 64-bit hashes of word n-grams; two different shingles
collide with probability ~2^-64 per pair, which is what "exact" means here).

Memory stays bounded by the candidates, not the corpus. Only the documents that are in some
candidate pair are asked for, through a text source: a callable `(ids: set[str]) -> Iterator[(id,
text)]`. The pipeline's reads them back from the phase-1 shards on disk (`parquet_text_source`),
one file and one row group at a time, decompressing text only for row groups that hold a wanted
id. Each text is reduced at once to its sorted uint64 shingle array; texts are never held.

Matching a text to its signature row uses the id and the 128-bit exact key stored with the
signature (`exact_key`), so a text that changed since the signatures were computed, or a second
record under the same id in another file, is never compared under the wrong row. A candidate
whose text does not come back (a deleted intermediate file, a foreign source) is verified with the
signature estimate instead; every such case is counted in the stats, never silent.

The staged plan (`staged.candidates.candidates_job`, `staged.verify.verify_job`) partitions the candidate documents by a
hash of their id, so every record under one id is read by one job and the counts above add up to
exactly those of one process; a verify job then holds the shingle sets of one partition plus, one
partition at a time, those of its pairs' other ends. Memory: 8 bytes per shingle (about one per
word) of the candidates of two partitions, plus num_perm × 4 bytes of signature per candidate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from oreline.data.dedup.minhash import estimated_jaccard
from oreline.data.dedup.shingles import TextSource, exact_key, jaccard, shingles

MAX_EXAMPLES = 20  # ids listed in the stats for each kind of missing or unmatched text


def verify_pairs(
    pairs: np.ndarray, signatures: np.ndarray, threshold: float, chunk: int = 65536
) -> np.ndarray:
    """Estimated Jaccard of each candidate pair (float32, P) of signature rows, computed in chunks."""
    sims = np.empty(len(pairs), dtype=np.float32)
    for s in range(0, len(pairs), chunk):
        p = pairs[s : s + chunk]
        sims[s : s + chunk] = estimated_jaccard(signatures[p[:, 0]], signatures[p[:, 1]])
    return sims


def pair_stats(exact: np.ndarray, estimates: np.ndarray, sims: np.ndarray, threshold: float) -> dict:
    """How the pairs were verified, and how often the estimate alone would have decided otherwise
    (false positives it would have removed, true duplicates it would have kept)."""
    est_above = np.asarray(estimates) >= threshold
    above = sims >= threshold
    return {
        "exact_verified_pairs": int(exact.sum()),
        "signature_verified_pairs": int((~exact).sum()),
        "estimate_above_exact_below": int((exact & est_above & ~above).sum()),
        "estimate_below_exact_above": int((exact & ~est_above & above).sum()),
    }


@dataclass
class Verified:
    """Similarity of every candidate pair and what it was computed from."""

    sims: np.ndarray  # (P,) float64: exact Jaccard where `exact`, else the signature estimate
    exact: np.ndarray  # (P,) bool
    sets: dict[int, np.ndarray] = field(default_factory=dict)  # row -> shingle hashes of read texts
    stats: dict = field(default_factory=dict)


def read_candidate_sets(
    rows: np.ndarray, ids: Sequence[str], exact: np.ndarray, text_source: TextSource, shingle_words: int
) -> tuple[dict[int, np.ndarray], dict]:
    """{row: sorted uint64 shingle hashes} for the given signature rows, from the text source."""
    by_key: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for r in rows.tolist():
        by_key[(ids[r], int(exact[r, 0]), int(exact[r, 1]))].append(r)
    wanted = {key[0] for key in by_key}
    sets: dict[int, np.ndarray] = {}
    unrequested, changed, repeated = [], [], 0
    for doc_id, text in text_source(wanted) if wanted else ():
        if doc_id not in wanted:
            unrequested.append(doc_id)
            continue
        hi, lo = exact_key(text)
        targets = by_key.get((doc_id, hi, lo))
        if targets is None:  # same id, other text: another record under this id, or an edited file
            changed.append(doc_id)
            continue
        if targets[0] in sets:
            repeated += 1
            continue
        hashes = shingles(text, shingle_words)
        for r in targets:  # same id and same exact key: the same shingle set
            sets[r] = hashes
    missing = [ids[r] for r in rows.tolist() if r not in sets]
    stats = {
        "candidate_docs": int(len(rows)),
        "texts_read": len(sets),
        "texts_missing": len(missing),
        "texts_unrequested": len(unrequested),
        "texts_other_version": len(changed),
        "texts_repeated": repeated,
    }
    for name, found in (("missing", missing), ("unrequested", unrequested), ("other_version", changed)):
        if found:
            stats[f"texts_{name}_examples"] = sorted(set(found))[:MAX_EXAMPLES]
    return sets, stats


def verify_exact(
    pairs: np.ndarray,
    estimates: np.ndarray,
    ids: Sequence[str],
    exact: np.ndarray,
    threshold: float,
    text_source: TextSource,
    shingle_words: int,
) -> Verified:
    """Exact Jaccard of each candidate pair (P, 2) of signature rows; the estimate where a text is missing."""
    rows = np.unique(pairs.ravel()) if len(pairs) else np.empty(0, dtype=np.int64)
    sets, stats = read_candidate_sets(rows, ids, exact, text_source, shingle_words)
    sims = np.asarray(estimates, dtype=np.float64).copy()
    is_exact = np.zeros(len(pairs), dtype=bool)
    for i, (a, b) in enumerate(pairs.tolist()):
        sa, sb = sets.get(a), sets.get(b)
        if sa is not None and sb is not None:
            sims[i] = jaccard(sa, sb)
            is_exact[i] = True
    stats.update(pair_stats(is_exact, estimates, sims, threshold))
    return Verified(sims=sims, exact=is_exact, sets=sets, stats=stats)


def parquet_text_source(
    paths: Sequence[str | Path], id_column: str = "id", text_column: str = "text"
) -> TextSource:
    """A text source over Parquet document files (the pipeline's phase-1 `kept-*.parquet`).

    Files are read in the given order, one row group at a time: the id column first, and the text
    column only of row groups holding a wanted id. A file that no longer exists is skipped (its
    candidates are then reported as texts_missing by the verification).
    """
    files = [Path(p) for p in paths]

    def source(ids: set[str]) -> Iterator[tuple[str, str]]:
        if not ids:
            return
        wanted = pa.array(sorted(ids), pa.string())
        for path in files:
            if not path.is_file():
                continue
            pf = pq.ParquetFile(path)
            for g in range(pf.num_row_groups):
                mask = pc.is_in(pf.read_row_group(g, columns=[id_column]).column(0), value_set=wanted)
                if not pc.any(mask).as_py():
                    continue
                hit = pf.read_row_group(g, columns=[id_column, text_column]).filter(mask)
                yield from zip(hit.column(0).to_pylist(), hit.column(1).to_pylist(), strict=True)

    return source
