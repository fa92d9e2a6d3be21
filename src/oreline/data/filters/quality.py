"""Heuristic quality filters: Gopher quality and repetition, C4, FineWeb, character entropy, ASCII ratio.

Every filter is a pure function `(doc, settings) -> reason | None`, `settings` being its entry of
[[data.steps]] (`oreline.config.GopherQualityStep`, ...), which holds every threshold with its
published default. It may write scores into `doc.metadata`, and only the C4 line rules may
change `doc.text` (they remove lines, as C4 did). The pipeline (`oreline.data.pipeline.steps`)
binds each to its settings as a step, which the runner counts and times. The runner's funnel
counts documents; what the C4 line rules cut from the documents they keep is counted by rule in
a `LineRemovals` (`c4(doc, settings, lines)`), for stats.json "line_filters".

Sources of the rules and thresholds (each a parameter of its step, `oreline config keys`; where
the papers and datatrove disagree oreline follows the paper, docs/design.md lists where):

- Gopher quality (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from
  Training Gopher", appendix A.1.1, Table A1; defaults as in datatrove's GopherQualityFilter):
  50 ≤ words ≤ 100,000; mean word length in [3, 10]; "#" and ellipsis to word ratios ≤ 0.1 each;
  ≤ 90% of lines start with a bullet; ≤ 30% of lines end with an ellipsis; ≥ 80% of words contain
  an alphabetic character; ≥ 2 distinct stop words of {the, be, to, of, and, that, have, with}.
- Gopher repetition (same table): duplicate-line fraction ≤ 0.30 (by count) and ≤ 0.20 (by chars);
  duplicate-paragraph fraction ≤ 0.30 / ≤ 0.20; most frequent 2/3/4-gram covers ≤ 0.20/0.18/0.16
  of the characters; duplicated 5..10-grams cover ≤ 0.15, 0.14, 0.13, 0.12, 0.11, 0.10. Words
  are those of the quality rule (whitespace-separated, punctuation stripped).
- C4 (Raffel et al. 2020, §2.2, and tensorflow-datasets `c4_utils.clean_page`): keep lines that
  end in terminal punctuation (not an ellipsis) with ≥ 5 words and no word over 1,000 characters;
  drop lines mentioning "javascript" or cookie/privacy/terms policies; drop the document on
  "lorem ipsum" or a "{" in a kept line; drop documents whose kept lines hold fewer than 3
  sentences (`count_sentences`; "[1]", "[edit]", "[citation needed]" removed first). The bad-words
  list is not applied (it would need a download).
- FineWeb (Penedo et al. 2024, "The FineWeb Datasets", §3.4; datatrove FineWebQualityFilter
  defaults): ≥ 12% of lines end in . ' " ! ? (FineWeb's marks); < 67% of lines are ≤ 30
  characters; characters in duplicated lines ≤ 1% of the text; newlines per word token ≤ 0.3.
- Entropy and ASCII ratio (the seed recipe): Shannon entropy of the character distribution in bits
  per character must be ≥ `min_entropy`; the ASCII share must be ≥ `min_ascii_ratio`.

Language handling. `doc.metadata["language"]` comes from the langid step (missing → treated as a
space-separated, Latin-script language). Word rules (Gopher word counts, lengths, symbols, alpha
words, n-gram repetition; C4's five-word minimum) split on whitespace, which is meaningless for
languages written without spaces (zh, ja, th, ...), so they are skipped there; line and paragraph
rules still apply. Gopher's stop words are English, so that rule runs only for English (or unknown)
documents. The ASCII ratio only makes sense for Latin-script languages (Russian or Chinese prose is
legitimately ~0% ASCII), so it runs only for those and unknown languages. Entropy applies to all.

Speed. The repetition rules are the costly part (datatrove: ~65 ms/doc here). Here words are mapped
to integer ids once, n-gram hashes are built by a vectorized rolling hash (uint64, wrapping), and
duplicates are found with one `np.unique` per n, so no n-gram strings are ever joined.

Model-based scoring (KenLM / tiny-LM perplexity) is not here: `oreline.data.pipeline.steps` adds the filter
from `oreline.data.filters.perplexity` after these when `perplexity_model` is set.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress

import numpy as np

from oreline.config import (
    AsciiRatioStep,
    C4Step,
    EntropyStep,
    FineWebStep,
    GopherQualityStep,
    GopherRepetitionStep,
)
from oreline.document import Document

Filter = Callable[[Document, object], str | None]

# languages written without spaces between words (lid.176 labels)
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo", "wuu", "yue", "dz"})
# languages written in the Latin script (lid.176 labels), where an ASCII share is a sane check
_LATIN = (
    "af an ast az br bs ca ceb co cs cy da de en eo es et eu fi fr fy ga gd gl gn hr ht hu id ia ie ilo io is it "
    "jbo jv kw la lb li lmo lt lv mg min ms mt nah nap nds nl nn no oc pl pms pt qu rm ro sc scn sco sh sk sl so "
    "sq su sv sw tl tr uz vec vi vls wa war yo"
)
LATIN_LANGUAGES = frozenset(_LATIN.split())
STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
PUNCT = string.punctuation + "«»“”‘’„‚…–—·•¿¡"
BULLETS = ("•", "-", "*", "‣", "◦", "⁃", "▪", "●")
ELLIPSES = ("...", "…")
# C4 keeps lines ending in these (tfds c4_utils._END_MARKS, plus CJK full stops)
C4_END_MARKS = (".", "?", "!", '"', "。", "！", "？")
C4_POLICY = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)
# A sentence ends at an end mark (closing quotes or brackets may follow) before white space and
# a capital, digit or opening quote, unless the word before the mark is an abbreviation or an
# initial ("Dr.", "e.g.", "J."): the cases Punkt, the sentence splitter tfds C4 counts with,
# decides on English. CJK full stops end a sentence wherever they stand.
_SENTENCE_BREAK = re.compile(r"(?<!\S)(\S*?)[.!?]+[\"'”’)\]]*\s+(?=[\"'“‘(\[]*[A-Z0-9])|[。！？]+(?=\S)")
_ABBREVIATED = (
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al inc ltd co corp no nos fig vol pp gen col lt sgt "
    "capt rep sen gov rev jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m"
)
_ABBREVIATIONS = frozenset(_ABBREVIATED.split())
# the tokens of datatrove's default word tokenizer (NLTK's Treebank word_tokenize) for the counts
# FineWeb takes from it: words with inner hyphens, periods and digits, clitics ("'s", "n't" as
# "n" + "'t"), an ellipsis, and every other punctuation mark on its own
_WORD_TOKEN = re.compile(r"\w+(?:[-.]\w+)*|'\w+|\.\.\.|[^\w\s]")
_DELETE_PUNCT = str.maketrans("", "", PUNCT)
_PUNCT_RUN = re.compile(f"[{re.escape(PUNCT)}]+")
CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)  # tfds c4_utils

_MIX = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio constant; odd, so multiplication is a bijection
_ROLL = np.uint64(0x100000001B3)  # FNV prime as the rolling-hash base


def language(doc: Document) -> str:
    return str(doc.metadata.get("language") or "").split("_")[0].lower()


def uses_spaces(doc: Document) -> bool:
    return language(doc) not in NO_SPACE_LANGUAGES


def _nonempty_lines(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.split("\n")) if s]


def _strip_punct(text: str) -> str:
    """text without punctuation: str.translate is fastest on ASCII, a regex on everything else."""
    return text.translate(_DELETE_PUNCT) if text.isascii() else _PUNCT_RUN.sub("", text)


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(count, characters) of items that occurred earlier in the list (first occurrences excluded)."""
    seen: set[str] = set()
    dup_n = dup_chars = 0
    for item in items:
        if item in seen:
            dup_n += 1
            dup_chars += len(item)
        else:
            seen.add(item)
    return dup_n, dup_chars


