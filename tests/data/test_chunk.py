"""Chunking: windows cover the text, never exceed the size, overlap as asked, break at whitespace."""

from __future__ import annotations

import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oreline.config import ChunkConfig, Config
from oreline.data.filters.chunk import chunk_document, chunk_spans, chunk_text
from oreline.document import Document


def check_spans(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    spans = chunk_spans(text, size, overlap)
    if not text:
        assert spans == []
        return spans
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (s0, e0), (s1, _) in zip(spans, spans[1:], strict=False):
        assert s0 < s1 <= e0, "windows must advance and leave no gap"
        assert e0 - s1 <= overlap
    assert all(0 < e - s <= size for s, e in spans)
    return spans


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("ab c\n\tdé中"), max_size=3000),
    size=st.integers(2, 400),
    data=st.data(),
)
def test_spans_cover_and_bound(text, size, data):
    overlap = data.draw(st.integers(0, size - 1))
    spans = check_spans(text, size, overlap)
    assert chunk_text(text, size, overlap) == [text[s:e] for s, e in spans]


def test_breaks_at_whitespace_and_overlaps(samples):
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        text = zf.read("gutenberg/chesterton-ball.txt").decode("latin-1")[:50_000]
    spans = check_spans(text, 2048, 512)
    assert len(spans) == pytest.approx(50_000 / (2048 - 512), rel=0.15)
    for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
        assert text[e0 - 1].isspace(), "window ends just after whitespace"
        assert text[s1 - 1].isspace(), "next window starts at a word"
        assert 512 - 2048 // 10 <= e0 - s1 <= 512
    # no whitespace at all: hard cuts of exactly size, overlap exactly as asked
    assert chunk_spans("x" * 5000, 2048, 512) == [(0, 2048), (1536, 3584), (3072, 5000)]


def test_chunk_document_ids_and_metadata():
    doc = Document("doc-1", "word " * 1000, url="http://x", metadata={"language": "en"})
    chunks = chunk_document(doc, ChunkConfig(size=1000, overlap=200))
    assert [c.id for c in chunks] == [f"doc-1#c{k}" for k in range(len(chunks))]
    assert all(c.metadata["chunk_count"] == len(chunks) and c.url == "http://x" for c in chunks)
    assert [c.metadata["chunk_index"] for c in chunks] == list(range(len(chunks)))
    assert all(doc.text[c.metadata["chunk_start"] :].startswith(c.text) for c in chunks)
    chunks[0].metadata["language"] = "fr"
    assert doc.metadata == {"language": "en"} and chunks[1].metadata["language"] == "en"
    whole = chunk_document(Document("short", "tiny"), Config())  # the whole config is accepted
    assert [(c.id, c.text, c.metadata["chunk_count"]) for c in whole] == [("short#c0", "tiny", 1)]
    with pytest.raises(ValueError):
        chunk_spans("abc", 10, 10)
