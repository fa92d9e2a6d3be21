"""Main-content extraction quality and speed on the article-extraction benchmark (dev half).

Data: {samples}/article-extraction-dev/ (scrapinghub/article-extraction-benchmark, 91 pages with
ground-truth article bodies). Metric as in the upstream evaluate.py, with single-token shingles:
bag-of-tokens overlap of `\\w+` tokens (lowercased), precision = matched / predicted tokens,
recall = matched / true tokens, summed over all pages (micro average), F1 from those.
Speed: pages per second of the extraction call alone (HTML already decoded), one process.

    .venv/bin/python benchmarks/extraction_quality.py [--limit N]

Prints one row per extractor and ratios against trafilatura measured in the same run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from oreline.config import larger_samples  # noqa: E402
from oreline.data.filters.extract import html_to_text  # noqa: E402
from oreline.data.read.payload import decode_payload

TOKEN = re.compile(r"\w+")


def tokens(text: str) -> Counter:
    return Counter(TOKEN.findall(text.lower()))


def load_pages(limit: int | None) -> list[tuple[str, str]]:
    root = larger_samples("article-extraction-dev") / "article-extraction-dev"
    truth = json.loads((root / "ground-truth.json").read_text(encoding="utf-8"))
    pages = []
    for key in sorted(truth)[:limit]:
        raw = gzip.decompress((root / "html" / f"{key}.html.gz").read_bytes())
        html, _, _ = decode_payload(raw, None, "text/html")
        pages.append((html, truth[key].get("articleBody", "")))
    return pages


def selectolax_raw(html: str) -> str:
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(html)
    for node in tree.css("script, style, noscript"):
        node.decompose()
    return tree.body.text(separator="\n") if tree.body else ""


def candidates() -> dict[str, object]:
    out = {
        "resiliparse main-content (default)": lambda h: html_to_text(h, "resiliparse", True),
        "resiliparse full page": lambda h: html_to_text(h, "resiliparse", False),
        "trafilatura": lambda h: html_to_text(h, "trafilatura", True),
        "html2text body_width=0": lambda h: html_to_text(h, "html2text", False),
    }
    try:
        import selectolax.lexbor  # noqa: F401

        out["selectolax lexbor raw text"] = selectolax_raw
    except ImportError:
        print("selectolax not installed: its row is skipped", file=sys.stderr)
    return out


def evaluate(fn, pages) -> dict[str, float]:
    tp = n_pred = n_true = 0
    start = time.perf_counter()
    preds = [fn(html) for html, _ in pages]
    seconds = time.perf_counter() - start
    for pred, (_, truth) in zip(preds, pages, strict=True):
        p, t = tokens(pred), tokens(truth)
        tp += sum((p & t).values())
        n_pred += sum(p.values())
        n_true += sum(t.values())
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "pages_s": len(pages) / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="first N pages only")
    args = ap.parse_args()
    pages = load_pages(args.limit)
    print(f"{len(pages)} pages from {larger_samples('article-extraction-dev') / 'article-extraction-dev'}")
    results = {name: evaluate(fn, pages) for name, fn in candidates().items()}
    ref = results["trafilatura"]
    print(
        f"{'extractor':38} {'P':>6} {'R':>6} {'F1':>6} {'pages/s':>8} {'ΔF1 vs traf':>12} {'speed vs traf':>14}"
    )
    for name, r in results.items():
        print(
            f"{name:38} {r['precision']:6.3f} {r['recall']:6.3f} {r['f1']:6.3f} {r['pages_s']:8.1f} "
            f"{r['f1'] - ref['f1']:+12.3f} {r['pages_s'] / ref['pages_s']:13.1f}x"
        )


if __name__ == "__main__":
    main()
