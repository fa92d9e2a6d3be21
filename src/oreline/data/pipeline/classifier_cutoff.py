"""The quality classifier's run-wide cut-off of `oreline data`, between phases 1 and 3.

With `data.quality.classifier_keep_top_fraction = F` the documents kept are those whose
"quality_score" is at least the cut-off: the score of rank ⌈F·m⌉ (from the top) of a bottom-k
sample (the `classifier_sample_docs` smallest hashes of document ids) of this run's phase-1
survivors, drawn per task and merged with the perplexity cut-offs' machinery
(`perplexity_cutoffs.run_sample`). The sample does not depend on task order, worker count or
executor, so neither does the output; when the run has no more scored documents than the sample
holds, the cut-off is exact (ties at the cut-off all kept). Written to work/classifier/cutoff.json
(the phase's marker) and stats.json "classifier"; phase 3 applies it
(`oreline.data.filters.classifier.top_fraction_step`). Without a fraction stats.json "classifier"
only names the model and the threshold.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def cutoff_path(work: Path) -> Path:
    return Path(work) / "classifier" / "cutoff.json"


def classifier_phase(work: Path, task_dirs: list[Path], cfg, executor=None) -> dict[str, Any] | None:
    """stats.json's "classifier": the model, its fingerprint, the threshold and (top-fraction mode) the cut-off."""
    from oreline.config import expand
    from oreline.data.filters.classifier import classifier_fingerprint, top_fraction_mode

    q = cfg.data.quality
    if not (q.enabled and q.classifier):
        return None
    info: dict[str, Any] = {
        "model": q.classifier,
        "model_fingerprint": classifier_fingerprint(expand(q.classifier)),
        "threshold": q.classifier_threshold,
        "keep_top_fraction": q.classifier_keep_top_fraction,
    }
    if not top_fraction_mode(cfg):
        return info
    out_file = cutoff_path(work)
    if out_file.is_file():
        return json.loads(out_file.read_text())
    from oreline.data.pipeline.perplexity_cutoffs import run_sample
    from oreline.io import write_json_atomic

    t0 = time.perf_counter()
    scored, sample = run_sample(
        task_dirs,
        out_file.parent / "samples",
        q.classifier_sample_docs,
        executor,
        column="quality_score",
        label="classifier",
    )
    info.update(
        {
            "scored_docs": scored,
            "sample_docs": len(sample),
            "cutoff": top_fraction_cutoff([s for _, s in sample], q.classifier_keep_top_fraction),
            "seconds": round(time.perf_counter() - t0, 6),
        }
    )
    write_json_atomic(out_file, info)
    return info


def top_fraction_cutoff(scores: list[float], fraction: float) -> float | None:
    """The lowest score among the top ⌈fraction·n⌉ of `scores` (None for no scores): keeping
    `score >= cutoff` keeps that many documents of these, plus any tied with the last."""
    if not scores:
        return None
    ranked = sorted(scores, reverse=True)
    keep = math.ceil(fraction * len(ranked) - 1e-9)  # 0.1 × 30 is 3.0000000000000004 in floats: 3, not 4
    return ranked[min(max(keep, 1), len(ranked)) - 1]


def cutoff_line(info: dict[str, Any]) -> str:
    """The funnel's line about the classifier of the run."""
    parts = [f"quality classifier {info['model']}"]
    if info.get("threshold") is not None:
        parts.append(f"documents scored below {info['threshold']:g} dropped")
    if info.get("keep_top_fraction") is not None:
        if info.get("cutoff") is None:
            parts.append(f"top {info['keep_top_fraction']:g}: no scored documents to cut by")
        else:
            parts.append(
                f"top {info['keep_top_fraction']:g} of this run kept: score ≥ {info['cutoff']:.4f} "
                f"(from a sample of {info['sample_docs']:,} of {info['scored_docs']:,} scored docs)"
            )
    return "; ".join(parts)