# ---------------------------------------------------------------------------------------------
# Gopher


@functools.lru_cache(maxsize=16)
def _any_case(words: tuple[str, ...]) -> frozenset[str]:
    """The stop words as written, capitalized and upper case."""
    return frozenset(v for w in words for v in (w, w.capitalize(), w.upper()))


def _distinct_stop_words(words: list[str], p: GopherQualityStep) -> int:
    """How many of the stop words occur (in any case): the paper asks for two *of* the words, so
    "the" twice is one."""
    stop = _any_case(tuple(p.stop_words))
    found: set[str] = set()
    for word in filter(stop.__contains__, words):
        found.add(word.lower())
        if len(found) >= p.min_stop_words:  # enough: the rest of the document does not matter
            break
    return len(found)


def _above(value: float, limit: float) -> bool:
    """value > limit, with limit rounded to 12 digits (1 - 0.8 is 0.19999999999999996, not 0.2)."""
    return value > round(limit, 12)


def gopher_quality(doc: Document, p: GopherQualityStep) -> str | None:
    """Gopher quality rules (Rae et al. 2021, Table A1). Word rules skipped for no-space languages."""
    text = doc.text
    lines = _nonempty_lines(text)
    if uses_spaces(doc):
        raw = text.split()
        words = _strip_punct(text).split()  # punctuation is not part of words
        n = len(words)
        doc.metadata["words"] = n
        if n < p.min_words or n == 0:
            return "gopher:short_doc"
        if n > p.max_words:
            return "gopher:long_doc"
        mean_len = sum(map(len, words)) / n
        doc.metadata["mean_word_length"] = round(mean_len, 3)
        if not p.min_avg_word_length <= mean_len <= p.max_avg_word_length:
            return "gopher:mean_word_length"
        n_raw = len(raw)
        limit = p.max_symbol_word_ratio
        if text.count("#") / n_raw > limit or (text.count("...") + text.count("…")) / n_raw > limit:
            return "gopher:symbol_ratio"
        if lines and sum(line.startswith(BULLETS) for line in lines) / len(lines) > p.max_bullet_lines_ratio:
            return "gopher:bullet_lines"
        if lines and sum(line.endswith(ELLIPSES) for line in lines) / len(lines) > p.max_ellipsis_lines_ratio:
            return "gopher:ellipsis_lines"
        # ≥ 80% of tokens need a letter; punctuation-only tokens vanished from `words`. C-level
        # map/compress do the common case (all letters); only the rest is checked letter by letter
        alpha = list(map(str.isalpha, words))
        mixed = sum(1 for w in compress(words, map(operator.not_, alpha)) if any(map(str.isalpha, w)))
        if _above((n_raw - sum(alpha) - mixed) / n_raw, 1 - p.min_alpha_words_ratio):
            return "gopher:alpha_words"
        if language(doc) in ("", "en") and _distinct_stop_words(words, p) < p.min_stop_words:
            return "gopher:stop_words"
        return None
    if lines and sum(line.startswith(BULLETS) for line in lines) / len(lines) > p.max_bullet_lines_ratio:
        return "gopher:bullet_lines"
    if lines and sum(line.endswith(ELLIPSES) for line in lines) / len(lines) > p.max_ellipsis_lines_ratio:
        return "gopher:ellipsis_lines"
    return None


