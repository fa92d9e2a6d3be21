"""Benchmark: how well both reference-LM kinds separate prose from web text and garbage, their
scoring speed per core, and the perplexity step's share of a real `oreline data` run.

References, both trained here by `oreline.quality.reference_lm.train_reference` on the same trusted
text (NLTK Gutenberg books plus every other clean news article body of article-extraction-dev):
the trigram interpolated modified Kneser-Ney model (`ngram`, queried with kenlm when installed)
and the tiny oreline Llama with its own BPE tokenizer (`llama`, LLAMA_DEFAULTS, --steps).

1. Separation: held-out books (prose), the other news articles (web), text extracted from the
   sample WARCs with resiliparse (crawl), and garbage: shuffled prose, keyword stuffing, repeated
   function words, random characters, navigation menus (link texts of real pages). Median
   perplexity per word per set and AUC against held-out prose (1.0: every document of the set
   scores above every prose one).
2. Speed: documents/s per core of `score_texts` on the crawl texts, from process CPU time with one
   torch thread (wall time printed too; the machine may be shared).
3. Share: `run_data` over the sample WARCs with `data.quality.perplexity_model` set (one worker);
   the perplexity step's seconds from the funnel against the sum of all steps' seconds and the
   run's wall time.
4. The ARPA query in pure Python against kenlm on the same file.

Run: `.venv/bin/python benchmarks/perplexity_filter.py [--steps 450]`
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import re
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

TRAIN_BOOKS = ["austen-emma.txt", "chesterton-brown.txt", "melville-moby_dick.txt", "austen-sense.txt"]
HELDOUT_BOOKS = ["austen-persuasion.txt", "chesterton-ball.txt", "chesterton-thursday.txt"]


def auc(low, high) -> float:
    lo, hi = np.asarray(low)[:, None], np.asarray(high)[None, :]
    return float((hi > lo).mean() + 0.5 * (hi == lo).mean())


def crawl_texts(root: Path) -> list[str]:
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from resiliparse.extract.html2text import extract_plain_text

    out = []
    for path in sorted(root.glob("web-archives/*/*.warc.gz")):
        with open(path, "rb") as fh:
            for rec in ArchiveIterator(fh, record_types=WarcRecordType.response):
                if "html" not in (rec.http_headers.get("Content-Type", "") if rec.http_headers else ""):
                    continue
                text = extract_plain_text(rec.reader.read().decode("utf-8", "replace"), main_content=True)
                if len(text) > 500:
                    out.append(text)
    return out


def test_sets(
    root: Path, books: dict[str, str], arts: list[str], truth: dict
) -> tuple[list[str], dict[str, list[str]]]:
    rng = random.Random(0)
    prose = [books[n][i : i + 3000] for n in HELDOUT_BOOKS for i in range(5000, 95000, 3000)]

    def shuffled(t: str) -> str:
        w = t.split()
        rng.shuffle(w)
        return " ".join(w)

    navs = []
    for key in sorted(truth):
        html = gzip.decompress((root / "article-extraction-dev" / "html" / f"{key}.html.gz").read_bytes())
        links = [
            " ".join(t.split())
            for t in re.findall(r"<a[^>]*>([^<]{2,40})</a>", html.decode("utf-8", "replace"))
        ]
        links = [t for t in links if t]
        if len(links) >= 20:
            navs.append("\n".join(links[:60]))
    return prose, {
        "web articles (held out)": [a for a in arts[1::2] if len(a) > 500],
        "crawl (WARC samples, resiliparse)": crawl_texts(root),
        "shuffled prose": [shuffled(t) for t in prose[:40]],
        "keyword stuffing": [
            " ".join([p] * 150)
            for p in ("click here", "buy cheap watches", "loading", "free download", "home")
        ],
        "repeated function words": [" ".join([p] * 300) for p in ("the", "and the", "of the", "to")],
        "random characters": [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz    ") for _ in range(2000)) for _ in range(10)
        ],
        "navigation menus": navs,
    }


NOT_GARBAGE = ("web articles (held out)", "crawl (WARC samples, resiliparse)", "repeated function words")


def separation(scorer, prose: list[str], sets: dict[str, list[str]]) -> None:
    p_prose = [s["perplexity"] for s in scorer.score_texts(prose)]
    print(f"  {'set':36} {'docs':>5} {'median ppl/word':>16} {'AUC vs prose':>13}")
    print(f"  {'held-out prose':36} {len(prose):5d} {np.median(p_prose):16.1f} {'-':>13}")
    garbage = []
    for name, texts in sets.items():
        p = [s["perplexity"] for s in scorer.score_texts(texts)]
        if name not in NOT_GARBAGE:
            garbage += p
        print(f"  {name:36} {len(texts):5d} {np.median(p):16.4g} {auc(p_prose, p):13.3f}")
    print(f"  AUC prose vs garbage (shuffled, stuffing, random chars, menus): {auc(p_prose, garbage):.3f}")


def speed(scorer, texts: list[str], batch: int = 32) -> tuple[float, float]:
    """(docs/s per core from CPU time, docs/s wall) with one torch thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(0, len(texts), batch):
            scorer.score_texts(texts[i : i + batch])
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        torch.set_num_threads(threads)
    return len(texts) / cpu, len(texts) / wall


