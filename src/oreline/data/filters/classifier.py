"""The quality-classifier steps of `oreline data` (`data.quality.classifier = DIR`).

Idea (DCLM, Li et al. 2024, §4.4; FineWeb-Edu): a small fastText classifier trained on text one
wants more of (positives) against ordinary web pages (negatives) ranks a crawl better than
perplexity; documents are then kept above a score or in the run's top fraction. The classifier is
trained by `oreline quality train-classifier` (`oreline.quality.classifier`); oreline ships no
quality positives, the user brings them.

- phase 1, step "quality:classifier" (`classifier_step`, batched): metadata "quality_score" (the
  probability of the positive label, 6 decimals); drops "classifier:no_text" (nothing left after
  normalisation) and, with `classifier_threshold` T, "classifier:<T";
- phase 3, step "quality:classifier_top" (`top_fraction_step`, before dedup), with
  `classifier_keep_top_fraction` F: the documents whose score is below the run-wide cut-off
  (`oreline.data.pipeline.classifier_cutoff`: a bottom-k sample of this run's own scores, so the
  result depends neither on task order nor on the executor) are dropped as "classifier:below_top_F".

Text is normalised as DCLM's and datatrove's fastText classifiers do before training and scoring:
lowercased, every whitespace run (newlines included) one space (`normalize_text`).

fastText binding: the `fasttext` package (the `quality` extra, needed to train) and
`fasttext-predict` (installed for language ID, prediction only) both install the module `fasttext`
with the same C++ binding; each `FastText.predict` wrapper breaks in its own way (0.9.3's calls
`np.array(probs, copy=False)`, which numpy 2 refuses; fasttext-predict's list form drops the
scores), so scoring calls the binding itself, `model.f.predict(line, k, threshold, errors)`, which
both packages have and which returns [(probability, label)].

A model file is somebody else's file: `load_model` checks its layout against its size
(`oreline.data.filters.fasttext_file`) before fastText's loader, which believes every count, reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oreline.document import Document
from oreline.errors import ConfigError, InputError

POSITIVE = "__label__hq"  # DCLM's label for the wanted class
NEGATIVE = "__label__lq"
MODEL_FILE = "model.bin"
META_FILE = "classifier.json"
# fastText's cost is linear in the text: a 50 MB "document" must not hold a worker for seconds;
# the first 100,000 characters decide the score (a page's quality shows long before that)
MAX_CHARS = 100_000
SCORE_DIGITS = 6


def normalize_text(text: str) -> str:
    """One line for fastText: lowercased, whitespace runs (newlines included) as one space, NULs
    as spaces (a NUL ends the C string), text that UTF-8 cannot encode (lone surrogates) replaced,
    and fastText's label prefix defused: a page holding "__label__hq" must not label itself."""
    text = " ".join(text[:MAX_CHARS].replace("\x00", " ").lower().replace("__label__", "_label_").split())
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def load_model(folder: str | Path) -> Any:
    """The fastText model of a classifier folder; InputError naming what to do when it is not one."""
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        raise InputError(
            f"{folder} holds no {MODEL_FILE}: it is not a quality-classifier folder",
            "train one with `oreline quality train-classifier --positive ... --negative ... --out DIR`",
        )
    try:
        import fasttext
    except ImportError as exc:
        raise InputError(
            "the fasttext module is not installed", "pip install 'oreline[quality]' (or fasttext-predict)"
        ) from exc
    # fastText's loader believes every size the file states (a short dictionary spins at end of
    # file growing a string, a matrix header allocates what it says): the file is walked first
    from oreline.data.filters.fasttext_file import check_model_file

    check_model_file(path)
    return fasttext.load_model(str(path))


class ClassifierScorer:
    """P(positive) for texts with one fastText model."""

    def __init__(self, folder: str | Path):
        self.folder = str(folder)
        self.model = load_model(folder)
        labels = list(self.model.get_labels()) if hasattr(self.model, "get_labels") else []
        if labels and POSITIVE not in labels:
            raise InputError(
                f"the model in {folder} has labels {labels}, not {POSITIVE}",
                "train it with `oreline quality train-classifier`",
            )

    def score(self, text: str) -> float | None:
        """P(positive) of one text; None when nothing is left to score after normalisation."""
        line = normalize_text(text)
        if not line:
            return None
        # k=-1: every label with its probability (two here); see the module docstring for why the binding
        for prob, label in self.model.f.predict(line + "\n", -1, 0.0, "replace"):
            if label == POSITIVE:
                return round(min(max(float(prob), 0.0), 1.0), SCORE_DIGITS)
        return 0.0

    def score_texts(self, texts: list[str]) -> list[float | None]:
        return [self.score(t) for t in texts]


_SCORERS: dict[tuple, ClassifierScorer] = {}


def cached_scorer(folder: str) -> ClassifierScorer:
    """One loaded model per worker process (a task per input file must not reload it), keyed by the
    model file's mtime so that a retrained model is reloaded."""
    path = Path(folder) / MODEL_FILE
    key = (str(path.resolve()), path.stat().st_mtime_ns if path.is_file() else None)
    if key not in _SCORERS:
        _SCORERS.clear()
        _SCORERS[key] = ClassifierScorer(folder)
    return _SCORERS[key]


def classifier_fingerprint(folder: str | Path) -> str | None:
    """sha256 of the model file itself (not of classifier.json, which a copy could keep stale):
    part of the data run's fingerprint, so that a retrained classifier re-runs `oreline data`."""
    from oreline.io import file_sha256

    path = Path(folder) / MODEL_FILE
    return file_sha256(path) if path.is_file() else None


def classifier_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / META_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def classifier_step(cfg):
    """The phase-1 step "quality:classifier" (batched): scores every document, see the module docstring."""
    from oreline.config import expand
    from oreline.data.pipeline.runner import Step

    if not cfg.classifier:
        raise ConfigError(
            "data.quality.classifier is not set",
            "train one with oreline quality train-classifier and set its folder",
        )
    scorer = cached_scorer(expand(cfg.classifier))
    threshold = cfg.classifier_threshold

    def judge(doc: Document, score: float | None) -> str | None:
        doc.metadata["quality_score"] = score
        if score is None:
            return "classifier:no_text"
        if threshold is not None and score < threshold:
            return f"classifier:<{threshold:g}"
        return None

    def batch(docs: list[Document]) -> list[str | None]:
        return [judge(d, s) for d, s in zip(docs, scorer.score_texts([d.text for d in docs]), strict=True)]

    return Step("quality:classifier", lambda doc: batch([doc])[0], batch_fn=batch, batch_size=64)


def top_fraction_mode(cfg) -> bool:
    q = cfg.data.quality
    return bool(q.enabled and q.classifier and q.classifier_keep_top_fraction is not None)


def top_fraction_step(cutoff_file: Path, cfg):
    """The phase-3 step "quality:classifier_top": drops documents scored below the run-wide cut-off
    as "classifier:below_top_F"; None when not in top-fraction mode."""
    if not top_fraction_mode(cfg) or not cutoff_file.is_file():
        return None
    from oreline.data.pipeline.runner import Step

    cutoff = json.loads(cutoff_file.read_text())["cutoff"]
    reason = f"classifier:below_top_{cfg.data.quality.classifier_keep_top_fraction:g}"

    def top(doc: Document) -> str | None:
        score = doc.metadata.get("quality_score")
        if cutoff is None or score is None:  # nothing scored in the whole run: nothing to cut by
            return None
        return None if score >= cutoff else reason

    return Step("quality:classifier_top", top)
