"""Benchmark: oreline's four web-data rule families against datatrove's, document by document.

The same real English documents go through oreline's Gopher quality, Gopher repetition, C4 and
FineWeb rules and through datatrove's GopherQualityFilter, GopherRepetitionFilter,
C4QualityFilter and FineWebQualityFilter, each family on its own (a fresh copy of every
document), at matched parameters: both at the papers' thresholds (datatrove's C4 is given the
paper's 3 sentences and 5 words per line, its defaults being 5 and 3; its FineWeb filter is given
FineWeb's end marks, oreline's `stop_chars`, instead of its later TERMINAL_PUNCTUATION).

The documents (English by lid.176, score ≥ 0.65):
- the sample crawl: `oreline data` over ORELINE_SAMPLES/web-archives with the quality rules and
  dedup off (extraction, normalization, language id on);
- the extraction benchmarks' pages: article-extraction-dev and extraction-dragnet-train HTML,
  extracted with oreline's default extractor;
- prose: Gutenberg books (nltk-gutenberg.zip) cut into ~5,000-character chunks of paragraphs.

Printed per family: a confusion table (both keep, both drop, only oreline drops, only datatrove
drops) with the agreement, every disagreement class (oreline's reason × datatrove's) with its
count, an example and the documented reason for it (who follows the paper, docs/design.md), and
documents/s of both, measured in the same run on one core each (datatrove in its own process).

datatrove lives in `benchmarks/.peers-venv` (git-ignored; created on first use, as for
benchmarks/data_vs_datatrove.py) and runs as a subprocess over a JSONL of the documents.

    .venv/bin/python benchmarks/filters_vs_datatrove.py [--prose-per-book 40] [--json OUT.json] [--docs DOCS.jsonl]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "benchmarks" / ".peers-venv"
PEER_PYTHON = PEERS / "bin" / "python"
SAMPLES = Path(os.environ.get("ORELINE_SAMPLES", ROOT.parent / "shared" / "data"))
FAMILIES = ("gopher_quality", "gopher_repetition", "c4", "fineweb")

DATATROVE_SCRIPT = r"""
import json, sys, time
from datatrove.data import Document
from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter, FineWebQualityFilter

docs = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
stop_chars = tuple(json.loads(sys.argv[2]))
filters = {
    "gopher_quality": GopherQualityFilter(),
    "gopher_repetition": GopherRepetitionFilter(),
    "c4": C4QualityFilter(min_num_sentences=3, min_words_per_line=5),
    "fineweb": FineWebQualityFilter(stop_chars=stop_chars),
}
for f in filters.values():  # load the word tokenizer before the clock starts
    f.filter(Document(text="Warm up the tokenizer. It loads once.", id="w"))
out = {}
for name, f in filters.items():
    reasons = []
    t0 = time.process_time()
    for d in docs:
        try:
            r = f.filter(Document(text=d["text"], id=d["id"]))
        except Exception as exc:
            r = (False, f"error:{type(exc).__name__}")
        reasons.append(None if r is True else (r[1] if isinstance(r, tuple) else "dropped"))
    out[name] = {"seconds": time.process_time() - t0, "reasons": reasons}
