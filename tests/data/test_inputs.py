"""Non-WARC inputs hold at most data.read.max_record_bytes of one record (issue 21)."""

from __future__ import annotations

import gzip
import json
import zipfile

from oreline.config import load_config
from oreline.data.read.inputs import iter_input_documents


def _read(path, limit: int):
    cfg = load_config(None, [f"data.read.max_record_bytes={limit}"])
    reported = []
    docs = list(
        iter_input_documents(
            path, cfg, report=lambda reason, offset, preview: reported.append((reason, offset))
        )
    )
    return docs, reported


def test_txt_and_txt_gz_over_the_limit_are_dropped(tmp_path):
    (tmp_path / "small.txt").write_text("small enough")
    (tmp_path / "big.txt.gz").write_bytes(gzip.compress(b"a" * 5_000))
    docs, reported = _read(tmp_path / "small.txt", 1_000)
    assert [d.text for d in docs] == ["small enough"] and reported == []
    docs, reported = _read(tmp_path / "big.txt.gz", 1_000)
    assert docs == [] and reported == [("read:too_large", 0)]
    assert [d.text for d in _read(tmp_path / "big.txt.gz", 5_000)[0]] == ["a" * 5_000]


def test_zip_member_over_the_limit_is_dropped_and_the_others_read(tmp_path):
    with zipfile.ZipFile(tmp_path / "books.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.txt", "first book")
        z.writestr("b.txt", "x" * 5_000)
        z.writestr("c.txt", "third book")
    docs, reported = _read(tmp_path / "books.zip", 1_000)
    assert [d.metadata["member"] for d in docs] == ["a.txt", "c.txt"]
    assert reported == [("read:too_large", None)]


def test_jsonl_line_over_the_limit_is_dropped_and_the_next_lines_read(tmp_path):
    lines = [
        json.dumps({"id": "a", "text": "before"}),
        json.dumps({"id": "big", "text": "y" * 3_000_000}),
        json.dumps({"id": "b", "text": "after"}),
    ]
    data = ("\n".join(lines) + "\n").encode()
    for name, raw in (("lines.jsonl", data), ("lines.jsonl.gz", gzip.compress(data))):
        (tmp_path / name).write_bytes(raw)
        docs, reported = _read(tmp_path / name, 1_000_000)
        assert [d.id for d in docs] == ["a", "b"], name
        assert reported == [("read:too_large", len(lines[0]) + 1)], name
        assert (
            docs[1].metadata["offset"] == len(lines[0]) + len(lines[1]) + 2
        )  # offsets still count every byte
