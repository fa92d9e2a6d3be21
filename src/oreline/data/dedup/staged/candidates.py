"""The candidate documents of the pairs: each id partition requests its candidates' rows, each
group of signature files is read once to fetch them (requests, fetch), each id partition writes its
candidates' sort fields, signatures and (exact verification) shingle sets (candidates), and ships
the rows that other partitions compare against (ship), so no job reads another partition's file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from oreline.data.dedup.minhash import (
    dedup_config,
    signature_matrix,
    verify_mode,
)
from oreline.data.dedup.staged.layout import (
    done,
    file_of,
    finish,
    read_part,
    read_table,
    stage_files,
    write_parts,
    write_table,
)
from oreline.data.dedup.verify import parquet_text_source, read_candidate_sets
from oreline.errors import DataIntegrityError


def _group_of(gid: np.ndarray, offsets: np.ndarray, groups: int) -> np.ndarray:
    """Which group of consecutive signature files holds each row (fetch jobs read one group each)."""
    files = len(offsets) - 1
    return (file_of(gid, offsets) * groups // max(files, 1)).astype(np.int32)


def request_job(p: int, stages: str, offsets: list[int], groups: int) -> dict:
    """Id partition p: its candidate documents' rows, by the file group that holds them."""
    out = Path(stages) / "requests" / f"p{p:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    t = read_part(stage_files(Path(stages) / "pairs"), p, ["role", "a", "b"])
    role = t.column("role").to_numpy()
    gids = np.unique(np.where(role == 0, t.column("a").to_numpy(), t.column("b").to_numpy())).astype(np.int64)
    group = _group_of(gids, np.asarray(offsets, dtype=np.int64), groups)
    table = pa.table(
        {"part": pa.array(group), "gid": pa.array(gids), "idpart": pa.array(np.full(len(gids), p, np.int32))}
    )
    return finish(out, {"candidates": len(gids), "bytes": write_parts(out, table)})


FETCH_COLUMNS = ["doc_id", "source", "offset", "exact_hi", "exact_lo", "signature"]


def fetch_job(g: int, stages: str, sig_paths: list[str], offsets: list[int], groups: int) -> dict:
    """File group g: the requested rows of its signature files (each file read once), by id partition."""
    out = Path(stages) / "fetched" / f"g{g:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    t = read_part(stage_files(Path(stages) / "requests"), g, ["gid", "idpart"]).sort_by(
        [("gid", "ascending")]
    )
    gids = t.column("gid").to_numpy()
    offs = np.asarray(offsets, dtype=np.int64)
    files = file_of(gids, offs)
    parts = []
    for f in np.unique(files).tolist():
        rows = read_table(sig_paths[f], columns=FETCH_COLUMNS)
        parts.append(rows.take(pa.array(gids[files == f] - offs[f])))
    if not parts:  # nothing requested here: an empty table of the same schema
        parts.append(read_table(sig_paths[0], columns=FETCH_COLUMNS).slice(0, 0))
    rows = pa.concat_tables(parts)
    rows = rows.append_column("gid", pa.array(gids)).append_column("part", t.column("idpart"))
    return finish(out, {"rows": rows.num_rows, "bytes": write_parts(out, rows)})


def candidates_job(p: int, stages: str, text_files: list[str] | None, cfg) -> dict:
    """One id partition of the candidate documents: sort fields, signature and (exact mode) shingle set."""
    out = Path(stages) / "cands" / f"p{p:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    t = read_part(stage_files(Path(stages) / "fetched"), p, FETCH_COLUMNS + ["gid"]).sort_by(
        [("gid", "ascending")]
    )
    gids = t.column("gid").to_numpy()
    info: dict[str, Any] = {"candidates": len(gids)}
    sets: dict[int, np.ndarray] = {}
    if verify_mode(dc) == "exact" and text_files is not None:
        ids = t.column("doc_id").to_pylist()
        exact = np.stack([t.column("exact_hi").to_numpy(), t.column("exact_lo").to_numpy()], axis=1)
        source = parquet_text_source(text_files)
        sets, info["read"] = read_candidate_sets(np.arange(len(ids)), ids, exact, source, dc.shingle_words)
    shingle_sets = [sets.get(i) for i in range(len(gids))]
    table = pa.table(
        {
            "gid": pa.array(gids),
            "doc_id": t.column("doc_id").cast(pa.string()),
            "source": t.column("source").cast(pa.string()),
            "offset": t.column("offset").cast(pa.int64()),
            "signature": t.column("signature"),
            "shingles": pa.array(shingle_sets, pa.list_(pa.uint64())),
        }
    )
    info["bytes"] = write_table(out, table)
    return finish(out, info)


