"""The data pipeline's phase-1 steps, built from the step list `cfg.data.step_list()`: the
[[data.steps]] entries in the user's order, or what the data.protocol/extract/normalize/langid/
quality switches expand to (protocol, extract, normalize, langid, the quality rules, then model
perplexity and the classifier). Each entry becomes a `Step` for the runner in
`oreline.data.pipeline.runner`, which alone counts, times and rejects; the filters themselves are
pure functions in their modules.

An entry's class in `oreline.config` names its implementation ("module:function", `impl`): a rule
(`rule = True`) is a filter `(doc, settings) -> reason`, wrapped here; any other kind is a builder
`(settings, cfg, context) -> Step`. So a new kind is one class in `oreline.config` plus its
function, and nothing here changes.
"""

from __future__ import annotations

import importlib
import time
from collections import Counter
from dataclasses import dataclass, field

from oreline.data.filters.extract import EXTRACTORS, ExtractTimeout, extract
from oreline.data.filters.extract_worker import extract_isolated
from oreline.data.pipeline.runner import Step
from oreline.document import Document
from oreline.errors import ConfigError


def _is_warc(doc: Document) -> bool:
    return "record_type" in doc.metadata


def _is_html(doc: Document) -> bool:
    return bool(doc.metadata.get("is_html"))


@dataclass
class StepContext:
    """What steps count beside the runner's funnel, for the task's stats.json: the characters
    normalization changed, the extraction paths (see `extract_text`) and what the C4 line rules
    removed (a quality.LineRemovals)."""

    normalize_removed: Counter = field(default_factory=Counter)
    extract_paths: dict[str, dict] | None = None
    lines: object = None


def protocol_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    from oreline.data.filters.protocol import protocol_reason

    pcfg = cfg.data.protocol
    return Step(settings.step_name(), lambda doc: protocol_reason(doc.metadata, pcfg), applies=_is_warc)


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


def extract_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    ecfg = cfg.data.extract
    paths = ctx.extract_paths if ctx is not None else None

    def extract_one(doc: Document) -> str | None:
        text, reason = extract_text(doc.text, ecfg, paths)  # enforces data.extract.timeout_s per page
        doc.metadata["is_html"] = False  # from here on the text is no longer HTML
        doc.metadata["extracted"] = True
        doc.text = text
        return reason

    return Step(settings.step_name(), extract_one, applies=_is_html)


def normalize_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    from oreline.data.filters.normalize import normalize_reason, normalize_with_counts

    ncfg = cfg.data.normalize
    removed = ctx.normalize_removed if ctx is not None else Counter()

    def normalize(doc: Document) -> str | None:
        text, counts = normalize_with_counts(doc.text, ncfg.form, ncfg.ftfy)
        removed.update(counts)
        doc.text = text
        return normalize_reason(text, ncfg)

    return Step(settings.step_name(), normalize)


def langid_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    from oreline.data.filters.langid import detect, langid_reason

    lcfg = cfg.data.langid

    def langid(doc: Document) -> str | None:
        lang, score = detect(doc.text)
        doc.metadata["language"] = lang
        doc.metadata["language_score"] = round(float(score), 4)
        return langid_reason(lang, score, lcfg)

    return Step(settings.step_name(), langid)


def c4_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    """C4's rules, counting what its line rules remove into the context's `lines`."""
    from oreline.data.filters.quality import c4

    lines = ctx.lines if ctx is not None else None
    return Step(settings.step_name(), lambda doc: c4(doc, settings, lines))


def perplexity_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    from oreline.data.filters.perplexity import perplexity_filter_factory

    step = perplexity_filter_factory(cfg.data.quality)  # the batched Step "quality:perplexity"
    step.name = settings.step_name()
    return step


def classifier_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    from oreline.data.filters.classifier import classifier_step as build

    step = build(cfg.data.quality)  # the batched Step "quality:classifier"
    step.name = settings.step_name()
    return step


def resolve(impl: str):
    """The function an "module:function" string names."""
    module, _, name = impl.partition(":")
    return getattr(importlib.import_module(module), name)


def build_step(settings, cfg, ctx: StepContext | None = None) -> Step:
    """The Step of one step-list entry (see the module docstring)."""
    fn = resolve(settings.impl)
    if settings.rule:
        return Step(settings.step_name(), lambda doc: fn(doc, settings))
    return fn(settings, cfg, ctx)


def filter_steps(
    cfg, normalize_removed: Counter, extract_paths: dict[str, dict] | None = None, lines=None
) -> list[Step]:
    """Phase-1 steps in the order of `cfg.data.step_list()`; `normalize_removed` counts what
    normalization changed, `extract_paths` the extraction paths (see `extract_text`), `lines` (a
    quality.LineRemovals) what the C4 line rules remove from the documents they keep."""
    ctx = StepContext(normalize_removed, extract_paths, lines)
    return [build_step(s, cfg, ctx) for s in cfg.data.step_list()]
