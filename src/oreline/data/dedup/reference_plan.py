"""The reference dedup plan: which documents to drop as exact or near duplicates, and for which
survivor, computed in one process. A test oracle, not what `oreline data` runs.

Two implementations with one result (tests/data/test_dedup_staged.py checks they agree):

- `dedup_plan`, here, the single-process reference: every signature in one process, so its memory
  grows with the corpus (benchmarks/dedup_scale.py measures it). Kept as the reference of tests
  and benchmarks, and used by nothing else.
- `oreline.data.dedup.staged.plan.staged_plan`, what `oreline data` runs: stages of jobs over
  partitioned files through an executor (local pool, Ray or Slurm); no job holds all documents.

Both number rows the same way (position in the concatenation of the signature files in
sorted-path order), keep the same survivor (lowest (source, offset, doc id, row)) and write the
same removals.parquet (REMOVALS_SCHEMA) and dedup_stats.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from oreline.config import DedupConfig
from oreline.data.dedup.buckets import lsh_candidates
from oreline.data.dedup.components import near_duplicate_clusters
from oreline.data.dedup.exact import exact_duplicates
from oreline.data.dedup.minhash import (
    Signatures,
    atomic_write_table,
    bands_rows,
    dedup_config,
    estimated_jaccard,
    read_signatures,
    verify_mode,
)
from oreline.data.dedup.shingles import TextSource, jaccard
from oreline.data.dedup.staged.plan import NO_TEXT_STATS, REMOVALS_SCHEMA
from oreline.data.dedup.verify import (
    verify_exact,
    verify_pairs,
)
from oreline.io import write_json_atomic


def _active_rows(s: Signatures, exact_dups: dict[int, int]) -> np.ndarray:
    active = s.n_shingles > 0
    if exact_dups:
        active[list(exact_dups)] = False
    return active


@dataclass
class NearDups:
    removed: dict[int, int]  # {row: survivor_row}
    stats: dict
    sets: dict[int, np.ndarray]  # shingle hashes of the candidates whose text was read (exact mode)


def _near_dups(s: Signatures, pairs: np.ndarray, dc: DedupConfig, text_source: TextSource | None) -> NearDups:
    """Verify candidate pairs (verify.py) and cluster the verified edges (components.py)."""
    mode = verify_mode(dc)
    sims = verify_pairs(pairs, s.sig, dc.threshold).astype(np.float64)
    stats: dict[str, Any] = {"verify": mode}
    sets: dict[int, np.ndarray] = {}
    if mode == "exact" and text_source is not None:
        v = verify_exact(pairs, sims, s.ids, s.exact, dc.threshold, text_source, dc.shingle_words)
        sims, sets = v.sims, v.sets
        stats.update(v.stats)
    elif mode == "exact":
        stats.update(NO_TEXT_STATS)
    edges = pairs if mode == "none" else pairs[sims >= dc.threshold]
    removed = near_duplicate_clusters(len(s.ids), edges, s.rank)
    stats.update(
        candidate_pairs=int(len(pairs)),
        verified_pairs=int(len(edges)),
        rejected_pairs=int(len(pairs) - len(edges)),
    )
    return NearDups(removed, stats, sets)


def _removal_similarity(s: Signatures, near: NearDups) -> tuple[list[float], list[str]]:
    """Similarity of each near-duplicate to its survivor: exact when both texts were read."""
    sims, methods = [], []
    for r, k in near.removed.items():
        if r in near.sets and k in near.sets:
            sims.append(jaccard(near.sets[r], near.sets[k]))
            methods.append("jaccard")
        else:
            sims.append(float(estimated_jaccard(s.sig[r], s.sig[k])))
            methods.append("minhash")
    return sims, methods


def dedup_plan(
    signature_paths: Sequence[str | Path],
    out_dir: str | Path,
    cfg: Any,
    text_source: TextSource | None = None,
) -> dict[str, tuple[str, str]]:
    """Exact and near-duplicate removals across all signature files: {doc_id: (reason, survivor_id)}.

    The single-process reference of `staged_plan`. text_source: `(ids) -> Iterator[(id, text)]`
    giving the texts of the ids it is asked for (only documents in some LSH candidate pair are
    asked for), used by exact verification; without it candidates are verified with the signature
    estimate. Writes out_dir/removals.parquet (doc_id, reason, survivor_id, similarity to the
    survivor, similarity_method: "exact_text" for exact duplicates, "jaccard" when computed from
    both shingle sets, "minhash" when estimated) and out_dir/dedup_stats.json with the counts of
    every stage.
    """
    dc = dedup_config(cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = read_signatures(signature_paths, dc)
    exact = exact_duplicates(s.exact, s.rank) if dc.exact else {}
    stats: dict[str, Any] = {
        "docs": len(s.ids),
        "signature_files": len(s.files),
        "exact_duplicates": len(exact),
    }
    near = NearDups({}, {}, {})
    if dc.minhash and dc.num_perm:
        bands, rows = bands_rows(dc)
        pairs = lsh_candidates(s.sig, bands, rows, _active_rows(s, exact))
        near = _near_dups(s, pairs, dc, text_source)
        stats.update(bands=bands, rows=rows, threshold=dc.threshold, **near.stats)
        stats["clusters"] = len(set(near.removed.values()))
    stats["near_duplicates"] = len(near.removed)
    plan = {s.ids[r]: ("dedup:exact", s.ids[k]) for r, k in exact.items()}
    plan.update({s.ids[r]: ("dedup:near_dup", s.ids[k]) for r, k in near.removed.items()})
    rows_removed = list(exact.items()) + list(near.removed.items())
    near_sims, near_methods = _removal_similarity(s, near)
    table = pa.table(
        {
            "doc_id": pa.array([s.ids[r] for r, _ in rows_removed], pa.string()),
            "reason": pa.array(
                ["dedup:exact"] * len(exact) + ["dedup:near_dup"] * len(near.removed), pa.string()
            ),
            "survivor_id": pa.array([s.ids[k] for _, k in rows_removed], pa.string()),
            "similarity": pa.array([1.0] * len(exact) + near_sims, pa.float32()),
            "similarity_method": pa.array(["exact_text"] * len(exact) + near_methods, pa.string()),
        },
        schema=REMOVALS_SCHEMA,
    )
    atomic_write_table(table, out_dir / "removals.parquet")
    write_json_atomic(out_dir / "dedup_stats.json", stats)
    return plan


def split_by_file(
    plan: dict[str, tuple[str, str]], ids_per_file: Sequence[Sequence[str]], keeper_order: Sequence[int]
) -> list[dict[str, list[str]]]:
    """The reference's removal list of each input file from a plan keyed by id.

    The plan is keyed by id, so a document whose id is removed anywhere is removed everywhere,
    except that when a survivor's own id occurs in several files, the copy in the file first in
    `keeper_order` (the run's order of input paths) stays.
    """
    keeper: dict[str, int] = {}
    for f in sorted(range(len(ids_per_file)), key=lambda f: keeper_order[f]):
        for d in ids_per_file[f]:
            keeper.setdefault(d, f)
    out = []
    for f, ids in enumerate(ids_per_file):
        mine = {}
        for d in ids:
            removal = plan.get(d)
            if removal is not None and not (removal[1] == d and keeper[d] == f):
                mine[d] = list(removal)
        out.append(mine)
    return out


# ---------------------------------------------------------------------------------------------
# the staged plan: layout and helpers
