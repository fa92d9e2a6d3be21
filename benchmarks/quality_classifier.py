"""Benchmark: the fastText quality classifier's scoring speed per core against the other steps of
the same `oreline data` run, and its held-out metrics on the stand-in data.

Stand-in (oreline ships no quality positives): Gutenberg prose (samples/english-prose) as positives
against the web pages of samples/web-archives through `oreline data` as negatives.

1. Train: `train_classifier` on the stand-in; held-out precision, recall and AUC from classifier.json.
2. Scoring: documents/s per core of `ClassifierScorer.score_texts` on the web documents of the run
   (each pass repeated until 2 s of CPU have passed), from process CPU time: one fastText thread.
3. Against the pipeline: `run_data` over the sample WARCs with `data.quality.classifier` set (one
   worker); every step's docs_in / seconds from the funnel in stats.json, the classifier's step
   among them, measured in the same run.

Target (issue 31): scoring ≥ 2,000 documents/s per core, so that the classifier never becomes the
pipeline's bottleneck.

Run: `.venv/bin/python benchmarks/quality_classifier.py [--samples DIR]`
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console

TARGET = 2000


def main() -> None:
    from oreline.config import Config, samples_dir
    from oreline.data.filters.classifier import ClassifierScorer
    from oreline.data.pipeline.run import run_data
    from oreline.quality.classifier import train_classifier

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--samples", type=Path, default=None, help="sample folder (default: the embedded samples)"
    )
    args = ap.parse_args()
    samples = args.samples or samples_dir()
    quiet = Console(file=io.StringIO())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        web = tmp / "web"
        run_data([str(samples / "web-archives")], web, Config(), workers=1, console=quiet)
        t0 = time.perf_counter()
        meta = train_classifier(
            [str(samples / "english-prose" / "nltk-gutenberg.zip")], [str(web)], tmp / "clf"
        )
        print(
            f"trained in {time.perf_counter() - t0:.1f} s: positives {meta['counts']['positive']}, "
            f"negatives {meta['counts']['negative']}"
        )
        print(
            f"held-out ({meta['heldout']['pieces']}): precision {meta['precision']}, recall {meta['recall']}, "
            f"AUC {meta['auc']}"
        )

        texts = [
            r["text"] for p in sorted((web / "docs").glob("*.parquet")) for r in pq.read_table(p).to_pylist()
        ]
        scorer = ClassifierScorer(tmp / "clf")
        scorer.score_texts(texts[:10])  # warm
        n, c0, w0 = 0, time.process_time(), time.perf_counter()
        while time.process_time() - c0 < 2.0:
            scorer.score_texts(texts)
            n += len(texts)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        chars = sum(len(t) for t in texts) / len(texts)
        rate = n / cpu
        print(
            f"scoring: {n:,} documents (mean {chars:,.0f} chars) in {cpu:.2f} s CPU ({wall:.2f} s wall): "
            f"{rate:,.0f} docs/s per core (target ≥ {TARGET:,}: {'met' if rate >= TARGET else 'NOT met'})"
        )

        cfg = Config.model_validate(
            {"data": {"quality": {"classifier": str(tmp / "clf"), "classifier_keep_top_fraction": 0.5}}}
        )
        t0 = time.perf_counter()
        stats = run_data([str(samples / "web-archives")], tmp / "run", cfg, workers=1, console=quiet)
        wall = time.perf_counter() - t0
        print(
            f"\n`oreline data` over {samples / 'web-archives'} with the classifier, 1 worker, {wall:.1f} s wall:"
        )
        print(f"{'step':28} {'docs in':>8} {'seconds':>9} {'docs/s':>10}")
        for st in stats["steps"]:
            rate = st["docs_in"] / st["seconds"] if st["seconds"] else float("inf")
            print(f"{st['name']:28} {st['docs_in']:>8,} {st['seconds']:>9.4f} {rate:>10,.0f}")
        print(json.dumps(stats["classifier"]))


if __name__ == "__main__":
    main()
