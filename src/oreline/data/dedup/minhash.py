"""MinHash signatures: shingle hashes → one uint32 row per document, and the signature files.

The whole near-duplicate scheme (Broder 1997 MinHash; Leskovec, Rajaraman & Ullman, "Mining of
Massive Datasets" ch. 3 for banded LSH; the same scheme as datatrove's MinhashDedup* stages and
datasketch's MinHashLSH), stage by stage, one module each:

1. `exact.py`: exact key, xxh3-128 of the text after lowercasing and collapsing whitespace
   (`shingles.exact_key`); survivor of a group = lowest rank.
2. `shingles.py`: lowercased whitespace words, every window of `shingle_words` words hashed to
   uint64 (xxh3-64 per word, a wrapping polynomial combine and a splitmix64 finalizer), as a set.
3. here: permutation k maps a shingle hash x to ((a_k·x + b_k) mod 2^64) >> 32 (multiply-add-
   shift, Dietzfelbinger 1996; x is already a uniform 64-bit hash), a_k odd, a_k, b_k drawn from a
   seeded numpy generator. The signature is the per-permutation minimum, uint32 (N, num_perm).
   P[sig_a[k] == sig_b[k]] = Jaccard(a, b), so the share of equal entries estimates it.
4. `buckets.py`: the signature is cut into `bands` bands of `rows` rows; two documents whose band
   rows are all equal in any band become a candidate pair. bands/rows, when not configured (here,
   `bands_rows`), minimise the weighted false-positive and false-negative areas under the S-curve
   1-(1-s^r)^b (datasketch's `_optimal_param`). Candidates are verified, so a false positive costs
   one check while a false negative loses a duplicate for good: false negatives weigh 0.98 under
   exact verification (17×7 at t=0.8, 128 perms: P(candidate | J=0.8) = 0.98) and 0.9 under
   signature verification (14×9: 0.87; its own estimate error near the threshold dominates).
5. `verify.py`: a candidate pair is an edge only if its Jaccard is ≥ the threshold ("exact": the
   shingle sets of the candidates' texts, read back from the phase-1 shards; "signature": the
   MinHash estimate; false: every candidate is an edge).
6. `components.py`: connected components of the verified edges; the survivor of a cluster, and of
   an exact-duplicate group, is the document with the smallest sort key (metadata
   source_file[:member], offset, doc id; the position in its task when there is no offset; then
   the global row): the earliest one in the input, whatever the order of the edges or the files.
   Components are transitive: A~B and B~C removes C even when A and C are below the threshold.
7. `staged/plan.py`: the stages as jobs over partitioned files (any executor);
   `reference_plan.py`: the single-process reference plan they are tested against.

Signature file (`dedup_stage_signatures`, one per phase-1 task): Parquet with columns `doc_id`,
`source`, `offset`, `exact_hi`, `exact_lo` (the 128-bit exact key as two uint64), `n_shingles`,
`signature` (fixed_size_list<uint32>[num_perm]); schema metadata records the format version,
num_perm, shingle_words and seed, and files with different settings refuse to be mixed. The
global row of a document is its position in the concatenation of the files in sorted-path order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from oreline.config import DedupConfig
from oreline.data.dedup.shingles import exact_key, shingles
from oreline.document import Document
from oreline.errors import ConfigError, DataIntegrityError, InputError
from oreline.io import write_with

FORMAT = "oreline-minhash-v1"
FN_WEIGHT = 0.9  # weight of the false-negative area when choosing bands/rows (see step 4)
FN_WEIGHT_EXACT = 0.98  # the same under exact verification, where false positives cost no precision
_EMPTY = np.uint32(0xFFFFFFFF)  # signature entry of a document without shingles


def dedup_config(cfg: Any) -> DedupConfig:
    """Accept the whole Config, DataConfig or DedupConfig (callers hold different levels)."""
    for attr in ("data", "dedup"):
        if hasattr(cfg, attr) and not isinstance(cfg, DedupConfig):
            cfg = getattr(cfg, attr)
    if not isinstance(cfg, DedupConfig):
        raise TypeError(f"expected a DedupConfig (cfg.data.dedup), got {type(cfg).__name__}")
    return cfg


def verify_mode(cfg: Any) -> str:
    """'exact', 'signature' or 'none', from data.dedup.verify (true means exact, false none)."""
    v = dedup_config(cfg).verify
    return "exact" if v is True else "none" if v is False else v


# ---------------------------------------------------------------------------------------------
# keys, shingles, signatures


def hash_params(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) uint64 arrays of the multiply-add-shift permutations; a is odd."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False) | np.uint64(1)
    b = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False)
    return a, b


def _minhash_rows(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n_shingles, num_perm) uint64 values (a·x + b) mod 2^64, before the >> 32.

    The shift is monotone, so it commutes with the minimum and is applied to the reduced
    signature only; the matrix is the whole cost of MinHash, so it is built in one buffer.
    """
    out = np.multiply(x[:, None], a[None, :])
    np.add(out, b[None, :], out=out)
    return out