def gopher_repetition(doc: Document, p: GopherRepetitionStep) -> str | None:
    """Gopher repetition rules (Rae et al. 2021, Table A1) with hashed n-grams instead of joined strings."""
    text = doc.text
    total = len(text)
    if total == 0:
        return "gopher_rep:empty"  # nothing to measure repetition on (datatrove drops it as "empty")
    # splitting on "\n\n" then stripping equals splitting on \n{2,}, without a regex
    paragraphs = [p for p in (q.strip() for q in text.split("\n\n")) if p]
    dup_n, dup_chars = _duplicates(paragraphs)
    if paragraphs and dup_n / len(paragraphs) > p.dup_para_frac:
        return "gopher_rep:dup_para_frac"
    if dup_chars / total > p.dup_para_char_frac:
        return "gopher_rep:dup_para_char_frac"
    lines = _nonempty_lines(text)
    dup_n, dup_chars = _duplicates(lines)
    if lines and dup_n / len(lines) > p.dup_line_frac:
        return "gopher_rep:dup_line_frac"
    if dup_chars / total > p.dup_line_char_frac:
        return "gopher_rep:dup_line_char_frac"
    if not uses_spaces(doc):
        return None
    # words as the quality rule and the paper count them: punctuation is not part of a word, so
    # "Frank," and "Frank." are the word "Frank" (as in datatrove, whose tokenizer splits it off)
    words = _strip_punct(text).split()
    if len(words) < 2:
        return None
    # one integer per distinct word: setdefault keeps the first counter value seen for each word
    vocab: dict[str, int] = {}
    ids = np.fromiter(map(vocab.setdefault, words, itertools.count()), dtype=np.uint64, count=len(words))
    with np.errstate(over="ignore"):
        ids = (ids + np.uint64(1)) * _MIX  # spread small ids over 64 bits before rolling
        ids ^= ids >> np.uint64(29)
    lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    csum = np.concatenate(([0], np.cumsum(lens)))
    top_fracs, dup_fracs = dict(p.top_n_grams), dict(p.dup_n_grams)
    h = ids
    for n in range(2, max((*top_fracs, *dup_fracs), default=1) + 1):
        if len(words) < n:
            break
        with np.errstate(over="ignore"):
            h = h[: len(words) - n + 1] * _ROLL + ids[n - 1 :]  # h_n[i] = h_{n-1}[i]·B + x[i+n-1]
        # a stable sort puts equal hashes together, first occurrence first
        order = np.argsort(h, kind="stable")
        sh = h[order]
        same = sh[1:] == sh[:-1]
        if not same.any():
            # no repeated n-gram means no repeated longer n-gram either; the most frequent n-gram
            # is then the first one (occurring once), as the paper's definition reads and datatrove
            # measures it: in a document of a few words it alone covers a large share
            for m, frac in sorted(top_fracs.items()):
                if m >= n and m <= len(words) and (csum[m] + m - 1) / total > frac:
                    return f"gopher_rep:top_{m}gram"
            break
        top_frac = top_fracs.get(n)
        if top_frac is not None:
            # run lengths of equal hashes: the most frequent n-gram's count and first position; of
            # n-grams equally frequent, the one that occurs first (datatrove's Counter.most_common)
            starts = np.flatnonzero(np.concatenate(([True], ~same)))
            counts = np.diff(np.append(starts, len(sh)))
            top = counts.max()
            best = order[starts[counts == top]].min()
            chars = csum[best + n] - csum[best] + (n - 1)  # the n-gram joined with spaces
            if top * chars / total > top_frac:
                return f"gopher_rep:top_{n}gram"
        dup_frac = dup_fracs.get(n)
        if dup_frac is None:
            continue
        # characters of words covered by a repeated (not first) occurrence of any n-gram, counted once
        repeats = order[1:][same]
        m = len(words) + 1
        cover = np.bincount(repeats, minlength=m) - np.bincount(repeats + n, minlength=m)
        covered = np.cumsum(cover[:-1]) > 0
        if lens[covered].sum() / total > dup_frac:
            return f"gopher_rep:dup_{n}gram"
    return None


