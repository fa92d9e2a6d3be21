"""datatrove's own filter test cases, run against oreline's rules at datatrove's parameters.

The inputs and parameters are transcribed from huggingface/datatrove's
tests/pipeline/filters/test_filters.py (Apache-2.0): the Gopher quality and repetition, C4 and
FineWeb cases. Each case asserts oreline's decision, with datatrove's reason beside the oreline
reason it corresponds to; datatrove's parameters are set as the step's settings (its
min_doc_words=10 is `min_words = 10`, its C4 defaults of 5 sentences and 3 words per line are
set explicitly, since oreline's defaults are the paper's 3 and 5). datatrove's -1 ("off") is 0.
"""

from __future__ import annotations

import pytest

from oreline.config import C4Step, FineWebStep, GopherQualityStep, GopherRepetitionStep
from oreline.data.filters.quality import c4, fineweb, gopher_quality, gopher_repetition
from oreline.document import Document

TEXT_LF_1 = (
    "I wish it need not have happened in my time,' said Frodo. 'So do I,' said Gandalf, 'and so do all who live to "
    "see such times. But that is not for them to decide. All we have to decide is what to do with the time that is "
    "given us.'"
)


def doc(text: str) -> Document:
    return Document("0", text, "https://example.com")


# ---------------------------------------------------------------------------------------------
# Gopher quality: GopherQualityFilter(min_doc_words=10, max_doc_words=1000)

GOPHER_QUALITY = GopherQualityStep(kind="gopher_quality", min_words=10, max_words=1000)
QUALITY_CASES = [
    # (text, datatrove's reason, oreline's reason)
    ("I am too small...", "gopher_short_doc", "gopher:short_doc"),
    ("I am " * 20, "gopher_below_avg_threshold", "gopher:mean_word_length"),
    ("interconnection " * 20, "gopher_above_avg_threshold", "gopher:mean_word_length"),
    ("# comment " * 20, "gopher_too_many_hashes", "gopher:symbol_ratio"),
    ("... comment " * 20, "gopher_too_many_ellipsis", "gopher:symbol_ratio"),
    (
        "the ./!*?<><> apple <?////> orange  ++ interconnection !<>??? have" * 20,
        "gopher_below_alpha_threshold",
        "gopher:alpha_words",
    ),
    (TEXT_LF_1, None, None),
]


@pytest.mark.parametrize(
    ("text", "datatrove", "expected"), QUALITY_CASES, ids=[c[1] or "kept" for c in QUALITY_CASES]
)
def test_gopher_quality_case(text, datatrove, expected):
    assert gopher_quality(doc(text), GOPHER_QUALITY) == expected


def test_gopher_quality_empty_doc():
    """GopherQualityFilter(min_doc_words=None) drops "" and blank text as "empty"; oreline with
    min_words = 0 drops them too, as a document without words (gopher:short_doc)."""
    off = GopherQualityStep(kind="gopher_quality", min_words=0)
    assert gopher_quality(doc(""), off) == "gopher:short_doc"
    assert gopher_quality(doc("   \n  \n"), off) == "gopher:short_doc"


# ---------------------------------------------------------------------------------------------
# Gopher repetition: GopherRepetitionFilter() (its defaults are the paper's)

GOPHER_REPETITION = GopherRepetitionStep(kind="gopher_repetition")
REPETITION_CASES = [
    ("I am your father.\n" * 4, "dup_line_frac", "gopher_rep:dup_line_frac"),
    ("I am your father.\n\n" * 4, "dup_para_frac", "gopher_rep:dup_para_frac"),
    (
        "I am groot.\n\n" + "You are a wizard.\n\n" + "I am your father.\n\n" + f"{'x' * 30}.\n\n" * 2,
        "dup_para_char_frac",
        "gopher_rep:dup_para_char_frac",
    ),
    (
        "I am groot.\n" + "You are a wizard.\n" + "I am your father.\n" + f"{'x' * 40}.\n" * 2,
        "dup_line_char_frac",
        "gopher_rep:dup_line_char_frac",
    ),
    ("I am Frank, I am Frank, I am Frank", "top_2_gram", "gopher_rep:top_2gram"),
    ("I am Frank, you are Jhon. I am Frank. I am Frank you are Jhon", "top_3_gram", "gopher_rep:top_3gram"),
    ("I am a solo traveller " * 4 + TEXT_LF_1, "duplicated_5_n_grams", "gopher_rep:dup_5gram"),
    ("", "empty", "gopher_rep:empty"),
]


