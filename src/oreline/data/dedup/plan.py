"""The dedup plan: which documents to drop as exact or near duplicates, and for which survivor.

Two implementations with one result (tests/data/test_dedup_staged.py checks they agree):

- `dedup_plan`, the single-process reference: every signature in one process (about 2.2 KB per
  document with 128 permutations: 2.1 GiB peak at 1M documents in benchmarks/dedup_scale.py, so
  a 1B-document dump would need ~2 TB on one node). Kept as the reference of tests and
  benchmarks, and used by nothing else.
- `staged_plan`, what `oreline data` runs: stages of jobs over partitioned files, each job a
  module-level function of plain arguments mapped through an executor (`oreline.executors`), so
  the local pool, Ray or Slurm can run them. No job holds all documents:

  | stage       | jobs                         | reads                                | writes (stages/…)                   |
  |-------------|------------------------------|--------------------------------------|-------------------------------------|
  | scatter     | one per group of signature   | its signature files                  | scatter/gG: rows by exact-key hash; |
  |             | files (~group_docs documents)|                                      | ids/gG: (row, id) by id hash        |
  | exact       | one per exact-key partition  | its partition of every scatter file  | exact/hH: removals by id hash;      |
  |             |                              |                                      | bands/hH: band keys of survivors    |
  |             |                              |                                      | by (band, key range)                |
  | buckets     | one per (band, key range)    | its bucket of every bands file       | pairs/qQ: candidate pairs under     |
  |             |                              |                                      | both ends' id partitions            |
  | requests    | one per id partition         | its rows of every pairs file         | requests/pP: its candidates' rows   |
  |             |                              |                                      | by signature-file group             |
  | fetch       | one per file group           | its requests; its signature files,   | fetched/gG: those rows by id        |
  |             |                              | each once                            | partition                           |
  | candidates  | one per id partition         | its rows of every fetched file, and  | cands/pP: id, sort fields,          |
  |             |                              | (exact mode) its documents' texts    | signature, shingle set              |
  | ship-verify | one per id partition         | its rows of every pairs file (pairs  | ship/verify/qQ: those candidates'   |
  |             |                              | whose second document is in it);     | rows by the partition of the pair's |
  |             |                              | cands/pQ, once                       | first document                      |
  | verify      | one per id partition         | its pairs; cands/pP; its rows of     | edges/pP: verified edges            |
  |             |                              | every ship/verify file               |                                     |
  | components  | one union-find job, or       | every edges file; sort fields of the | near/: removal, survivor by id hash;|
  |             | large/small-star rounds over | touched documents                    | kept/: the same by the survivor's   |
  |             | node partitions (large runs) |                                      | id hash                             |
  | ship-       | one per id partition         | its rows of every kept file; cands/  | ship/similarity/qQ: survivors' rows |
  | similarity  |                              | pQ, once                             | by their removal's partition        |
  | similarity  | one per id partition         | its removals; cands/pP; its rows of  | similarity/pP                       |
  |             |                              | every ship/similarity file           |                                     |
  | assign      | one per id partition         | its ids, exact and near removals     | assign/pP: removals by file group   |
  | lists       | one per group of files       | its rows of every assign file        | out/task-NNNNN.json per file        |

  Rows are numbered as the reference numbers them (position in the concatenation of the
  signature files in sorted-path order), the survivor rule is the same (lowest (source, offset,
  doc id, row)), bucket pairs come from the same function (`buckets.bucket_pairs`), and the
  verification reads texts per id partition, so removals and stats are identical to the
  reference's whatever the partition counts or the order jobs run in.

Each job writes its files atomically (`oreline.io`: a unique temporary name per attempt, then a
rename) and a `.done` marker with its counts last; a job whose marker exists is skipped, so a
killed run resumes and two attempts of one job leave one valid output.

Memory per job: docs/design.md "Distributed dedup" (formulas, measured by
benchmarks/dedup_scale.py). Partition counts follow the number of documents (`Partitions.for_docs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from oreline.config import DedupConfig
from oreline.data.dedup.buckets import band_keys, bucket_pairs, key_range, lsh_candidates
from oreline.data.dedup.components import components, group_min, near_duplicate_clusters
from oreline.data.dedup.exact import exact_duplicates
from oreline.data.dedup.minhash import (
    Signatures,
    atomic_write_table,
    bands_rows,
    check_signature_file,
    dedup_config,
    estimated_jaccard,
    read_signatures,
    signature_matrix,
    signature_width,
    verify_mode,
)
from oreline.data.dedup.shingles import TextSource, jaccard, splitmix
from oreline.data.dedup.verify import (
    pair_stats,
    parquet_text_source,
    read_candidate_sets,
    verify_exact,
    verify_pairs,
)
from oreline.errors import DataIntegrityError, InputError
from oreline.io import write_json_atomic, write_with

# ---------------------------------------------------------------------------------------------
# the single-process reference


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
        stats.update(_NO_TEXT)
    edges = pairs if mode == "none" else pairs[sims >= dc.threshold]
    removed = near_duplicate_clusters(len(s.ids), edges, s.rank)
    stats.update(
        candidate_pairs=int(len(pairs)),
        verified_pairs=int(len(edges)),
        rejected_pairs=int(len(pairs) - len(edges)),
    )
    return NearDups(removed, stats, sets)


_NO_TEXT = {
    "verify": "signature",
    "verify_note": "exact verification asked for, but no text source was given: MinHash estimate used",
}


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


REMOVALS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("reason", pa.string()),
        ("survivor_id", pa.string()),
        ("similarity", pa.float32()),
        ("similarity_method", pa.string()),
    ]
)


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

DOCS_PER_PARTITION = 250_000  # documents per exact / id partition (exact job ≈ 1.1 KB per document)
DOCS_PER_KEY_RANGE = 4_000_000  # documents per (band, key range) bucket job (24 bytes each)
STAR_EDGES = 20_000_000  # above this many verified edges, components run as distributed star rounds


@dataclass(frozen=True)
class Partitions:
    exact: int  # X: exact-key hash partitions
    ranges: int  # R: key ranges per band
    ids: int  # P: id hash partitions (candidates, verify, similarity, assign)
    star: int = 0  # S: node partitions of large-star/small-star rounds; 0: one components job
    # unless the verified edges exceed STAR_EDGES (then S = P)
    group_docs: int = DOCS_PER_PARTITION  # documents per group of signature files (scatter, lists)

    @classmethod
    def for_docs(cls, docs: int) -> Partitions:
        n = max(1, math.ceil(docs / DOCS_PER_PARTITION))
        return cls(n, max(1, math.ceil(docs / DOCS_PER_KEY_RANGE)), n)


def id_partition(doc_ids: Sequence[str], parts: int) -> np.ndarray:
    """Hash partition of each document id (int32): every record under one id lands in one partition."""
    h = np.fromiter(
        (xxhash.xxh3_64_intdigest(d.encode("utf-8", "surrogatepass")) for d in doc_ids),
        dtype=np.uint64,
        count=len(doc_ids),
    )
    return (h % np.uint64(parts)).astype(np.int32)


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".done")


def _done(path: Path) -> dict | None:
    m = _marker(path)
    return json.loads(m.read_text()) if m.is_file() else None


def _finish(path: Path, info: dict) -> dict:
    write_json_atomic(_marker(path), info)
    return info


def _writer_options(schema: pa.Schema) -> dict:
    """Parquet options of the stage files: dictionary encoding only for the columns that repeat
    (source paths). Keys, row numbers and signatures are unique or random: the dictionary the
    writer tries first and then abandons tripled the write and read CPU of the bands files
    (measured: 3.5M band rows written in 0.74 s with it, 0.24 s without, at the same size)."""
    return {"use_dictionary": [c for c in ("source", "reason") if c in schema.names]}


def _write_parts(path: Path, table: pa.Table, col: str = "part") -> int:
    """Write `table` sorted by `col`, one row group per value, so readers of one partition skip the
    rest by the row groups' statistics. Returns the bytes written."""
    table = table.sort_by([(col, "ascending")])

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, table.schema, **_writer_options(table.schema)) as w:
            parts = table.column(col).to_numpy()
            starts = np.flatnonzero(np.concatenate(([True], parts[1:] != parts[:-1]))) if len(parts) else []
            bounds = list(starts) + [len(parts)]
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                w.write_table(table.slice(lo, hi - lo))

    write_with(path, write)
    return path.stat().st_size


