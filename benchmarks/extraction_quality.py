"""Main-content extraction quality and speed on several benchmarks, each beside trafilatura.

Benchmarks (under ORELINE_SAMPLES, read in place, never copied into the repository):
- "scrapinghub": article-extraction-dev/ — scrapinghub/article-extraction-benchmark, dev half
  (91 news/blog pages, MIT). Gold: the article body only (no headline, byline or captions).
- "dragnet": extraction-dragnet-train/ — the Dragnet benchmark's *training* split (966 pages from
  2012, GNU AGPLv3: read from there, never copied). Gold: the article text before Dragnet's
  comments marker; it includes headlines, bylines and captions. The Dragnet test split is held
  out: never load it here.
- "cleaneval" and "readability" (`--cleaneval DIR` or ORELINE_CLEANEVAL=DIR): an unpacked copy,
  OUTSIDE the repository, of the j-szulc/html-cleaning-dataset-merged GitHub repository (measured
  at commit 46e01a0; `git archive HEAD cleaneval-dev cleaneval-final readability | tar -x -C DIR`),
  each subset as <subset>/input/<id>.html + <subset>/GoldStandard/<id>.txt. That repository has
  no licence of its own ("all rights belong to their respective owners"), so no page of it is
  committed here. Per source:
  - "cleaneval": cleaneval-dev (58 pages) and cleaneval-final (681 of its 740 pages have a gold
    file; the rest are skipped), the CLEANEVAL shared task of ACL-SIGWAC, 2007
    (cleaneval.sigwac.org.uk, via archive.org): web pages crawled in 2006-07 with hand-cleaned
    text, published for research with no licence stated; the pages' copyright stays with their
    sites. Gold: all running text of the page less boilerplate (headings, lists and short
    paragraphs included), a "URL:" first line and <p>/<h>/<l> block markers, both removed here.
    A different target from article extraction: it rewards keeping every content block.
  - "readability": the test pages of mozilla/readability (its test/test-pages, Apache-2.0 as
    part of that repository; the captured pages' text belongs to their publishers): 116 pages,
    gold = readability's expected.html, tags removed here. Some are synthetic unit-test pages
    (base-url, hidden-nodes, …). Host = the page's name less a trailing "-<n>" (nytimes-1..5
    are one site).
  - "l3s-gn1": page-signal-master, the L3S-GN1 set (Kohlschütter et al., "Boilerplate Detection
    using Shallow Text Features", WSDM 2010): 621 Google News article pages of 2008 from 408
    sites, each annotated in place; gold = the spans labelled headline or full text (comments,
    related and supplemental content excluded). Research data with no licence stated.
  - "cleanportaleval": CleanPortalEval-master (ppke-nlpg/CleanPortalEval): 71 news and blog
    pages of five portals (bbc.co.uk, blogs.wsj.com, tv.msnbc.com, washingtonpost.com x2) with
    CleanEval-style gold; host = the file name's site part. No licence stated.
  (`git archive HEAD ... page-signal-master CleanPortalEval-master` adds them to DIR.) The
  merged repository also holds dragnet_data, the whole Dragnet set *with its test split*; it
  is never loaded here.

Per benchmark and extractor (oreline's default, trafilatura as oreline calls it with
include_comments=False, resiliparse's main content alone, oreline keeping headlines, bylines
and captions):
- per-page F1: mean over pages of the token F1 of lowercase `\\w+` token bags (a page whose
  gold and output are both empty scores 1; only one empty scores 0);
- the Scrapinghub benchmark's own metric (its evaluate.py, re-implemented): 4-token shingles,
  case kept, each page's tp/fp/fn normalised to sum 1, precision and recall averaged over
  pages, F1 of those two means;
- pages per CPU-second of the extraction call alone (HTML already decoded; best of `--rounds`;
  every extractor runs in this one thread), interleaved page by page (`timed`): on a shared
  machine wall time swung 3x between runs, CPU time ~10%; trafilatura and oreline are timed in
  the same run;
- empty outputs on pages whose gold is non-empty, and pages with per-page F1 < 0.5;
- for oreline − trafilatura: the mean per-page F1 difference with a paired bootstrap 95%
  interval (pages resampled with replacement, 2,000 resamples, seed 0).

`--cv K` additionally re-chooses the boilerplate selectors on K-1 folds split **by host**
(pages of one site never on both sides) and scores each page with the choice made without it,
as `scripts/train_extract_model.py` does on all pages; without it the shipped selectors are
scored (which, on the Scrapinghub dev half they were chosen on, is in-sample).

    ORELINE_SAMPLES=../shared/data .venv/bin/python benchmarks/extraction_quality.py \
        [--bench scrapinghub dragnet cleaneval readability l3s-gn1 cleanportaleval] [--limit N] \
        [--rounds 2] [--cv 5] [--cleaneval DIR] [--also [resiliparse pruned_headlines]]
"""

