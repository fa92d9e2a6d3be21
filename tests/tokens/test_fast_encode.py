"""The fast encoder gives HF's ids for every input: real multilingual documents, every code point,
whitespace/apostrophe edge cases; it rejects what HF rejects and falls back (loudly) when unsure."""

from __future__ import annotations

import array
import gzip
import json
import warnings

import pytest
import regex

from oreline.config import TokenizerConfig
from oreline.tokens import fast_encode
from oreline.tokens.fast_encode import FastEncoder
from oreline.tokens.train_bpe import load_tokenizer, train_tokenizer

EDGE = [
    "  a",
    "a  \n b",
    "it's",
    "IT'S",
    "'ll",
    "'s'll've",
    "don't we'll",
    "x'",
    "'",
    "''",
    " 's",
    "a'S",
    "\ta",
    "a\t\tb",
    "\t",
    "a\r\nb",
    "\r\n",
    "\r\n\r\n  x",
    "a \r\n b",
    "\n",
    "\n\n",
    " \n",
    "\n ",
    "  ",
    "a\u00a0b",
    "\u00a0",
    " \u00a0 ",
    "a\u3000b",
    "\u3000\u3000x",
    "a\u0085b",
    "\u0085",
    "a\u2028\u2029b",
    "a\u200bb",
    "a\ufeffb",
    "\u000b\u000cx",
    "\x1c\x1d\x1e\x1fx",
    "a \t\n\u00a0\u3000 b",
    "end ",
    "end  ",
    "1,000.5",
    "x1y2",
    "١٢٣ ٤",
    "Ⅻ ½²",
    "😀😀 😀",
    "👩‍👩‍👧",
    "a\u0301b",
    "<s>",
    " </s>x",
    "▁",
    "▁▁ ▁x",
    "",
    " ",
]


@pytest.fixture(params=["byte_tokenizer_dir", "metaspace_tokenizer_dir"])
def tok(request):
    tok = load_tokenizer(request.getfixturevalue(request.param))
    assert tok.fast is not None, "oreline's own tokenizers must get the fast encoder"
    return tok


def _hf(tok, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.hf.encode_batch_fast(texts, add_special_tokens=False)]


def _assert_same(tok, texts: list[str]) -> None:
    want, got = _hf(tok, texts), tok.fast.encode_batch(texts)
    bad = [t for t, a, b in zip(texts, want, got, strict=True) if a != b]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ, e.g. {bad[0][:200]!r}"


@pytest.mark.extended("langid/lingua-testdata/sentences")
def test_same_ids_on_sentences_in_79_languages(tok, full_samples):
    files = sorted((full_samples / "langid" / "lingua-testdata" / "sentences").glob("*.txt.gz"))
    assert len(files) >= 70
    texts = []
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            lines = fh.read(25_000).splitlines()[:-1]  # the last line may be cut
        texts += lines[:100]  # one sentence per document ...
        texts.append("\n".join(lines[100:]))  # ... and the rest as one long document
    _assert_same(tok, texts)
    _assert_same(tok, texts)  # again from a warm cache


def test_same_ids_on_web_archive_payloads(tok, samples):
    """Raw payloads as decoded by the WARC reader: HTML, scripts, many charsets, binary read as text."""
    from oreline.data.read.record import ReadReport, record_to_document
    from oreline.data.read.warc import iter_records

    texts = []
    for path in sorted((samples / "web-archives").rglob("*")):
        if path.is_file() and (".warc" in path.name or ".arc" in path.name):
            report = ReadReport()
            for record in iter_records(path, report=report):
                doc = record_to_document(record, report)
                if not isinstance(doc, str):  # a str is the reason the record has no document
                    texts.append(doc.text[:3000])  # the start of each: HTML head, scripts, binary
    assert len(texts) > 100
    _assert_same(tok, texts)


def test_edge_cases(tok):
    _assert_same(tok, EDGE)
    _assert_same(tok, ["".join(EDGE), " ".join(EDGE), "\n".join(EDGE)])
    for text in EDGE:  # the single-text path too
        assert tok.encode(text) == tok.hf.encode(text, add_special_tokens=False).ids, repr(text)


def _every_code_point() -> str:
    cps = array.array("I", range(0x110000))
    del cps[0xD800:0xE000]  # surrogates are not text (see test_lone_surrogates_raise)
    return cps.tobytes().decode("utf-32-le")


def _mapped(piece: str) -> str:
    return piece.encode("utf-8").decode("latin-1").translate(fast_encode._BYTE_TRANSLATE)