def pipeline_share(root: Path, ref: Path, out: Path) -> str:
    from rich.console import Console

    from oreline.config import Config
    from oreline.data.pipeline.run import run_data

    cfg = Config.model_validate({"data": {"workers": 1, "quality": {"perplexity_model": str(ref)}}})
    stats = run_data([str(root / "web-archives")], out, cfg, workers=1, console=Console(file=io.StringIO()))
    steps = {s["name"]: s for s in stats["steps"]}
    ppl = (
        steps["quality:perplexity"]["seconds"]
        + steps.get("quality:perplexity_buckets", {"seconds": 0})["seconds"]
    )
    total = sum(s["seconds"] for s in stats["steps"])
    scored = steps["quality:perplexity"]["docs_in"]
    return (
        f"{scored} docs scored in {ppl:.2f} s = {100 * ppl / total:.1f}% of the steps' {total:.1f} s "
        f"({100 * ppl / stats['seconds']:.1f}% of the run's {stats['seconds']:.1f} s wall); "
        f"cut-offs {[round(c, 1) for c in stats['perplexity']['cutoffs']]}, "
        f"dropped {steps['quality:perplexity_buckets']['dropped']}"
    )


def main() -> None:
    import torch

    from oreline.config import larger_samples
    from oreline.data.filters.ngram_scorer import ArpaModel, load_scorer
    from oreline.data.filters.words import sentences
    from oreline.quality.reference_lm import train_reference

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=450, help="llama reference training steps")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core per scorer, as in a pipeline worker
    root = larger_samples("article-extraction-dev")
    with zipfile.ZipFile(root / "english-prose" / "nltk-gutenberg.zip") as zf:
        books = {n: zf.read(f"gutenberg/{n}").decode("latin-1") for n in TRAIN_BOOKS + HELDOUT_BOOKS}
    truth = json.loads((root / "article-extraction-dev" / "ground-truth.json").read_text())
    arts = [truth[k]["articleBody"] for k in sorted(truth)]
    prose, sets = test_sets(root, books, arts, truth)
    crawl = sets["crawl (WARC samples, resiliparse)"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        src.mkdir()
        paths = []
        for n in TRAIN_BOOKS:
            (src / n).write_text(books[n], encoding="utf-8")
            paths.append(str(src / n))
        (src / "articles.jsonl").write_text(
            "".join(json.dumps({"id": f"a{i}", "text": a}) + "\n" for i, a in enumerate(arts[::2]))
        )
        paths.append(str(src / "articles.jsonl"))
        for kind, extra in (("ngram", {}), ("llama", {"steps": args.steps})):
            t0 = time.perf_counter()
            meta = train_reference(paths, tmp / kind, kind=kind, **extra)
            print(
                f"\n== {kind}: trained in {time.perf_counter() - t0:.1f} s, held-out perplexity per word "
                f"{meta['heldout_perplexity']}"
                + (
                    f", {meta['steps']} steps, {meta['train_tokens_seen']:,} tokens"
                    if kind == "llama"
                    else f", {meta['train_tokens']:,} tokens"
                )
            )
            t0 = time.perf_counter()
            scorer = load_scorer(tmp / kind)
            print(f"  model load {time.perf_counter() - t0:.2f} s (once per worker process in a data run)")
            separation(scorer, prose, sets)
            per_core, wall = speed(scorer, crawl)
            mean_chars = sum(map(len, crawl)) / len(crawl)
            print(
                f"  speed on {len(crawl)} crawl texts (mean {mean_chars:,.0f} chars): {per_core:,.1f} docs/s per core "
                f"(CPU time), {wall:,.1f} docs/s wall, 1 thread"
            )
            print(
                "  pipeline (sample WARCs, 1 worker): "
                + pipeline_share(root, tmp / kind, tmp / f"run-{kind}")
            )

        query = [s for t in prose for s in sentences(t)]
        n = sum(len(s) + 1 for s in query)
        ours = ArpaModel(tmp / "ngram" / "model.arpa")
        t0_ours = time.perf_counter()
        a = [ours.sentence_log10(s) for s in query]
        t1_ours = time.perf_counter()
        line = f"\nARPA query {n:,} tokens: oreline ArpaModel {n / (t1_ours - t0_ours):,.0f} tokens/s"
        try:
            import kenlm
        except ImportError:
            print(line + "; kenlm not installed (pip install 'oreline[ngram]')")
            return
        fast = kenlm.Model(str(tmp / "ngram" / "model.arpa"))
        t0 = time.perf_counter()
        b = [fast.score(" ".join(s), bos=True, eos=True) for s in query]
        t1 = time.perf_counter()
        kenlm_rate, ours_rate = n / (t1 - t0), n / (t1_ours - t0_ours)
        print(
            line
            + f"; kenlm {kenlm_rate:,.0f} tokens/s ({kenlm_rate / ours_rate:.1f}× ours); max |Δ log10 p| "
            f"per sentence {np.max(np.abs(np.subtract(a, b))):.1e}"
        )


if __name__ == "__main__":
    main()