@pytest.mark.parametrize(
    ("text", "datatrove", "expected"), REPETITION_CASES, ids=[c[1] for c in REPETITION_CASES]
)
def test_gopher_repetition_case(text, datatrove, expected):
    assert gopher_repetition(doc(text), GOPHER_REPETITION) == expected


# ---------------------------------------------------------------------------------------------
# C4: C4QualityFilter() with datatrove's defaults, 5 sentences and 3 words per line

C4_DATATROVE = C4Step(kind="c4", min_sentences=5, min_words_per_line=3)


def test_c4_keeps_quality_text():
    good = (
        "This is a well-written paragraph with several sentences.\n"
        "The content continues with more good information here.\n"
        "Another important point is being made in this line.\n"
        "We can see that this document has quality content.\n"
        "Finally, the conclusion wraps everything up nicely.\n"
        "An additional sentence to ensure we pass the threshold."
    )
    assert c4(doc(good), C4_DATATROVE) is None


def test_c4_rejects_lorem_ipsum():
    text = (
        "This is a sentence with lorem ipsum dolor sit amet.\n"
        "Another sentence with proper punctuation.\n"
        "More content to fill out the document.\n"
        "Even more content is needed to pass the check.\n"
        "The final sentence of the document."
    )
    assert c4(doc(text), C4_DATATROVE) == "c4:lorem_ipsum"  # datatrove: lorem_ipsum


def test_c4_rejects_curly_bracket():
    text = (
        "This is some code with a { bracket.\n"
        "Another sentence follows this one.\n"
        "More content to fill out the document.\n"
        "Even more content is needed to pass.\n"
        "The final sentence of the document."
    )
    assert c4(doc(text), C4_DATATROVE) == "c4:curly_bracket"  # datatrove: curly_bracket


def test_c4_rejects_too_few_sentences():
    assert (
        c4(doc("Just one sentence."), C4_DATATROVE) == "c4:too_few_sentences"
    )  # datatrove: too_few_sentences


def test_c4_removes_policy_lines_from_text():
    """C4QualityFilter(min_num_sentences=-1, min_words_per_line=-1): the cookie line goes."""
    off = C4Step(kind="c4", min_sentences=0, min_words_per_line=0)
    d = doc("This site uses cookies for tracking.\nAnother valid line here today.")
    assert c4(d, off) is None
    assert "cookies" not in d.text


# ---------------------------------------------------------------------------------------------
# FineWeb: FineWebQualityFilter(...)


def test_fineweb_rejects_empty_doc():
    assert fineweb(doc(""), FineWebStep(kind="fineweb")) == "fineweb:empty"  # datatrove: empty


def test_fineweb_rejects_low_punctuation_ratio():
    fw = FineWebStep(kind="fineweb", line_punct_ratio=0.5)  # line_punct_thr=0.5
    text = "No punctuation here\nAnother line without any\nStill nothing"
    assert fineweb(doc(text), fw) == "fineweb:line_punct_ratio"


def test_fineweb_rejects_mostly_short_lines():
    # short_line_thr=0.5, short_line_length=30, line_punct_thr=0.0
    fw = FineWebStep(kind="fineweb", short_line_ratio=0.5, short_line_length=30, line_punct_ratio=0.0)
    assert fineweb(doc("hi.\nbye.\nok.\nno.\nyes."), fw) == "fineweb:short_line_ratio"


def test_fineweb_keeps_quality_text():
    text = (
        "This is a well-written paragraph that ends with proper punctuation.\n"
        "The content here is substantial and has meaningful information.\n"
        "Quality filtering ensures that only the best documents pass through.\n"
        "Each line here is long enough and ends with a terminal punctuation mark.\n"
        "This document should pass all the quality checks applied by the filter."
    )
    assert fineweb(doc(text), FineWebStep(kind="fineweb")) is None


def test_fineweb_rejects_list_heavy_doc():
    fw = FineWebStep(kind="fineweb", new_line_ratio=0.1)  # datatrove asserts only that it is dropped
    assert fineweb(doc("\n".join(["a"] * 50)), fw) is not None
