"""The verify stage (candidate pairs → verified edges, per id partition of the pair's first
document) and the similarity stage (each near-duplicate's similarity to its survivor)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from oreline.data.dedup.minhash import (
    dedup_config,
    estimated_jaccard,
    signature_width,
    verify_mode,
)
from oreline.data.dedup.shingles import jaccard
from oreline.data.dedup.staged.candidates import CAND_COLUMNS, Cands, load_cands
from oreline.data.dedup.staged.layout import done, finish, read_part, stage_files, write_table
from oreline.data.dedup.verify import pair_stats


def _pairs_of(stages: Path, p: int) -> np.ndarray:
    """Unique candidate pairs (a, b, bpart) whose first document is in id partition p."""
    t = read_part(stage_files(stages / "pairs"), p, ["role", "a", "b", "bpart"])
    t = t.filter(pc.equal(t.column("role"), 0))
    arr = np.stack([t.column(c).to_numpy() for c in ("a", "b", "bpart")], axis=1).astype(np.int64)
    return np.unique(arr, axis=0) if len(arr) else arr.reshape(0, 3)


def _similarities(
    stages: Path, p: int, pairs: np.ndarray, width: int, kind: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimates as the reference rounds them, similarities, exact?) of pairs (a, b, bpart), a in
    partition p: b from p's own candidates, or from the rows shipped to p for stage `kind`."""
    mine = load_cands(stages, p, width)
    ia = mine.index(pairs[:, 0])
    est = np.empty(len(pairs), dtype=np.float32)
    sims = np.empty(len(pairs), dtype=np.float64)
    exact = np.zeros(len(pairs), dtype=bool)
    local = pairs[:, 2] == p
    shipped = None
    if not local.all():
        shipped = Cands(read_part(stage_files(stages / "ship" / kind), p, CAND_COLUMNS), width)
    for other, sel in ((mine, np.flatnonzero(local)), (shipped, np.flatnonzero(~local))):
        if not len(sel):
            continue
        ib = other.index(pairs[sel, 1])
        est[sel] = estimated_jaccard(mine.sig[ia[sel]], other.sig[ib])
        for k, a, b in zip(sel.tolist(), ia[sel].tolist(), ib.tolist(), strict=True):
            sa, sb = mine.sets[a], other.sets[b]
            if sa is not None and sb is not None:
                sims[k] = jaccard(sa, sb)
                exact[k] = True
    est64 = est.astype(np.float64)
    sims[~exact] = est64[~exact]
    return est64, sims, exact


def verify_job(p: int, stages: str, cfg) -> dict:
    """One id partition of the candidate pairs (by their first document): the verified edges."""
    out = Path(stages) / "edges" / f"p{p:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    st = Path(stages)
    pairs = _pairs_of(st, p)
    est, sims, exact = _similarities(st, p, pairs, signature_width(dc), "verify")
    keep = np.ones(len(pairs), dtype=bool) if verify_mode(dc) == "none" else sims >= dc.threshold
    edges = pa.table({"a": pa.array(pairs[keep, 0]), "b": pa.array(pairs[keep, 1])})
    info = {"candidate_pairs": len(pairs), "verified_pairs": int(keep.sum())}
    info.update(pair_stats(exact, est, sims, dc.threshold))
    info["bytes"] = write_table(out, edges)
    return finish(out, info)


def similarity_job(p: int, stages: str, cfg) -> dict:
    """Similarity of each near-duplicate of id partition p to its survivor (exact when both texts were read)."""
    out = Path(stages) / "similarity" / f"p{p:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    st = Path(stages)
    t = read_part(stage_files(st / "near"), p, ["gid", "survivor", "kpart", "doc_id", "survivor_id"])
    t = t.sort_by([("gid", "ascending")])
    pairs = np.stack([t.column(c).to_numpy() for c in ("gid", "survivor", "kpart")], axis=1).astype(np.int64)
    _, sims, exact = _similarities(st, p, pairs, signature_width(dedup_config(cfg)), "similarity")
    table = pa.table(
        {
            "gid": t.column("gid"),
            "doc_id": t.column("doc_id"),
            "reason": pa.array(["dedup:near_dup"] * t.num_rows, pa.string()),
            "survivor_id": t.column("survivor_id"),
            "similarity": pa.array(sims, pa.float32()),
            "similarity_method": pa.array(np.where(exact, "jaccard", "minhash").tolist(), pa.string()),
            "part": pa.array(np.full(t.num_rows, p, dtype=np.int32)),
        }
    )
    return finish(out, {"near_duplicates": t.num_rows, "bytes": write_table(out, table)})
