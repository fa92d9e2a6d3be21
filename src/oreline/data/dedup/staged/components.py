"""Connected components of the verified edges and each component's survivor: one job when the
edges fit one node, else large-star / small-star rounds as jobs over node partitions (the
algorithm of oreline.data.dedup.components; staged/plan.py runs the rounds until the edge set
stops changing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from oreline.data.dedup.components import components, group_min
from oreline.data.dedup.shingles import splitmix
from oreline.data.dedup.staged.layout import (
    RANK,
    done,
    finish,
    id_partition,
    read_part,
    read_table,
    stage_files,
    write_parts,
)
from oreline.errors import DataIntegrityError


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
    return write_parts(path, removed.select(["kpart", "survivor", "part"]), col="kpart")


SORT_FIELDS = ["gid", "doc_id", "source", "offset"]


def _sort_fields_among(tables: list[pa.Table], nodes: np.ndarray) -> pa.Table:
    """(gid, doc_id, source, offset) of the documents `nodes` (sorted gids), sorted by gid, from
    candidate rows that hold each of them once."""
    keys = [t.filter(pc.is_in(t.column("gid"), value_set=pa.array(nodes))) for t in tables]
    t = pa.concat_tables(keys).sort_by([("gid", "ascending")])
    if not np.array_equal(t.column("gid").to_numpy(), nodes):
        raise DataIntegrityError(
            "a document on a verified edge is missing from the candidate files",
            "delete the run's work/dedup folder and run oreline data again",
        )
    return t


def _sort_fields_of(stages: Path, ids: int, nodes: np.ndarray) -> pa.Table:
    """(gid, doc_id, source, offset) of the given candidate documents, sorted by gid: every
    candidates file read once (the one components job)."""
    cands = [read_table(stages / "cands" / f"p{p:05d}.parquet", columns=SORT_FIELDS) for p in range(ids)]
    return _sort_fields_among(cands, nodes)


def components_job(stages: str, ids: int, cfg) -> dict:
    """Connected components of every verified edge in one job (memory: the edges and the
    documents on them); each component's survivor is its lowest rank."""
    out = Path(stages) / "near" / "near.parquet"
    if (info := done(out)) is not None:
        return info
    st = Path(stages)
    edges = [read_table(f) for f in stage_files(st / "edges")]
    e = np.stack([np.concatenate([t.column(c).to_numpy() for t in edges]) for c in ("a", "b")], axis=1)
    nodes, labels = components(e)
    t = _sort_fields_of(st, ids, nodes).append_column("label", pa.array(labels))
    removed, clusters = _pick_survivors(t, ids)
    info = {"edges": len(e), "touched": len(nodes), "near_duplicates": removed.num_rows, "clusters": clusters}
    info["bytes"] = _write_kept(st / "kept" / "near.parquet", removed) + write_parts(out, removed)
    return finish(out, info)


def _node_part(x: np.ndarray, parts: int) -> np.ndarray:
    return (splitmix(np.asarray(x).astype(np.uint64)) % np.uint64(parts)).astype(np.int32)


def _directed(a: np.ndarray, b: np.ndarray, parts: int) -> pa.Table:
    keep = a != b
    u = np.concatenate((a[keep], b[keep])).astype(np.int64)
    v = np.concatenate((b[keep], a[keep])).astype(np.int64)
    return pa.table({"part": pa.array(_node_part(u, parts)), "u": pa.array(u), "v": pa.array(v)})


def star_init_job(p: int, stages: str, parts: int) -> dict:
    """The verified edges of id partition p, both directions, by node partition (round 0's input),
    and its candidates' sort fields by node partition (what label_fields_job reads once the rounds
    converge)."""
    st = Path(stages)
    out = st / "star" / "r000-L" / f"p{p:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    fields = read_table(st / "cands" / f"p{p:05d}.parquet", columns=SORT_FIELDS)
    fields = fields.append_column("part", pa.array(_node_part(fields.column("gid").to_numpy(), parts)))
    written = write_parts(st / "star" / "fields" / f"p{p:05d}.parquet", fields)
    t = read_table(st / "edges" / f"p{p:05d}.parquet")
    table = _directed(t.column("a").to_numpy(), t.column("b").to_numpy(), parts)
    return finish(out, {"bytes": written + write_parts(out, table)})