@pytest.mark.slow
def test_every_code_point_in_context(byte_tokenizer_dir):
    """All of Unicode after a letter, between spaces, after a space and before a newline, through
    HF's ByteLevel pre-tokenizer and ours: same pieces, but for the code points of ONIG_UNASSIGNED,
    whose texts the encoder hands to HF (digits: test_onig_unassigned_table_is_exact). Ids alone would not show a
    different split everywhere (a small vocabulary has no merge across most boundaries), so pieces
    are compared for every code point, ids for the Basic Multilingual Plane and ONIG_UNASSIGNED."""
    tok = load_tokenizer(byte_tokenizer_dir)
    split = regex.compile(fast_encode.GPT2_PATTERN).findall
    table = "".join(map(chr, fast_encode._code_points(fast_encode.ONIG_UNASSIGNED)))
    every = _every_code_point().translate(dict.fromkeys(map(ord, table)))
    line = "a{0} {0} {0}\n".format
    for start in range(0, len(every), 128):  # HF's pre_tokenize_str slows down on long texts
        chunk = every[start : start + 128]
        text = "".join(map(line, chunk))
        want = [p for p, _ in tok.hf.pre_tokenizer.pre_tokenize_str(text)]
        if want != list(map(_mapped, split(text))):  # name the code points
            bad = [
                f"U+{ord(c):04X}"
                for c in chunk
                if [p for p, _ in tok.hf.pre_tokenizer.pre_tokenize_str(line(c))]
                != list(map(_mapped, split(line(c))))
            ]
            pytest.fail(f"pieces differ for {bad[:20]}")
    lines = list(map(line, every[: every.index("\U00010000")] + table))
    texts = ["".join(lines[i : i + 256]) for i in range(0, len(lines), 256)]
    assert _hf(tok, texts) == tok.fast.encode_batch(texts)


def test_onig_unassigned_table_is_exact():
    """ONIG_UNASSIGNED is exactly where `regex` and Oniguruma disagree on letters, digits, spaces
    (on failure, the message holds what to put in the table)."""
    from tokenizers import Regex, pre_tokenizers

    every = _every_code_point()
    differ = set()
    for cls in (r"\p{L}", r"\p{N}", r"\s"):
        not_in_cls = "".join(
            p for p, _ in pre_tokenizers.Split(Regex(cls + "+"), "removed").pre_tokenize_str(every)
        )
        onig = set(map(ord, every)) - set(map(ord, not_in_cls))
        differ |= onig ^ set(map(ord, regex.findall(cls, every)))
    table = set(fast_encode._code_points(fast_encode.ONIG_UNASSIGNED))
    ranges: list[list[int]] = []
    for c in sorted(differ):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    assert differ == table, "regenerate ONIG_UNASSIGNED: " + " ".join(
        f"{a:X}" if a == b else f"{a:X}-{b:X}" for a, b in ranges
    )
    assert fast_encode.unicode_tables_agree() is None


@pytest.mark.parametrize("text", ["a\ud800b", "\udfff", "ok text then \udc80", "it's \ud83d"])
def test_lone_surrogates_raise(tok, text):
    """tokenize's _encode rejects the document when encoding raises; the fast path must raise too."""
    with pytest.raises(Exception):  # noqa: B017 - HF raises TypeError, we UnicodeEncodeError
        tok.hf.encode_batch_fast([text], add_special_tokens=False)
    with pytest.raises(UnicodeEncodeError):
        tok.encode_batch(["fine", text])
    assert tok.encode_batch(["fine"]) == _hf(tok, ["fine"])  # nothing half-cached


def test_cache_limit_clears_and_stays_exact(tok, corpus, monkeypatch):
    monkeypatch.setattr(fast_encode, "CACHE_LIMIT", 50)
    texts = [t for _, t in corpus["austen"][:40] + corpus["zh"][:40]]
    _assert_same(tok, texts)
    assert len(tok.fast.cache) <= 50


def test_unsupported_configurations_use_hf(corpus_files, byte_tokenizer_dir, tmp_path):
    prefixed = tmp_path / "prefixed"
    train_tokenizer(corpus_files, prefixed, TokenizerConfig(vocab_size=400, continuing_subword_prefix="##"))
    assert load_tokenizer(prefixed).fast is None
    tok = load_tokenizer(byte_tokenizer_dir)
    config = json.loads((byte_tokenizer_dir / "tokenizer.json").read_text())
    reasons = {
        "added": {
            **config,
            "added_tokens": [
                *config["added_tokens"],
                {**config["added_tokens"][0], "content": "hi", "id": 5, "special": False},
            ],
        },
        "normalizer": {**config, "normalizer": {"type": "NFC"}},
        "prefix space": {**config, "pre_tokenizer": {**config["pre_tokenizer"], "add_prefix_space": True}},
        "dropout": {**config, "model": {**config["model"], "dropout": 0.1}},
    }
    for name, cfg in reasons.items():
        assert fast_encode.unsupported_reason(cfg, tok.hf) is not None, name
    assert fast_encode.unsupported_reason(config, tok.hf) is None


def test_self_check_failure_warns_and_falls_back(byte_tokenizer_dir, monkeypatch):
    # A pre-tokenizer that ignores contractions: wrong on "It's", which the self-check contains.
    monkeypatch.setattr(
        fast_encode, "GPT2_PATTERN", r""" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    )
    with pytest.warns(RuntimeWarning, match="falling back"):
        tok = load_tokenizer(byte_tokenizer_dir)
    assert tok.fast is None
    assert tok.encode("It's") == tok.hf.encode("It's", add_special_tokens=False).ids


def test_no_warning_for_oreline_tokenizers(byte_tokenizer_dir, metaspace_tokenizer_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in (byte_tokenizer_dir, metaspace_tokenizer_dir):
            assert isinstance(load_tokenizer(path).fast, FastEncoder)