def _read_table(path: Path | str, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file. Not `pq.read_table`: that imports pyarrow.dataset, ~0.4 s of the driver
    of a small run whose whole plan runs in it."""
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns)


def _write_table(path: Path, table: pa.Table) -> int:
    write_with(path, lambda tmp: pq.write_table(table, tmp, **_writer_options(table.schema)))
    return path.stat().st_size


def _read_part(paths: Sequence[Path], part: int, columns: list[str], col: str = "part") -> pa.Table:
    """The rows of one partition of files written by `_write_parts`: only the row groups whose
    statistics say they hold it are read (one row group per partition value)."""
    tables = []
    for path in paths:
        pf = pq.ParquetFile(path)
        ci = pf.schema_arrow.get_field_index(col)
        groups = []
        for g in range(pf.metadata.num_row_groups):
            stats = pf.metadata.row_group(g).column(ci).statistics
            if stats is None or not stats.has_min_max or stats.min <= part <= stats.max:
                groups.append(g)
        t = pf.read_row_groups(groups, columns=columns + [col]) if groups else pf.schema_arrow.empty_table()
        t = t.filter(pc.equal(t.column(col), part)).select(columns)
        tables.append(t)
    return pa.concat_tables(tables) if tables else None


def _stage_files(stage: Path) -> list[Path]:
    """A stage's output files (every job of a stage has finished before the next stage starts)."""
    return sorted(stage.glob("*.parquet"))


def _file_of(gid: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return np.searchsorted(offsets, gid, side="right") - 1


RANK = ["source", "offset", "doc_id", "gid"]  # the survivor rule: lowest of these, in this order


# ---------------------------------------------------------------------------------------------
# stage jobs (module-level functions of plain arguments: any executor can run them)


def scatter_job(g: int, files: list[tuple[str, int]], stages: str, parts: tuple[int, int, int], cfg) -> dict:
    """A group of signature files ((path, first row) each): rows by exact-key hash (with their band
    keys), and ids by id hash."""
    out = Path(stages) / "scatter" / f"g{g:06d}.parquet"
    if (info := _done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    x, _, p = parts
    width = signature_width(dc)
    tables, id_tables = [], []
    for sig_path, offset in files:
        table = _read_table(sig_path)
        n = table.num_rows
        gid = np.arange(offset, offset + n, dtype=np.int64)
        idp = id_partition(table.column("doc_id").to_pylist(), p)
        hi = table.column("exact_hi").to_numpy()
        cols = {
            "part": pa.array((hi % np.uint64(x)).astype(np.int32)),
            "gid": pa.array(gid),
            "exact_hi": table.column("exact_hi"),
            "exact_lo": table.column("exact_lo"),
            "n_shingles": table.column("n_shingles"),
            "source": table.column("source"),
            "offset": table.column("offset"),
            "doc_id": table.column("doc_id"),
            "idpart": pa.array(idp),
        }
        if width:
            bands, rows = bands_rows(dc)
            keys = band_keys(signature_matrix(table, width), bands, rows)
            cols["keys"] = pa.FixedSizeListArray.from_arrays(pa.array(keys.ravel()), bands)
        tables.append(pa.table(cols))
        id_tables.append(
            pa.table({"part": pa.array(idp), "gid": pa.array(gid), "doc_id": table.column("doc_id")})
        )
    written = _write_parts(out, pa.concat_tables(tables))
    written += _write_parts(Path(stages) / "ids" / f"g{g:06d}.parquet", pa.concat_tables(id_tables))
    return _finish(out, {"docs": sum(t.num_rows for t in tables), "bytes": written})


def exact_job(h: int, stages: str, parts: tuple[int, int, int], cfg) -> dict:
    """One exact-key partition: exact duplicates (survivor: lowest rank), band keys of the rest."""
    out = Path(stages) / "exact" / f"h{h:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    _, ranges, _ = parts
    width = signature_width(dc)
    cols = ["gid", "exact_hi", "exact_lo", "n_shingles", "source", "offset", "doc_id", "idpart"]
    t = _read_part(_stage_files(Path(stages) / "scatter"), h, cols + (["keys"] if width else []))
    # groups by key with numpy; the string sort fields are sorted only within groups of two or more
    hi, lo = t.column("exact_hi").to_numpy(), t.column("exact_lo").to_numpy()
    order = np.lexsort((lo, hi))
    shi, slo = hi[order], lo[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (shi[1:] != shi[:-1]) | (slo[1:] != slo[:-1])
    sizes = np.diff(np.append(np.flatnonzero(starts), len(order)))
    multi = order[np.repeat(sizes > 1, sizes)] if dc.exact else order[:0]
    g = t.take(pa.array(multi)).append_column("pos", pa.array(multi))
    g = g.sort_by([("exact_hi", "ascending"), ("exact_lo", "ascending")] + [(c, "ascending") for c in RANK])
    ghi, glo = g.column("exact_hi").to_numpy(), g.column("exact_lo").to_numpy()
    first = np.ones(g.num_rows, dtype=bool)
    first[1:] = (ghi[1:] != ghi[:-1]) | (glo[1:] != glo[:-1])
    survivor = np.maximum.accumulate(np.where(first, np.arange(g.num_rows), 0))
    gdup = ~first
    dup = np.zeros(t.num_rows, dtype=bool)
    dup[g.column("pos").to_numpy()[gdup]] = True
    removed = g.filter(pa.array(gdup)).select(["gid", "doc_id", "exact_hi", "exact_lo", "source", "offset"])
    removed = removed.append_column("survivor_id", g.column("doc_id").take(pa.array(survivor[gdup])))
    removed = removed.append_column("part", g.column("idpart").filter(pa.array(gdup)))
    written = _write_parts(out, removed)
    if width:
        bands, _ = bands_rows(dc)
        active = ~dup & (t.column("n_shingles").to_numpy() > 0)
        keys = t.column("keys").combine_chunks().flatten().to_numpy().reshape(-1, bands)[active]
        gid = t.column("gid").to_numpy()[active]
        idpart = t.column("idpart").to_numpy()[active]
        q = key_range(keys, ranges).astype(np.int32) + np.arange(bands, dtype=np.int32) * ranges
        band_rows = pa.table(
            {
                "part": pa.array(q.ravel()),
                "key": pa.array(keys.ravel()),
                "gid": pa.array(np.repeat(gid, bands)),
                "idpart": pa.array(np.repeat(idpart, bands)),
            }
        )
        written += _write_parts(Path(stages) / "bands" / f"h{h:05d}.parquet", band_rows)
    return _finish(out, {"docs": t.num_rows, "exact_duplicates": int(dup.sum()), "bytes": written})


def bucket_job(q: int, stages: str, cfg) -> dict:
    """One (band, key range): candidate pairs of documents sharing a band key, by id partition."""
    out = Path(stages) / "pairs" / f"q{q:06d}.parquet"
    if (info := _done(out)) is not None:
        return info
    t = _read_part(_stage_files(Path(stages) / "bands"), q, ["key", "gid", "idpart"])
    gid = t.column("gid").to_numpy()
    pairs = bucket_pairs(t.column("key").to_numpy(), gid)
    order = np.argsort(gid, kind="stable")
    idpart = t.column("idpart").to_numpy()
    part_of = idpart[order][np.searchsorted(gid[order], pairs.ravel())].reshape(-1, 2)
    # each pair under both ends' id partitions (role 0: as its first document, 1: as its second),
    # so every later job reads only its own partition of these files
    table = pa.table(
        {
            "part": pa.array(np.concatenate((part_of[:, 0], part_of[:, 1]))),
            "role": pa.array(np.repeat(np.array([0, 1], dtype=np.int8), len(pairs))),
            "a": pa.array(np.concatenate((pairs[:, 0], pairs[:, 0]))),
            "b": pa.array(np.concatenate((pairs[:, 1], pairs[:, 1]))),
            "apart": pa.array(np.concatenate((part_of[:, 0], part_of[:, 0]))),
            "bpart": pa.array(np.concatenate((part_of[:, 1], part_of[:, 1]))),
        }
    )
    return _finish(out, {"rows": t.num_rows, "pairs": len(pairs), "bytes": _write_parts(out, table)})


def _pairs_of(stages: Path, p: int) -> np.ndarray:
    """Unique candidate pairs (a, b, bpart) whose first document is in id partition p."""
    t = _read_part(_stage_files(stages / "pairs"), p, ["role", "a", "b", "bpart"])
    t = t.filter(pc.equal(t.column("role"), 0))
    arr = np.stack([t.column(c).to_numpy() for c in ("a", "b", "bpart")], axis=1).astype(np.int64)
    return np.unique(arr, axis=0) if len(arr) else arr.reshape(0, 3)


def _group_of(gid: np.ndarray, offsets: np.ndarray, groups: int) -> np.ndarray:
    """Which group of consecutive signature files holds each row (fetch jobs read one group each)."""
    files = len(offsets) - 1
    return (_file_of(gid, offsets) * groups // max(files, 1)).astype(np.int32)


def request_job(p: int, stages: str, offsets: list[int], groups: int) -> dict:
    """Id partition p: its candidate documents' rows, by the file group that holds them."""
    out = Path(stages) / "requests" / f"p{p:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    t = _read_part(_stage_files(Path(stages) / "pairs"), p, ["role", "a", "b"])
    role = t.column("role").to_numpy()
    gids = np.unique(np.where(role == 0, t.column("a").to_numpy(), t.column("b").to_numpy())).astype(np.int64)
    group = _group_of(gids, np.asarray(offsets, dtype=np.int64), groups)
    table = pa.table(
        {"part": pa.array(group), "gid": pa.array(gids), "idpart": pa.array(np.full(len(gids), p, np.int32))}
    )
    return _finish(out, {"candidates": len(gids), "bytes": _write_parts(out, table)})


FETCH_COLUMNS = ["doc_id", "source", "offset", "exact_hi", "exact_lo", "signature"]


def fetch_job(g: int, stages: str, sig_paths: list[str], offsets: list[int], groups: int) -> dict:
    """File group g: the requested rows of its signature files (each file read once), by id partition."""
    out = Path(stages) / "fetched" / f"g{g:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    t = _read_part(_stage_files(Path(stages) / "requests"), g, ["gid", "idpart"]).sort_by(
        [("gid", "ascending")]
    )
    gids = t.column("gid").to_numpy()
    offs = np.asarray(offsets, dtype=np.int64)
    files = _file_of(gids, offs)
    parts = []
    for f in np.unique(files).tolist():
        rows = _read_table(sig_paths[f], columns=FETCH_COLUMNS)
        parts.append(rows.take(pa.array(gids[files == f] - offs[f])))
    if not parts:  # nothing requested here: an empty table of the same schema
        parts.append(_read_table(sig_paths[0], columns=FETCH_COLUMNS).slice(0, 0))
    rows = pa.concat_tables(parts)
    rows = rows.append_column("gid", pa.array(gids)).append_column("part", t.column("idpart"))
    return _finish(out, {"rows": rows.num_rows, "bytes": _write_parts(out, rows)})


def candidates_job(p: int, stages: str, text_files: list[str] | None, cfg) -> dict:
    """One id partition of the candidate documents: sort fields, signature and (exact mode) shingle set."""
    out = Path(stages) / "cands" / f"p{p:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    t = _read_part(_stage_files(Path(stages) / "fetched"), p, FETCH_COLUMNS + ["gid"]).sort_by(
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
    info["bytes"] = _write_table(out, table)
    return _finish(out, info)


class _Cands:
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


def _load_cands(stages: Path, p: int, width: int) -> _Cands:
    return _Cands(_read_table(stages / "cands" / f"p{p:05d}.parquet", columns=CAND_COLUMNS), width)


CAND_COLUMNS = ["gid", "signature", "shingles"]


def _ship_requests(stages: Path, q: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(gid, destination partition) of the candidates of id partition q that other partitions'
    jobs of stage `kind` compare against: for verify, the second documents of pairs whose first
    document is elsewhere; for similarity, the survivors of removals elsewhere."""
    if kind == "verify":
        t = _read_part(_stage_files(stages / "pairs"), q, ["role", "b", "apart"])
        t = t.filter(pc.equal(t.column("role"), 1))
        gid, dest = t.column("b").to_numpy(), t.column("apart").to_numpy()
    else:
        t = _read_part(_stage_files(stages / "kept"), q, ["survivor", "part"], col="kpart")
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
    if (info := _done(out)) is not None:
        return info
    gids, dest = _ship_requests(st, q, kind)
    cands = _read_table(st / "cands" / f"p{q:05d}.parquet", columns=CAND_COLUMNS)
    have = cands.column("gid").to_numpy()
    order = np.argsort(have, kind="stable")
    i = order[np.searchsorted(have, gids, sorter=order)] if len(have) else np.zeros(0, np.int64)
    if len(gids) and not np.array_equal(have[i], gids):
        raise DataIntegrityError(
            "a candidate document is missing from its partition's candidate file",
            "delete the run's work/dedup folder and run oreline data again",
        )
    table = cands.take(pa.array(i, pa.int64())).append_column("part", pa.array(dest, pa.int32()))
    return _finish(out, {"rows": table.num_rows, "bytes": _write_parts(out, table)})


def _similarities(
    stages: Path, p: int, pairs: np.ndarray, width: int, kind: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimates as the reference rounds them, similarities, exact?) of pairs (a, b, bpart), a in
    partition p: b from p's own candidates, or from the rows shipped to p for stage `kind`."""
    mine = _load_cands(stages, p, width)
    ia = mine.index(pairs[:, 0])
    est = np.empty(len(pairs), dtype=np.float32)
    sims = np.empty(len(pairs), dtype=np.float64)
    exact = np.zeros(len(pairs), dtype=bool)
    local = pairs[:, 2] == p
    shipped = None
    if not local.all():
        shipped = _Cands(_read_part(_stage_files(stages / "ship" / kind), p, CAND_COLUMNS), width)
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
    if (info := _done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    st = Path(stages)
    pairs = _pairs_of(st, p)
    est, sims, exact = _similarities(st, p, pairs, signature_width(dc), "verify")
    keep = np.ones(len(pairs), dtype=bool) if verify_mode(dc) == "none" else sims >= dc.threshold
    edges = pa.table({"a": pa.array(pairs[keep, 0]), "b": pa.array(pairs[keep, 1])})
    info = {"candidate_pairs": len(pairs), "verified_pairs": int(keep.sum())}
    info.update(pair_stats(exact, est, sims, dc.threshold))
    info["bytes"] = _write_table(out, edges)
    return _finish(out, info)


def _pick_survivors(t: pa.Table, ids: int) -> tuple[pa.Table, int]:
    """(removals, components) from touched documents (gid, label, sort fields): per label, the
    lowest (source, offset, doc_id, gid) survives; removals carry the id partitions of both ends."""
    t = t.sort_by([("label", "ascending")] + [(c, "ascending") for c in RANK])
    lab = t.column("label").to_numpy()
    first = np.concatenate(([True], lab[1:] != lab[:-1])) if len(lab) else np.zeros(0, bool)
    survivor = np.maximum.accumulate(np.where(first, np.arange(len(lab)), 0))
    gid = t.column("gid").to_numpy()
    doc_ids = t.column("doc_id")
    removed = pa.table(
        {
            "gid": pa.array(gid[~first]),
            "survivor": pa.array(gid[survivor[~first]]),
            "doc_id": doc_ids.filter(pa.array(~first)),
            "survivor_id": doc_ids.take(pa.array(survivor[~first])),
        }
    )
    removed = removed.append_column("part", pa.array(id_partition(removed.column("doc_id").to_pylist(), ids)))
    kpart = id_partition(removed.column("survivor_id").to_pylist(), ids)
    return removed.append_column("kpart", pa.array(kpart)), int(first.sum())


def _write_kept(path: Path, removed: pa.Table) -> int:
    """The removals by their survivor's id partition (kpart): the similarity stage's shipping
    requests, so the ship job of a partition reads only the rows that name its survivors."""
    return _write_parts(path, removed.select(["kpart", "survivor", "part"]), col="kpart")


def _sort_fields_of(stages: Path, ids: int, nodes: np.ndarray) -> pa.Table:
    """(gid, doc_id, source, offset) of the given candidate documents, sorted by gid."""
    keys = []
    for p in range(ids):
        t = _read_table(stages / "cands" / f"p{p:05d}.parquet", columns=["gid", "doc_id", "source", "offset"])
        keys.append(t.filter(pc.is_in(t.column("gid"), value_set=pa.array(nodes))))
    t = pa.concat_tables(keys).sort_by([("gid", "ascending")])
    if not np.array_equal(t.column("gid").to_numpy(), nodes):
        raise DataIntegrityError(
            "a document on a verified edge is missing from the candidate files",
            "delete the run's work/dedup folder and run oreline data again",
        )
    return t


def components_job(stages: str, ids: int, cfg) -> dict:
    """Connected components of every verified edge in one job (memory: the edges and the
    documents on them); each component's survivor is its lowest rank."""
    out = Path(stages) / "near" / "near.parquet"
    if (info := _done(out)) is not None:
        return info
    st = Path(stages)
    edges = [_read_table(f) for f in _stage_files(st / "edges")]
    e = np.stack([np.concatenate([t.column(c).to_numpy() for t in edges]) for c in ("a", "b")], axis=1)
    nodes, labels = components(e)
    t = _sort_fields_of(st, ids, nodes).append_column("label", pa.array(labels))
    removed, clusters = _pick_survivors(t, ids)
    info = {"edges": len(e), "touched": len(nodes), "near_duplicates": removed.num_rows, "clusters": clusters}
    info["bytes"] = _write_kept(st / "kept" / "near.parquet", removed) + _write_parts(out, removed)
    return _finish(out, info)


# large-star / small-star rounds (components.py) as jobs over node partitions, for edge sets
# larger than one node: round r reads r{r}-L (directed edges by their first node's partition)


def _node_part(x: np.ndarray, parts: int) -> np.ndarray:
    return (splitmix(np.asarray(x).astype(np.uint64)) % np.uint64(parts)).astype(np.int32)


def _directed(a: np.ndarray, b: np.ndarray, parts: int) -> pa.Table:
    keep = a != b
    u = np.concatenate((a[keep], b[keep])).astype(np.int64)
    v = np.concatenate((b[keep], a[keep])).astype(np.int64)
    return pa.table({"part": pa.array(_node_part(u, parts)), "u": pa.array(u), "v": pa.array(v)})


def star_init_job(p: int, stages: str, parts: int) -> dict:
    """The verified edges of id partition p, both directions, by node partition (round 0's input)."""
    out = Path(stages) / "star" / "r000-L" / f"p{p:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    t = _read_table(Path(stages) / "edges" / f"p{p:05d}.parquet")
    table = _directed(t.column("a").to_numpy(), t.column("b").to_numpy(), parts)
    return _finish(out, {"bytes": _write_parts(out, table)})


def large_star_job(r: int, q: int, stages: str, parts: int) -> dict:
    """Round r, node partition q: the fingerprint of the round's edges, every node's m(u) =
    min(u, N(u)) (the labels once the edges stop changing), and large-star's edges for small-star."""
    st = Path(stages) / "star"
    out = st / f"r{r:03d}-S" / f"p{q:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    t = _read_part(_stage_files(st / f"r{r:03d}-L"), q, ["u", "v"])
    e = np.stack([t.column("u").to_numpy(), t.column("v").to_numpy()], axis=1).astype(np.int64)
    e = np.unique(e, axis=0) if len(e) else e.reshape(0, 2)
    u, v = e[:, 0], e[:, 1]
    low = u < v  # each undirected edge once: at its smaller end, which lives in one partition
    with np.errstate(over="ignore"):
        fp = int(
            np.sum(splitmix(splitmix(u[low].astype(np.uint64)) ^ v[low].astype(np.uint64)), dtype=np.uint64)
        )
    nodes, m = group_min(u, v)
    labels = pa.table({"part": pa.array(_node_part(m, parts)), "node": pa.array(nodes), "label": pa.array(m)})
    written = _write_parts(st / f"r{r:03d}-labels" / f"p{q:05d}.parquet", labels)
    mu = m[np.searchsorted(nodes, u)]
    big = (v > u) & (v != mu)
    hi, lo = np.maximum(v[big], mu[big]), np.minimum(v[big], mu[big])
    table = pa.table({"part": pa.array(_node_part(hi, parts)), "hi": pa.array(hi), "lo": pa.array(lo)})
    written += _write_parts(out, table)
    return _finish(out, {"edges": int(low.sum()), "fingerprint": fp, "bytes": written})


def small_star_job(r: int, q: int, stages: str, parts: int) -> dict:
    """Round r, node partition q: small-star over the edges whose larger end is in q → round r+1's input."""
    st = Path(stages) / "star"
    out = st / f"r{r + 1:03d}-L" / f"p{q:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    t = _read_part(_stage_files(st / f"r{r:03d}-S"), q, ["hi", "lo"])
    hi, lo = t.column("hi").to_numpy().astype(np.int64), t.column("lo").to_numpy().astype(np.int64)
    nodes, m = group_min(hi, lo)
    mu = m[np.searchsorted(nodes, hi)]
    table = _directed(np.concatenate((lo, nodes)), np.concatenate((mu, m)), parts)
    return _finish(out, {"bytes": _write_parts(out, table)})


def star_pick_job(q: int, r: int, stages: str, parts: int, ids: int) -> dict:
    """Label partition q of the converged round r: each component's survivor and removals."""
    st = Path(stages)
    out = st / "near" / f"q{q:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    t = _read_part(_stage_files(st / "star" / f"r{r:03d}-labels"), q, ["node", "label"])
    t = t.sort_by([("node", "ascending")])
    nodes = t.column("node").to_numpy()
    fields = _sort_fields_of(st, ids, nodes).append_column("label", t.column("label"))
    removed, clusters = _pick_survivors(fields, ids)
    info = {"touched": len(nodes), "near_duplicates": removed.num_rows, "clusters": clusters}
    info["bytes"] = _write_kept(Path(stages) / "kept" / f"q{q:05d}.parquet", removed) + _write_parts(
        out, removed
    )
    return _finish(out, info)


MAX_STAR_ROUNDS = 64


def _star_components(executor, st: str, ids: int, parts: int) -> dict:
    """Components by large-star/small-star rounds until the edge set stops changing."""
    _run(executor, star_init_job, [(p, st, parts) for p in range(ids)], "dedup:star")
    previous = None
    for r in range(MAX_STAR_ROUNDS):
        res = _run(executor, large_star_job, [(r, q, st, parts) for q in range(parts)], "dedup:star")
        fingerprint = (sum(x["edges"] for x in res), sum(x["fingerprint"] for x in res) % 2**64)
        if fingerprint == previous:  # round r's edges are round r-1's: a fixed point, labels final
            picked = _run(
                executor, star_pick_job, [(q, r, st, parts, ids) for q in range(parts)], "dedup:star"
            )
            return {
                "near_duplicates": sum(x["near_duplicates"] for x in picked),
                "clusters": sum(x["clusters"] for x in picked),
                "star_rounds": r,
            }
        previous = fingerprint
        _run(executor, small_star_job, [(r, q, st, parts) for q in range(parts)], "dedup:star")
    raise DataIntegrityError(
        f"large-star/small-star did not converge in {MAX_STAR_ROUNDS} rounds",
        "report this with the run's work/dedup folder; meanwhile set fewer verified edges (raise data.dedup.threshold)",
    )


def similarity_job(p: int, stages: str, cfg) -> dict:
    """Similarity of each near-duplicate of id partition p to its survivor (exact when both texts were read)."""
    out = Path(stages) / "similarity" / f"p{p:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    st = Path(stages)
    t = _read_part(_stage_files(st / "near"), p, ["gid", "survivor", "kpart", "doc_id", "survivor_id"])
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
    return _finish(out, {"near_duplicates": t.num_rows, "bytes": _write_table(out, table)})


def _last_per_id(t: pa.Table) -> dict[str, str]:
    """{doc_id: survivor_id} of the last row per id (the reference's dict keeps the last assignment)."""
    return dict(zip(t.column("doc_id").to_pylist(), t.column("survivor_id").to_pylist(), strict=True))


def assign_job(p: int, stages: str, offsets: list[int], keeper_order: list[int], group_of: list[int]) -> dict:
    """Id partition p: which rows of which input file to drop, and why (the reference's `split_by_file`)."""
    out = Path(stages) / "assign" / f"p{p:05d}.parquet"
    if (info := _done(out)) is not None:
        return info
    st = Path(stages)
    exact = _read_part(
        _stage_files(st / "exact"),
        p,
        ["gid", "doc_id", "survivor_id", "exact_hi", "exact_lo", "source", "offset"],
    )
    # the reference iterates exact removals by (key, rank) and near ones by row: the last one wins
    exact = exact.sort_by(
        [("exact_hi", "ascending"), ("exact_lo", "ascending")] + [(c, "ascending") for c in RANK]
    )
    plan = {d: ("dedup:exact", k) for d, k in _last_per_id(exact).items()}
    near_path = st / "similarity" / f"p{p:05d}.parquet"
    if near_path.is_file():
        near = _read_table(near_path, columns=["gid", "doc_id", "survivor_id"]).sort_by(
            [("gid", "ascending")]
        )
        plan.update({d: ("dedup:near_dup", k) for d, k in _last_per_id(near).items()})
    ids = _read_part(_stage_files(st / "ids"), p, ["gid", "doc_id"]).sort_by([("gid", "ascending")])
    gid = ids.column("gid").to_numpy()
    doc_ids = ids.column("doc_id").to_pylist()
    offs = np.asarray(offsets, dtype=np.int64)
    files = _file_of(gid, offs)
    order = np.asarray(keeper_order, dtype=np.int64)
    keeper: dict[str, int] = {}
    for d, f in zip(doc_ids, files.tolist(), strict=True):
        if d in plan and (d not in keeper or order[f] < order[keeper[d]]):
            keeper[d] = f
    rows: dict[str, list] = {"part": [], "file": [], "row": [], "doc_id": [], "reason": [], "survivor_id": []}
    for g, d, f in zip(gid.tolist(), doc_ids, files.tolist(), strict=True):
        removal = plan.get(d)
        if removal is not None and not (removal[1] == d and keeper[d] == f):
            for k, v in zip(rows, (group_of[f], f, g - int(offs[f]), d, *removal), strict=True):
                rows[k].append(v)
    table = pa.table(
        {
            "part": pa.array(rows["part"], pa.int32()),
            "file": pa.array(rows["file"], pa.int32()),
            "row": pa.array(rows["row"], pa.int64()),
            "doc_id": pa.array(rows["doc_id"], pa.string()),
            "reason": pa.array(rows["reason"], pa.string()),
            "survivor_id": pa.array(rows["survivor_id"], pa.string()),
        }
    )
    return _finish(out, {"removed_rows": table.num_rows, "bytes": _write_parts(out, table)})


def list_job(g: int, stages: str, files: list[tuple[int, str]]) -> dict:
    """The removal lists of a group of input files ((file, list path) each), {doc_id: [reason,
    survivor_id]}, as phase 3 reads them."""
    done = Path(stages) / "lists" / f"g{g:06d}"
    if (info := _done(done)) is not None:
        return info
    t = _read_part(
        _stage_files(Path(stages) / "assign"), g, ["file", "row", "doc_id", "reason", "survivor_id"]
    )
    t = t.sort_by([("file", "ascending"), ("row", "ascending")])
    lists: dict[int, dict[str, list[str]]] = {f: {} for f, _ in files}
    cols = (t.column(c).to_pylist() for c in ("file", "doc_id", "reason", "survivor_id"))
    for f, d, r, k in zip(*cols, strict=True):
        lists[f].setdefault(d, [r, k])
    for f, path in files:
        write_json_atomic(Path(path), lists[f])
    return _finish(done, {"removed": sum(len(x) for x in lists.values())})


def file_groups(counts: Sequence[int], docs: int) -> list[int]:
    """Group of each signature file: consecutive files until a group holds `docs` documents, so
    the per-file stages (scatter, lists) run jobs of a useful size whatever the tasks' size."""
    groups, g, filled = [], 0, 0
    for n in counts:
        if filled and filled + n > docs:
            g, filled = g + 1, 0
        groups.append(g)
        filled += n
    return groups


# ---------------------------------------------------------------------------------------------
# orchestration


def _run(executor, fn, jobs: list[tuple], label: str) -> list[dict]:
    from oreline.executors.interface import TaskCrashed

    results = executor.map(fn, jobs, label=label) if jobs else []
    crashed = [r for r in results if isinstance(r, TaskCrashed)]
    if crashed:
        raise DataIntegrityError(
            f"dedup stage {label}: {len(crashed)} job(s) crashed their worker twice ({crashed[0].error})",
            "run the same command again: finished jobs are kept and the crashed ones retried",
        )
    return results


def _merge_read_stats(parts: list[dict]) -> dict:
    from oreline.data.dedup.verify import MAX_EXAMPLES

    out: dict[str, Any] = {}
    examples: dict[str, list[str]] = {}
    for r in parts:
        for k, v in r.items():
            if k.endswith("_examples"):
                examples.setdefault(k, []).extend(v)
            else:
                out[k] = out.get(k, 0) + v
    for k, v in examples.items():
        out[k] = sorted(set(v))[:MAX_EXAMPLES]
    return out


def staged_plan(
    signature_paths: Sequence[str | Path],
    out_dir: str | Path,
    cfg: Any,
    executor,
    text_files: Sequence[str | Path] | None = None,
    list_paths: Sequence[str | Path] | None = None,
    keeper_order: Sequence[int] | None = None,
    partitions: Partitions | None = None,
) -> dict[str, Any]:
    """The dedup plan as stages of jobs through `executor`; returns the stats (also dedup_stats.json).

    Writes out_dir/removals.parquet and out_dir/dedup_stats.json like `dedup_plan` (the same rows,
    ordered by kind, then partition and row), its stage files under out_dir/stages, and, when `list_paths` is
    given (one per signature path, in the given order), each input file's removal list there
    (`split_by_file`'s content; `keeper_order`: the files' positions in the run's input order).
    text_files: the Parquet documents (id, text) exact verification reads candidates' texts from.
    """
    dc = dedup_config(cfg)
    out_dir = Path(out_dir)
    stages = out_dir / "stages"
    given = [str(p) for p in signature_paths]
    order = sorted(range(len(given)), key=lambda i: given[i])
    sig_paths = [given[i] for i in order]
    if not sig_paths:
        raise InputError("the dedup plan was given no signature files", "run phase 1 (oreline data) first")
    counts = [check_signature_file(p, dc) for p in sig_paths]
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64).tolist()
    docs = offsets[-1]
    parts = partitions or Partitions.for_docs(docs)
    pt = (parts.exact, parts.ranges, parts.ids)
    texts = [str(p) for p in text_files] if text_files is not None else None
    st = str(stages)

    group_of = file_groups(counts, parts.group_docs)
    members: list[list[int]] = [[] for _ in range(group_of[-1] + 1)]
    for f, g in enumerate(group_of):
        members[g].append(f)
    sj = [(g, [(sig_paths[f], offsets[f]) for f in fs], st, pt, dc) for g, fs in enumerate(members)]
    _run(executor, scatter_job, sj, "dedup:scatter")
    ex = _run(executor, exact_job, [(h, st, pt, dc) for h in range(parts.exact)], "dedup:exact")
    stats: dict[str, Any] = {
        "docs": docs,
        "signature_files": len(sig_paths),
        "exact_duplicates": sum(r["exact_duplicates"] for r in ex),
    }
    minhash = bool(dc.minhash and dc.num_perm)
    if minhash:
        bands, rows = bands_rows(dc)
        _run(executor, bucket_job, [(q, st, dc) for q in range(bands * parts.ranges)], "dedup:buckets")
        groups = min(len(sig_paths), parts.ids)
        _run(executor, request_job, [(p, st, offsets, groups) for p in range(parts.ids)], "dedup:requests")
        fj = [(g, st, sig_paths, offsets, groups) for g in range(groups)]
        _run(executor, fetch_job, fj, "dedup:fetch")
        cj = [(p, st, texts, dc) for p in range(parts.ids)]
        cands = _run(executor, candidates_job, cj, "dedup:candidates")
        _run(executor, ship_job, [(q, st, "verify") for q in range(parts.ids)], "dedup:ship-verify")
        ver = _run(executor, verify_job, [(p, st, dc) for p in range(parts.ids)], "dedup:verify")
        mode = verify_mode(dc)
        stats.update(bands=bands, rows=rows, threshold=dc.threshold, verify=mode)
        if mode == "exact" and texts is not None:
            stats.update(_merge_read_stats([c["read"] for c in cands]))
            for k in (
                "exact_verified_pairs",
                "signature_verified_pairs",
                "estimate_above_exact_below",
                "estimate_below_exact_above",
            ):
                stats[k] = sum(v[k] for v in ver)
        elif mode == "exact":
            stats.update(_NO_TEXT)
        candidate_pairs = sum(v["candidate_pairs"] for v in ver)
        verified = sum(v["verified_pairs"] for v in ver)
        stats.update(
            candidate_pairs=candidate_pairs,
            verified_pairs=verified,
            rejected_pairs=candidate_pairs - verified,
        )
        star = parts.star or (parts.ids if verified > STAR_EDGES else 0)
        if star:
            comp = _star_components(executor, st, parts.ids, star)
        else:
            comp = _run(executor, components_job, [(st, parts.ids, dc)], "dedup:components")[0]
        sh = [(q, st, "similarity") for q in range(parts.ids)]
        _run(executor, ship_job, sh, "dedup:ship-similarity")
        _run(executor, similarity_job, [(p, st, dc) for p in range(parts.ids)], "dedup:similarity")
        stats["clusters"] = comp["clusters"]
        stats["near_duplicates"] = comp["near_duplicates"]
    else:
        stats["near_duplicates"] = 0
    if list_paths is not None:
        keep = list(keeper_order) if keeper_order is not None else list(range(len(given)))
        keep = [keep[i] for i in order]
        lists = [str(list_paths[i]) for i in order]
        aj = [(p, st, offsets, keep, group_of) for p in range(parts.ids)]
        _run(executor, assign_job, aj, "dedup:assign")
        lj = [(g, st, [(f, lists[f]) for f in fs]) for g, fs in enumerate(members)]
        _run(executor, list_job, lj, "dedup:lists")
    _write_removals(stages, out_dir / "removals.parquet", minhash)
    write_json_atomic(out_dir / "dedup_stats.json", stats)
    return stats


def _write_removals(stages: Path, path: Path, minhash: bool) -> None:
    """removals.parquet from the partition files, one partition in memory at a time."""

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, REMOVALS_SCHEMA) as w:
            for f in _stage_files(stages / "exact"):
                t = _read_table(f, columns=["gid", "doc_id", "survivor_id"]).sort_by([("gid", "ascending")])
                n = t.num_rows
                w.write_table(
                    pa.table(
                        {
                            "doc_id": t.column("doc_id"),
                            "reason": pa.array(["dedup:exact"] * n, pa.string()),
                            "survivor_id": t.column("survivor_id"),
                            "similarity": pa.array(np.ones(n, np.float32)),
                            "similarity_method": pa.array(["exact_text"] * n, pa.string()),
                        },
                        schema=REMOVALS_SCHEMA,
                    )
                )
            for f in _stage_files(stages / "similarity") if minhash else []:
                w.write_table(_read_table(f, columns=REMOVALS_SCHEMA.names).cast(REMOVALS_SCHEMA))

    write_with(path, write)