from __future__ import annotations

import argparse
import gzip
import html as html_lib
import json
import os
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from oreline.config import larger_samples  # noqa: E402
from oreline.data.filters.boilerplate import fit_selectors, tokens  # noqa: E402
from oreline.data.filters.extract import extract, pruned_text  # noqa: E402
from oreline.data.read.payload import decode_payload  # noqa: E402

Page = tuple[str, str, str, str]  # id, host, html, gold text
_CANONICAL = re.compile(
    r"""<(?:link[^>]+rel=["']?canonical|meta[^>]+property=["']og:url)[^>]+(?:href|content)=["']?(https?://[^"'\s>]+)""",
    re.I,
)


def _decode(raw: bytes) -> str:
    return decode_payload(raw, None, "text/html")[0]


def load_scrapinghub(limit: int | None) -> list[Page]:
    root = larger_samples("article-extraction-dev") / "article-extraction-dev"
    truth = json.loads((root / "ground-truth.json").read_text(encoding="utf-8"))
    pages = []
    for key in sorted(truth)[:limit]:
        html = _decode(gzip.decompress((root / "html" / f"{key}.html.gz").read_bytes()))
        host = urlparse(truth[key].get("url", "")).netloc
        pages.append((key, host, html, truth[key].get("articleBody", "")))
    return pages


def _host_of(key: str, html: str) -> str:
    """The page's own host from its canonical link or og:url (Dragnet's gold has no URL)."""
    m = _CANONICAL.search(html[:200_000])
    return urlparse(m.group(1)).netloc.lower().removeprefix("www.") if m else f"page:{key}"


def load_dragnet(limit: int | None) -> list[Page]:
    root = larger_samples("extraction-dragnet-train") / "extraction-dragnet-train"
    truth = json.loads((root / "ground-truth.json").read_text(encoding="utf-8"))
    pages = []
    for key in sorted(truth, key=lambda k: (len(k), k))[:limit]:
        html = _decode(gzip.decompress((root / "html" / f"{key}.html.gz").read_bytes()))
        pages.append((key, _host_of(key, html), html, truth[key].get("articleBody", "")))
    return pages


_CLEANEVAL_MARKS = re.compile(r"<(?:p|h|l)>", re.I)
_TAG = re.compile(r"<[^>]*>")
_CLEANEVAL_URL = re.compile(r"""<text id=["']?(https?://[^"'\s>]+)""", re.I)


def _cleaneval_root(root: Path | None) -> Path:
    root = root or (Path(os.environ["ORELINE_CLEANEVAL"]) if os.environ.get("ORELINE_CLEANEVAL") else None)
    if root is None or not (root / "cleaneval-dev" / "input").is_dir():
        raise SystemExit(
            f"the cleaneval/readability benchmarks need an unpacked j-szulc/html-cleaning-dataset-merged "
            f"(got {root}): `git clone` it outside this repository and pass --cleaneval DIR "
            f"or set ORELINE_CLEANEVAL=DIR (DIR/cleaneval-dev/input/*.html must exist)"
        )
    return root


def _subset(root: Path, subset: str) -> list[tuple[str, Path, Path]]:
    """(id, html path, gold path) of the subset's pages that have a gold file."""
    out = []
    for path in sorted((root / subset / "input").glob("*.html"), key=lambda p: (len(p.stem), p.stem)):
        gold = root / subset / "GoldStandard" / f"{path.stem}.txt"
        if gold.exists():
            out.append((f"{subset}/{path.stem}", path, gold))
    return out


