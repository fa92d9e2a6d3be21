"""The dedup plan: which documents to drop as exact or near duplicates, and for which survivor.

Two implementations with one result (tests/data/test_dedup_staged.py checks they agree):

- `oreline.data.dedup.reference_plan.dedup_plan`, the single-process reference: every signature
  in one process; the oracle of tests and benchmarks, used by nothing else.
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
  |             | large/small-star rounds over | touched documents (star: shipped by  | kept/: the same by the survivor's   |
  |             | node partitions (large runs) | node, then by label partition)       | id hash                             |
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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from oreline.data.dedup.minhash import (
    bands_rows,
    check_signature_file,
    dedup_config,
    verify_mode,
)
from oreline.data.dedup.staged.assign import assign_job, file_groups, list_job
from oreline.data.dedup.staged.buckets import bucket_job
from oreline.data.dedup.staged.candidates import candidates_job, fetch_job, request_job, ship_job
from oreline.data.dedup.staged.components import (
    components_job,
    label_fields_job,
    large_star_job,
    small_star_job,
    star_init_job,
    star_pick_job,
)
from oreline.data.dedup.staged.exact import exact_job, scatter_job
from oreline.data.dedup.staged.layout import Partitions, read_table, stage_files
from oreline.data.dedup.staged.verify import similarity_job, verify_job
from oreline.errors import DataIntegrityError, InputError
from oreline.io import write_json_atomic, write_with

# the removal list both plans write (`dedup/reference_plan.py` writes the same one)
REMOVALS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("reason", pa.string()),
        ("survivor_id", pa.string()),
        ("similarity", pa.float32()),
        ("similarity_method", pa.string()),
    ]
)
# stats of a plan asked for exact verification but given no texts to verify with
NO_TEXT_STATS = {
    "verify": "signature",
    "verify_note": "exact verification asked for, but no text source was given: MinHash estimate used",
}

STAR_EDGES = 20_000_000  # above this many verified edges, components run as distributed star rounds
MAX_STAR_ROUNDS = 64


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


def _star_components(executor, st: str, ids: int, parts: int) -> dict:
    """Components by large-star/small-star rounds until the edge set stops changing."""
    _run(executor, star_init_job, [(p, st, parts) for p in range(ids)], "dedup:star")
    previous = None
    for r in range(MAX_STAR_ROUNDS):
        res = _run(executor, large_star_job, [(r, q, st, parts) for q in range(parts)], "dedup:star")
        fingerprint = (sum(x["edges"] for x in res), sum(x["fingerprint"] for x in res) % 2**64)
        if fingerprint == previous:  # round r's edges are round r-1's: a fixed point, labels final
            _run(executor, label_fields_job, [(q, r, st, parts) for q in range(parts)], "dedup:star")
            picked = _run(executor, star_pick_job, [(q, r, st, ids) for q in range(parts)], "dedup:star")
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
            stats.update(NO_TEXT_STATS)
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
            for f in stage_files(stages / "exact"):
                t = read_table(f, columns=["gid", "doc_id", "survivor_id"]).sort_by([("gid", "ascending")])
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
            for f in stage_files(stages / "similarity") if minhash else []:
                w.write_table(read_table(f, columns=REMOVALS_SCHEMA.names).cast(REMOVALS_SCHEMA))

    write_with(path, write)