def minhash_signature(text: str, num_perm: int = 128, shingle_words: int = 5, seed: int = 1) -> np.ndarray:
    """The uint32 MinHash signature of one text (all 0xFFFFFFFF when it has no words)."""
    return minhash_signatures([text], num_perm, shingle_words, seed)[0][0]


def minhash_signatures(
    texts: Sequence[str], num_perm: int = 128, shingle_words: int = 5, seed: int = 1, max_rows: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """Signatures (N, num_perm) uint32 and shingle counts (N,) of many texts, batched.

    Shingle hashes of consecutive documents are stacked and permuted in blocks of about max_rows
    rows, then reduced per document with np.minimum.reduceat, so numpy's per-call cost is paid per
    block, not per document. The block (max_rows × num_perm × 8 bytes = 1 MiB by default) stays in
    the L2 cache: measured here, 1,024-row blocks ran 2-3× faster than 16,384-row ones.
    """
    a, b = hash_params(num_perm, seed)
    sets = [shingles(t, shingle_words) for t in texts]
    counts = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
    sig = np.full((len(sets), num_perm), _EMPTY, dtype=np.uint32)
    start = 0
    while start < len(sets):
        stop, rows = start, 0
        while stop < len(sets) and (rows == 0 or rows + counts[stop] <= max_rows):
            rows += counts[stop]
            stop += 1
        block = [i for i in range(start, stop) if counts[i]]
        if block:
            vals = _minhash_rows(np.concatenate([sets[i] for i in block]), a, b)
            offsets = np.concatenate(([0], np.cumsum(counts[block])[:-1]))
            sig[block] = (np.minimum.reduceat(vals, offsets, axis=0) >> np.uint64(32)).astype(np.uint32)
        start = stop
    return sig, counts


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float | np.ndarray:
    """Share of equal signature entries; rows of 2-D inputs are compared pairwise."""
    return (np.asarray(a) == np.asarray(b)).mean(axis=-1)


@functools.lru_cache(maxsize=64)  # a few ms per call, and every stage job asks
def optimal_bands_rows(
    threshold: float, num_perm: int, fp_weight: float = 1 - FN_WEIGHT, fn_weight: float = FN_WEIGHT
) -> tuple[int, int]:
    """(bands, rows), bands·rows ≤ num_perm, minimising the weighted error areas of the S-curve.

    False-positive area: ∫_0^t P(candidate | s) ds; false-negative area: ∫_t^1 1 - P(candidate | s) ds,
    with P(candidate | s) = 1 - (1 - s^r)^b (datasketch `_optimal_param`, trapezoid rule here).
    """
    best, best_err = (1, num_perm), float("inf")
    lo = np.linspace(0.0, threshold, 513)
    hi = np.linspace(threshold, 1.0, 513)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = np.trapezoid(1 - (1 - lo**r) ** b, lo)
            fn = np.trapezoid((1 - hi**r) ** b, hi)
            err = fp_weight * fp + fn_weight * fn
            if err < best_err:
                best, best_err = (b, r), err
    return best


def bands_rows(cfg: DedupConfig) -> tuple[int, int]:
    if cfg.bands and cfg.rows:
        if cfg.bands * cfg.rows > cfg.num_perm:
            raise ConfigError(
                f"data.dedup.bands × rows = {cfg.bands * cfg.rows} exceeds num_perm = {cfg.num_perm}",
                "lower bands or rows, raise num_perm, or unset both to have them chosen",
            )
        return cfg.bands, cfg.rows
    fn = FN_WEIGHT_EXACT if verify_mode(cfg) == "exact" else FN_WEIGHT
    return optimal_bands_rows(cfg.threshold, cfg.num_perm, 1 - fn, fn)


# ---------------------------------------------------------------------------------------------
# signature files


def atomic_write_table(table: pa.Table, path: Path) -> None:
    write_with(path, lambda tmp: pq.write_table(table, tmp))


def _sort_fields(doc: Document, position: int) -> tuple[str, int]:
    md = doc.metadata
    source = str(md.get("source_file") or md.get("source") or "")
    if md.get("member"):  # documents of one zip archive are ordered by member name
        source = f"{source}:{md['member']}"
    offset = md.get("offset")
    return source, int(offset) if isinstance(offset, int | np.integer) else position


def dedup_stage_signatures(
    docs: Iterable[Document], out_path: str | Path, cfg: Any, batch: int = 512
) -> dict:
    """Stage 1: write the exact key and MinHash signature of every document to one Parquet file.

    Returns {"docs": n, "path": str}. The file is written atomically (temp name, then rename).
    """
    dc = dedup_config(cfg)
    num_perm = dc.num_perm if dc.minhash else 0
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    cols: dict[str, list] = {k: [] for k in ("doc_id", "source", "offset", "exact_hi", "exact_lo")}
    sigs, counts, texts = [], [], []

    def flush() -> None:
        if num_perm:
            s, c = minhash_signatures(texts, num_perm, dc.shingle_words, dc.seed)
        else:
            s, c = np.zeros((len(texts), 0), np.uint32), np.zeros(len(texts), np.int64)
        sigs.append(s)
        counts.append(c)
        texts.clear()

    for position, doc in enumerate(docs):
        source, offset = _sort_fields(doc, position)
        hi, lo = exact_key(doc.text)
        for k, v in zip(cols, (doc.id, source, offset, hi, lo), strict=True):
            cols[k].append(v)
        texts.append(doc.text)
        if len(texts) >= batch:
            flush()
    flush()
    sig = np.concatenate(sigs) if sigs else np.zeros((0, num_perm), np.uint32)
    arrays = {
        "doc_id": pa.array(cols["doc_id"], pa.string()),
        "source": pa.array(cols["source"], pa.string()),
        "offset": pa.array(cols["offset"], pa.int64()),
        "exact_hi": pa.array(np.array(cols["exact_hi"], dtype=np.uint64)),
        "exact_lo": pa.array(np.array(cols["exact_lo"], dtype=np.uint64)),
        "n_shingles": pa.array(np.concatenate(counts).astype(np.int32)),
    }
    if num_perm:
        arrays["signature"] = pa.FixedSizeListArray.from_arrays(pa.array(sig.ravel()), num_perm)
    meta = {
        "format": FORMAT,
        "num_perm": str(num_perm),
        "shingle_words": str(dc.shingle_words),
        "seed": str(dc.seed),
    }
    table = pa.table(arrays).replace_schema_metadata(meta)
    atomic_write_table(table, out_path)
    return {"docs": table.num_rows, "path": str(out_path)}


@dataclass
class Signatures:
    """All signature files of a run, concatenated in sorted-path order."""

    ids: list[str]
    rank: np.ndarray  # (N,) position in the (source, offset, doc_id) order: lower survives
    exact: np.ndarray  # (N, 2) uint64
    n_shingles: np.ndarray  # (N,)
    sig: np.ndarray  # (N, num_perm) uint32
    files: list[str]


def signature_width(cfg: Any) -> int:
    """Signature columns a run's files must have: num_perm, or 0 when MinHash is off."""
    dc = dedup_config(cfg)
    return dc.num_perm if dc.minhash else 0


def check_signature_file(path: str | Path, cfg: Any) -> int:
    """Rows of one signature file, after checking it was built with this run's settings."""
    dc = dedup_config(cfg)
    if not Path(path).is_file():
        raise InputError(f"signature file {path} not found", "re-run the dedup signature stage for its task")
    md = pq.ParquetFile(path).metadata
    meta = {k.decode(): v.decode() for k, v in (md.metadata or {}).items()}
    if meta.get("format") != FORMAT:
        raise DataIntegrityError(
            f"{path} is not an oreline signature file ({meta.get('format')})",
            "re-run the dedup signature stage",
        )
    got = (int(meta["num_perm"]), int(meta["shingle_words"]), int(meta["seed"]))
    want = (signature_width(dc), dc.shingle_words, dc.seed)
    if got != want:
        raise DataIntegrityError(
            f"{path} was built with num_perm/shingle_words/seed {got}, this run uses {want}",
            "delete the stale signature files and re-run the dedup signature stage",
        )
    return md.num_rows


def signature_matrix(table: pa.Table, width: int) -> np.ndarray:
    """The (rows, width) uint32 signatures of a signature table (zero columns without MinHash)."""
    if not width:
        return np.zeros((table.num_rows, 0), np.uint32)
    return table.column("signature").combine_chunks().flatten().to_numpy().reshape(-1, width)


def read_signatures(paths: Iterable[str | Path], cfg: Any) -> Signatures:
    """Every signature file of a run in one process (the reference plan; the staged plan never does)."""
    dc = dedup_config(cfg)
    files = sorted(str(p) for p in paths)
    ids: list[str] = []
    keys: list[tuple[str, int, str]] = []
    exact, shingle_counts, sigs = [], [], []
    want = signature_width(dc)
    for f in files:
        check_signature_file(f, dc)
        table = pq.read_table(f)
        tid = table.column("doc_id").to_pylist()
        ids.extend(tid)
        keys.extend(
            zip(table.column("source").to_pylist(), table.column("offset").to_pylist(), tid, strict=True)
        )
        exact.append(
            np.stack([table.column("exact_hi").to_numpy(), table.column("exact_lo").to_numpy()], axis=1)
        )
        shingle_counts.append(table.column("n_shingles").to_numpy())
        sigs.append(signature_matrix(table, want))
    rank = np.empty(len(keys), dtype=np.int64)
    rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
    return Signatures(
        ids=ids,
        rank=rank,
        exact=np.concatenate(exact) if exact else np.zeros((0, 2), np.uint64),
        n_shingles=np.concatenate(shingle_counts) if shingle_counts else np.zeros(0, np.int32),
        sig=np.concatenate(sigs) if sigs else np.zeros((len(ids), want), np.uint32),
        files=files,
    )