def load_cleaneval(root: Path | None, limit: int | None) -> list[Page]:
    """CleanEval dev + final; host from the gold's "URL:" line or the input's <text id=URL>."""
    root = _cleaneval_root(root)
    pages = []
    for key, path, gold_path in [*_subset(root, "cleaneval-dev"), *_subset(root, "cleaneval-final")][:limit]:
        html = _decode(path.read_bytes())
        gold = gold_path.read_text(encoding="utf-8", errors="replace")
        url = ""
        if gold.startswith("URL:"):
            url, _, gold = gold.partition("\n")
            url = url.removeprefix("URL:").strip()
        elif m := _CLEANEVAL_URL.search(html[:2000]):
            url = m.group(1)
        host = urlparse(url).netloc.lower().removeprefix("www.") or f"page:{key}"
        pages.append((key, host, html, _CLEANEVAL_MARKS.sub(" ", gold)))
    return pages


def load_readability(root: Path | None, limit: int | None) -> list[Page]:
    root = _cleaneval_root(root)
    pages = []
    for key, path, gold_path in _subset(root, "readability")[:limit]:
        html = _decode(path.read_bytes())
        gold = html_lib.unescape(_TAG.sub(" ", gold_path.read_text(encoding="utf-8", errors="replace")))
        pages.append((key, re.sub(r"-\d+$", "", path.stem), html, gold))
    return pages


_L3S_SEL = re.compile(r"\bx-nc-sel(\d)\b")
# L3S-GN1's labels (Kohlschütter et al. 2010): 1 headline, 2 full text, 3 supplemental, 4
# related content, 5 user comments, 0 not content. Gold here: headline and full text.
_L3S_GOLD = {"1", "2"}


def _l3s_gold(annotated: str) -> str:
    """The text of an L3S-GN1 annotated page whose nearest labelled ancestor is headline or full
    text (labelled spans nest: an outer "not content" span may hold a "full text" one)."""
    from resiliparse.parse.html import HTMLTree, NodeType

    doc = HTMLTree.parse(annotated).document
    out: list[str] = []
    stack = [(doc, None)] if doc is not None else []
    while stack:  # iterative: some pages nest deeper than Python's recursion limit
        node, label = stack.pop()
        if node.type == NodeType.TEXT:
            if label in _L3S_GOLD:
                out.append(node.text)
            continue
        if node.type == NodeType.ELEMENT:
            if node.tag in ("script", "style", "noscript", "head"):
                continue
            m = _L3S_SEL.search(node.getattr("class") or "")
            label = m.group(1) if m else label
        stack.extend((child, label) for child in reversed(list(node.child_nodes)))
    return " ".join(out)


def load_l3s(root: Path | None, limit: int | None) -> list[Page]:
    """L3S-GN1 (page-signal-master of the merged repository): 621 Google News pages of 2008;
    the host is the input's first absolute link's host (pages of one site share templates)."""
    root = _cleaneval_root(root)
    pages = []
    for key, path, gold_path in _subset(root, "page-signal-master")[:limit]:
        html = _decode(path.read_bytes())
        gold = _l3s_gold(gold_path.read_text(encoding="utf-8", errors="replace"))
        pages.append((key, _host_of(key, html), html, gold))
    return pages


def load_cleanportaleval(root: Path | None, limit: int | None) -> list[Page]:
    """CleanPortalEval (ppke-nlpg, 71 news and blog pages of five portals, CleanEval-style gold);
    the host is the file name's site part (bbc.co.uk_news_01 -> bbc.co.uk)."""
    root = _cleaneval_root(root)
    pages = []
    for key, path, gold_path in _subset(root, "CleanPortalEval-master")[:limit]:
        html = _decode(path.read_bytes())
        gold = gold_path.read_text(encoding="utf-8", errors="replace")
        if gold.lstrip().startswith("URL:"):
            gold = gold.lstrip().partition("\n")[2]
        gold = html_lib.unescape(_CLEANEVAL_MARKS.sub(" ", gold))
        pages.append((key, path.stem.split("_")[0], html, gold))
    return pages


