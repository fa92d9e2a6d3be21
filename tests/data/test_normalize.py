"""Text normalization: invisible characters, whitespace, Unicode forms, counts."""

from __future__ import annotations

import gzip
import unicodedata

import pytest

from oreline.config import NormalizeConfig
from oreline.data.filters.normalize import (
    normalize_reason,
    normalize_text,
    normalize_with_counts,
    replacement_ratio,
)


def test_removes_each_category_and_counts_it():
    cases = {
        "nul": "\x00",
        "zero_width": "\u200b",
        "bidi": "\u202e",
        "word_joiner": "\u2060",
        "bom": "\ufeff",
        "c0_control": "\x07",
        "c1_control": "\x9b",
        "surrogate": "\udc80",
    }
    for category, ch in cases.items():
        text, counts = normalize_with_counts(f"ab{ch}cd{ch}ef")
        assert text == "abcdef", category
        assert counts[category] == 2, (category, counts)


def test_every_listed_invisible_range_is_removed():
    chars = [chr(c) for c in [*range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2065), 0xFEFF]]
    chars += [chr(c) for c in range(0x20) if c not in (0x09, 0x0A, 0x0B, 0x0C, 0x0D)] + [
        chr(c) for c in range(0x80, 0xA0) if c != 0x85
    ]
    assert normalize_text("x" + "".join(chars) + "y") == "xy"


def test_whitespace_keeps_paragraphs():
    raw = "  Title  \r\n\r\n\r\n\r\nFirst   line\t\t of text   \nsecond line\n\n\n\n\nNext paragraph.  \n  "
    text, counts = normalize_with_counts(raw)
    assert text == "Title\n\nFirst line of text\nsecond line\n\nNext paragraph."
    assert counts["whitespace_collapsed"] > 0 and counts["carriage_return"] == 4
    assert normalize_text("a\tb") == "a\tb"  # a single tab is kept (tables, code)


def test_line_separators_do_not_glue_words():
    assert normalize_text("end\x0cstart\x0bmore\u2028next\x85last") == "end\nstart\nmore\nnext\nlast"
    assert normalize_text("para one\u2029para two") == "para one\n\npara two"


def test_unicode_forms():
    decomposed = "Cafe\u0301 r\u00e9sum\u00e9"
    assert normalize_text(decomposed) == unicodedata.normalize("NFC", decomposed)
    assert normalize_text("ﬁne\u00a0\u00a0x", form="NFKC") == "fine x"
    assert normalize_text("ﬁne", form="none") == "ﬁne"


def test_control_only_document_becomes_empty_and_is_dropped():
    text, counts = normalize_with_counts("\x00\x01\u200b\ufeff \t\n\r\x9f")
    assert text == ""
    assert normalize_reason(text, NormalizeConfig()) == "normalize:empty"
    assert sum(counts.values()) >= 8


def test_replacement_ratio_reason():
    cfg = NormalizeConfig(max_replacement_ratio=0.05)
    assert replacement_ratio("ab\ufffd\ufffd") == 0.5
    assert normalize_reason("mostly \ufffd\ufffd\ufffd\ufffd", cfg) == "normalize:replacement_chars"
    assert normalize_reason("clean text", cfg) is None


def test_real_text_is_idempotent_and_clean(samples):
    raw = gzip.decompress((samples / "english-prose" / "tinyshakespeare.txt.gz").read_bytes()).decode(
        "utf-8"
    )[:200_000]
    once = normalize_text(raw)
    assert normalize_text(once) == once
    assert "\n\n" in once and "\n\n\n" not in once
    assert len(once) > 0.9 * len(raw)  # clean prose loses only whitespace


def test_ftfy_option_repairs_mojibake():
    pytest.importorskip("ftfy")
    text, counts = normalize_with_counts("The Mona Lisa doesnÃ¢â‚¬â„¢t have eyebrows.", use_ftfy=True)
    assert text == "The Mona Lisa doesn't have eyebrows." and counts["ftfy_fixed"] == 1


def test_the_fast_whitespace_spellings_equal_the_plain_regexes():
    """normalize.py spells its three whitespace rules for speed (see the comment there); they must
    do exactly what the plain spellings do, on any mix of horizontal spaces and newlines."""
    import re

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from oreline.data.filters import normalize as nm

    plain_run = re.compile(f"[{nm._HSPACE}]{{2,}}")
    plain_trailing = re.compile(f"[{nm._HSPACE}]+$", re.M)
    plain_newlines = re.compile(r"\n{3,}")
    assert set(nm._HSPACE_CHARS) == {c for c in map(chr, range(0x3001)) if re.fullmatch(f"[{nm._HSPACE}]", c)}

    @settings(max_examples=400, deadline=None)
    @given(st.text(alphabet=st.sampled_from(" \t\n\u00a0\u2003\u3000\u200b\r\x0bab.é")))
    def same(text):
        assert nm._HSPACE_RUN.sub(" ", text) == plain_run.sub(" ", text)
        assert "\n".join(line.rstrip(nm._HSPACE_CHARS) for line in text.split("\n")) == plain_trailing.sub(
            "", text
        )
        assert nm._MANY_NEWLINES.sub("\n\n", text) == plain_newlines.sub("\n\n", text)

    same()
