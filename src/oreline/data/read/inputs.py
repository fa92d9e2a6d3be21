"""Input discovery and the readers of non-WARC inputs.

`discover_inputs(items)` turns a mix of files, folders (walked recursively, sorted) and globs
into a deterministic list of `(path, kind)`; files of an unknown kind are returned separately so
the run reports them instead of ignoring them. Kinds, by suffix:

    warc     .warc(.gz|.zst) .wet(.gz|.zst) .wat(.gz|.zst) .arc(.gz)   (read by data/read/warc.py)
    jsonl    .jsonl .jsonl.gz .jsonl.zst    one JSON object per line, text under data.read.jsonl_text_key
    parquet  .parquet                       any table with a text column (oreline shards included)
    txt      .txt .txt.gz                   one document per file (clean prose)
    zip      .zip                           one document per .txt member (e.g. NLTK's Gutenberg)

`iter_input_documents(path, cfg, report)` reads the non-WARC kinds. Text that is not valid
UTF-8 is decoded as Latin-1 (every byte sequence is valid Latin-1; the Gutenberg files in the
samples need it) and the fallback is recorded in `metadata["charset"]`. A malformed line or
row never stops the file: it is passed to `report(reason, offset, preview)` and skipped.

A JSONL object or Parquet row without text under `data.read.jsonl_text_key` is `read:no_text`,
whether the key is missing, holds no string, or holds an empty (whitespace-only) string; the
preview says which. A `TextFieldCounts` passed in counts, per file, the records with and without
text and the fields the others held, so a run whose key matches nothing can name the fields that
were there (`oreline data` fails on it; see data/pipeline/run.py).

Memory is bounded per record by `data.read.max_record_bytes`, as for WARC records (issue 21:
2 MB .txt.gz/.zip/.jsonl.gz files that decompress to 2 GiB peaked at 4.3-4.4 GB or ended in
MemoryError): a txt file or zip member is read up to the limit, a JSONL line with `readline(limit)`,
and whatever is larger is dropped as `read:too_large` without being held.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oreline.document import Document, content_id
from oreline.errors import InputError
from oreline.parquet import (
    MAX_BATCH_ROWS,
    MAX_ROW_GROUP_BYTES,
    byte_lengths,
    byte_slices,
    row_bytes,
    row_group_bytes,
    small_value,
    string_columns,
)

KINDS: dict[str, tuple[str, ...]] = {
    "warc": (
        ".warc",
        ".warc.gz",
        ".warc.zst",
        ".wet",
        ".wet.gz",
        ".wet.zst",
        ".wat",
        ".wat.gz",
        ".wat.zst",
        ".arc",
        ".arc.gz",
    ),
    "jsonl": (".jsonl", ".jsonl.gz", ".jsonl.zst"),
    "parquet": (".parquet",),
    "txt": (".txt", ".txt.gz"),
    "zip": (".zip",),
}

Report = Callable[[str, "int | None", str], None]
DEFAULT_MAX_RECORD_BYTES = 50_000_000  # data.read.max_record_bytes


MAX_FIELD_NAMES = 100  # distinct field names counted per file (a hostile file may have millions)


@dataclass
class TextFieldCounts:
    """Of one JSONL/Parquet input: the records (objects, rows) read, those without a string under
    the text key (`missing`) or with an empty one (`empty`), and how often each field name
    occurred in the records without it: the names a user's data has instead."""

    key: str
    records: int = 0
    missing: int = 0
    empty: int = 0
    fields: Counter = field(default_factory=Counter)

    def lacks(self, names: Iterable[str], records: int = 1) -> None:
        self.missing += records
        for name in names:
            name = str(name)[:100]
            if name in self.fields or len(self.fields) < MAX_FIELD_NAMES:
                self.fields[name] += records

    def as_dict(self) -> dict[str, Any]:
        top = sorted(self.fields.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
        return {
            "key": self.key,
            "records": self.records,
            "missing": self.missing,
            "empty": self.empty,
            "fields": dict(top),
        }


def input_kind(path: str | Path) -> str | None:
    name = Path(path).name.lower()
    for kind, suffixes in KINDS.items():
        if name.endswith(suffixes):
            return kind
    return None


def _walk_files(root: Path, errors: list[dict[str, Any]] | None) -> list[Path]:
    """Every non-hidden file under `root`, sorted. A folder that cannot be listed (permissions, a
    path too long for the system, I/O errors) is recorded in `errors` instead of being skipped silently."""
    found: list[Path] = []

    def failed(exc: OSError) -> None:
        if errors is not None:
            errors.append(
                {
                    "file": str(exc.filename or root),
                    "offset": None,
                    "error": f"folder not read: {type(exc).__name__}: {exc.strerror or exc}",
                }
            )

    for folder, _dirs, names in os.walk(root, onerror=failed):
        found.extend(Path(folder) / n for n in names if not n.startswith("."))
    return sorted(p for p in found if p.is_file())


def discover_inputs(
    items: Iterable[str | Path],
    errors: list[dict[str, Any]] | None = None,
) -> tuple[list[tuple[Path, str]], list[Path]]:
    """Expand inputs into (sorted, de-duplicated) `(file, kind)` pairs and the files of unknown kind.

    Raises InputError for an item that names nothing, so a typo never runs on an empty set.
    Folders that cannot be listed are appended to `errors` as `{file, offset, error}` (the form of
    stats.json's errors).
    """
    found: list[Path] = []
    for item in items:
        item = str(item)
        path = Path(item).expanduser()
        if path.is_dir():
            found.extend(_walk_files(path, errors))
        elif path.is_file():
            found.append(path)
        elif glob.has_magic(item):
            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            files = [m for m in matches if m.is_file()] + [
                q for m in matches if m.is_dir() for q in _walk_files(m, errors)
            ]
            if not files:
                raise InputError(
                    f"input glob {item!r} matches no file",
                    "check the pattern (quote it so the shell does not expand it)",
                )
            found.extend(files)
        else:
            raise InputError(
                f"input {item!r} does not exist",
                "pass existing files, folders or globs of WARC/WET/JSONL/Parquet/txt inputs",
            )
    seen: set[Path] = set()
    known: list[tuple[Path, str]] = []
    unknown: list[Path] = []
    for p in found:
        key = p.resolve()
        if key in seen:
            continue
        seen.add(key)
        kind = input_kind(p)
        if kind is None:
            unknown.append(p)
        else:
            known.append((p, kind))
    return known, unknown


def open_binary(path: Path) -> io.BufferedIOBase:
    """Open a file, transparently decompressing .gz and .zst."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def decode_text(raw: bytes) -> tuple[str, str]:
    """Bytes to text: UTF-8 (BOM stripped) when valid, else Latin-1 which accepts every byte."""
    try:
        return raw.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        return raw.decode("latin-1"), "latin-1"


def _data_cfg(cfg: Any) -> Any:
    return getattr(cfg, "data", cfg)


def _ignore(reason: str, offset: int | None, preview: str) -> None:
    return None


def iter_input_documents(
    path: str | Path, cfg: Any, report: Report | None = None, text_field: TextFieldCounts | None = None
) -> Iterator[Document]:
    """Documents of one non-WARC input (jsonl, parquet, txt, zip); cfg is a Config or DataConfig.
    `text_field` counts the records of a jsonl/parquet input with and without text."""
    path = Path(path)
    report = report or _ignore
    text_field = text_field or TextFieldCounts(_data_cfg(cfg).read.jsonl_text_key)
    kind = input_kind(path)
    read_cfg = _data_cfg(cfg).read
    limit = getattr(read_cfg, "max_record_bytes", DEFAULT_MAX_RECORD_BYTES)
    if kind == "txt":
        yield from _iter_txt(path, limit, report)
    elif kind == "zip":
        yield from _iter_zip(path, limit, report)
    elif kind == "jsonl":
        yield from _iter_jsonl(
            path, read_cfg.jsonl_text_key, read_cfg.jsonl_id_key, report, limit, text_field
        )
    elif kind == "parquet":
        groups = getattr(read_cfg, "max_row_group_bytes", MAX_ROW_GROUP_BYTES)
        yield from _iter_parquet(
            path, read_cfg.jsonl_text_key, read_cfg.jsonl_id_key, report, limit, groups, text_field
        )
    else:
        raise InputError(
            f"{path} is not a jsonl/parquet/txt/zip input (kind {kind})",
            "read WARC files with oreline.data.read.warc.iter_records",
        )


def _text_doc(
    text: str, charset: str, source: str, offset: int | None = None, member: str | None = None
) -> Document:
    md: dict[str, Any] = {"source_file": source, "charset": charset, "content_type": "text/plain"}
    if offset is not None:
        md["offset"] = offset
    if member is not None:
        md["member"] = member
    return Document(id=content_id(text), text=text, url="", metadata=md)


def _iter_txt(path: Path, limit: int, report: Report) -> Iterator[Document]:
    with open_binary(path) as fh:
        raw = fh.read(limit + 1)  # never more than the limit (a .txt.gz may be a bomb)
    if len(raw) > limit:
        report("read:too_large", 0, f"{path.name}: more than {limit:,} bytes (data.read.max_record_bytes)")
        return
    text, charset = decode_text(raw)
    yield _text_doc(text, charset, str(path))


def _iter_zip(path: Path, limit: int, report: Report) -> Iterator[Document]:
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        report("read:bad_zip", None, str(exc))
        return
    with archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            if not info.filename.lower().endswith(".txt"):
                report("read:zip_member_not_txt", None, info.filename)
                continue
            too_large = f"{info.filename}: more than {limit:,} bytes (data.read.max_record_bytes)"
            if info.file_size > limit:  # the declared size: zipfile never returns more than it
                report("read:too_large", None, too_large)
                continue
            try:
                with archive.open(info) as member:
                    raw = member.read(limit + 1)
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
                report("read:bad_zip_member", None, f"{info.filename}: {exc}")
                continue
            if len(raw) > limit:
                report("read:too_large", None, too_large)
                continue
            text, charset = decode_text(raw)
            yield _text_doc(text, charset, str(path), member=info.filename)


def _iter_jsonl(
    path: Path,
    text_key: str,
    id_key: str,
    report: Report,
    limit: int = DEFAULT_MAX_RECORD_BYTES,
    text_field: TextFieldCounts | None = None,
) -> Iterator[Document]:
    text_field = text_field or TextFieldCounts(text_key)
    offset = 0
    lineno = -1
    try:
        with open_binary(path) as fh:
            while True:
                raw = fh.readline(limit + 1)  # a line is never held beyond the limit
                if not raw:
                    break
                lineno += 1
                line_offset, offset = offset, offset + len(raw)
                if len(raw) > limit:
                    while not raw.endswith(b"\n"):  # skip the rest of the line a window at a time
                        raw = fh.readline(1 << 20)
                        if not raw:
                            break
                        offset += len(raw)
                    report(
                        "read:too_large",
                        line_offset,
                        f"line {lineno + 1}: more than {limit:,} bytes (data.read.max_record_bytes)",
                    )
                    continue
                if not raw.strip():
                    continue
                line, charset = decode_text(raw)
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    report("read:bad_json", line_offset, f"line {lineno + 1}: {exc}: {line[:200]}")
                    continue
                doc = _obj_to_doc(obj, text_key, id_key, str(path), line_offset, charset, report, text_field)
                if doc is not None:
                    yield doc
    except (OSError, EOFError) as exc:  # truncated gzip/zstd: keep what was read, report the rest
        report("read:corrupt_file", offset, f"{type(exc).__name__}: {exc}")


def _obj_to_doc(
    obj: Any,
    text_key: str,
    id_key: str,
    source: str,
    offset: int,
    charset: str,
    report: Report,
    text_field: TextFieldCounts,
) -> Document | None:
    if not isinstance(obj, dict):
        report("read:not_an_object", offset, repr(obj)[:200])
        return None
    text_field.records += 1
    text = obj.get(text_key)
    if not isinstance(text, str):
        text_field.lacks(obj)
        what = "no key" if text_key not in obj else f"{type(text).__name__}, not a string,"
        report("read:no_text", offset, f"{what} under {text_key!r}; keys {sorted(obj)[:10]}")
        return None
    if not text.strip():
        text_field.empty += 1
        report("read:no_text", offset, f"empty text under {text_key!r} ({len(text)} characters)")
        return None
    doc_id = obj.get(id_key)
    md = {k: v for k, v in obj.items() if k not in (text_key, id_key, "url", "metadata")}
    if isinstance(obj.get("metadata"), dict):
        md.update(obj["metadata"])
    md.setdefault("source_file", source)
    md.setdefault("offset", offset)
    md.setdefault("charset", charset)
    return Document(
        id=str(doc_id) if doc_id not in (None, "") else content_id(text),
        text=text,
        url=str(obj.get("url") or ""),
        metadata=md,
    )


def _iter_parquet(
    path: Path,
    text_key: str,
    id_key: str,
    report: Report,
    limit: int,
    group_limit: int,
    text_field: TextFieldCounts | None = None,
) -> Iterator[Document]:
    """Rows of a Parquet file as documents, in bounded memory (oreline/parquet.py): a row group whose
    pages decode to more than `group_limit` is dropped whole, unread; string columns are read as
    dictionaries and turned into Python strings ~64 MiB of real bytes at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from oreline.data.read.shards import row_to_doc

    try:
        schema = pq.read_schema(path)
        pf = pq.ParquetFile(path, read_dictionary=string_columns(schema))
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError variants for non-Parquet bytes
        report("read:bad_parquet", None, f"{type(exc).__name__}: {exc}")
        return
    text_field = text_field or TextFieldCounts(text_key)
    if text_key not in pf.schema_arrow.names:
        rows = pf.metadata.num_rows
        text_field.records += rows
        text_field.lacks(pf.schema_arrow.names, rows)
        report(
            "read:no_text_column",
            None,
            f"no column {text_key!r} in {rows:,} rows; columns {pf.schema_arrow.names[:10]}",
        )
        return
    row_index = 0
    for g in range(pf.num_row_groups):
        meta = pf.metadata.row_group(g)
        rows = f"row group {g} (rows {row_index}-{row_index + meta.num_rows - 1})"
        try:
            size = row_group_bytes(pf, g, path=path, stop_above=group_limit)
        except (OSError, ValueError) as exc:
            report("read:bad_parquet", row_index, f"{rows}: unreadable page header ({exc})")
            row_index += meta.num_rows
            continue
        if size > group_limit:
            report(
                "read:too_large",
                row_index,
                f"{rows}: pages of more than {group_limit:,} bytes uncompressed "
                f"({size:,} counted; the footer states {meta.total_byte_size:,}), over "
                "data.read.max_row_group_bytes; rewrite the file with smaller row groups or raise the limit",
            )
            row_index += meta.num_rows
            continue
        for batch in pf.iter_batches(batch_size=MAX_BATCH_ROWS, row_groups=[g]):
            text_field.records += batch.num_rows
            text = batch.column(text_key)
            textual = pa.types.is_string(text.type) or pa.types.is_large_string(text.type)
            if pa.types.is_dictionary(text.type):
                textual = pa.types.is_string(text.type.value_type) or pa.types.is_large_string(
                    text.type.value_type
                )
            lengths = byte_lengths(text) if textual else np.zeros(batch.num_rows, dtype=np.int64)
            big = lengths > limit
            if big.any():  # dropped before they become Python strings
                ids = batch.column(id_key) if id_key in batch.schema.names else None
                for i in np.flatnonzero(big).tolist():
                    doc_id = small_value(ids, i) if ids is not None else None
                    report(
                        "read:too_large",
                        row_index + i,
                        f"row {row_index + i} (id {doc_id!r}): {int(lengths[i]):,} bytes of {text_key!r}, "
                        f"more than {limit:,} (data.read.max_record_bytes)",
                    )
            keep = np.flatnonzero(~big)
            kept = batch.take(pa.array(keep)) if big.any() else batch
            for start, stop in byte_slices(row_bytes(kept)):
                for i, row in zip(
                    keep[start:stop].tolist(), kept.slice(start, stop - start).to_pylist(), strict=True
                ):
                    # the fields a row without text holds (row_to_doc takes the row apart)
                    held = (
                        [k for k, v in row.items() if v is not None]
                        if not isinstance(row.get(text_key), str)
                        else ()
                    )
                    doc = row_to_doc(row, text_key=text_key, id_key=id_key)
                    if not isinstance(doc.text, str):
                        text_field.lacks(held)
                        report(
                            "read:no_text",
                            row_index + i,
                            f"row {row_index + i}: {text_key!r} is {type(doc.text).__name__}",
                        )
                    elif not doc.text.strip():
                        text_field.empty += 1
                        report(
                            "read:no_text",
                            row_index + i,
                            f"row {row_index + i}: empty text under {text_key!r} ({len(doc.text)} characters)",
                        )
                    else:
                        if not doc.id:
                            doc.id = content_id(doc.text)
                        doc.metadata.setdefault("source_file", str(path))
                        doc.metadata.setdefault("offset", row_index + i)
                        yield doc
            row_index += batch.num_rows


def iter_text_documents(paths: Iterable[str | Path], report: Report | None = None) -> Iterator[Document]:
    """The documents of clean-text inputs (.txt/.txt.gz/.zip/.jsonl/.parquet files or folders);
    WARC files and unknown kinds are refused: they need `oreline data` first. `report(reason,
    offset, preview)` hears of every record that is not a document (no text, too large, ...)."""
    from oreline.config import DataConfig

    found, unknown = discover_inputs([str(p) for p in paths])
    if unknown:
        raise InputError(
            f"{len(unknown)} input files of unknown kind, e.g. {unknown[0]}",
            "pass .txt/.txt.gz/.zip/.jsonl/.parquet files",
        )
    for path, kind in found:
        if kind == "warc":
            raise InputError(f"{path} is a WARC file", "run oreline data first and score its Parquet shards")
        yield from iter_input_documents(path, DataConfig(), report)
