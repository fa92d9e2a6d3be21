"""Training a fastText quality classifier (`oreline quality train-classifier`).

`train_classifier(positive, negative, out, seed)` trains a two-label fastText model (DCLM's recipe:
text one wants more of against ordinary web pages) into a self-describing folder:

- `model.bin`: the fastText model, labels `__label__hq` (positive) and `__label__lq`;
- `classifier.json`: the inputs with their fingerprints (sha256 over their files), the settings
  (fastText's included), the documents and pieces per class on each side of the split, and the
  held-out metrics `precision`, `recall` (positive class, score ≥ 0.5) and `auc` (ROC AUC,
  computed here from the scores: the Mann-Whitney statistic, ties counted half), and the model's
  fingerprint (sha256 of model.bin; `oreline data` puts it into its run fingerprint).

Steps: every input document (txt/zip/JSONL/Parquet files or folders, or an `oreline data` output,
whose docs/ are read) gets a key, a keyed hash of its text with the seed; per class the
⌈heldout_fraction·n⌉ documents with the smallest keys (at least one when the class has two) are
held out, so the split depends on the seed and the texts only, never on input order, and pieces of
one document never sit on both sides. Documents are cut into pieces of about `PIECE_CHARS`
characters at paragraph boundaries (a book is one document, a web page a short one; fastText
learns from lines of similar size), normalised as the scorer does (`normalize_text`), and the
smaller class's training pieces are repeated up to the larger's count (a book gives thousands of
pieces, a web page one), so that the classes weigh the same and 0.5 means "as likely either way". fastText trains with thread=1 in a fresh process
(`_fit_in_fresh_process` says why), so equal inputs and seed give a byte-identical model.bin
(tests/data/test_quality_classifier.py checks it).

It sits in the quality layer with `train-reference`: the data layer only scores
(`oreline.data.filters.classifier`).
"""

from __future__ import annotations

import hashlib
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oreline.data.filters.classifier import (
    META_FILE,
    MODEL_FILE,
    NEGATIVE,
    POSITIVE,
    ClassifierScorer,
    normalize_text,
)
from oreline.errors import InputError

PIECE_CHARS = 2000
HELDOUT_FRACTION = 0.1
# CPU-sized fastText settings: DCLM's classifier uses bigrams too; 64 dimensions and 100k hash
# buckets keep model.bin at ~26 MB (fastText's defaults, dim 100 and 2M buckets, write 800 MB)
FASTTEXT_DEFAULTS: dict[str, Any] = {
    "dim": 64,
    "wordNgrams": 2,
    "bucket": 100_000,
    "epoch": 5,
    "lr": 0.1,
    "minCount": 1,
    "loss": "softmax",
}


def _pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """Consecutive lines joined until a piece reaches `size` characters; a longer line is cut."""
    buf: list[str] = []
    n = 0
    for line in text.splitlines():
        while len(line) > size:
            yield line[:size]
            line = line[size:]
        if not line.strip():
            continue
        buf.append(line)
        n += len(line) + 1
        if n >= size:
            yield "\n".join(buf)
            buf, n = [], 0
    if buf:
        yield "\n".join(buf)


def _resolve(paths: list[str]) -> list[str]:
    """Inputs as readable paths ({samples} expanded): an `oreline data` output stands for its docs/
    (not its rejects/)."""
    from oreline.config import expand
    from oreline.outdir import require_finished_data_run

    return [str(require_finished_data_run(Path(expand(p)))) for p in paths]


def _documents(paths: list[str]) -> Iterator[str]:
    from oreline.data.read.inputs import iter_text_documents

    for doc in iter_text_documents(paths):
        if isinstance(doc.text, str) and doc.text.strip():
            yield doc.text


def _key(text: str, seed: int) -> int:
    h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=str(seed).encode())
    return int.from_bytes(h.digest(), "big")


def _fingerprint(path: str) -> dict[str, Any]:
    """sha256 over an input's files (names relative to it, sizes and contents)."""
    from oreline.io import file_sha256

    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    h = hashlib.sha256()
    size = 0
    for f in files:
        size += f.stat().st_size
        h.update(f"{f.relative_to(root) if root.is_dir() else f.name}\0{f.stat().st_size}\0".encode())
        h.update(file_sha256(f).encode())
    return {"path": path, "files": len(files), "bytes": size, "sha256": h.hexdigest()}