# ---------------------------------------------------------------------------------------------
# C4


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def count_sentences(line: str) -> int:
    """Sentences in one line of text (≥ 1 when it is not blank): C4 counts the sentences of the
    lines it keeps (tfds: NLTK Punkt per line), not its end marks, so "Dr. Smith left at 5 p.m."
    is one sentence and a line ending in a quotation mark is one too."""
    if not line.strip():
        return 0
    n = 1
    for m in _SENTENCE_BREAK.finditer(line):
        word = m.group(1)
        if word is not None:
            word = word.lstrip("\"'“‘([").lower()
            if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                continue
        n += 1
    return n


@dataclass
class LineRemovals:
    """What the C4 line rules removed from the documents C4 kept (a dropped document's lines are
    its drop, in the funnel): lines and UTF-8 bytes per rule, and the kept documents' bytes before
    and after. The rules' bytes are those of the removed lines themselves; the rest of
    bytes_before - bytes_after is the newlines, blank lines, edge whitespace and citation marks
    ("[1]") that went with them."""

    docs: int = 0  # documents kept
    docs_changed: int = 0  # ... of which lost at least one line
    bytes_before: int = 0
    bytes_after: int = 0
    rules: dict[str, list[int]] = field(default_factory=dict)  # rule -> [lines, bytes]

    def add(self, other: dict) -> None:
        """Add the `as_dict()` of another task's counts."""
        self.docs += other["docs"]
        self.docs_changed += other["docs_changed"]
        self.bytes_before += other["bytes_before"]
        self.bytes_after += other["bytes_after"]
        for rule, v in other["rules"].items():
            entry = self.rules.setdefault(rule, [0, 0])
            entry[0] += v["lines"]
            entry[1] += v["bytes"]

    def as_dict(self) -> dict:
        return {
            "docs": self.docs,
            "docs_changed": self.docs_changed,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "rules": {r: {"lines": n, "bytes": b} for r, (n, b) in sorted(self.rules.items())},
        }


