"""The perplexity filter steps of `oreline data` (`data.quality.perplexity_model = DIR`).

Idea (Wenzek et al. 2020, "CCNet", §3.3): a language model trained on trusted text gives low
perplexity to text that looks like it and high perplexity to boilerplate, spam, lists and
gibberish; documents are then cut by an absolute perplexity or sorted into head / middle / tail
buckets by percentiles of the crawl's own distribution.

- phase 1, step "quality:perplexity" (`perplexity_filter_factory`, batched: the llama kind scores
  batches of documents): metadata "perplexity" and "perplexity_paragraphs"; drops
  "perplexity:no_tokens" and, with `perplexity_max`, "perplexity:>MAX";
- phase 3, step "quality:perplexity_buckets" (`bucket_step`, before dedup): head ≤ p30 < middle ≤
  p60 < tail with the cut-offs of `oreline.data.pipeline.perplexity_cutoffs`, metadata
  "perplexity_bucket", buckets outside `perplexity_keep_buckets` dropped as "perplexity:<bucket>".

Scores come from `oreline.data.filters.ngram_scorer` (n-gram) or `llama_scorer` (llama).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from oreline.config import QualityConfig
from oreline.data.filters.ngram_scorer import _cached_scorer
from oreline.document import Document
from oreline.errors import ConfigError


def _finite(x: float | None, digits: int) -> float | None:
    return round(x, digits) if x is not None and math.isfinite(x) else None


def perplexity_filter_factory(cfg: QualityConfig):
    """The phase-1 step "quality:perplexity" (a batched Step): scores every document.

    Writes metadata["perplexity"] (per word, see the module docstring) and
    metadata["perplexity_paragraphs"] (one per non-empty line, None where nothing was scored).
    Drops "perplexity:no_tokens" and, with perplexity_max set, "perplexity:>MAX". Without an
    absolute cut-off the buckets are applied in phase 3 (`bucket_step`), once the cut-offs have
    been computed from this run's own documents (`compute_cutoffs`).
    """
    from oreline.data.pipeline.runner import Step

    if not cfg.perplexity_model:
        raise ConfigError(
            "data.quality.perplexity_model is not set",
            "train a model with oreline quality train-reference and set its folder",
        )
    from oreline.config import expand

    scorer = _cached_scorer(expand(cfg.perplexity_model))
    limit = cfg.perplexity_max

    def judge(doc: Document, s: dict[str, Any]) -> str | None:
        doc.metadata["perplexity"] = _finite(s["perplexity"], 2) if s["words"] else None
        doc.metadata["perplexity_paragraphs"] = [_finite(p, 1) for p in s["paragraphs"]]
        if not s["words"]:
            return "perplexity:no_tokens"
        if limit is not None and s["perplexity"] > limit:
            return f"perplexity:>{limit:g}"
        return None

    def batch(docs: list[Document]) -> list[str | None]:
        return [judge(d, s) for d, s in zip(docs, scorer.score_texts([d.text for d in docs]), strict=True)]

    return Step(
        "quality:perplexity",
        lambda doc: batch([doc])[0],
        batch_fn=batch,
        batch_size=getattr(scorer, "batch_docs", 32),
    )


def bucket_mode(cfg) -> bool:
    """CCNet buckets (cut-offs from this run) instead of an absolute perplexity cut-off."""
    q = cfg.data.quality
    return bool(q.enabled and q.perplexity_model and q.perplexity_max is None)


def bucket_step(cutoffs_file: Path, cfg):
    """The phase-3 step "quality:perplexity_buckets": head ≤ p30 < middle ≤ p60 < tail.

    Sets metadata["perplexity_bucket"]; drops buckets not in perplexity_keep_buckets with the
    reason "perplexity:<bucket>". None when not in bucket mode.
    """
    if not bucket_mode(cfg) or not cutoffs_file.is_file():
        return None
    from oreline.data.pipeline.runner import Step

    info = json.loads(cutoffs_file.read_text())
    cuts = info["cutoffs"]
    keep = set(cfg.data.quality.perplexity_keep_buckets)

    def bucket(doc: Document) -> str | None:
        ppl = doc.metadata.get("perplexity")
        if cuts is None or ppl is None:  # no sample at all: nothing to cut by
            return None
        name = "head" if ppl <= cuts[0] else "middle" if ppl <= cuts[1] else "tail"
        doc.metadata["perplexity_bucket"] = name
        return None if name in keep else f"perplexity:{name}"

    return Step("quality:perplexity_buckets", bucket)