def _heldout_keys(keys: list[int], fraction: float) -> set[int]:
    """The keys of the held-out documents: the ⌈fraction·n⌉ smallest, at least one of two or more."""
    distinct = sorted(set(keys))
    if len(distinct) < 2:
        return set()
    n = min(max(math.ceil(fraction * len(distinct) - 1e-9), 1), len(distinct) - 1)
    return set(distinct[:n])


def auc_score(labels: list[int], scores: list[float]) -> float | None:
    """ROC AUC: the probability that a random positive scores above a random negative (ties half)."""
    pos = sum(labels)
    neg = len(labels) - pos
    if not pos or not neg:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):  # average ranks over ties
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def heldout_metrics(labels: list[int], scores: list[float], threshold: float = 0.5) -> dict[str, Any]:
    tp = sum(1 for y, s in zip(labels, scores, strict=True) if y and s >= threshold)
    fp = sum(1 for y, s in zip(labels, scores, strict=True) if not y and s >= threshold)
    fn = sum(1 for y, s in zip(labels, scores, strict=True) if y and s < threshold)
    auc = auc_score(labels, scores)
    return {
        "threshold": threshold,
        "precision": round(tp / (tp + fp), 6) if tp + fp else None,
        "recall": round(tp / (tp + fn), 6) if tp + fn else None,
        "auc": round(auc, 6) if auc is not None else None,
        "pieces": {"positive": sum(labels), "negative": len(labels) - sum(labels)},
    }


def _fit(train_file: str, model_file: str, seed: int, settings: dict[str, Any]) -> str | None:
    """Train and save one fastText model (in the child of `_fit_in_fresh_process`); the error text or None."""
    import fasttext

    try:
        model = fasttext.train_supervised(train_file, thread=1, seed=seed, verbose=0, **settings)
    except RuntimeError as exc:  # "Encountered NaN."
        return str(exc)
    from oreline.io import write_with

    write_with(model_file, lambda tmp: model.save_model(str(tmp)))  # fastText writes by name
    return None


