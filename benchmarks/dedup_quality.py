"""Benchmark: MinHash near-dup precision/recall against exact Jaccard, signature speed vs datasketch,
and the quality filters' time per document.

Planted set: ~2 KB documents of consecutive English-prose paragraphs (NLTK Gutenberg books), each
paired with one mutant whose exact 5-word-shingle Jaccard to it is set to a target level
(0.5 ... 0.95, one level at the threshold itself) by replacing words (bisection on the number
replaced). The whole set goes through the real stages (dedup_stage_signatures → dedup_plan), twice:
with `verify = "signature"` (the MinHash estimate decides) and `verify = "exact"` (the exact
shingle Jaccard decides, texts read back by `parquet_text_source` from Parquet document files
written like the pipeline's phase-1 shards; the source counts which ids it was asked for). Each
mode gets its own bands×rows (chosen for it, see data/dedup/minhash.py, step 4). Ground truth is exact Jaccard
≥ threshold.

- recall: planted pairs at or above the threshold whose two documents end in one cluster.
- precision: removed documents whose exact Jaccard to their survivor is ≥ the threshold.
- Both are reported over all pairs and "clear of the threshold", i.e. |J - threshold| ≥ 0.1: within
  that band the signature estimate (standard error ~0.035 at 128 permutations) cannot decide
  reliably, so a J=0.75 pair is kept ~90% of the time, not always, and a J=0.85 pair removed ~93%;
  exact verification leaves only LSH's misses (P(candidate | J=0.8) = 0.98 with 17×7).

Speed: our numpy+xxhash signatures vs datasketch `MinHash.update_batch` on the same documents and
shingles, datasketch run in benchmarks/.peers-venv (git-ignored: `python -m venv
benchmarks/.peers-venv && benchmarks/.peers-venv/bin/pip install datasketch`) when it is not
importable here. Run: `.venv/bin/python benchmarks/dedup_quality.py [--docs 600]`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from oreline.config import DedupConfig, QualityConfig, samples_dir
from oreline.data.dedup.minhash import dedup_stage_signatures, minhash_signatures
from oreline.data.dedup.reference_plan import dedup_plan
from oreline.data.dedup.shingles import jaccard, shingles
from oreline.data.dedup.verify import parquet_text_source
from oreline.data.filters.quality import quality_filters
from oreline.data.read.shards import write_documents
from oreline.document import Document

LEVELS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
BOOKS = [
    "austen-emma.txt",
    "melville-moby_dick.txt",
    "chesterton-brown.txt",
    "austen-sense.txt",
    "whitman-leaves.txt",
]

PEER_SCRIPT = r"""
import json, sys, time
from datasketch import MinHash
docs = json.load(sys.stdin)
grams = []
for t in docs:
    w = t.lower().split()
    grams.append([" ".join(w[i:i + 5]).encode() for i in range(max(1, len(w) - 4))])
t0 = time.perf_counter()
for g in grams:
    m = MinHash(num_perm=128)
    m.update_batch(g)
    m.digest()
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def base_docs(n: int, size: int = 2000) -> list[str]:
    docs = []
    with zipfile.ZipFile(samples_dir() / "english-prose" / "nltk-gutenberg.zip") as zf:
        for book in BOOKS:
            text = zf.read(f"gutenberg/{book}").decode("latin-1")
            cur = ""
            for para in re.split(r"\n\s*\n", text):
                cur += " ".join(para.split()) + "\n\n"
                if len(cur) >= size:
                    docs.append(cur)
                    cur = ""
    random.Random(0).shuffle(docs)
    return docs[:n]


def mutant(text: str, target: float, rng: random.Random) -> tuple[str, float]:
    """A copy of text with words replaced so that exact shingle Jaccard is close to target."""
    words = text.split()
    order = rng.sample(range(len(words)), len(words))
    fresh = [f"zq{rng.randrange(10**9)}" for _ in words]
    base = shingles(text)

    def make(k: int) -> str:
        out = list(words)
        for i in order[:k]:
            out[i] = fresh[i]
        return " ".join(out)

    lo, hi = 0, len(words)
    while lo < hi:  # smallest k with Jaccard <= target
        mid = (lo + hi) // 2
        if jaccard(base, shingles(make(mid))) <= target:
            hi = mid
        else:
            lo = mid + 1
    best = min(
        (k for k in (lo - 1, lo) if k >= 0), key=lambda k: abs(jaccard(base, shingles(make(k))) - target)
    )
    m = make(best)
    return m, jaccard(base, shingles(m))


