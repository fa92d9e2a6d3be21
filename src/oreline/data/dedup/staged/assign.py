"""The removals per input file: which rows of which file to drop and why (assign, per id
partition), then each file's removal list as phase 3 reads it (lists, per group of files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from oreline.data.dedup.staged.layout import (
    RANK,
    done,
    file_of,
    finish,
    read_part,
    read_table,
    stage_files,
    write_parts,
)
from oreline.io import write_json_atomic


def _last_per_id(t: pa.Table) -> dict[str, str]:
    """{doc_id: survivor_id} of the last row per id (the reference's dict keeps the last assignment)."""
    return dict(zip(t.column("doc_id").to_pylist(), t.column("survivor_id").to_pylist(), strict=True))


def assign_job(p: int, stages: str, offsets: list[int], keeper_order: list[int], group_of: list[int]) -> dict:
    """Id partition p: which rows of which input file to drop, and why (the reference's `split_by_file`)."""
    out = Path(stages) / "assign" / f"p{p:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    st = Path(stages)
    exact = read_part(
        stage_files(st / "exact"),
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
        near = read_table(near_path, columns=["gid", "doc_id", "survivor_id"]).sort_by([("gid", "ascending")])
        plan.update({d: ("dedup:near_dup", k) for d, k in _last_per_id(near).items()})
    ids = read_part(stage_files(st / "ids"), p, ["gid", "doc_id"]).sort_by([("gid", "ascending")])
    gid = ids.column("gid").to_numpy()
    doc_ids = ids.column("doc_id").to_pylist()
    offs = np.asarray(offsets, dtype=np.int64)
    files = file_of(gid, offs)
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
    return finish(out, {"removed_rows": table.num_rows, "bytes": write_parts(out, table)})


def list_job(g: int, stages: str, files: list[tuple[int, str]]) -> dict:
    """The removal lists of a group of input files ((file, list path) each), {doc_id: [reason,
    survivor_id]}, as phase 3 reads them."""
    out = Path(stages) / "lists" / f"g{g:06d}"  # the group's marker (its lists are the outputs)
    if (info := done(out)) is not None:
        return info
    t = read_part(stage_files(Path(stages) / "assign"), g, ["file", "row", "doc_id", "reason", "survivor_id"])
    t = t.sort_by([("file", "ascending"), ("row", "ascending")])
    lists: dict[int, dict[str, list[str]]] = {f: {} for f, _ in files}
    cols = (t.column(c).to_pylist() for c in ("file", "doc_id", "reason", "survivor_id"))
    for f, d, r, k in zip(*cols, strict=True):
        lists[f].setdefault(d, [r, k])
    for f, path in files:
        write_json_atomic(Path(path), lists[f])
    return finish(out, {"removed": sum(len(x) for x in lists.values())})


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