def _fit_in_fresh_process(train_file: Path, model_file: Path, seed: int, settings: dict[str, Any]) -> None:
    """fastText 0.9.3 trains with thread=1 deterministically only in a fresh process: a second
    training in one process gave other model bytes, or stopped with "Encountered NaN.", on 3 of 5
    tries here (memory of the first it reads before writing, by the look of it), while six fresh
    processes gave six identical models. So each training runs in a spawned child."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        error = pool.submit(_fit, str(train_file), str(model_file), seed, settings).result()
    if error is not None:
        raise InputError(
            f"fastText training failed: {error}",
            "pass other fastText settings (a smaller lr) or check the inputs for degenerate text",
        )


def train_classifier(
    positive: list[str],
    negative: list[str],
    out: str | Path,
    seed: int = 1,
    heldout_fraction: float = HELDOUT_FRACTION,
    console: Any = None,
    **fasttext_settings: Any,
) -> dict[str, Any]:
    """Train the classifier into `out` and return classifier.json's contents (see the module docstring).

    `fasttext_settings` override FASTTEXT_DEFAULTS (e.g. bucket=20_000 for a smaller model)."""
    from oreline.io import file_sha256, write_json_atomic
    from oreline.outdir import claim_folder

    try:
        import fasttext
    except ImportError as exc:  # fasttext-predict alone installs the module without training
        raise InputError("the fasttext package is not installed", "pip install 'oreline[quality]'") from exc
    if not hasattr(fasttext, "train_supervised"):
        raise InputError(
            "the installed fasttext module can only predict (fasttext-predict), not train",
            "pip install 'oreline[quality]' (the fasttext package)",
        )
    unknown = sorted(set(fasttext_settings) - set(FASTTEXT_DEFAULTS))
    if unknown:
        raise InputError(f"unknown fastText settings {unknown}", f"use some of {sorted(FASTTEXT_DEFAULTS)}")
    out = Path(out)
    claim_folder(
        out, "classifier", "oreline quality train-classifier", legacy=lambda d: (d / META_FILE).is_file()
    )
    t0 = time.perf_counter()
    classes = {"positive": (_resolve(positive), POSITIVE), "negative": (_resolve(negative), NEGATIVE)}
    # pass 1: the documents' keys, per class (the split needs them all before any piece is written)
    keys = {name: [_key(t, seed) for t in _documents(paths)] for name, (paths, _) in classes.items()}
    for name, ks in keys.items():
        if len(set(ks)) < 2:
            raise InputError(
                f"the {name} inputs hold {len(set(ks))} distinct document(s): a held-out split needs two or more",
                f"pass more {name} documents (--{name})",
            )
    held = {name: _heldout_keys(ks, heldout_fraction) for name, ks in keys.items()}
    counts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=out, prefix=".train-") as tmp:
        train_lines: dict[str, list[tuple[tuple[int, int], str]]] = {}
        heldout: list[tuple[int, str]] = []  # (label, line)
        # pass 2: pieces, normalised, on the side of their document
        for name, (paths, label) in classes.items():
            lines: list[tuple[tuple[int, int], str]] = []
            n_held_docs = 0
            n_held_pieces = 0
            for text in _documents(paths):
                k = _key(text, seed)
                is_held = k in held[name]
                n_held_docs += is_held
                for i, piece in enumerate(_pieces(text)):
                    line = normalize_text(piece)
                    if not line:
                        continue
                    if is_held:
                        heldout.append((int(name == "positive"), line))
                        n_held_pieces += 1
                    else:  # ordered by (document key, piece): independent of input order
                        lines.append(((k, i), f"{label} {line}"))
            lines.sort()
            train_lines[name] = lines
            counts[name] = {
                "documents": len(keys[name]),
                "heldout_documents": n_held_docs,
                "train_pieces": len(lines),
                "heldout_pieces": n_held_pieces,
            }
        balance = max(len(v) for v in train_lines.values())
        if min(len(v) for v in train_lines.values()) == 0:
            raise InputError(
                "one class has no training text after the held-out split",
                "pass more documents for both --positive and --negative",
            )
        train_file = Path(tmp) / "train.txt"
        # the smaller class repeated up to the larger's count (every piece of both is used), the two
        # interleaved (each in key order) so that no stretch of an epoch sees one class only
        chosen = {name: [v[i % len(v)][1] for i in range(balance)] for name, v in train_lines.items()}
        with open(train_file, "w", encoding="utf-8") as f:
            for a, b in zip(chosen["positive"], chosen["negative"], strict=True):
                f.write(a + "\n" + b + "\n")
        settings = {**FASTTEXT_DEFAULTS, **fasttext_settings}
        _fit_in_fresh_process(train_file, out / MODEL_FILE, seed, settings)
    for name in counts:
        counts[name]["trained_pieces"] = balance
    scorer = ClassifierScorer(out)
    labels = [y for y, _ in heldout]
    scores = [scorer.score(line) or 0.0 for _, line in heldout]
    metrics = heldout_metrics(labels, scores)
    meta = {
        "kind": "fasttext",
        "labels": {"positive": POSITIVE, "negative": NEGATIVE},
        "score": "P(positive) of the normalised text (lowercased, whitespace runs as one space)",
        "fingerprint": file_sha256(out / MODEL_FILE),
        "inputs": {
            "positive": [_fingerprint(p) for p in classes["positive"][0]],
            "negative": [_fingerprint(p) for p in classes["negative"][0]],
        },
        "settings": {
            "seed": seed,
            "heldout_fraction": heldout_fraction,
            "piece_chars": PIECE_CHARS,
            "thread": 1,
            "fasttext": settings,
        },
        "counts": counts,
        "heldout": metrics,
        "precision": metrics["precision"],
        "recall": metrics["recall"],
        "auc": metrics["auc"],
        "seconds": round(time.perf_counter() - t0, 3),
    }
    write_json_atomic(out / META_FILE, meta)
    if console is not None:
        console.print(
            f"quality classifier: {counts['positive']['documents']:,} positive and {counts['negative']['documents']:,} "
            f"negative documents, {balance:,} training pieces per class; held-out ({metrics['pieces']['positive']:,} + "
            f"{metrics['pieces']['negative']:,} pieces): precision {metrics['precision']}, recall {metrics['recall']}, "
            f"AUC {metrics['auc']} → {out / MODEL_FILE}"
        )
    return meta