CAND_COLUMNS = ["gid", "signature", "shingles"]


class Cands:
    """Signatures and shingle sets of some candidate documents, looked up by global row."""

    def __init__(self, table: pa.Table, width: int):
        order = np.argsort(table.column("gid").to_numpy(), kind="stable")
        table = table.take(pa.array(order))
        self.gid = table.column("gid").to_numpy()
        self.sig = signature_matrix(table, width)
        self.sets = [
            None if s is None else np.asarray(s, dtype=np.uint64)
            for s in table.column("shingles").to_pylist()
        ]

    def index(self, gid: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.gid, gid)
        if len(gid) and (i.max(initial=0) >= len(self.gid) or not np.array_equal(self.gid[i], gid)):
            raise DataIntegrityError(
                "a candidate document is missing from its partition's candidate file",
                "delete the run's work/dedup folder and run oreline data again",
            )
        return i


def load_cands(stages: Path, p: int, width: int) -> Cands:
    return Cands(read_table(stages / "cands" / f"p{p:05d}.parquet", columns=CAND_COLUMNS), width)


def _ship_requests(stages: Path, q: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(gid, destination partition) of the candidates of id partition q that other partitions'
    jobs of stage `kind` compare against: for verify, the second documents of pairs whose first
    document is elsewhere; for similarity, the survivors of removals elsewhere."""
    if kind == "verify":
        t = read_part(stage_files(stages / "pairs"), q, ["role", "b", "apart"])
        t = t.filter(pc.equal(t.column("role"), 1))
        gid, dest = t.column("b").to_numpy(), t.column("apart").to_numpy()
    else:
        t = read_part(stage_files(stages / "kept"), q, ["survivor", "part"], col="kpart")
        gid, dest = t.column("survivor").to_numpy(), t.column("part").to_numpy()
    req = np.stack([gid.astype(np.int64), dest.astype(np.int64)], axis=1)[dest != q]
    req = np.unique(req, axis=0) if len(req) else req.reshape(0, 2)
    return req[:, 0], req[:, 1].astype(np.int32)


def ship_job(q: int, stages: str, kind: str) -> dict:
    """Id partition q's candidate rows that stage `kind` ("verify" or "similarity") needs in other
    partitions, by destination partition: q's candidates file is read once here, so each job of
    that stage reads its own candidates and what was shipped to it, never another partition's file."""
    st = Path(stages)
    out = st / "ship" / kind / f"q{q:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    gids, dest = _ship_requests(st, q, kind)
    cands = read_table(st / "cands" / f"p{q:05d}.parquet", columns=CAND_COLUMNS)
    have = cands.column("gid").to_numpy()
    order = np.argsort(have, kind="stable")
    i = order[np.searchsorted(have, gids, sorter=order)] if len(have) else np.zeros(0, np.int64)
    if len(gids) and not np.array_equal(have[i], gids):
        raise DataIntegrityError(
            "a candidate document is missing from its partition's candidate file",
            "delete the run's work/dedup folder and run oreline data again",
        )
    table = cands.take(pa.array(i, pa.int64())).append_column("part", pa.array(dest, pa.int32()))
    return finish(out, {"rows": table.num_rows, "bytes": write_parts(out, table)})