def _c4_line_rule(line: str, spaced: bool, p: C4Step) -> str | None:
    """The C4 rule that removes this (stripped, non-empty) line, in C4's order; "lorem_ipsum" and
    "curly_bracket" drop the whole document."""
    if not line.endswith(C4_END_MARKS) or line.endswith(ELLIPSES):
        return "no_end_mark"
    words = line.split()
    if spaced and len(words) < p.min_words_per_line:
        return "few_words"
    if any(len(w) > p.max_word_length for w in words):
        return "long_word"
    low = line.lower()
    if p.filter_lorem_ipsum and "lorem ipsum" in low:
        return "lorem_ipsum"
    if p.filter_javascript and "javascript" in low:
        return "javascript"
    if p.filter_curly_bracket and "{" in line:
        return "curly_bracket"
    if p.filter_policy and any(s in low for s in C4_POLICY):
        return "policy"
    return None


def _too_few_sentences(lines: list[str], least: int) -> bool:
    """Fewer than `least` sentences in these non-empty lines; each holds one at least, so only a
    document with fewer lines than that needs its sentences counted."""
    return len(lines) < least and sum(map(count_sentences, lines)) < least


def c4(doc: Document, p: C4Step, lines: LineRemovals | None = None) -> str | None:
    """C4 rules (Raffel et al. 2020; tfds c4_utils.clean_page). With filter_lines, removes lines,
    counted into `lines` when the document is kept."""
    spaced = uses_spaces(doc)
    if not p.filter_lines:
        low = doc.text.lower()
        if p.filter_lorem_ipsum and "lorem ipsum" in low:
            return "c4:lorem_ipsum"
        if p.filter_curly_bracket and "{" in doc.text:
            return "c4:curly_bracket"
        if _too_few_sentences(_nonempty_lines(doc.text), p.min_sentences):
            return "c4:too_few_sentences"
        return None
    kept: list[str] = []
    removed = {"no_end_mark": 0, "few_words": 0, "long_word": 0, "javascript": 0, "policy": 0}
    removed_bytes = dict.fromkeys(removed, 0)
    for raw_line in doc.text.split("\n"):
        line = (CITATION.sub("", raw_line) if p.remove_citations else raw_line).strip()
        if not line:
            continue
        rule = _c4_line_rule(line, spaced, p)
        if rule == "lorem_ipsum" or rule == "curly_bracket":
            return f"c4:{rule}"
        if rule is None:
            kept.append(line)
            continue
        removed[rule] += 1
        removed_bytes[rule] += _utf8_len(raw_line)
    new_text = "\n".join(kept)
    if _too_few_sentences(kept, p.min_sentences):
        return "c4:too_few_sentences"
    if any(removed.values()):
        doc.metadata["c4_removed_lines"] = {k: v for k, v in removed.items() if v}
    if lines is not None:
        lines.docs += 1
        lines.docs_changed += any(removed.values())
        lines.bytes_before += _utf8_len(doc.text)
        lines.bytes_after += _utf8_len(new_text)
        for rule, n in removed.items():
            if n:
                entry = lines.rules.setdefault(rule, [0, 0])
                entry[0] += n
                entry[1] += removed_bytes[rule]
    doc.text = new_text
    return None