def page_f1(pred: str, gold: str) -> float:
    p, g = tokens(pred), tokens(gold)
    if not p or not g:
        return float(not p and not g)
    tp = sum((p & g).values())
    return 2 * tp / (sum(p.values()) + sum(g.values()))


_SHINGLE_TOKEN = re.compile(r"\w+")


def _shingles(text: str, n: int = 4) -> Counter:
    toks = _SHINGLE_TOKEN.findall(text or "")
    return Counter(tuple(toks[i : i + n]) for i in range(max(1, len(toks) - n + 1)) if toks[i : i + n])


def shingle_metric(preds: list[str], golds: list[str]) -> float:
    """The Scrapinghub benchmark's F1 (its evaluate.py): see the module docstring."""
    precisions, recalls = [], []
    for pred, gold in zip(preds, golds, strict=True):
        p, g = _shingles(pred), _shingles(gold)
        tp, fp, fn = sum((p & g).values()), sum((p - g).values()), sum((g - p).values())
        if fp == fn == 0:
            precisions.append(1.0)
            recalls.append(1.0)
            continue
        if tp + fp > 0:
            precisions.append(tp / (tp + fp))
        if tp + fn > 0:
            recalls.append(tp / (tp + fn))
    prec = sum(precisions) / len(precisions)
    rec = sum(recalls) / len(recalls)
    return 2 * prec * rec / (prec + rec) if prec + rec else 0.0


def paired_bootstrap(a: list[float], b: list[float], n: int = 2000) -> tuple[float, float, float]:
    """Mean of a - b with a percentile 95% interval over pages resampled with replacement."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    rng = random.Random(0)
    k = len(diffs)
    means = sorted(sum(diffs[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    return sum(diffs) / k, means[int(0.025 * n)], means[int(0.975 * n) - 1]


def folds_by_host(pages: list[Page], k: int) -> list[int]:
    hosts = sorted({p[1] for p in pages})
    random.Random(0).shuffle(hosts)
    fold = {h: i % k for i, h in enumerate(hosts)}
    return [fold[p[1]] for p in pages]


def timed(fns: dict[str, Callable[[int], str]], n: int, rounds: int) -> tuple[dict, dict]:
    """Texts and pages per CPU-second per extractor; each fn(i) extracts page i. Interleaved: on
    each page every extractor runs in turn (the order rotating from page to page), each call
    timed by this process's CPU clock, so a machine whose load changes during the run moves
    every extractor's time alike. The best of `rounds` per extractor."""
    texts: dict[str, list[str]] = {}
    best: dict[str, float] = {}
    names = list(fns)
    for fn in fns.values():
        fn(0)  # imports and first-call setup are not extraction time
    for _ in range(rounds):
        seconds = dict.fromkeys(names, 0.0)
        out: dict[str, list[str]] = {name: [] for name in names}
        for i in range(n):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                start = time.process_time()
                text = fns[name](i)
                seconds[name] += time.process_time() - start
                out[name].append(text)
        for name in names:
            texts[name] = out[name]
            best[name] = max(best.get(name, 0.0), n / max(seconds[name], 1e-9))
    return texts, best


def cv_selectors(pages: list[Page], k: int) -> list[tuple[str, ...]]:
    """Per page, the selectors chosen on the folds without its host."""
    fold = folds_by_host(pages, k)
    shared: dict = {}
    chosen = {}
    for f in range(k):
        train = [(p[2], p[3]) for p, pf in zip(pages, fold, strict=True) if pf != f]
        sel, f1 = fit_selectors(train, lambda html, s: pruned_text(html, s)[0], cache=shared)
        chosen[f] = tuple(sel)
        print(f"  fold {f}: {len(sel)} selectors on {len(train)} pages (train F1 {f1:.4f}): {sel}")
    return [chosen[f] for f in fold]


