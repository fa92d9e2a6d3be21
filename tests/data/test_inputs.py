"""Non-WARC inputs hold at most data.read.max_record_bytes of one record (issue 21)."""

from __future__ import annotations

import gzip
import json
import zipfile
from pathlib import Path

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


def _parquet(path, rows: list[dict], row_group_size: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


def test_parquet_row_over_the_limit_is_dropped_with_its_id_and_the_next_rows_read(tmp_path):
    rows = [{"id": "a", "text": "before"}, {"id": "big", "text": "y" * 5_000}, {"id": "b", "text": "after"}]
    _parquet(tmp_path / "docs.parquet", rows * 2, row_group_size=4)  # the second "big" opens row group 2
    reported = []
    cfg = load_config(None, ["data.read.max_record_bytes=1000"])
    docs = list(
        iter_input_documents(
            tmp_path / "docs.parquet",
            cfg,
            report=lambda reason, offset, preview: reported.append((reason, offset, preview)),
        )
    )
    assert [(d.id, d.metadata["offset"]) for d in docs] == [("a", 0), ("b", 2), ("a", 3), ("b", 5)]
    assert [(r, o) for r, o, _ in reported] == [("read:too_large", 1), ("read:too_large", 4)]
    assert "(id 'big'): 5,000 bytes" in reported[0][2]


BOUNDED_READ = """
import json
from pathlib import Path
import sys
import pyarrow as pa
from oreline.config import load_config
from oreline.data.read.inputs import iter_input_documents
reported = []
cfg = load_config(None, ["data.read.max_row_group_bytes=" + sys.argv[2]])
docs = list(iter_input_documents(sys.argv[1], cfg, report=lambda r, o, p: reported.append((r, o))))
print(json.dumps({"docs": len(docs), "reported": reported, "peak": pa.default_memory_pool().max_memory()}))
"""


def test_a_parquet_row_group_over_the_limit_is_dropped_unread(tmp_path):
    """A row group's columns are decoded whole by Arrow (batching does not bound it: 48 rows of
    4 MB peaked at 274 MB with batches of 1 or 1,024 rows); a file whose row group states more than
    data.read.max_row_group_bytes loses that row group, counted, and Arrow never allocates it."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from oreline.parquet import BATCH_BYTES, batch_rows

    assert batch_rows(48, 48 * (4 << 20)) == BATCH_BYTES // (4 << 20) == 16
    assert batch_rows(10, 10 << 30) == 1 and batch_rows(100_000, 1 << 20) == 1024
    rows = [{"id": str(i), "text": (str(i) + " ") * (1 << 20)} for i in range(24)]  # 24 rows of 2-3 MB
    with pq.ParquetWriter(tmp_path / "mixed.parquet", pa.Table.from_pylist(rows[:1]).schema) as w:
        w.write_table(pa.Table.from_pylist([{"id": "small", "text": "a small row"}] * 3))
        w.write_table(pa.Table.from_pylist(rows))  # ~60 MB uncompressed, a few hundred KB on disk
        w.write_table(pa.Table.from_pylist([{"id": "after", "text": "read on after it"}]))
    for limit, docs, reported in ((32 << 20, 4, [["read:too_large", 3]]), (128 << 20, 28, [])):
        done = subprocess.run(
            [sys.executable, "-c", BOUNDED_READ, str(tmp_path / "mixed.parquet"), str(limit)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert (got["docs"], got["reported"]) == (docs, reported)
        if reported:  # the big row group was never decoded
            assert got["peak"] < 1 << 20, f"Arrow allocated {got['peak']:,} bytes"


HOSTILE_READ = """
import json
from pathlib import Path
import sys
import pyarrow as pa
from oreline.config import load_config
from oreline.data.read.inputs import iter_input_documents
reported = {}
cfg = load_config(None, sys.argv[2:])
docs = list(iter_input_documents(sys.argv[1], cfg, report=lambda r, o, p: reported.update({r: p})))
print(json.dumps({"docs": len(docs), "reported": reported, "peak": pa.default_memory_pool().max_memory()}))
"""


def _hostile_read(path, *overrides) -> dict:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", HOSTILE_READ, str(path), *overrides],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _benchmark_module():
    import importlib.util
    import sys

    name = "oreline_hostile_cases"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).parents[2] / "benchmarks" / "hostile_inputs.py"
        )
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_a_footer_that_understates_a_row_group_is_not_believed(tmp_path):
    """The footer says 1,000 bytes; the page headers (which Arrow holds each page to) say 24 MB:
    the row group is over an 8 MB limit and is dropped unread, the counted size in the reason."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "understated.parquet"
    rows = [{"id": f"r{i}", "text": "a" * (1 << 20)} for i in range(24)]
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd", use_dictionary=False)
    _benchmark_module().understate_footer(path, 1000)
    assert pq.ParquetFile(path).metadata.row_group(0).total_byte_size == 1000
    got = _hostile_read(path, f"data.read.max_row_group_bytes={8 << 20}")
    assert got["docs"] == 0 and list(got["reported"]) == ["read:too_large"]
    assert "the footer states 1,000" in got["reported"]["read:too_large"]
    assert got["peak"] < 1 << 20, f"Arrow allocated {got['peak']:,} bytes"


def test_rows_repeating_one_dictionary_entry_are_measured_not_expanded(tmp_path):
    """200 rows naming one 1 MiB dictionary entry (a few KB on disk, footer honestly ~1 MB) are
    each over max_record_bytes: counted from the dictionary's lengths, never expanded by Arrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = pa.DictionaryArray.from_arrays(pa.array([0] * 200, pa.int32()), pa.array(["b" * (1 << 20)]))
    table = pa.table({"id": [f"r{i}" for i in range(200)], "text": text})
    pq.write_table(table, tmp_path / "dict.parquet", compression="zstd", store_schema=False)
    got = _hostile_read(tmp_path / "dict.parquet", "data.read.max_record_bytes=100000")
    assert got["docs"] == 0 and list(got["reported"]) == ["read:too_large"]
    assert got["peak"] < 16 << 20, f"Arrow allocated {got['peak']:,} bytes (200 MiB expanded)"