# ---------------------------------------------------------------------------------------------
# FineWeb


def fineweb(doc: Document, p: FineWebStep) -> str | None:
    """FineWeb quality rules (Penedo et al. 2024; datatrove FineWebQualityFilter defaults)."""
    lines = _nonempty_lines(doc.text)
    if not lines:
        return "fineweb:empty"
    n = len(lines)
    stop = tuple(p.stop_chars)
    ended = sum(line.endswith(stop) for line in lines)
    if ended / n < p.line_punct_ratio and not (ended == 0 and p.line_punct_exclude_zero):
        return "fineweb:line_punct_ratio"
    if sum(len(line) <= p.short_line_length for line in lines) / n >= p.short_line_ratio:
        return "fineweb:short_line_ratio"
    _, dup_chars = _duplicates(lines)
    if dup_chars / max(1, len(doc.text) - doc.text.count("\n")) > p.char_dup_ratio:
        return "fineweb:char_dup_ratio"
    if uses_spaces(doc):
        # per word token as datatrove counts them, punctuation included, not per whitespace token;
        # every whitespace token holds at least one word token, so below the limit per whitespace
        # token the text is below it per word token too, and the regex is not needed
        newlines = doc.text.count("\n")
        n_words = len(doc.text.split())
        if n_words and newlines / n_words > p.new_line_ratio:
            n_words = len(_WORD_TOKEN.findall(doc.text))
            if newlines / n_words > p.new_line_ratio:
                return "fineweb:list_ratio"
    return None


# ---------------------------------------------------------------------------------------------
# entropy, ASCII


def char_entropy(text: str) -> float:
    """Shannon entropy of the character distribution, in bits per character."""
    if not text:
        return 0.0
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    _, counts = np.unique(codes, return_counts=True)
    p = counts / codes.size
    return float(-(p * np.log2(p)).sum())


def entropy(doc: Document, p: EntropyStep) -> str | None:
    """Drop documents whose character entropy is below p.min_entropy (repeated or degenerate text)."""
    h = char_entropy(doc.text)
    doc.metadata["entropy"] = round(h, 4)
    if h < p.min_entropy:
        return f"entropy:<{p.min_entropy:g}"
    return None


def ascii_ratio(doc: Document, p: AsciiRatioStep) -> str | None:
    """Drop Latin-script documents whose ASCII share is below p.min_ascii_ratio (other scripts pass)."""
    text = doc.text
    if not text:
        return None
    lang = language(doc)
    if lang and lang not in LATIN_LANGUAGES:
        return None
    ratio = len(text.encode("ascii", "ignore")) / len(text)
    doc.metadata["ascii_ratio"] = round(ratio, 4)
    if ratio < p.min_ascii_ratio:
        return f"ascii:<{p.min_ascii_ratio:.2f}"
    return None


def bind(settings, lines: LineRemovals | None = None) -> Callable[[Document], str | None]:
    """One rule bound to its [[data.steps]] entry: fn(doc) -> reason; the C4 line rules count what
    they remove into `lines` when given."""
    if isinstance(settings, C4Step):
        return lambda doc: c4(doc, settings, lines)
    fn = RULES[settings.kind]
    return lambda doc: fn(doc, settings)


RULES: dict[str, Filter] = {
    "gopher_quality": gopher_quality,
    "gopher_repetition": gopher_repetition,
    "c4": c4,
    "fineweb": fineweb,
    "entropy": entropy,
    "ascii_ratio": ascii_ratio,
}


def quality_filters(
    cfg, lines: LineRemovals | None = None
) -> list[tuple[str, Callable[[Document], str | None]]]:
    """The rules a `data.quality` section switches on, in the pipeline's order, each bound to the
    thresholds that section expands to: [(kind, fn(doc) -> reason)] (for scripts and benchmarks
    that run the rules without the pipeline)."""
    from oreline.config import DataConfig, steps_from_sections

    return [(s.kind, bind(s, lines)) for s in steps_from_sections(DataConfig(quality=cfg)) if s.kind in RULES]