print("RESULTS " + json.dumps(out))
"""

# Why oreline and datatrove decide a document differently, by (family, oreline reason, datatrove
# reason): each a deliberate choice documented in docs/design.md ("The step list and the rules
# as published"), with who follows the paper.
EXPLAINED = {
    (
        "gopher_quality",
        None,
        "gopher_below_alpha_threshold",
    ): "datatrove divides the words with a letter by all "
    "its tokens, punctuation tokens included, so ordinary prose with commas falls below 80%; oreline divides "
    "by whitespace words (the paper: '80% of words contain an alphabetic character'; oreline)",
    ("gopher_quality", "gopher:alpha_words", None): "words with a letter among whitespace words (oreline) "
    "against among tokens (datatrove), as above",
    ("gopher_quality", "gopher:ellipsis_lines", None): "datatrove divides the lines ending in an ellipsis by "
    "all lines, blank ones included; oreline by the non-empty lines (the paper's lines of text; oreline)",
    ("gopher_quality", "gopher:bullet_lines", None): "bullet lines among non-empty lines (oreline) against "
    "among all lines, blank ones included (datatrove), as above",
    ("gopher_quality", None, "gopher_short_doc"): "word counts near the 50-word line: datatrove's tokens "
    "without punctuation against oreline's whitespace words without punctuation",
    ("gopher_quality", "gopher:short_doc", None): "word counts near the 50-word line (as above)",
    ("gopher_quality", None, "gopher_enough_stop_words"): "datatrove matches stop words in lower case only, "
    "oreline in any case ('The', 'THE'): the word is the same (oreline)",
    (
        "gopher_repetition",
        None,
        "dup_para_frac",
    ): "datatrove counts whitespace-only paragraphs (a non-breaking "
    "space between blocks) as paragraphs and their repeats as duplicates; oreline strips paragraphs and "
    "leaves empty ones out (no text, no repetition; oreline)",
    ("gopher_repetition", None, "dup_para_char_frac"): "whitespace-only paragraphs (as above)",
    (
        "gopher_repetition",
        None,
        "dup_line_frac",
    ): "datatrove counts blank and whitespace-only lines as lines and "
    "their repeats as duplicate lines; oreline counts the non-empty lines (the paper's lines of text; oreline)",
    ("gopher_repetition", None, "dup_line_char_frac"): "blank and whitespace-only lines (as above)",
    ("gopher_repetition", None, "duplicated_N_n_grams"): "duplicated n-gram characters: oreline counts the "
    "characters of the words repeated n-grams cover, each once (the paper's 'characters contained in "
    "duplicated n-grams'); datatrove adds up the joined lengths of repeats found in a greedy left-to-right "
    "scan, spaces and punctuation tokens included; documents near the limit",
    ("gopher_repetition", "gopher_rep:dup_Ngram", None): "duplicated n-gram characters (as above)",
    (
        "gopher_repetition",
        None,
        "top_N_gram",
    ): "top n-gram characters: datatrove's tokens include punctuation "
    "marks and split clitics, so its n-grams differ from oreline's words without punctuation; documents "
    "near the limit",
    ("gopher_repetition", "gopher_rep:top_Ngram", None): "top n-gram characters (as above)",
    (
        "c4",
        None,
        "too_few_sentences",
    ): "sentence count: spaCy's splitter against oreline's Punkt-like per-line "
    "count (tfds C4 counts Punkt sentences; neither is Punkt itself)",
    ("c4", "c4:too_few_sentences", None): "datatrove's end marks accept ' (a line ending in an apostrophe is "
    "kept there); C4's (tfds _END_MARKS) are . ? ! \" (the paper; oreline), or the sentence counts differ",
    (
        "fineweb",
        None,
        "line_punct_ratio",
    ): "datatrove tests the end mark on the line as written, so a trailing "
    "non-breaking space hides it; oreline strips the line first (FineWeb's rule is about the text; oreline)",
    ("fineweb", "fineweb:line_punct_ratio", None): "end marks on stripped lines against lines as written (as "
    "above)",
    (
        "fineweb",
        "fineweb:char_dup_ratio",
        None,
    ): "duplicate lines: oreline compares stripped lines (two lines "
    "differing in a trailing non-breaking space are the same line), datatrove the lines as written",
    ("fineweb", None, "char_dup_ratio"): "duplicate lines, stripped against as written, and datatrove's "
    "newline-free length against oreline's (as above)",
    ("fineweb", "fineweb:short_line_ratio", None): "short lines: stripped (oreline) against as written",
    ("fineweb", None, "short_line_ratio"): "short lines: stripped (oreline) against as written",
    ("fineweb", "fineweb:list_ratio", None): "newlines per word: oreline's Treebank-like token regex against "
    "spaCy's tokens, near the 0.3 line",
    ("fineweb", None, "list_ratio"): "newlines per word near the 0.3 line (as above)",
}


def why(family: str, ours: str | None, theirs: str | None) -> str | None:
    """The documented reason for a disagreement class (n-gram sizes folded into N)."""

    def fold(reason: str | None) -> str | None:
        return re.sub(r"(top|dup|duplicated)_\d+", r"\1_N", reason) if reason else None

    return EXPLAINED.get((family, fold(ours), fold(theirs)))


def ensure_peers() -> None:
    if PEER_PYTHON.exists():
        return
    print(f"creating {PEERS} with datatrove[processing] (kept out of the project's environment)", flush=True)
    subprocess.run(["python3", "-m", "venv", str(PEERS)], check=True)
    subprocess.run(
        [str(PEER_PYTHON), "-m", "pip", "install", "-q", "datatrove[processing]", "spacy"], check=True
    )


def crawl_docs(tmp: Path) -> list[dict]:
    from oreline.config import load_config
    from oreline.data.pipeline.run import run_data
    from oreline.data.read.shards import read_documents

    cfg = load_config(
        None,
        [
            "data.quality.enabled=false",
            "data.dedup.exact=false",
            "data.dedup.minhash=false",
            'data.langid.languages=["en"]',
        ],
    )
    out = tmp / "crawl"
    run_data([str(SAMPLES / "web-archives")], out, cfg, workers=1)
    files = sorted((out / "docs").glob("*.parquet"))
    return [{"id": d.id, "source": "crawl", "text": d.text} for d in read_documents(files)]


def page_docs() -> list[dict]:
    from oreline.config import ExtractConfig
    from oreline.data.filters.langid import detect
    from oreline.data.pipeline.steps import extract_text

    ecfg = ExtractConfig()
    out = []
    for folder in ("article-extraction-dev", "extraction-dragnet-train"):
        for path in sorted((SAMPLES / folder / "html").glob("*")):
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            text, reason = extract_text(raw.decode("utf-8", "replace"), ecfg)
            if reason is not None:
                continue
            lang, score = detect(text)
            if lang == "en" and score >= 0.65:
                out.append({"id": f"{folder}/{path.name}", "source": "pages", "text": text})
    return out


def prose_docs(per_book: int) -> list[dict]:
    out = []
    with zipfile.ZipFile(SAMPLES / "english-prose" / "nltk-gutenberg.zip") as zf:
        for name in sorted(n for n in zf.namelist() if n.endswith(".txt")):
            text = zf.read(name).decode("latin-1").replace("\r\n", "\n")
            cur, k = "", 0
            for para in re.split(r"\n\s*\n", text):
                cur += para.strip() + "\n\n"
                if len(cur) > 5000:
                    out.append({"id": f"{name}#{k}", "source": "prose", "text": cur})
                    cur, k = "", k + 1
                    if k >= per_book:
                        break
    return out


def oreline_decisions(docs: list[dict]) -> dict[str, dict]:
    from oreline.config import C4Step, FineWebStep, GopherQualityStep, GopherRepetitionStep
    from oreline.data.filters.quality import c4, fineweb, gopher_quality, gopher_repetition
    from oreline.document import Document

    rules = {
        "gopher_quality": (gopher_quality, GopherQualityStep(kind="gopher_quality")),
        "gopher_repetition": (gopher_repetition, GopherRepetitionStep(kind="gopher_repetition")),
        "c4": (c4, C4Step(kind="c4")),
        "fineweb": (fineweb, FineWebStep(kind="fineweb")),
    }
    out = {}
    for name, (fn, settings) in rules.items():
        copies = [Document(d["id"], d["text"], metadata={"language": "en"}) for d in docs]
        t0 = time.process_time()
        reasons = [fn(doc, settings) for doc in copies]
        out[name] = {"seconds": time.process_time() - t0, "reasons": reasons}
    return out


def datatrove_decisions(path: Path, stop_chars: list[str]) -> dict[str, dict]:
    ensure_peers()
    proc = subprocess.run(
        [str(PEER_PYTHON), "-c", DATATROVE_SCRIPT, str(path), json.dumps(stop_chars)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")), None)
    if line is None:
        sys.exit(f"datatrove failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULTS ") :])


def compare(docs: list[dict], ore: dict, dt: dict) -> dict:
    report = {}
    for fam in FAMILIES:
        a, b = ore[fam]["reasons"], dt[fam]["reasons"]
        table = Counter()
        classes: dict[tuple, list[str]] = {}
        for d, ra, rb in zip(docs, a, b, strict=True):
            cell = {
                (False, False): "both keep",
                (True, True): "both drop",
                (True, False): "only oreline drops",
                (False, True): "only datatrove drops",
            }[(ra is not None, rb is not None)]
            table[cell] += 1
            if (ra is None) != (rb is None):
                classes.setdefault((ra, rb), []).append(d["id"])
        n = len(docs)
        report[fam] = {
            "table": dict(table),
            "agreement": (table["both keep"] + table["both drop"]) / n,
            "classes": [
                {
                    "oreline": ra,
                    "datatrove": rb,
                    "docs": len(ids),
                    "example": ids[0],
                    "why": why(fam, ra, rb),
                }
                for (ra, rb), ids in sorted(classes.items(), key=lambda kv: -len(kv[1]))
            ],
            "oreline_docs_per_s": n / max(ore[fam]["seconds"], 1e-9),
            "datatrove_docs_per_s": n / max(dt[fam]["seconds"], 1e-9),
        }
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prose-per-book", type=int, default=40)
    ap.add_argument("--json", type=Path, help="write the full comparison here")
    ap.add_argument("--docs", type=Path, help="JSONL of the documents: read when it exists, else written")
    args = ap.parse_args()
    from oreline.config import FineWebStep

    with tempfile.TemporaryDirectory(prefix="filters-vs-datatrove-") as tmp_name:
        tmp = Path(tmp_name)
        path = args.docs or tmp / "docs.jsonl"
        if path.is_file():
            docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        else:
            docs = crawl_docs(tmp) + page_docs() + prose_docs(args.prose_per_book)
            path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
        ore = oreline_decisions(docs)
        dt = datatrove_decisions(path, FineWebStep(kind="fineweb").stop_chars)
    report = compare(docs, ore, dt)
    sources = Counter(d["source"] for d in docs)
    print(f"{len(docs)} English documents: " + ", ".join(f"{k} {v}" for k, v in sources.items()))
    total_o = sum(ore[f]["seconds"] for f in FAMILIES)
    total_d = sum(dt[f]["seconds"] for f in FAMILIES)
    for fam, r in report.items():
        t = r["table"]
        print(
            f"\n{fam}: agreement {r['agreement']:.2%}  both keep {t.get('both keep', 0)} · both drop "
            f"{t.get('both drop', 0)} · only oreline drops {t.get('only oreline drops', 0)} · only datatrove "
            f"drops {t.get('only datatrove drops', 0)}   docs/s oreline {r['oreline_docs_per_s']:,.0f}, "
            f"datatrove {r['datatrove_docs_per_s']:,.0f} ({r['oreline_docs_per_s'] / r['datatrove_docs_per_s']:.1f}x)"
        )
        for c in r["classes"]:
            print(
                f"  {c['docs']:4d}  oreline {c['oreline'] or 'keeps'} / datatrove {c['datatrove'] or 'keeps'}"
                f"  e.g. {c['example']}\n        {c['why'] or 'UNEXPLAINED'}"
            )
    print(
        f"\nall four families: oreline {len(docs) / total_o:,.0f} docs/s, datatrove {len(docs) / total_d:,.0f} "
        f"docs/s ({total_d / total_o:.1f}x), CPU time of one process each"
    )
    if args.json:
        args.json.write_text(json.dumps({"sources": sources, "report": report}, indent=2))


if __name__ == "__main__":
    main()