def run_benchmark(name: str, pages: list[Page], rounds: int, cv: int, extractors: list[str]) -> dict:
    golds = [p[3] for p in pages]
    fns: dict[str, Callable[[int], str]] = {
        "oreline": lambda i: extract(pages[i][2])[0],
        "trafilatura": lambda i: extract(pages[i][2], "trafilatura")[0],
        "resiliparse": lambda i: extract(pages[i][2], "resiliparse")[0],
        "oreline pruned_headlines": lambda i: extract(pages[i][2], "pruned_headlines")[0],
    }
    fns = {k: fn for k, fn in fns.items() if k in ("oreline", "trafilatura") or k.split()[-1] in extractors}
    if cv:
        per_page = cv_selectors(pages, cv)
        fns["oreline, selectors CV by host"] = lambda i: pruned_text(pages[i][2], per_page[i])[0]
    texts, speed = timed(fns, len(pages), rounds)
    rows = {}
    for ext, out in texts.items():
        f1s = [page_f1(t, g) for t, g in zip(out, golds, strict=True)]
        rows[ext] = {
            "f1s": f1s,
            "f1": sum(f1s) / len(f1s),
            "shingle_f1": shingle_metric(out, golds),
            "pages_s": speed[ext],
            "empty": sum(1 for t, g in zip(out, golds, strict=True) if g.strip() and not t.strip()),
            "low": sum(1 for f in f1s if f < 0.5),
        }
    return rows


def report(name: str, n: int, rows: dict) -> None:
    ref = rows["trafilatura"]
    print(f"\n## {name}: {n} pages")
    print(
        f"{'extractor':32} {'F1/page':>8} {'SH-F1':>7} {'pages/s':>8} {'x traf':>7} {'empty':>6} "
        f"{'F1<.5':>6}  Δ F1/page vs trafilatura [95% paired bootstrap]"
    )
    for ext, r in rows.items():
        diff = ""
        if ext != "trafilatura":
            mean, lo, hi = paired_bootstrap(r["f1s"], ref["f1s"])
            diff = f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"
        print(
            f"{ext:32} {r['f1']:8.4f} {r['shingle_f1']:7.4f} {r['pages_s']:8.1f} "
            f"{r['pages_s'] / ref['pages_s']:6.1f}x {r['empty']:6d} {r['low']:6d}  {diff}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benches = ["scrapinghub", "dragnet", "cleaneval", "readability", "l3s-gn1", "cleanportaleval"]
    ap.add_argument("--bench", nargs="+", default=benches[:2], choices=benches)
    ap.add_argument(
        "--cleaneval", type=Path, default=None, help="DIR: unpacked html-cleaning-dataset-merged (see above)"
    )
    ap.add_argument("--limit", type=int, default=None, help="first N pages of each benchmark")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds (best kept)")
    ap.add_argument("--cv", type=int, default=0, help="also re-choose selectors in K host folds")
    ap.add_argument("--dump", type=Path, default=None, help="write per-page F1s as JSON here")
    ap.add_argument(
        "--also",
        nargs="*",
        default=["resiliparse", "pruned_headlines"],
        choices=["resiliparse", "pruned_headlines"],
        help="extractors beside oreline and trafilatura (none: `--also`)",
    )
    args = ap.parse_args()
    loaders = {
        "scrapinghub": lambda: load_scrapinghub(args.limit),
        "dragnet": lambda: load_dragnet(args.limit),
        "cleaneval": lambda: load_cleaneval(args.cleaneval, args.limit),
        "readability": lambda: load_readability(args.cleaneval, args.limit),
        "l3s-gn1": lambda: load_l3s(args.cleaneval, args.limit),
        "cleanportaleval": lambda: load_cleanportaleval(args.cleaneval, args.limit),
    }
    sets = {name: loaders[name]() for name in args.bench}
    dump = {}
    for name, pages in sets.items():
        rows = run_benchmark(name, pages, args.rounds, args.cv, args.also)
        report(name, len(pages), rows)
        dump[name] = {ext: dict(zip([p[0] for p in pages], r["f1s"], strict=True)) for ext, r in rows.items()}
    if args.dump:
        args.dump.write_text(json.dumps(dump))


if __name__ == "__main__":
    main()
