"""Text normalization: valid Unicode, NFC, no invisible characters, tidy whitespace.

Steps, in this order (the order makes the result idempotent: normalizing twice changes nothing):
1. optional ftfy `fix_text` (mojibake repair; optional dependency, off by default),
2. lone surrogates removed (they cannot be encoded as UTF-8; they come from bad decoders),
3. line endings: CRLF and CR become LF; vertical tab, form feed, NEL (U+0085), U+2028 become LF
   and U+2029 (paragraph separator) becomes a blank line, so that removing them never glues
   two words together,
4. invisible characters removed with one `str.translate`: NUL; zero-width space/non-joiner/
   joiner (U+200B–U+200D); bidi marks (U+200E, U+200F, U+061C), embeddings/overrides
   (U+202A–U+202E) and isolates (U+2066–U+2069); word joiner and invisible operators
   (U+2060–U+2064); BOM / zero-width no-break space (U+FEFF); C0 controls except tab and
   newline, DEL, and C1 controls (U+0080–U+009F),
5. Unicode normalization form (NFC by default, NFKC optional) — after step 4 because NFKC turns
   exotic spaces into U+0020, which step 6 then collapses,
6. whitespace: runs of two or more horizontal spaces (space, tab, NBSP, U+2000–U+200A, U+3000 …)
   become one space, line ends are stripped, three or more newlines become two, and the text is
   stripped at both ends.

Zero-width joiners and non-joiners are removed as the spec asks; note this also splits emoji ZWJ
sequences and changes Persian/Indic spellings that use ZWNJ. The counts say how often it
happened (`zero_width`), so a run can tell whether it matters for its languages.

`normalize_with_counts` returns a Counter of removed characters by category so that the pipeline
can report what normalization did; `normalize_text` is the same without the counts.
Rules follow the usual LM-data practice (e.g. CCNet's and Dolma's normalizers; Unicode TR #9
for the bidi controls, TR #15 for normalization forms).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

_CATEGORIES: dict[str, list[int]] = {
    "nul": [0x00],
    "zero_width": [0x200B, 0x200C, 0x200D],
    "bidi": [0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A)],
    "word_joiner": list(range(0x2060, 0x2065)),
    "bom": [0xFEFF],
    "c0_control": [c for c in range(0x01, 0x20) if c not in (0x09, 0x0A, 0x0B, 0x0C, 0x0D)] + [0x7F],
    "c1_control": [c for c in range(0x80, 0xA0) if c != 0x85],
}
_CATEGORY_OF = {chr(c): name for name, codes in _CATEGORIES.items() for c in codes}
_LINE_BREAKS = {"\x0b": "\n", "\x0c": "\n", "\x85": "\n", "\u2028": "\n", "\u2029": "\n\n"}
_TABLE = str.maketrans({**{ch: None for ch in _CATEGORY_OF}, **_LINE_BREAKS})
_REMOVABLE = re.compile("[" + re.escape("".join(_CATEGORY_OF)) + "]")
_BREAKS = re.compile("[\x0b\x0c\x85\u2028\u2029]")
_SURROGATES = re.compile("[\ud800-\udfff]")
_HSPACE = " \t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
# Spelled for Python's regex engine, which is fast only from a literal or a single class: written
# "[h]{2,}", "[h]+$" (MULTILINE) and "\n{3,}", these three took 0.6 s of 11.5M characters of
# prose; as below 0.16 s (tests/data/test_normalize.py checks them against those spellings).
_HSPACE_RUN = re.compile(f"[{_HSPACE}][{_HSPACE}]+")
_HSPACE_CHARS = " \t\u00a0\u1680\u202f\u205f\u3000" + "".join(chr(c) for c in range(0x2000, 0x200B))
_MANY_NEWLINES = re.compile("\n\n\n+")
_STRIP = " \t\n\u00a0\u1680\u202f\u205f\u3000" + "".join(chr(c) for c in range(0x2000, 0x200B))

REMOVED_CATEGORIES = tuple(_CATEGORIES) + ("surrogate",)


def normalize_with_counts(text: str, form: str = "NFC", use_ftfy: bool = False) -> tuple[str, Counter]:
    """Normalized text and a Counter of what changed (removed characters by category, plus
    `carriage_return`, `line_separator` and `whitespace_collapsed`)."""
    counts: Counter = Counter()
    if use_ftfy:
        try:
            import ftfy
        except ImportError as exc:
            from oreline.errors import ConfigError

            raise ConfigError(
                "data.normalize.ftfy is on but ftfy is not installed",
                "pip install 'oreline[extract]' or set data.normalize.ftfy=false",
            ) from exc
        fixed = ftfy.fix_text(text)
        if fixed != text:
            counts["ftfy_fixed"] += 1
        text = fixed
    if not text.isascii():
        n = len(text)
        text = _SURROGATES.sub("", text)
        if len(text) != n:
            counts["surrogate"] += n - len(text)
    if "\r" in text:
        counts["carriage_return"] += text.count("\r")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    found = _REMOVABLE.findall(text)
    breaks = _BREAKS.findall(text)
    if found or breaks:
        for ch in found:
            counts[_CATEGORY_OF[ch]] += 1
        if breaks:
            counts["line_separator"] += len(breaks)
        text = text.translate(_TABLE)
    if form != "none" and not text.isascii():
        text = unicodedata.normalize(form, text)
    before = len(text)
    text = _HSPACE_RUN.sub(" ", text)
    text = "\n".join(line.rstrip(_HSPACE_CHARS) for line in text.split("\n"))  # trailing spaces
    text = _MANY_NEWLINES.sub("\n\n", text)
    text = text.strip(_STRIP)
    if len(text) != before:
        counts["whitespace_collapsed"] += before - len(text)
    return text, counts


def normalize_text(text: str, form: str = "NFC", use_ftfy: bool = False) -> str:
    """Normalized text (see the module docstring for the steps)."""
    return normalize_with_counts(text, form=form, use_ftfy=use_ftfy)[0]


def replacement_ratio(text: str) -> float:
    """Share of U+FFFD in the text (mojibake from decoding; see data.normalize.max_replacement_ratio)."""
    return text.count("\ufffd") / len(text) if text else 0.0


def normalize_reason(text: str, cfg) -> str | None:
    """Drop reason after normalization: "normalize:empty" or "normalize:replacement_chars"."""
    if not text:
        return "normalize:empty"
    if replacement_ratio(text) > cfg.max_replacement_ratio:
        return "normalize:replacement_chars"
    return None
