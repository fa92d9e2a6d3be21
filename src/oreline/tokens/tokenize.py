"""Documents → packed token shards, in parallel, with a manifest that makes re-runs free.

Each document becomes `[BOS] + encode(text) + [EOS]`. BOS/EOS are injected here, explicitly;
the tokenizer never matches special-token text in documents (see train_bpe), so a document
containing the literal characters "<s>" yields exactly one BOS: the one we put in front.

Split: a document goes to validation when the first 8 bytes of sha256(id), read as an unsigned
integer, fall below a threshold, `val_fraction * 2**64` by default. The decision depends on the id
alone, so adding documents to a corpus never moves an existing document between train and
validation. A split must serve its purpose, though: with `val_min_tokens` (`oreline run` and
`oreline tokenize` give `tokenize.val_sequences` sequences of `train.seq_len` tokens), a fraction
that leaves validation shorter raises the threshold to the hash of the next documents in hash
order until it holds that many tokens, at most half of the corpus's (`VAL_MAX_SHARE`): a small
source gets a validation split a training run can use instead of none. Each task reports its
training documents of lowest hash (only as many as could be needed), so the threshold is found
without a second pass over the corpus, and only the tasks holding a moved document run again.
The threshold is a function of ids and token counts, so it is deterministic; the manifest records
it (`val_split`) and the summary says when and why it was raised. A held-out set the user names
(`tokenize.val_inputs`, `oreline tokenize --val FILE`: a published benchmark's text, say) replaces
the rule: its documents are the validation split and every input document is trained on.

Tasks: one per input file; when there are fewer files than workers, multi-row-group Parquet
files are split into row-group ranges. Each task streams its file batch by batch and writes
`{split}-{generation}-{task:05d}-{part:03d}.tok` shards (a new part every `max_shard_tokens`).
Tasks run on the executor `tokenize.executor` names (executors/): a local process pool (each
worker single-threaded, or this process for workers=1), Ray core tasks on a cluster
(`data.ray`) or Slurm array jobs (`data.slurm`; their job files and logs go to `slurm/` in the
output folder, which every node must see). The plan depends on `workers` alone, so every
executor writes the same shards.

Re-runs: the manifest records a key = sha256(tokenizer fingerprint, input file sha256s,
settings). When the key matches and every shard is present with its recorded size, nothing is
done. Otherwise new shards are written under a new generation name, the manifest is replaced
atomically (the commit point: a reader sees the old set or the new set, never a mix), and only
then are the shards of the old generation deleted.

The output folder (`oreline.outdir`): `.oreline-owner` (kind "tokens") is written into it first;
a non-empty folder without it is refused (one written before markers existed is recognised by its
manifest's "format"); `force=True` adopts a non-empty folder when none of its names is one this
command writes (`TOKENS_NAMES`). The run holds the folder's lock `.oreline-lock`. Clean-up deletes
only names of the exact form oreline gives its shards (`SHARD_NAME`, and their `.NAME.tmp-PID`
temporaries) that the new manifest does not list; any other file in the folder is left alone.
The inputs: a data run that has not finished is refused unless `allow_incomplete`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import math
import os
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np

from oreline.config import RayConfig, SlurmConfig, TokenizeConfig, expand
from oreline.errors import DataIntegrityError, DiskFull, InputError, OrelineError, disk_full_cause, free_space
from oreline.executors import make_executor
from oreline.executors.interface import TaskCrashed
from oreline.io import file_sha256, write_atomic, write_json_atomic
from oreline.outdir import LOCK, OWNER, FolderLock, claim_folder, is_temp_of, remove_listed
from oreline.tokens import shards as fmt
from oreline.tokens.inputs import Rejects, expand_inputs, iter_batches, parquet_row_groups
from oreline.tokens.train_bpe import OrelineTokenizer, load_tokenizer

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
# A raised validation threshold never takes more than this share of a corpus's tokens: training
# keeps the larger part of a source too small for both.
VAL_MAX_SHARE = 0.5
SHARD_NAME = re.compile(
    r"(train|val)-[0-9a-f]{10}-\d{5}-\d{3}\.tok"
)  # {split}-{generation}-{task}-{part}.tok
TOKENS_NAMES = re.compile(
    r"manifest\.json|rejects\.jsonl|slurm|"
    + re.escape(OWNER)
    + "|"
    + re.escape(LOCK)
    + "|"
    + SHARD_NAME.pattern
)


def id_hash(doc_id: str) -> int:
    """The split's key of a document: the first 8 bytes of sha256(id), little-endian."""
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8", "surrogatepass")).digest()[:8], "little")


