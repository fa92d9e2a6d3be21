"""Session fixtures of the token layer: a small real corpus, two trained tokenizers, token shards.

The corpus is real text from the samples: Shakespeare and Austen paragraphs, Chinese and
Russian lines of the Common Crawl pages in the resiliparse excerpt (gb2312/gbk and windows-1251
pages, as the WARC reader decodes them), plus a few hand-written edge cases (literal special-token
text, emoji, whitespace runs). Training stays small (vocab 768, ~450 KB) so the session costs
about a second per tokenizer.
"""

from __future__ import annotations

import gzip
import json
import re
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oreline.config import TokenizeConfig, TokenizerConfig

EDGE_CASES = [
    "A document that mentions <s> and </s> and <pad> as plain text.",
    "<s>starts with a literal BOS</s>",
    "Emoji: 😀🎉👩‍👩‍👧 and symbols ∑∫√ ½ — done.",
    "whitespace   runs\t\ttabs\n\n\n  and   leading spaces",
    "   leading and trailing   ",
    "Mixed: English, 中文字符, Русский текст, ελληνικά, العربية.",
]


def _paragraphs(text: str, min_chars: int = 40) -> list[str]:
    return [p.strip("\n") for p in text.split("\n\n") if len(p.strip()) >= min_chars]


def _web_lines(warc: Path, n: int) -> dict[str, list[str]]:
    """The first n text lines of the pages in `warc` with >= 10 Chinese / >= 20 Cyrillic letters."""
    from oreline.data.filters.extract import html_to_text
    from oreline.data.read.record import ReadReport, record_to_document
    from oreline.data.read.warc import iter_records

    out: dict[str, list[str]] = {"zh": [], "ru": []}
    report = ReadReport()
    for record in iter_records(warc, report=report):
        for line in html_to_text(record_to_document(record, report).text, main_content=False).splitlines():
            if len(re.findall("[\u4e00-\u9fff]", line)) >= 10:
                out["zh"].append(line)
            elif len(re.findall("[а-яА-ЯёЁ]", line)) >= 20:
                out["ru"].append(line)
    assert all(len(lines) >= n for lines in out.values()), {k: len(v) for k, v in out.items()}
    return {k: v[:n] for k, v in out.items()}


@pytest.fixture(scope="session")
def corpus(samples) -> dict[str, list[tuple[str, str]]]:
    """Named groups of (id, text) documents."""
    prose = samples / "english-prose"
    with gzip.open(prose / "tinyshakespeare.txt.gz", "rt", encoding="utf-8") as fh:
        shakespeare = _paragraphs(fh.read(250_000))
    with zipfile.ZipFile(prose / "nltk-gutenberg.zip") as zf:
        austen = _paragraphs(zf.read("gutenberg/austen-persuasion.txt").decode("utf-8", "replace")[:150_000])
    web = _web_lines(
        samples / "web-archives/commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz", 150
    )
    zh, ru = web["zh"], web["ru"]
    return {
        "shakespeare": [(f"shakespeare-{i}", t) for i, t in enumerate(shakespeare)],
        "austen": [(f"austen-{i}", t) for i, t in enumerate(austen)],
        "zh": [(f"zh-{i}", t) for i, t in enumerate(zh)],
        "ru": [(f"ru-{i}", t) for i, t in enumerate(ru)],
        "edge": [(f"edge-{i}", t) for i, t in enumerate(EDGE_CASES)],
    }


def write_parquet(path: Path, docs: list[tuple[str, str]], row_group_size: int = 256) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "id": [d[0] for d in docs],
            "text": [d[1] for d in docs],
            "url": [""] * len(docs),
            "language": ["xx"] * len(docs),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_jsonl(
    path: Path, docs: list[tuple[str, str]], gz: bool = True, extra_lines: list[str] = ()
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "text": t}, ensure_ascii=False) for i, t in docs] + list(extra_lines)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture(scope="session")
def corpus_files(corpus, tmp_path_factory) -> list[Path]:
    """Two Parquet shards and one JSONL.gz file, in this order."""
    root = tmp_path_factory.mktemp("docs")
    return [
        write_parquet(root / "part-0.parquet", corpus["shakespeare"] + corpus["zh"]),
        write_parquet(root / "part-1.parquet", corpus["austen"] + corpus["ru"]),
        write_jsonl(root / "extra.jsonl.gz", corpus["edge"]),
    ]


@pytest.fixture(scope="session")
def byte_tokenizer_dir(corpus_files, tmp_path_factory) -> Path:
    from oreline.tokens.train_bpe import train_tokenizer

    out = tmp_path_factory.mktemp("tok-byte")
    train_tokenizer(corpus_files, out, TokenizerConfig(vocab_size=768, pre_tokenizer="byte_level"))
    return out


@pytest.fixture(scope="session")
def metaspace_tokenizer_dir(corpus_files, tmp_path_factory) -> Path:
    from oreline.tokens.train_bpe import train_tokenizer

    out = tmp_path_factory.mktemp("tok-meta")
    train_tokenizer(corpus_files, out, TokenizerConfig(vocab_size=768, pre_tokenizer="metaspace"))
    return out


@pytest.fixture(scope="session")
def tokens_dir(corpus_files, byte_tokenizer_dir, tmp_path_factory) -> Path:
    """Token shards of the corpus (val 10%, small shards so sequences cross shard boundaries). Read-only."""
    from oreline.tokens.tokenize import tokenize_corpus

    out = tmp_path_factory.mktemp("tokens")
    tokenize_corpus(
        corpus_files,
        byte_tokenizer_dir,
        out,
        TokenizeConfig(val_fraction=0.1, max_shard_tokens=20_000),
        workers=2,
    )
    return out
