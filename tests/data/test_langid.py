"""Language identification with the bundled lid.176 model on real sentences."""

from __future__ import annotations

import gzip

import pytest

from oreline.config import LangIdConfig
from oreline.data.filters.langid import detect, detect_batch, langid_reason


def sentences(samples, lang: str, n: int = 40) -> list[str]:
    path = samples / "langid" / "lingua-testdata" / "sentences" / f"{lang}.txt.gz"
    return gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()[:n]


@pytest.mark.extended("langid/lingua-testdata/sentences")
@pytest.mark.parametrize("lang", ["en", "de", "fr", "ru", "zh", "ja", "ar", "es"])
def test_sentences_are_recognised(full_samples, lang):
    results = detect_batch(sentences(full_samples, lang))
    accuracy = sum(got == lang for got, _ in results) / len(results)
    assert accuracy >= 0.85, (lang, accuracy, results[:5])
    assert all(0.0 <= score <= 1.0 for _, score in results)


@pytest.mark.extended("langid/lingua-testdata/sentences/de.txt.gz")
def test_multiline_text_is_scored_as_a_whole(full_samples):
    # one sentence per line: fastText would refuse the newlines, and per-line answers would vary
    text = "\n".join(sentences(full_samples, "de", 20))
    lang, score = detect(text)
    assert lang == "de" and score > 0.9
    assert detect("Hello there.\nThis is English.\n\nIt spans several lines.\n")[0] == "en"


def test_short_chinese_without_kana_is_not_japanese():
    assert detect("北京大学")[0] == "zh"
    assert detect("これは日本語の文章です。ひらがなとカタカナ。")[0] == "ja"


def test_uppercase_and_empty_text():
    assert detect("THIS IS A WARNING ABOUT THE WEATHER TOMORROW IN THE CITY")[0] == "en"
    assert detect("") == ("und", 0.0)
    assert detect(" \n\t ") == ("und", 0.0)


def test_langid_reason():
    cfg = LangIdConfig(languages=["en"], threshold=0.65)
    assert langid_reason("en", 0.9, cfg) is None
    assert langid_reason("en", 0.5, cfg) == "lang:score<0.65"
    assert langid_reason("de", 0.99, cfg) == "lang:other"
    assert langid_reason("de", 0.99, LangIdConfig(languages=[])) is None
    assert langid_reason("de", 0.2, LangIdConfig(languages=[])) == "lang:score<0.65"
    assert langid_reason("de", 0.2, LangIdConfig(enabled=False)) is None


def test_surrogates_and_nul_do_not_break_detection():
    german = "Das ist ein ganz normaler deutscher Satz über das Wetter von morgen."
    assert detect("\ud800" + german)[0] == "de"  # the binding would refuse the whole string
    assert detect("x\x00" + german)[0] == "de"  # a NUL would cut the text at the C boundary
