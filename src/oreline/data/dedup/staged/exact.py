"""The scatter and exact stages: signature rows by exact-key hash, then exact duplicates per key
partition (the survivor: lowest rank) and the band keys of every other document for the buckets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from oreline.data.dedup.buckets import band_keys, key_range
from oreline.data.dedup.minhash import (
    bands_rows,
    dedup_config,
    signature_matrix,
    signature_width,
)
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


def scatter_job(g: int, files: list[tuple[str, int]], stages: str, parts: tuple[int, int, int], cfg) -> dict:
    """A group of signature files ((path, first row) each): rows by exact-key hash (with their band
    keys), and ids by id hash."""
    out = Path(stages) / "scatter" / f"g{g:06d}.parquet"
    if (info := done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    x, _, p = parts
    width = signature_width(dc)
    tables, id_tables = [], []
    for sig_path, offset in files:
        table = read_table(sig_path)
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
    written = write_parts(out, pa.concat_tables(tables))
    written += write_parts(Path(stages) / "ids" / f"g{g:06d}.parquet", pa.concat_tables(id_tables))
    return finish(out, {"docs": sum(t.num_rows for t in tables), "bytes": written})


def exact_job(h: int, stages: str, parts: tuple[int, int, int], cfg) -> dict:
    """One exact-key partition: exact duplicates (survivor: lowest rank), band keys of the rest."""
    out = Path(stages) / "exact" / f"h{h:05d}.parquet"
    if (info := done(out)) is not None:
        return info
    dc = dedup_config(cfg)
    _, ranges, _ = parts
    width = signature_width(dc)
    cols = ["gid", "exact_hi", "exact_lo", "n_shingles", "source", "offset", "doc_id", "idpart"]
    t = read_part(stage_files(Path(stages) / "scatter"), h, cols + (["keys"] if width else []))
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
    written = write_parts(out, removed)
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
        written += write_parts(Path(stages) / "bands" / f"h{h:05d}.parquet", band_rows)
    return finish(out, {"docs": t.num_rows, "exact_duplicates": int(dup.sum()), "bytes": written})
