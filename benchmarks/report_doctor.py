"""How long `oreline report` and `oreline doctor run` take on a run of realistic size, and what the
report's reading strategy saves against the obvious peer (pandas), measured in the same run.

The run directory is manufactured at scale: the tests' healthy run (real tokenizer, real token
shards, real checkpoints) plus a data/docs Parquet of --docs documents made of Shakespeare
paragraphs from the samples (synthetic words when absent) in shards of 10k rows, and a
metrics.jsonl of --records train records (a 10-step log interval over --records × 10 steps).

Measured:
- documents: `scan_documents` (pyarrow, `text` + `language` columns only, utf8_length in Arrow)
  vs pandas `read_parquet` of every column + `str.len()` + `value_counts()`.
- metrics: `read_metrics` (json per line) vs `pandas.read_json(lines=True)`.
- whole `write_report` and `diagnose_run` wall time.

Run: .venv/bin/python benchmarks/report_doctor.py [--docs 50000] [--records 20000]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from oreline.config import samples_dir
from oreline.doctor.artifacts import load_run, read_metrics
from oreline.doctor.run import diagnose_run
from oreline.report.html import scan_documents, write_report

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    "the",
    "a",
    "river",
    "mountain",
    "history",
    "science",
    "music",
    "garden",
    "city",
    "language",
    "water",
]


def _factory():
    spec = importlib.util.spec_from_file_location("run_factory", REPO / "tests" / "doctor" / "run_factory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paragraphs() -> list[str]:
    path = samples_dir() / "english-prose" / "tinyshakespeare.txt.gz"
    if path.is_file():
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            text = fh.read()
        return [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 300))) for _ in range(2000)]


def scale_up(run: Path, docs: int, records: int) -> None:
    rng = random.Random(1)
    paras = _paragraphs()
    for old in (run / "data" / "docs").glob("*.parquet"):
        old.unlink()
    per_shard = 10_000
    for shard in range(math.ceil(docs / per_shard)):
        rows = []
        for i in range(shard * per_shard, min(docs, (shard + 1) * per_shard)):
            text = "\n\n".join(rng.choice(paras) for _ in range(rng.randint(1, 8)))
            lang = rng.choices(["en", "de", "fr", "es", "zh"], [80, 6, 6, 5, 3])[0]
            rows.append(
                {
                    "id": f"doc-{i}",
                    "text": text,
                    "url": f"https://example.org/{i}",
                    "language": lang,
                    "language_score": rng.uniform(0.65, 1.0),
                    "source_file": "crawl.warc.gz",
                    "offset": i * 1000,
                    "metadata": json.dumps({"gopher_words": len(text.split())}),
                }
            )
        pq.write_table(
            pa.Table.from_pylist(rows),
            run / "data" / "docs" / f"part-{shard:05d}.parquet",
            compression="zstd",
        )
    lines = [
        line
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["type"] != "train"
    ]
    template = next(
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["type"] == "train"
    )
    with open(run / "metrics.jsonl", "w") as fh:
        for line in lines[:1]:  # the start record first
            fh.write(line + "\n")
        for k in range(1, records + 1):
            step = 10 * k
            rec = dict(
                template,
                step=step,
                tokens_seen=step * 1024,
                loss=3.0 + 6 * math.exp(-k / (records / 5)),
                lr=3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / records))),
                grad_norm=0.4 + math.exp(-k / (records / 4)) + abs(rng.gauss(0, 0.02)),
                tokens_per_s=2000 * rng.uniform(0.97, 1.03),
                rss_mb=900 + rng.uniform(-5, 5),
            )
            fh.write(json.dumps(rec) + "\n")
        for line in lines[1:]:
            fh.write(line + "\n")


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--records", type=int, default=20_000)
    args = ap.parse_args()
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run = _factory().build_healthy_run(Path(tmp) / "run")
        scale_up(run, args.docs, args.records)
        mb = sum(p.stat().st_size for p in (run / "data" / "docs").glob("*.parquet")) / 1e6
        metrics_mb = (run / "metrics.jsonl").stat().st_size / 1e6
        print(
            f"run: {args.docs:,} documents ({mb:.1f} MB Parquet), {args.records:,} train records "
            f"({metrics_mb:.1f} MB metrics.jsonl); built in {time.perf_counter() - t0:.1f} s"
        )

        loaded = load_run(run)
        ours_docs = best_of(lambda: scan_documents(loaded))

        def pandas_docs():
            frames = [pd.read_parquet(p) for p in sorted((run / "data" / "docs").glob("*.parquet"))]
            df = pd.concat(frames)
            return df["text"].str.len().describe(), df["language"].value_counts()

        peer_docs = best_of(pandas_docs)
        print(
            f"documents  oreline scan_documents {ours_docs:6.2f} s | pandas read_parquet(all columns) "
            f"{peer_docs:6.2f} s | ratio ×{peer_docs / ours_docs:.2f}"
        )

        path = run / "metrics.jsonl"
        ours_m = best_of(lambda: read_metrics(path))
        peer_m = best_of(lambda: pd.read_json(path, lines=True))
        print(
            f"metrics    oreline read_metrics   {ours_m:6.2f} s | pandas read_json(lines=True)      "
            f"{peer_m:6.2f} s | ratio ×{peer_m / ours_m:.2f}"
        )

        report_s = best_of(lambda: write_report(run), repeat=2)
        doctor_s = best_of(lambda: diagnose_run(run), repeat=2)
        size = (run / "report.html").stat().st_size / 1e6
        print(
            f"write_report {report_s:.2f} s ({size:.2f} MB report.html); diagnose_run {doctor_s:.2f} s "
            f"(findings: {[f.check for f in diagnose_run(run)] or 'none'})"
        )


if __name__ == "__main__":
    sys.exit(main())
