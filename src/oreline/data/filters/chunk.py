"""Character windows with overlap, broken at whitespace near the window edges.

A window starts at `start` and would end at `start + size`. When that is inside the text, the end
moves back to just after the last whitespace within the final `slack` characters (slack = 10% of
size), so words are not cut; with no whitespace there (long URLs, CJK text) the window is cut at
exactly `size`. The next window starts `overlap` characters before that end, moved forward to just
after the first whitespace within `slack` characters, as long as it stays at or before the end.

Guarantees (tested with hypothesis): every window is at most `size` characters; windows start at
strictly increasing offsets; each starts at or before the previous one's end, so every character
of the text is in some window; consecutive windows share at most `overlap` characters.
"""

from __future__ import annotations

from typing import Any

from oreline.config import ChunkConfig
from oreline.document import Document


def chunk_spans(text: str, size: int = 2048, overlap: int = 512) -> list[tuple[int, int]]:
    """(start, end) character offsets of the windows of text."""
    if size <= 0 or not 0 <= overlap < size:
        raise ValueError(f"need 0 <= overlap ({overlap}) < size ({size})")
    n = len(text)
    if n <= size:
        return [(0, n)] if n else []
    slack = max(1, size // 10)
    spans = []
    start = 0
    while True:
        end = start + size
        if end >= n:
            spans.append((start, n))
            return spans
        # end just after the last whitespace in text[end - slack : end]
        cut = next((i + 1 for i in range(end - 1, max(start, end - slack) - 1, -1) if text[i].isspace()), end)
        end = cut
        spans.append((start, end))
        nxt = max(start + 1, end - overlap)
        # start just after the first whitespace in text[nxt : nxt + slack], never past end
        for i in range(nxt, min(end, nxt + slack)):
            if text[i].isspace():
                nxt = i + 1
                break
        start = min(nxt, end)


def chunk_text(text: str, size: int = 2048, overlap: int = 512) -> list[str]:
    """Overlapping windows of at most `size` characters that together cover the whole text."""
    return [text[s:e] for s, e in chunk_spans(text, size, overlap)]


def chunk_document(doc: Document, cfg: Any) -> list[Document]:
    """Windows of doc as Documents with ids "{id}#c{k}" and chunk_index/chunk_count/chunk_start.

    `cfg` is the ChunkConfig (cfg.data.chunk); a whole Config or DataConfig is accepted too.
    Every chunk gets its own copy of the metadata.
    """
    while not isinstance(cfg, ChunkConfig):
        cfg = cfg.data if hasattr(cfg, "data") else cfg.chunk
    spans = chunk_spans(doc.text, cfg.size, cfg.overlap)
    return [
        Document(
            id=f"{doc.id}#c{k}",
            text=doc.text[s:e],
            url=doc.url,
            metadata={**doc.metadata, "chunk_index": k, "chunk_count": len(spans), "chunk_start": s},
        )
        for k, (s, e) in enumerate(spans)
    ]
