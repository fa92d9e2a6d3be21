"""Parquet shards of documents: a size-bounded, atomic writer and a streaming reader.

Layout of one shard (zstd-compressed Parquet, one stable schema for every shard of every run):

    id, text, url                                   the Document itself
    source_file, record_id, offset, crawl_date,     where it came from (WARC record, input file)
    http_status, content_type, charset, record_type
    language, language_score                        lid.176 top language and its score
    words, mean_word_length, entropy, ascii_ratio,  quality scores (null where a rule did not run)
    perplexity, quality_score
    chunk_index, chunk_count, chunk_start,          set when the chunk step split a document
    parent_id
    metadata                                        every other metadata key, as one JSON object

Flat columns for the common keys make the shards directly useful to pyarrow, DuckDB and
`datasets.load_dataset("parquet", ...)`; the JSON column keeps whatever else a step recorded
(quality scores, normalization counts) without changing the schema from one run to the next.

`ShardWriter` starts a new file when the uncompressed size of the rows in the current one would
pass `max_bytes`, so a compressed shard never exceeds the bound. Each file is written under a
temporary name and renamed when closed: a killed writer leaves no half shard behind.

Rejected documents use the same writer with `REJECT_SCHEMA` (step, reason, truncated text).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from oreline.document import Document
from oreline.errors import InputError
from oreline.io import refuse_planted, write_new

# metadata key -> arrow type of its flat column; every other key goes into the JSON column
FLAT_COLUMNS: dict[str, pa.DataType] = {
    "source_file": pa.string(),
    "record_id": pa.string(),
    "offset": pa.int64(),
    "crawl_date": pa.string(),
    "http_status": pa.int32(),
    "content_type": pa.string(),
    "charset": pa.string(),
    "record_type": pa.string(),
    "language": pa.string(),
    "language_score": pa.float64(),
    "words": pa.int64(),  # quality scores (data/filters/quality.py writes them while filtering)
    "mean_word_length": pa.float64(),
    "entropy": pa.float64(),
    "ascii_ratio": pa.float64(),
    "perplexity": pa.float64(),
    "quality_score": pa.float64(),  # the quality classifier's P(positive) (data/filters/classifier.py)
    "chunk_index": pa.int32(),
    "chunk_count": pa.int32(),
    "chunk_start": pa.int64(),
    "parent_id": pa.string(),
}

DOC_SCHEMA = pa.schema(
    [("id", pa.string()), ("text", pa.string()), ("url", pa.string())]
    + list(FLAT_COLUMNS.items())
    + [("metadata", pa.string())]
)

REJECT_TEXT_CHARS = 4000  # rejects keep this much text: enough to see why, bounded on disk
# ... and at most this many UTF-8 bytes of id, url and metadata JSON: a document with a 5 MB id
# or metadata must not make its reject row 5 MB. A cut field is listed in the row's metadata
# under "_cut" ({field: original bytes}); cut metadata becomes {"_cut": …, "_head": first bytes}.
REJECT_ID_BYTES = 1024
REJECT_URL_BYTES = 8192
REJECT_METADATA_BYTES = 65536

REJECT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("step", pa.string()),
        ("reason", pa.string()),
        ("url", pa.string()),
        ("source_file", pa.string()),
        ("record_id", pa.string()),
        ("offset", pa.int64()),
        ("text_chars", pa.int64()),
        ("text", pa.string()),
        ("metadata", pa.string()),
    ]
)

ROW_GROUP_BYTES = 32 * 1024 * 1024  # flush buffered rows at this size: bounds writer memory


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def _coerce(value: Any, typ: pa.DataType) -> Any:
    """A metadata value as its column type; None when it does not fit (kept then in JSON)."""
    if value is None:
        return None
    try:
        if pa.types.is_string(typ):
            return value if isinstance(value, str) else str(value)
        if pa.types.is_integer(typ):
            return int(value)
        if pa.types.is_floating(typ):
            return float(value)
    except (TypeError, ValueError):
        return None
    return value


def doc_to_row(doc: Document) -> dict[str, Any]:
    row: dict[str, Any] = {"id": doc.id, "text": doc.text, "url": doc.url or ""}
    rest = {}
    for key, value in doc.metadata.items():
        typ = FLAT_COLUMNS.get(key)
        coerced = _coerce(value, typ) if typ is not None else None
        if typ is not None and (coerced is not None or value is None):
            row[key] = coerced
        else:
            rest[key] = value
    row["metadata"] = json.dumps(rest, ensure_ascii=False, default=_json_default) if rest else "{}"
    return row


def _cut(value: str, limit: int) -> tuple[str, int | None]:
    """`value` cut to `limit` UTF-8 bytes (at a character boundary); the original size when cut."""
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return value, None
    return raw[:limit].decode("utf-8", "ignore"), len(raw)


def reject_row(doc: Document, step: str, reason: str) -> dict[str, Any]:
    md = doc.metadata
    text = doc.text if isinstance(doc.text, str) else repr(doc.text)
    rest = {k: v for k, v in md.items() if k not in ("source_file", "record_id", "offset")}
    cut: dict[str, int] = {}
    fields = {
        "id": (str(doc.id), REJECT_ID_BYTES),
        "url": (doc.url or "", REJECT_URL_BYTES),
        "source_file": (_coerce(md.get("source_file"), pa.string()), REJECT_URL_BYTES),
        "record_id": (_coerce(md.get("record_id"), pa.string()), REJECT_ID_BYTES),
    }
    short: dict[str, Any] = {}
    for name, (value, limit) in fields.items():
        short[name], size = _cut(value, limit) if isinstance(value, str) else (value, None)
        if size is not None:
            cut[name] = size
    meta = json.dumps(rest, ensure_ascii=False, default=_json_default)
    head, size = _cut(meta, REJECT_METADATA_BYTES)
    if size is not None:
        cut["metadata"] = size
        meta = json.dumps({"_cut": cut, "_head": head}, ensure_ascii=False)
    elif cut:
        meta = json.dumps({**rest, "_cut": cut}, ensure_ascii=False, default=_json_default)
    return {
        "id": short["id"],
        "step": step,
        "reason": reason,
        "url": short["url"],
        "source_file": short["source_file"],
        "record_id": short["record_id"],
        "offset": _coerce(md.get("offset"), pa.int64()),
        "text_chars": len(text),
        "text": text[:REJECT_TEXT_CHARS].encode("utf-8", "replace").decode("utf-8"),
        "metadata": meta,
    }


def row_bytes(row: dict[str, Any]) -> int:
    """Uncompressed size estimate of one row (strings as UTF-8, numbers as 8 bytes)."""
    total = 0
    for value in row.values():
        total += len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else 8
    return total


class ShardWriter:
    """Write rows to `<dir>/<prefix>-NNN.parquet`, a new file whenever `max_bytes` would be passed.

    Use as a context manager; `paths` lists the finished (renamed) files. On an exception the
    temporary file is removed and nothing partial remains.
    """

    def __init__(self, out_dir: str | Path, prefix: str, max_bytes: int, schema: pa.Schema = DOC_SCHEMA):
        self.out_dir = Path(out_dir)
        self.prefix = prefix
        self.max_bytes = max(int(max_bytes), 1)
        self.schema = schema
        self.paths: list[Path] = []
        self.rows_written = 0
        self._buffer: list[dict[str, Any]] = []
        self._buffer_bytes = 0
        self._file_bytes = 0
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._final: Path | None = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write_doc(self, doc: Document) -> None:
        self.write_row(doc_to_row(doc))

    def write_row(self, row: dict[str, Any]) -> None:
        size = row_bytes(row)
        if self._file_bytes + self._buffer_bytes + size > self.max_bytes and (
            self._file_bytes or self._buffer
        ):
            self._finish_file()
        self._buffer.append(row)
        self._buffer_bytes += size
        if self._buffer_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        if self._writer is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._final = self.out_dir / f"{self.prefix}-{len(self.paths):03d}.parquet"
            # attempt-unique: two attempts of a task (a zombie and its retry, maybe on two nodes
            # with the same PID) may write the same shard at once; each renames its own whole file
            self._tmp = self.out_dir / f".{self._final.name}.tmp-{uuid.uuid4().hex[:16]}"
            refuse_planted(self._final)
            write_new(self._tmp, b"")  # a new file of ours (O_EXCL|O_NOFOLLOW) that the writer then fills
            self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        table = pa.Table.from_pylist(self._buffer, schema=self.schema)
        self._writer.write_table(table)
        self.rows_written += len(self._buffer)
        self._file_bytes += self._buffer_bytes
        self._buffer, self._buffer_bytes = [], 0

    def _finish_file(self) -> None:
        self._flush()
        if self._writer is None:
            return
        self._writer.close()
        with open(self._tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self._tmp, self._final)
        self.paths.append(self._final)
        self._writer, self._tmp, self._final, self._file_bytes = None, None, None, 0

    def close(self) -> list[Path]:
        self._finish_file()
        return self.paths

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._tmp is not None and self._tmp.exists():
            self._tmp.unlink()
        self._writer, self._tmp, self._buffer = None, None, []


def write_documents(docs: Iterable[Document], out_dir: str | Path, prefix: str, max_bytes: int) -> list[Path]:
    with ShardWriter(out_dir, prefix, max_bytes) as writer:
        for doc in docs:
            writer.write_doc(doc)
    return writer.paths


def parquet_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Parquet files named directly or found (recursively, sorted) in folders."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.parquet") if not q.name.startswith(".")))
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"{p} does not exist", "pass Parquet files or folders written by oreline data")
    return out


def row_to_doc(row: dict[str, Any], text_key: str = "text", id_key: str = "id") -> Document:
    """A Document from one Parquet row: oreline's own columns, or any table with a text column."""
    text = row.pop(text_key, None)
    doc_id = row.pop(id_key, None)
    url = row.pop("url", None) or ""
    extra = row.pop("metadata", None)
    metadata = {k: v for k, v in row.items() if v is not None}
    if isinstance(extra, str) and extra.startswith("{"):
        try:
            metadata.update(json.loads(extra))
        except json.JSONDecodeError:
            metadata["metadata"] = extra
    elif extra is not None:
        metadata["metadata"] = extra
    return Document(id="" if doc_id is None else str(doc_id), text=text, url=str(url), metadata=metadata)


def read_documents(paths: str | Path | Iterable[str | Path], batch_rows: int = 1024) -> Iterator[Document]:
    """Stream Documents from oreline Parquet shards (files or folders), one batch in memory at a time."""
    for path in parquet_files(paths):
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=batch_rows):
            for row in batch.to_pylist():
                yield row_to_doc(row)


def count_rows(paths: str | Path | Iterable[str | Path]) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows for p in parquet_files(paths))