def is_val(doc_id: str, val_fraction: float) -> bool:
    """Stable split by id hash: adding documents never moves existing ones."""
    return id_hash(doc_id) < val_fraction * 2**64


def fraction_threshold(val_fraction: float) -> int:
    """The hash threshold of `is_val` at `val_fraction`: a document is in validation below it."""
    return math.ceil(val_fraction * 2**64)


def val_min_tokens(val_sequences: int, seq_len: int) -> int:
    """Tokens a validation split needs for `val_sequences` sequences of `seq_len` (the loader cuts
    `seq_len + 1` tokens for each, overlapping by one); 0 asks for no minimum."""
    return val_sequences * seq_len + 1 if val_sequences > 0 else 0


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    index: int
    path: str
    row_groups: tuple[int, int] | None  # [start, stop) of a Parquet file; None: the whole file
    tokenizer_dir: str
    tokenizer_fingerprint: str
    out_dir: str
    generation: str
    val_below: int  # a document whose id_hash is below this goes to validation
    max_shard_tokens: int
    val_min_tokens: int = 0  # >0: report the lowest-hash training documents that add up to this


def plan_tasks(paths: list[Path], workers: int) -> list[tuple[Path, tuple[int, int] | None]]:
    """One task per file, splitting Parquet files by row groups when files are fewer than workers."""
    if len(paths) >= workers:
        return [(p, None) for p in paths]
    per_file = -(-workers // len(paths))
    plan: list[tuple[Path, tuple[int, int] | None]] = []
    for p in paths:
        groups = parquet_row_groups(p) if p.name.endswith(".parquet") else 1
        parts = min(per_file, groups)
        if parts <= 1:
            plan.append((p, None))
            continue
        bounds = [round(i * groups / parts) for i in range(parts + 1)]
        plan.extend((p, (a, b)) for a, b in zip(bounds, bounds[1:], strict=False) if b > a)
    return plan


_TOKENIZER: OrelineTokenizer | None = None


def _encode(
    tok: OrelineTokenizer,
    ids: list[str],
    texts: list[str],
    rejects: Rejects,
    source: str,
) -> tuple[list[str], list[list[int]]]:
    try:
        return ids, tok.encode_batch(texts)
    except Exception:  # a text the tokenizer cannot take (e.g. lone surrogates): find it, keep the rest
        kept_ids, out = [], []
        for doc_id, text in zip(ids, texts, strict=True):
            try:
                out.append(tok.encode(text))
                kept_ids.append(doc_id)
            except Exception as exc:
                rejects.add(
                    "encode_error", source, -1, {"id": doc_id, "error": str(exc)[:200], "text": text[:500]}
                )
        return kept_ids, out


def run_task(task: Task) -> dict:
    """Tokenize one input file (or row-group range) into train/val shards; return their records."""
    global _TOKENIZER
    if _TOKENIZER is None:  # a worker process: one task per core, keep the tokenizer's thread pool out
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if _TOKENIZER is None or str(_TOKENIZER.dir) != str(Path(task.tokenizer_dir).resolve()):
        _TOKENIZER = load_tokenizer(task.tokenizer_dir)
        _TOKENIZER.dir = _TOKENIZER.dir.resolve()
    tok = _TOKENIZER
    if tok.fingerprint != task.tokenizer_fingerprint:
        raise InputError(
            f"tokenizer at {task.tokenizer_dir} changed during the run", "re-run oreline tokenize"
        )
    out = Path(task.out_dir)
    rejects = Rejects()
    writers: dict[str, fmt.ShardWriter] = {}
    parts = Counter()
    records: list[dict] = []
    # the training documents of lowest hash, as a max-heap of (-hash, tokens), kept only while the
    # ones below them add up to fewer than val_min_tokens: the candidates for a raised threshold
    lowest: list[tuple[int, int]] = []
    lowest_tokens = 0

    def finish(split: str) -> None:
        w = writers.pop(split)
        header = w.close()
        records.append(
            {
                "name": w.path.name,
                "split": split,
                "sha256": file_sha256(w.path),
                "tokens": header.tokens,
                "documents": header.documents,
                "bytes": header.file_size,
                "task": task.index,
            }
        )

    def writer(split: str) -> fmt.ShardWriter:
        if split not in writers:
            name = f"{split}-{task.generation}-{task.index:05d}-{parts[split]:03d}.tok"
            parts[split] += 1
            writers[split] = fmt.ShardWriter(
                out / name, tok.fingerprint, tok.vocab_size, tok.bos_id, tok.eos_id
            )
        return writers[split]

    try:
        for ids, texts in iter_batches(Path(task.path), rejects, row_groups=task.row_groups):
            ids, encoded = _encode(tok, ids, texts, rejects, task.path)
            hashes = [id_hash(i) for i in ids]
            if task.val_min_tokens > 0:
                for h, e in zip(hashes, encoded, strict=True):
                    if h < task.val_below:
                        continue
                    n = len(e) + 2  # BOS + EOS, as the shard holds it
                    heapq.heappush(lowest, (-h, n))
                    lowest_tokens += n
                    while lowest_tokens - lowest[0][1] >= task.val_min_tokens:
                        lowest_tokens -= heapq.heappop(lowest)[1]
            if task.val_below > 0:
                flags = [h < task.val_below for h in hashes]
                groups = {
                    "train": [e for e, v in zip(encoded, flags, strict=True) if not v],
                    "val": [e for e, v in zip(encoded, flags, strict=True) if v],
                }
            else:
                groups = {"train": encoded}
            for split, docs in groups.items():
                while docs:  # cut the batch where the shard fills up, so shards stay near max_shard_tokens
                    w = writer(split)
                    room = task.max_shard_tokens - w.tokens
                    filled = np.cumsum([len(d) + 2 for d in docs])
                    k = max(1, min(len(docs), int(np.searchsorted(filled, room, side="left")) + 1))
                    w.add_documents(docs[:k])
                    docs = docs[k:]
                    if w.tokens >= task.max_shard_tokens:
                        finish(split)
        for split in list(writers):
            finish(split)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return {
        "task": task.index,
        "shards": records,
        "rejected": rejects.counts,
        "reject_rows": rejects.rows,
        "lowest_train": sorted((-h, n) for h, n in lowest),
    }


def _settings(cfg: TokenizeConfig, min_tokens: int = 0) -> dict:
    return {
        **({"val_min_tokens": min_tokens} if min_tokens > 0 else {}),
        "val_fraction": cfg.val_fraction,
        "max_shard_tokens": cfg.max_shard_tokens,
        "format_version": fmt.VERSION,
        "split_rule": "sha256(id)[:8] little-endian < val_fraction * 2**64",
        "id_key": "id",
        "text_key": "text",
    }


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def read_manifest(tokens_dir: str | Path) -> dict:
    path = Path(tokens_dir) / MANIFEST
    if not path.is_file():
        raise InputError(
            f"no {MANIFEST} in {tokens_dir}", "run `oreline tokenize DOCS --tokenizer DIR --out DIR` first"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise DataIntegrityError(f"{path} is nested too deeply to be a token manifest", fmt.FIX) from None
    except ValueError as exc:  # not UTF-8, not JSON, or an integer past the digit limit
        raise DataIntegrityError(f"{path} is not valid JSON ({exc})", fmt.FIX) from None
    _check_manifest(path, manifest)
    return manifest


# What readers of a manifest index without a check: a manifest lacking one fails here, naming it.
_MANIFEST_KEYS = {
    "shards": list,
    "tokenizer_fingerprint": str,
    "data_fingerprint": str,
    "bos_id": int,
    "eos_id": int,
}
_MAX_VOCAB = 1 << 32  # uint32 token ids (shards.DTYPES)
_SHARD_KEYS = {"name": str, "split": str, "tokens": int, "documents": int, "sha256": str, "bytes": int}


def _check_manifest(path: Path, manifest: object) -> None:
    """The shape the loader relies on: an object with typed keys, shards named by plain file names."""
    if not isinstance(manifest, dict):
        raise DataIntegrityError(
            f"{path} holds a JSON {type(manifest).__name__}, not a token manifest (an object)", fmt.FIX
        )
    for key, kind in _MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            got = "missing" if key not in manifest else f"a {type(manifest[key]).__name__}"
            raise DataIntegrityError(f"{path}: key {key!r} is {got}, expected a {kind.__name__}", fmt.FIX)
    vocab = manifest.get("vocab_size")
    if vocab is not None and (type(vocab) is not int or not 0 < vocab <= _MAX_VOCAB):
        raise DataIntegrityError(f"{path}: vocab_size {str(vocab)[:40]} is not a vocabulary size", fmt.FIX)
    limit = vocab if vocab is not None else _MAX_VOCAB
    for key in ("bos_id", "eos_id"):  # the loader masks and marks documents by these ids
        if not 0 <= manifest[key] < limit:
            raise DataIntegrityError(
                f"{path}: {key} {manifest[key]} is outside the vocabulary (ids 0..{limit - 1})", fmt.FIX
            )
    if manifest["bos_id"] == manifest["eos_id"]:
        raise DataIntegrityError(f"{path}: bos_id and eos_id are both {manifest['bos_id']}", fmt.FIX)
    for i, shard in enumerate(manifest["shards"]):
        if not isinstance(shard, dict):
            raise DataIntegrityError(
                f"{path}: shards[{i}] is a {type(shard).__name__}, not an object", fmt.FIX
            )
        for key, kind in _SHARD_KEYS.items():
            if not isinstance(shard.get(key), kind) or isinstance(shard.get(key), bool):
                got = "missing" if key not in shard else f"a {type(shard[key]).__name__}"
                raise DataIntegrityError(
                    f"{path}: shards[{i}].{key} is {got}, expected a {kind.__name__}", fmt.FIX
                )
        # a name is joined to the tokens folder: "../x" or "/x" would read a file outside it
        if Path(shard["name"]).name != shard["name"] or shard["name"] in ("", ".", ".."):
            raise DataIntegrityError(
                f"{path}: shards[{i}].name {shard['name'][:80]!r} is not a file name in {path.parent}",
                fmt.FIX,
            )


def _up_to_date(out: Path, key: str) -> dict | None:
    try:
        manifest = read_manifest(out)
    except Exception:
        return None
    if manifest.get("key") != key:
        return None
    for s in manifest.get("shards", []):
        p = out / s["name"]
        if not p.is_file() or p.stat().st_size != s["bytes"]:
            return None
    return manifest


def _legacy_tokens(folder: Path) -> bool:
    try:
        return (
            json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("format")
            == "oreline-token-shards"
        )
    except (OSError, ValueError, AttributeError):
        return False


def tokenize_corpus(
    inputs: list[str | Path],
    tokenizer_dir: str | Path,
    out_dir: str | Path,
    cfg: TokenizeConfig,
    workers: int | None = None,
    force: bool = False,
    allow_incomplete: bool = False,
    ray: RayConfig | None = None,
    console=None,
    slurm: SlurmConfig | None = None,
    val_min_tokens: int = 0,
    val_inputs: list[str | Path] | None = None,
) -> dict:
    """Tokenize documents into packed shards + manifest.json; a no-op when nothing changed.

    `force` writes into a non-empty folder oreline did not create; `allow_incomplete` reads a data
    run that has not finished (see the module docstring); `ray` is the cluster of
    `cfg.executor = "ray"` (the config's data.ray), `slurm` the sbatch settings of
    `cfg.executor = "slurm"` (data.slurm); `val_min_tokens` the tokens the validation split holds
    at least when the corpus allows (`val_min_tokens()`; 0: `cfg.val_fraction` alone decides);
    `val_inputs` (default `cfg.val_inputs`) a held-out set the user names: its documents are the
    validation split, every document of `inputs` is trained on, and no hash decides."""
    out = Path(out_dir)
    paths = expand_inputs(inputs, allow_incomplete)
    given = val_inputs if val_inputs is not None else cfg.val_inputs
    val_paths = expand_inputs([expand(str(v)) for v in given], allow_incomplete) if given else []
    tok = load_tokenizer(tokenizer_dir)
    claim_folder(
        out, "tokens", "oreline tokenize", force=force, reserved=TOKENS_NAMES.fullmatch, legacy=_legacy_tokens
    )
    with FolderLock(out, "oreline tokenize"):
        try:
            return _tokenize(paths, tok, out, cfg, workers, ray, console, slurm, val_min_tokens, val_paths)
        except Exception as exc:  # a full disk, wherever it struck (a worker's error arrives wrapped)
            full = disk_full_cause(exc)
            if full is None:
                raise
            raise _disk_full(out, full) from None


def _disk_full(out: Path, exc: OSError) -> DiskFull:
    """A full disk as one error: the shards this run wrote are removed (the manifest still lists
    the folder's earlier set, which stays as it was), with the room left and the fix."""

    try:
        listed = {s["name"] for s in read_manifest(out)["shards"]}
    except OrelineError:  # no earlier set (or a damaged one, which the next run replaces)
        listed = set()
    remove_listed(
        out,
        [
            p.name
            for p in out.iterdir()
            if (SHARD_NAME.fullmatch(p.name) and p.name not in listed) or is_temp_of(p.name, SHARD_NAME)
        ],
    )
    free = free_space(out)
    what = Path(exc.filename).name if exc.filename else "token shards"
    return DiskFull(
        f"no space left on the device of {out} while writing {what} ({free}); the shards this run "
        "wrote were removed, and what the folder held before is unchanged",
        "free space there or pass another --out, then run the same `oreline tokenize` command again",
    )


def _tokenize(
    paths: list[Path],
    tok: OrelineTokenizer,
    out: Path,
    cfg: TokenizeConfig,
    workers: int | None,
    ray: RayConfig | None = None,
    console=None,
    slurm: SlurmConfig | None = None,
    min_tokens: int = 0,
    val_paths: list[Path] | None = None,
) -> dict:
    t0 = time.perf_counter()
    workers = max(1, workers or cfg.workers)
    val_paths = val_paths or []
    input_records = [{"path": str(p), "sha256": file_sha256(p), "bytes": p.stat().st_size} for p in paths]
    input_records += [
        {"path": str(p), "sha256": file_sha256(p), "bytes": p.stat().st_size, "split": "val"}
        for p in val_paths
    ]
    settings = _settings(cfg, min_tokens)
    docs_fp = hashlib.sha256(
        _canonical([r["sha256"] if "split" not in r else ["val", r["sha256"]] for r in input_records])
    ).hexdigest()
    key = hashlib.sha256(
        _canonical({"tokenizer": tok.fingerprint, "docs": docs_fp, "settings": settings})
    ).hexdigest()
    existing = _up_to_date(out, key)
    if existing is not None:
        return {**existing, "up_to_date": True}

    out.mkdir(parents=True, exist_ok=True)
    generation = key[:10]
    # a named held-out set: its files are all validation (every hash is below 2**64), the inputs
    # all training (none is below 0)
    below = 0 if val_paths else fraction_threshold(cfg.val_fraction)
    tasks = [
        Task(
            i,
            str(p),
            rg,
            str(tok.dir),
            tok.fingerprint,
            str(out),
            generation,
            below,
            cfg.max_shard_tokens,
            min_tokens,
        )
        for i, (p, rg) in enumerate(plan_tasks(paths, workers))
    ]
    tasks += [
        Task(
            len(tasks) + i,
            str(p),
            rg,
            str(tok.dir),
            tok.fingerprint,
            str(out),
            generation,
            2**64,
            cfg.max_shard_tokens,
        )
        for i, (p, rg) in enumerate(plan_tasks(val_paths, workers) if val_paths else [])
    ]
    global _TOKENIZER
    _TOKENIZER = tok  # tasks run in this process (workers=1) reuse the tokenizer loaded above
    _TOKENIZER.dir = _TOKENIZER.dir.resolve()
    # a local pool forks its workers from a forkserver: safe with the threads the caller may hold
    # (torch, tensorboard, rayon), unlike a plain fork
    # the Slurm executor's job files and array logs go to out/slurm/, a folder the nodes share
    executor = make_executor(cfg.executor, workers=workers, ray=ray, slurm=slurm, work=out, console=console)

    def run_tasks(todo: list[Task]) -> list[dict]:
        results = executor.map(run_task, [(t,) for t in todo], label="tokenize")
        crashed = [r for r in results if isinstance(r, TaskCrashed)]
        if crashed:
            names = ", ".join(sorted({r.args[0].path for r in crashed}))
            raise DataIntegrityError(
                f"{len(crashed)} tokenize task(s) lost their worker twice ({crashed[0].error}); input(s): {names}",
                "re-run oreline tokenize (finished runs are not repeated); if it fails again, check those "
                "files and the machine's memory",
            )
        return results

    results = run_tasks(tasks)
    val_split = {"fraction": cfg.val_fraction, "below": below, "min_tokens": min_tokens, "raised": False}
    if val_paths:
        val_split = {"given": [str(p) for p in val_paths], "min_tokens": min_tokens, "raised": False}
    raised = None if val_paths else _raised_threshold(results, below, min_tokens)
    if raised is not None:
        # a second generation name: the first pass's shards of these tasks are cleaned up below
        again = hashlib.sha256(f"{key}:{raised}".encode()).hexdigest()[:10]
        redo = {r["task"] for r in results if any(h < raised for h, _ in r["lowest_train"])}
        rerun = run_tasks(
            [dataclasses.replace(t, generation=again, val_below=raised) for t in tasks if t.index in redo]
        )
        results = [r for r in results if r["task"] not in redo] + rerun
        val_split.update(below=raised, raised=True)

    shard_records = sorted(
        (s for r in results for s in r["shards"]),
        key=lambda s: (SPLITS.index(s["split"]), s["task"], s["name"]),
    )
    rejected = Counter()
    reject_rows = []
    for r in results:
        rejected.update(r["rejected"])
        reject_rows.extend(r["reject_rows"])
    if reject_rows:
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in reject_rows)
        write_atomic(
            out / "rejects.jsonl", text.encode("utf-8", "backslashreplace")
        )  # lone surrogates stay visible
    splits = {
        s: {
            "shards": sum(1 for r in shard_records if r["split"] == s),
            "documents": sum(r["documents"] for r in shard_records if r["split"] == s),
            "tokens": sum(r["tokens"] for r in shard_records if r["split"] == s),
        }
        for s in SPLITS
    }
    if not shard_records:
        raise InputError(
            f"no usable documents in {len(paths)} input file(s) (rejected: {dict(rejected)})",
            "check the inputs hold non-empty 'text' fields",
        )
    seconds = time.perf_counter() - t0
    total_tokens = sum(r["tokens"] for r in shard_records)
    manifest = {
        "format": "oreline-token-shards",
        "format_version": fmt.VERSION,
        "key": key,
        "data_fingerprint": hashlib.sha256(
            _canonical([tok.fingerprint] + [r["sha256"] for r in shard_records])
        ).hexdigest(),
        "tokenizer_fingerprint": tok.fingerprint,
        "tokenizer_dir": str(tok.dir),
        "vocab_size": tok.vocab_size,
        "dtype": str(fmt.DTYPES[fmt.dtype_code_for(tok.vocab_size)]),
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "pad_id": tok.pad_id,
        "docs_fingerprint": docs_fp,
        "inputs": input_records,
        "settings": settings,
        "workers": workers,
        "shards": [{k: v for k, v in r.items() if k != "task"} for r in shard_records],
        "splits": splits,
        "val_split": {**val_split, **({} if val_paths else {"share_of_ids": val_split["below"] / 2**64})},
        "rejected": dict(rejected),
        "seconds": round(seconds, 3),
        "tokens_per_second": round(total_tokens / max(seconds, 1e-9), 1),
    }
    write_json_atomic(out / MANIFEST, manifest)  # the commit point
    keep = {r["name"] for r in shard_records}  # older generations and killed attempts' shards go
    remove_listed(
        out,
        [
            p.name
            for p in out.iterdir()
            if (SHARD_NAME.fullmatch(p.name) and p.name not in keep) or is_temp_of(p.name, SHARD_NAME)
        ],
    )
    if not reject_rows:
        (out / "rejects.jsonl").unlink(missing_ok=True)
    return {**manifest, "up_to_date": False}


def _raised_threshold(results: list[dict], below: int, min_tokens: int) -> int | None:
    """The lowest hash threshold at which validation holds `min_tokens`, or None when `below`
    already does (or no minimum is asked). Documents join in hash order, while the split stays
    within VAL_MAX_SHARE of all tokens; a corpus too small for even that keeps what it has."""
    if min_tokens <= 0 or below == 0:  # val_fraction = 0 asks for no validation split at all
        return None
    val = sum(s["tokens"] for r in results for s in r["shards"] if s["split"] == "val")
    total = sum(s["tokens"] for r in results for s in r["shards"])
    if val >= min_tokens:
        return None
    candidates = sorted(c for r in results for c in r["lowest_train"])
    chosen = None
    for h, n in candidates:
        if val + n > VAL_MAX_SHARE * total:
            break
        val += n
        chosen = h
        if val >= min_tokens:
            break
    return None if chosen is None else chosen + 1


def describe_val_split(manifest: dict) -> str:
    """One line on how the validation split was chosen (the tokenize summary)."""
    rule = manifest.get("val_split")
    val = manifest["splits"]["val"]
    held = f"validation: {val['documents']:,} documents, {val['tokens']:,} tokens"
    if not rule:
        return f"{held} (id hash below val_fraction)"
    if rule.get("given"):
        shown = ", ".join(Path(p).name for p in rule["given"][:3]) + (" …" if len(rule["given"]) > 3 else "")
        short = (
            f"; fewer than the {rule['min_tokens']:,} tokens tokenize.val_sequences asks for"
            if rule["min_tokens"] and val["tokens"] < rule["min_tokens"]
            else ""
        )
        return f"{held}: the documents of {shown} (tokenize.val_inputs), every input trained on{short}"
    fraction = f"val_fraction {rule['fraction']:g}"
    want = f"{rule['min_tokens']:,} tokens tokenize.val_sequences asks for"
    if rule["raised"]:
        return (
            f"{held}: {fraction} held fewer than the {want}, so the split was raised to the ids "
            f"of lowest hash ({rule['share_of_ids']:.2%} of the hash range)"
        )
    if rule["min_tokens"] and val["tokens"] < rule["min_tokens"]:
        return (
            f"{held}: fewer than the {want}; a larger split would take more than "
            f"{VAL_MAX_SHARE:.0%} of the corpus's tokens"
        )
    return f"{held} ({fraction}" + (f"; at least the {want})" if rule["min_tokens"] else ")")


def print_manifest_summary(manifest: dict, console) -> None:
    from rich.table import Table

    if manifest.get("up_to_date"):
        console.print(
            f"token shards are up to date (same tokenizer {manifest['tokenizer_fingerprint'][:12]}…, "
            f"same documents and settings): nothing to do"
        )
    table = Table(title=f"token shards ({manifest['dtype']})")
    for col in ("split", "shards", "documents", "tokens"):
        table.add_column(col, justify="right" if col != "split" else "left")
    for split, s in manifest["splits"].items():
        table.add_row(split, f"{s['shards']:,}", f"{s['documents']:,}", f"{s['tokens']:,}")
    console.print(table)
    val_line = describe_val_split(manifest)
    raised = (manifest.get("val_split") or {}).get("raised") or not manifest["splits"]["val"]["documents"]
    console.print(f"[yellow]{val_line}[/]" if raised else val_line)
    if manifest["rejected"]:
        console.print(
            "rejected rows: "
            + ", ".join(f"{k}={v}" for k, v in sorted(manifest["rejected"].items()))
            + " (see rejects.jsonl)"
        )
    if not manifest.get("up_to_date"):
        console.print(
            f"{manifest['tokens_per_second']:,.0f} tokens/s over {manifest['seconds']:.1f} s with {manifest['workers']} worker(s)"
        )
    console.print(
        f"tokenizer {manifest['tokenizer_fingerprint'][:12]}…, data fingerprint {manifest['data_fingerprint'][:12]}…"
    )
