"""The data pipeline's filter steps, in order: protocol, extract, normalize, langid, quality
(heuristics, then model perplexity when a reference model is set). Each is a `Step` for the
runner in `oreline.data.pipeline.runner`; the filters themselves are pure functions in their modules.
"""

from __future__ import annotations

import time
from collections import Counter

from oreline.data.filters.extract import EXTRACTORS, ExtractTimeout, extract
from oreline.data.filters.extract_worker import extract_isolated
from oreline.data.pipeline.runner import Step
from oreline.document import Document
from oreline.errors import ConfigError


def _is_warc(doc: Document) -> bool:
    return "record_type" in doc.metadata


def _is_html(doc: Document) -> bool:
    return bool(doc.metadata.get("is_html"))


def protocol_step(cfg) -> Step:
    from oreline.data.filters.protocol import protocol_reason

    pcfg = cfg.data.protocol
    return Step("protocol", lambda doc: protocol_reason(doc.metadata, pcfg), applies=_is_warc)


def extract_text(html: str, cfg, paths: dict[str, dict] | None = None) -> tuple[str, str | None]:
    """(text, drop reason) under `cfg.data.extract`: "extract:timeout", "extract:too_large",
    "extract:error", "extract:empty". Runs in the extraction child (`extract_worker`) unless
    `cfg.isolate` is off. It lives here, not in `extract`, because the child imports `extract`.

    `paths`, when given, counts per extraction path (e.g. "pruned", "pruned:too_deep") the pages
    and the seconds they took, the call to the child included: `{path: {"docs", "seconds"}}`."""
    t0 = time.perf_counter()
    if cfg.isolate:
        if cfg.extractor not in EXTRACTORS:
            raise ConfigError(f"unknown extractor {cfg.extractor!r}", f"use one of {sorted(EXTRACTORS)}")
        if not html:
            text, reason, path = "", None, "empty"
        else:
            text, reason, path = extract_isolated(
                html, cfg.extractor, cfg.main_content, cfg.timeout_s, cfg.max_memory_mb
            )
    else:
        path = cfg.extractor
        try:
            text, path = extract(html, cfg.extractor, cfg.main_content, cfg.timeout_s)
            reason = None
        except ExtractTimeout:
            text, reason = "", "extract:timeout"
        except ConfigError:
            raise
        except Exception:  # a parser failing on one page drops that page, never the run
            text, reason = "", "extract:error"
    if paths is not None:
        entry = paths.setdefault(path, {"docs": 0, "seconds": 0.0})
        entry["docs"] += 1
        entry["seconds"] += time.perf_counter() - t0
    if reason is not None:
        return "", reason
    if len(text.strip()) < max(cfg.min_chars, 1):
        return text, "extract:empty"
    return text, None


def extract_step(cfg, paths: dict[str, dict] | None = None) -> Step:
    ecfg = cfg.data.extract

    def extract_one(doc: Document) -> str | None:
        text, reason = extract_text(doc.text, ecfg, paths)  # enforces data.extract.timeout_s per page
        doc.metadata["is_html"] = False  # from here on the text is no longer HTML
        doc.metadata["extracted"] = True
        doc.text = text
        return reason

    return Step("extract", extract_one, applies=_is_html)


def normalize_step(cfg, removed: Counter) -> Step:
    from oreline.data.filters.normalize import normalize_reason, normalize_with_counts

    ncfg = cfg.data.normalize

    def normalize(doc: Document) -> str | None:
        text, counts = normalize_with_counts(doc.text, ncfg.form, ncfg.ftfy)
        removed.update(counts)
        doc.text = text
        return normalize_reason(text, ncfg)

    return Step("normalize", normalize)


def langid_step(cfg) -> Step:
    from oreline.data.filters.langid import detect, langid_reason

    lcfg = cfg.data.langid

    def langid(doc: Document) -> str | None:
        lang, score = detect(doc.text)
        doc.metadata["language"] = lang
        doc.metadata["language_score"] = round(float(score), 4)
        return langid_reason(lang, score, lcfg)

    return Step("langid", langid)


def quality_steps(cfg, lines=None) -> list[Step]:
    """The quality steps; `lines` (a quality.LineRemovals) counts what the C4 line rules remove."""
    from oreline.data.filters.quality import quality_filters

    qcfg = cfg.data.quality
    steps = [Step(f"quality:{name}", fn) for name, fn in quality_filters(qcfg, lines)]
    if qcfg.perplexity_model:
        from oreline.data.filters.perplexity import perplexity_filter_factory

        steps.append(perplexity_filter_factory(qcfg))  # the batched Step "quality:perplexity"
    if qcfg.classifier:
        from oreline.data.filters.classifier import classifier_step

        steps.append(classifier_step(qcfg))  # the batched Step "quality:classifier"
    return steps


def filter_steps(
    cfg, normalize_removed: Counter, extract_paths: dict[str, dict] | None = None, lines=None
) -> list[Step]:
    """Phase-1 steps in order, each present only when its config section is enabled;
    `extract_paths` collects the extraction paths (see `extract_text`), `lines` (a
    quality.LineRemovals) what the C4 line rules remove from the documents they keep."""
    d = cfg.data
    steps: list[Step] = []
    if d.protocol.enabled:
        steps.append(protocol_step(cfg))
    if d.extract.enabled:
        steps.append(extract_step(cfg, extract_paths))
    if d.normalize.enabled:
        steps.append(normalize_step(cfg, normalize_removed))
    if d.langid.enabled:
        steps.append(langid_step(cfg))
    if d.quality.enabled:
        steps.extend(quality_steps(cfg, lines))
    return steps
