"""Parquet shards: round trip, size bound, atomic writes, stable schema, readable by datasets."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from oreline.data.read.shards import (
    DOC_SCHEMA,
    REJECT_SCHEMA,
    REJECT_TEXT_CHARS,
    ShardWriter,
    count_rows,
    read_documents,
    reject_row,
    write_documents,
)
from oreline.document import Document


def _docs(n: int, size: int = 300) -> list[Document]:
    return [
        Document(
            id=f"doc-{i}",
            text=f"document {i} " + "é word " * (size // 7),
            url=f"https://example.org/{i}",
            metadata={
                "source_file": "a.warc.gz",
                "offset": i * 100,
                "language": "fr",
                "language_score": 0.91,
                "http_status": 200,
                "entropy": 4.2,
                "c4_removed_lines": {"javascript": 1},
            },
        )
        for i in range(n)
    ]


def test_round_trip_keeps_text_url_and_metadata(tmp_path):
    docs = _docs(20)
    paths = write_documents(docs, tmp_path, "part-00000", max_bytes=1 << 30)
    assert [p.name for p in paths] == ["part-00000-000.parquet"]
    back = list(read_documents(tmp_path))
    assert [d.id for d in back] == [d.id for d in docs]
    assert [d.text for d in back] == [d.text for d in docs]
    assert back[3].url == "https://example.org/3"
    md = back[3].metadata
    assert md["offset"] == 300 and md["language"] == "fr" and md["http_status"] == 200
    assert md["entropy"] == 4.2 and md["c4_removed_lines"] == {"javascript": 1}


def test_shards_are_bounded_by_max_bytes_and_lose_nothing(tmp_path):
    docs = _docs(200, size=2000)
    limit = 60_000
    paths = write_documents(docs, tmp_path, "part-00007", max_bytes=limit)
    assert len(paths) > 3
    assert [p.name for p in paths] == [f"part-00007-{k:03d}.parquet" for k in range(len(paths))]
    for p in paths:
        assert p.stat().st_size <= limit
    assert [d.id for d in read_documents(paths)] == [d.id for d in docs]
    assert count_rows(tmp_path) == 200


def test_schema_is_identical_whatever_the_metadata(tmp_path):
    write_documents([Document("a", "x", "", {})], tmp_path / "one", "p", 1 << 20)
    write_documents(
        [Document("b", "y", "u", {"language": "en", "weird": [1, 2], "http_status": "n/a"})],
        tmp_path / "two",
        "p",
        1 << 20,
    )
    s1 = pq.read_schema(next((tmp_path / "one").glob("*.parquet")))
    s2 = pq.read_schema(next((tmp_path / "two").glob("*.parquet")))
    assert s1.equals(s2) and s1.equals(DOC_SCHEMA)
    back = next(read_documents(tmp_path / "two"))
    assert back.metadata["http_status"] == "n/a"  # did not fit the int column: kept in the JSON column
    assert back.metadata["weird"] == [1, 2]


def test_failed_writer_leaves_nothing_behind(tmp_path):
    with pytest.raises(RuntimeError), ShardWriter(tmp_path, "part-00001", 1 << 30) as writer:
        for doc in _docs(5):
            writer.write_doc(doc)
        writer._flush()  # a temp file exists now
        assert list(tmp_path.iterdir())
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_zstd_compression_is_used(tmp_path):
    (path,) = write_documents(_docs(10), tmp_path, "p", 1 << 30)
    assert pq.ParquetFile(path).metadata.row_group(0).column(1).compression == "ZSTD"


def test_reject_rows_truncate_text_and_keep_the_reason(tmp_path):
    doc = Document(
        "r1",
        "z" * (REJECT_TEXT_CHARS * 3),
        "https://x",
        {"source_file": "f.warc", "offset": 7, "language": "en"},
    )
    row = reject_row(doc, "quality:c4", "c4:too_few_sentences")
    assert row["text_chars"] == REJECT_TEXT_CHARS * 3 and len(row["text"]) == REJECT_TEXT_CHARS
    with ShardWriter(tmp_path, "part-00000", 1 << 30, REJECT_SCHEMA) as w:
        w.write_row(row)
    table = pq.read_table(w.paths[0])
    assert table.schema.equals(REJECT_SCHEMA)
    assert table.column("reason").to_pylist() == ["c4:too_few_sentences"]
    assert table.column("offset").to_pylist() == [7]


def test_datasets_load_the_shards(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    paths = write_documents(_docs(50, size=3000), tmp_path / "docs", "part-00000", max_bytes=40_000)
    assert len(paths) > 1
    ds = datasets.load_dataset(
        "parquet", data_files=[str(p) for p in paths], split="train", cache_dir=str(tmp_path / "cache")
    )
    assert len(ds) == 50
    assert {"id", "text", "url", "language", "language_score", "metadata"} <= set(ds.column_names)
    assert ds[10]["id"] == "doc-10" and ds[10]["language"] == "fr"
