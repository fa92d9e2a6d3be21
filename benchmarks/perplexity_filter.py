"""Benchmark: how well the reference n-gram LM separates prose from web text and garbage, and speed.

Reference: a trigram interpolated modified Kneser-Ney model estimated by oreline on NLTK Gutenberg
books plus every other clean news article body of the samples (article-extraction-dev). Scored:
held-out books (prose), the other news articles (web), text extracted from the sample WARCs with
resiliparse (crawl), and garbage: shuffled prose, keyword stuffing, repeated function words,
random characters, and navigation menus (link texts of real pages). Prints median perplexity per
set and AUC against held-out prose (1.0: every document of the set scores above every prose one),
then training time and query speed of the pure-Python ARPA query against kenlm on the same file.

Run: `.venv/bin/python benchmarks/perplexity_filter.py`
"""

from __future__ import annotations

import gzip
import json
import random
import re
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from oreline.config import samples_dir
from oreline.data.perplexity import ArpaModel, doc_perplexity, estimate_kneser_ney, sentences, write_arpa

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


def main() -> None:
    root = samples_dir()
    with zipfile.ZipFile(root / "english-prose" / "nltk-gutenberg.zip") as zf:
        books = {n: zf.read(f"gutenberg/{n}").decode("latin-1") for n in TRAIN_BOOKS + HELDOUT_BOOKS}
    truth = json.loads((root / "article-extraction-dev" / "ground-truth.json").read_text())
    arts = [truth[k]["articleBody"] for k in sorted(truth)]
    t0 = time.perf_counter()
    train = [s for n in TRAIN_BOOKS for s in sentences(books[n])] + [s for a in arts[::2] for s in sentences(a)]
    t1 = time.perf_counter()
    model = estimate_kneser_ney(train, order=3)
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        arpa_path = Path(tmp) / "model.arpa"
        write_arpa(model, arpa_path)
        t3 = time.perf_counter()
        ours = ArpaModel(arpa_path)
        t4 = time.perf_counter()
        n_tok = sum(len(s) + 1 for s in train)
        print(f"training: {n_tok:,} tokens, tokenize {t1 - t0:.2f} s, estimate {t2 - t1:.2f} s, write ARPA "
              f"{t3 - t2:.2f} s ({arpa_path.stat().st_size / 1e6:.1f} MB, n-grams {[len(k) for k in model['keys'][1:]]}), "
              f"load {t4 - t3:.2f} s")

        rng = random.Random(0)
        prose = [books[n][i : i + 3000] for n in HELDOUT_BOOKS for i in range(5000, 95000, 3000)]

        def shuffled(t: str) -> str:
            w = t.split()
            rng.shuffle(w)
            return " ".join(w)

        navs = []
        for key in sorted(truth):
            html = gzip.decompress((root / "article-extraction-dev" / "html" / f"{key}.html.gz").read_bytes())
            links = [" ".join(t.split()) for t in re.findall(r"<a[^>]*>([^<]{2,40})</a>", html.decode("utf-8", "replace"))]
            links = [t for t in links if t]
            if len(links) >= 20:
                navs.append("\n".join(links[:60]))
        sets = {
            "web articles (held out)": [a for a in arts[1::2] if len(a) > 500],
            "crawl (WARC samples, resiliparse)": crawl_texts(root),
            "shuffled prose": [shuffled(t) for t in prose[:40]],
            "keyword stuffing": [" ".join([p] * 150) for p in ("click here", "buy cheap watches", "loading", "free download", "home")],
            "repeated function words": [" ".join([p] * 300) for p in ("the", "and the", "of the", "to")],
            "random characters": ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz    ") for _ in range(2000)) for _ in range(10)],
            "navigation menus": navs,
        }
        p_prose = [doc_perplexity(ours, t)[0] for t in prose]
        print(f"{'set':36} {'docs':>5} {'median ppl':>11} {'AUC vs prose':>13}")
        print(f"{'held-out prose':36} {len(prose):5d} {np.median(p_prose):11.1f} {'-':>13}")
        garbage = []
        for name, texts in sets.items():
            p = [doc_perplexity(ours, t)[0] for t in texts]
            if name not in ("web articles (held out)", "crawl (WARC samples, resiliparse)", "repeated function words"):
                garbage += p
            print(f"{name:36} {len(texts):5d} {np.median(p):11.1f} {auc(p_prose, p):13.3f}")
        print(f"AUC prose vs garbage (shuffled, stuffing, random chars, menus): {auc(p_prose, garbage):.3f}")

        query = [s for t in prose for s in sentences(t)]
        n = sum(len(s) + 1 for s in query)
        t0 = time.perf_counter()
        a = [ours.sentence_log10(s) for s in query]
        t1 = time.perf_counter()
        line = f"query {n:,} tokens: oreline ArpaModel {n / (t1 - t0):,.0f} tokens/s"
        try:
            import kenlm
        except ImportError:
            print(line + "; kenlm not installed (pip install 'oreline[ngram]')")
            return
        fast = kenlm.Model(str(arpa_path))
        t0 = time.perf_counter()
        b = [fast.score(" ".join(s), bos=True, eos=True) for s in query]
        t1 = time.perf_counter()
        print(line + f"; kenlm {n / (t1 - t0):,.0f} tokens/s; max |Δ log10 p| per sentence {np.max(np.abs(np.subtract(a, b))):.1e}")


if __name__ == "__main__":
    main()
