"""The token layer's JSONL reader holds at most max_line_bytes of one line (issue 21)."""

from __future__ import annotations

import gzip
import json

from oreline.tokens.inputs import Rejects, iter_batches, iter_texts


def test_jsonl_line_over_the_limit_is_a_reject_and_reading_goes_on(tmp_path):
    lines = [
        json.dumps({"id": "a", "text": "before"}),
        json.dumps({"id": "big", "text": "y" * 3_000_000}),
        json.dumps({"id": "b", "text": "after"}),
    ]
    path = tmp_path / "docs.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    rejects = Rejects()
    got = []
    for ids, texts in iter_batches(path, rejects, max_line_bytes=1_000_000):
        got.extend(zip(ids, texts, strict=True))
    assert got == [("a", "before"), ("b", "after")]
    assert rejects.counts == {"too_large": 1} and rejects.rows[0]["row"] == 1
    rejects = Rejects()
    assert [t for _, t in iter_texts([path], rejects)][1] == "y" * 3_000_000  # under the default 50 MB limit
    assert rejects.counts == {}


def test_parquet_text_over_the_limit_is_a_reject_and_rows_keep_their_numbers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"id": "a", "text": "before"},
        {"id": "big", "text": "y" * 3_000_000},
        {"id": "empty", "text": ""},
        {"id": "b", "text": "after"},
    ]
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    rejects = Rejects()
    got = []
    for ids, texts in iter_batches(path, rejects, max_line_bytes=1_000_000):
        got.extend(zip(ids, texts, strict=True))
    assert got == [("a", "before"), ("b", "after")]
    assert rejects.counts == {"too_large": 1, "no_text": 1}
    assert [(r["reason"], r["row"]) for r in rejects.rows] == [("too_large", 1), ("no_text", 2)]
    assert rejects.rows[1]["raw"]["detail"] == "empty"
    assert "id 'big'" in rejects.rows[0]["raw"]