def measure_quality(docs: list[str]) -> tuple[float, float]:
    """(wall, CPU) milliseconds per document; CPU time is less inflated on a shared machine."""
    fs = quality_filters(QualityConfig())
    t0, c0 = time.perf_counter(), time.process_time()
    for i, text in enumerate(docs):
        doc = Document(str(i), text, metadata={"language": "en"})
        for _, fn in fs:
            if fn(doc):
                break
    return (time.perf_counter() - t0) / len(docs) * 1000, (time.process_time() - c0) / len(docs) * 1000


def peer_seconds(texts: list[str]) -> float | None:
    try:
        import datasketch  # noqa: F401

        cmd = [sys.executable]
    except ImportError:
        peer = Path(__file__).parent / ".peers-venv" / "bin" / "python"
        if not peer.exists():
            return None
        cmd = [str(peer)]
    res = subprocess.run(cmd + ["-c", PEER_SCRIPT], input=json.dumps(texts), capture_output=True, text=True)
    if res.returncode != 0:
        print(f"datasketch peer failed: {res.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(res.stdout)["seconds"]


def run_plan(docs: list[Document], cfg: DedupConfig, tmp: Path, exact: bool) -> tuple[dict, dict, float, int]:
    """(plan, dedup_stats, plan seconds, ids asked of the text source) for one verification mode."""
    mode = "exact" if exact else "signature"
    cfg = cfg.model_copy(update={"verify": mode})
    half = len(docs) // 2
    paths = [tmp / mode / "sig-0.parquet", tmp / mode / "sig-1.parquet"]
    dedup_stage_signatures(docs[:half], paths[0], cfg)
    dedup_stage_signatures(docs[half:], paths[1], cfg)
    asked: set[str] = set()
    source = None
    if exact:  # the documents as Parquet shards, like the pipeline's phase-1 kept files
        kept = write_documents(docs[:half], tmp / mode / "task-0", "kept", 1 << 62)
        kept += write_documents(docs[half:], tmp / mode / "task-1", "kept", 1 << 62)
        shards = parquet_text_source(kept)

        def source(ids: set[str]):
            asked.update(ids)
            return shards(ids)

    t0 = time.perf_counter()
    plan = dedup_plan(paths, tmp / mode / "plan", cfg, text_source=source)
    seconds = time.perf_counter() - t0
    stats = json.loads((tmp / mode / "plan" / "dedup_stats.json").read_text())
    return plan, stats, seconds, len(asked)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=600, help="base documents (each gets one mutant)")
    args = ap.parse_args()
    cfg = DedupConfig()
    rng = random.Random(1)
    bases = base_docs(args.docs)
    docs, planted = [], []
    for i, text in enumerate(bases):
        level = LEVELS[i % len(LEVELS)]
        m, j = mutant(text, level, rng)
        docs.append(Document(f"b{i:05d}", text, metadata={"source": "base", "offset": i}))
        docs.append(Document(f"m{i:05d}", m, metadata={"source": "mutant", "offset": i}))
        planted.append((f"b{i:05d}", f"m{i:05d}", level, j))
    sets = {d.id: shingles(d.text) for d in docs}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        dedup_stage_signatures(docs, Path(tmp) / "timing.parquet", cfg)
        sig_rate = len(docs) / (time.perf_counter() - t0)
        runs = {mode: run_plan(docs, cfg, Path(tmp), mode == "exact") for mode in ("signature", "exact")}
    print(
        f"{len(docs)} documents ({len(bases)} bases + mutants), threshold {cfg.threshold}, num_perm {cfg.num_perm}; "
        f"signature stage {sig_rate:.0f} docs/s (incl. exact keys + Parquet)"
    )
    roots = {}
    for mode, (plan, _, _, _) in runs.items():
        survivor = {k: v[1] for k, v in plan.items()}
        roots[mode] = lambda d, survivor=survivor: survivor.get(
            d, d
        )  # clusters are stars around their survivor
    by_level = defaultdict(list)
    for b, m, level, j in planted:
        by_level[level].append((b, m, j))
    print(
        f"{'target J':>9} {'exact J (mean, min-max)':>26} {'pairs':>6} {'clustered: signature':>21} {'exact':>6}"
    )
    for level in LEVELS:
        rows = by_level[level]
        js = [j for _, _, j in rows]
        hit = {mode: np.mean([root(b) == root(m) for b, m, _ in rows]) for mode, root in roots.items()}
        print(
            f"{level:9.2f} {np.mean(js):10.3f} ({min(js):.3f}-{max(js):.3f})      {len(rows):6d} "
            f"{hit['signature']:21.3f} {hit['exact']:6.3f}"
        )
    above = [(b, m) for b, m, _, j in planted if j >= cfg.threshold]
    clear = [(b, m) for b, m, _, j in planted if j >= cfg.threshold + 0.1]
    for mode, (plan, stats, seconds, asked) in runs.items():
        root = roots[mode]
        recall = sum(root(b) == root(m) for b, m in above) / len(above)
        recall_clear = sum(root(b) == root(m) for b, m in clear) / len(clear)
        exact_to_survivor = {d: jaccard(sets[d], sets[s]) for d, (_, s) in plan.items()}
        precision = sum(j >= cfg.threshold for j in exact_to_survivor.values()) / max(1, len(plan))
        outside = {d: j for d, j in exact_to_survivor.items() if abs(j - cfg.threshold) >= 0.1}
        precision_clear = sum(j >= cfg.threshold for j in outside.values()) / max(1, len(outside))
        print(
            f"[verify={mode}] bands×rows {stats['bands']}×{stats['rows']}: "
            f"recall (exact J >= {cfg.threshold}) {recall:.3f} of {len(above)} pairs, "
            f"(J >= {cfg.threshold + 0.1:.2f}) {recall_clear:.3f} of {len(clear)}; "
            f"precision {precision:.3f} of {len(plan)} removals, (|J - t| >= 0.1) {precision_clear:.3f} of {len(outside)}"
        )
        line = (
            f"    candidate pairs {stats['candidate_pairs']}, verified {stats['verified_pairs']}, "
            f"rejected {stats['rejected_pairs']}; plan {seconds:.2f} s"
        )
        if mode == "exact":
            line += (
                f"; exactly verified pairs {stats['exact_verified_pairs']}, texts asked {asked} "
                f"of {len(docs)} docs, read {stats['texts_read']}, missing {stats['texts_missing']}; "
                f"the estimate alone would have removed {stats['estimate_above_exact_below']} "
                f"and kept {stats['estimate_below_exact_above']} of them wrongly"
            )
        print(line)

    texts = [d.text for d in docs]
    t0 = time.perf_counter()
    minhash_signatures(texts, cfg.num_perm, cfg.shingle_words, cfg.seed)
    ours = time.perf_counter() - t0
    peer = peer_seconds(texts)
    line = f"signatures, {len(texts)} docs of ~2 KB, 128 perms: oreline {len(texts) / ours:.0f} docs/s"
    if peer:
        line += f"; datasketch update_batch {len(texts) / peer:.0f} docs/s; ratio {peer / ours:.1f}x"
    else:
        line += "; datasketch not available (see the docstring for the peer venv)"
    print(line)
    five_kb = base_docs(200, size=5000)
    print(
        f"quality filters (all enabled), {len(five_kb)} docs of ~{np.mean([len(t) for t in five_kb]) / 1000:.1f} KB: "
        "{:.2f} ms/doc wall, {:.2f} ms/doc CPU".format(*measure_quality(five_kb))
    )


if __name__ == "__main__":
    main()
