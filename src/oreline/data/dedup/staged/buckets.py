"""The buckets stage: candidate pairs of documents that share a band key, per (band, key range),
filed under both ends' id partitions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from oreline.data.dedup.buckets import bucket_pairs
from oreline.data.dedup.staged.layout import done, finish, read_part, stage_files, write_parts


def bucket_job(q: int, stages: str, cfg) -> dict:
    """One (band, key range): candidate pairs of documents sharing a band key, by id partition."""
    out = Path(stages) / "pairs" / f"q{q:06d}.parquet"
    if (info := done(out)) is not None:
        return info
    t = read_part(stage_files(Path(stages) / "bands"), q, ["key", "gid", "idpart"])
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
    return finish(out, {"rows": t.num_rows, "pairs": len(pairs), "bytes": write_parts(out, table)})