def large_star_job(r: int, q: int, stages: str, parts: int) -> dict:
    """Round r, node partition q: the fingerprint of the round's edges, every node's m(u) =
    min(u, N(u)) (the labels once the edges stop changing), and large-star's edges for small-star."""
    st = Path(stages) / "star"
    out = st / f"r{r:03d}-S" / f"p{q:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    t = read_part(stage_files(st / f"r{r:03d}-L"), q, ["u", "v"])
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
    written = write_parts(st / f"r{r:03d}-labels" / f"p{q:05d}.parquet", labels)
    mu = m[np.searchsorted(nodes, u)]
    big = (v > u) & (v != mu)
    hi, lo = np.maximum(v[big], mu[big]), np.minimum(v[big], mu[big])
    table = pa.table({"part": pa.array(_node_part(hi, parts)), "hi": pa.array(hi), "lo": pa.array(lo)})
    written += write_parts(out, table)
    return finish(out, {"edges": int(low.sum()), "fingerprint": fp, "bytes": written})


def small_star_job(r: int, q: int, stages: str, parts: int) -> dict:
    """Round r, node partition q: small-star over the edges whose larger end is in q → round r+1's input."""
    st = Path(stages) / "star"
    out = st / f"r{r + 1:03d}-L" / f"p{q:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    t = read_part(stage_files(st / f"r{r:03d}-S"), q, ["hi", "lo"])
    hi, lo = t.column("hi").to_numpy().astype(np.int64), t.column("lo").to_numpy().astype(np.int64)
    nodes, m = group_min(hi, lo)
    mu = m[np.searchsorted(nodes, hi)]
    table = _directed(np.concatenate((lo, nodes)), np.concatenate((mu, m)), parts)
    return finish(out, {"bytes": write_parts(out, table)})


# Once the rounds converge, every touched document needs its sort fields beside its label. The
# labels of round r are filed by label partition but written per node partition; the fields live in
# the candidates files of id partitions. star_init_job files each id partition's candidates by node
# partition, and label_fields_job joins one node partition's labels with those rows, filed by label
# partition: no job reads every candidates file.


def label_fields_job(q: int, r: int, stages: str, parts: int) -> dict:
    """Node partition q of the converged round r: its nodes' labels with their sort fields, by
    label partition."""
    st = Path(stages) / "star"
    out = st / f"r{r:03d}-fields" / f"p{q:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    labels = read_table(st / f"r{r:03d}-labels" / f"p{q:05d}.parquet").sort_by([("node", "ascending")])
    nodes = labels.column("node").to_numpy()
    fields = _sort_fields_among([read_part(stage_files(st / "fields"), q, SORT_FIELDS)], nodes)
    table = fields.append_column("label", labels.column("label")).append_column("part", labels.column("part"))
    return finish(out, {"touched": len(nodes), "bytes": write_parts(out, table)})


def star_pick_job(q: int, r: int, stages: str, ids: int) -> dict:
    """Label partition q of the converged round r: each component's survivor and removals."""
    st = Path(stages)
    out = st / "near" / f"q{q:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    fields = read_part(stage_files(st / "star" / f"r{r:03d}-fields"), q, SORT_FIELDS + ["label"])
    removed, clusters = _pick_survivors(fields, ids)
    info = {"touched": fields.num_rows, "near_duplicates": removed.num_rows, "clusters": clusters}
    info["bytes"] = _write_kept(Path(stages) / "kept" / f"q{q:05d}.parquet", removed) + write_parts(
        out, removed
    )
    return finish(out, info)
