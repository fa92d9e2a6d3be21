"""The words perplexity is normalized by, the same for every reference kind.

Perplexity per *word* (not per BPE token) makes n-gram and llama references read on one scale and
makes the figure independent of the tokenizer. Words are lowercased `\\w+` runs and punctuation
marks with digits mapped to 0, plus one end-of-sentence per sentence; paragraphs are the non-empty
lines of extracted text (what CCNet scores).
"""

from __future__ import annotations

import re

TOKEN = re.compile(r"\w+|[^\w\s]")
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
DIGIT = re.compile(r"\d")


def sentences(text: str) -> list[list[str]]:
    """Token lists of the sentences of text (empty sentences dropped)."""
    out = []
    for part in SENTENCE_BREAK.split(text):
        # non-printable marks (controls, lone surrogates) are not words and would break the ARPA file
        toks = [t for t in TOKEN.findall(DIGIT.sub("0", part.lower())) if t.isprintable()]
        if toks:
            out.append(toks)
    return out


def paragraphs(text: str) -> list[str]:
    """The non-empty lines of text, stripped: CCNet scores paragraphs (= lines of extracted text)."""
    return [line.strip() for line in text.split("\n") if line.strip()]


def word_count(text: str) -> int:
    """Words the perplexity is normalized by: n-gram tokens plus one end-of-sentence per sentence."""
    return sum(len(s) + 1 for s in sentences(text))
