"""Document inputs of the token layer: Parquet shards and JSONL(.gz) files, read in batches.

The data layer writes Parquet shards with columns `id`, `text`, `url` and metadata. The token
layer only needs `id` and `text`, so it reads those two columns with pyarrow directly, one
record batch at a time (memory is bounded by the batch, not by the shard). JSONL(.gz) files
with "id"/"text" keys are accepted too, so hand-made corpora work without the data layer.

Folders are expanded recursively to `*.parquet`, `*.jsonl`, `*.jsonl.gz` in sorted order,
skipping hidden/underscore names and anything under a `rejects` folder (the data layer keeps
dropped documents there; they must never be trained on). An `oreline data` output folder
stands for its `docs/` folder. A data run that has not finished (no `_SUCCESS`), passed as its
folder or its `docs/`, is refused unless `allow_incomplete` (CLI: --allow-incomplete); files
named one by one are taken as they are.

Bad input never crashes a run and never disappears: a JSONL line that is not JSON, or a row
without text (no text key, null, not a string, or an empty string: one reason, `no_text`, whose
row says which in `detail`) is counted under a reason and returned to the caller, who keeps it
in a rejects file next to its output. A JSONL line longer than `max_line_bytes` (50 MB, the
data layer's record limit) is read at most that far and counted as `too_large`, so a small
compressed file holding one huge line cannot exhaust memory.
"""

from __future__ import annotations

import glob
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from oreline.document import content_id
from oreline.errors import InputError
from oreline.outdir import require_finished_data_run
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

SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz")
BATCH_ROWS = 1024
MAX_LINE_BYTES = 50_000_000  # = data.read.max_record_bytes by default


def _is_input(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def _skipped(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return any(p.startswith((".", "_")) or p == "rejects" for p in parts)


def expand_inputs(items: list[str | Path], allow_incomplete: bool = False) -> list[Path]:
    """Files, folders and globs → an ordered list of input files (duplicates removed)."""
    out: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():  # an `oreline data` output folder: its kept documents only, once finished
            path = require_finished_data_run(path, allow_incomplete)
        if path.is_dir() and (path / "_SUCCESS").is_file() and (path / "docs").is_dir():
            path = path / "docs"
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and _is_input(p) and not _skipped(p, path)
            )
        elif path.is_file():
            found = [path]
        else:
            found = sorted(Path(p) for p in glob.glob(str(item), recursive=True) if Path(p).is_file())
        if not found:
            raise InputError(
                f"no Parquet/JSONL documents found at {item}",
                "pass .parquet, .jsonl or .jsonl.gz files or a folder holding them",
            )
        for p in found:
            if not _is_input(p):
                raise InputError(
                    f"{p} is not a Parquet or JSONL(.gz) file",
                    "convert it with `oreline data`, or pass .parquet/.jsonl/.jsonl.gz",
                )
            if p.resolve() not in {q.resolve() for q in out}:
                out.append(p)
    if not out:
        raise InputError("no input documents given", "pass Parquet/JSONL files or folders")
    return out


@dataclass(slots=True)
class Rejects:
    """Rows that could not be used, with the reason; counted per reason, kept for inspection."""

    counts: dict[str, int] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    keep: int = 1000  # rows kept verbatim per task; counts are always complete

    def add(self, reason: str, source: str, where: int, raw: object) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.rows) < self.keep:
            if isinstance(raw, dict):
                raw = {k: v[:2000] if isinstance(v, str) else v for k, v in raw.items()}
            else:
                raw = str(raw)[:2000]
            self.rows.append({"reason": reason, "source": source, "row": where, "raw": raw})


def parquet_row_groups(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).num_row_groups


def _parquet_batches(
    path: Path,
    id_key: str,
    text_key: str,
    row_groups: tuple[int, int] | None,
    rejects: Rejects,
    max_text_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[list[str], list[str]]]:
    """Batches of ~64 MiB of real text; a row group whose pages decode to more than
    MAX_ROW_GROUP_BYTES, or a text over `max_text_bytes`, is counted as too_large and never
    decoded into Python; string columns are read as dictionaries (oreline/parquet.py)."""
    import numpy as np
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    names = schema.names
    if text_key not in names:
        raise InputError(
            f"{path} has no {text_key!r} column (columns: {names})",
            "pass documents written by `oreline data` or set data.read.jsonl_text_key",
        )
    columns = [text_key] + ([id_key] if id_key in names else [])
    pf = pq.ParquetFile(path, read_dictionary=string_columns(schema, columns))
    first, end = row_groups or (0, pf.num_row_groups)
    row = sum(pf.metadata.row_group(g).num_rows for g in range(first))
    for g in range(first, end):
        rows = pf.metadata.row_group(g).num_rows
        try:
            size = row_group_bytes(pf, g, columns, path=path, stop_above=MAX_ROW_GROUP_BYTES)
        except (OSError, ValueError) as exc:
            rejects.add("bad_parquet", str(path), row, f"row group {g}: unreadable page header ({exc})")
            row += rows
            continue
        if size > MAX_ROW_GROUP_BYTES:  # never decoded
            rejects.add(
                "too_large",
                str(path),
                row,
                f"row group {g} (rows {row}-{row + rows - 1}): pages of more than {MAX_ROW_GROUP_BYTES:,} "
                f"bytes uncompressed ({size:,} counted); rewrite the file with smaller row groups",
            )
            row += rows
            continue
        for batch in pf.iter_batches(batch_size=MAX_BATCH_ROWS, columns=columns, row_groups=[g]):
            text = batch.column(text_key)
            textual = bool(string_columns(batch.schema, [text_key]))
            lengths = byte_lengths(text) if textual else np.zeros(batch.num_rows, dtype=np.int64)
            big = set(np.flatnonzero(lengths > max_text_bytes).tolist())
            for i in sorted(big):  # counted here, and never made Python strings
                doc_id = small_value(batch.column(id_key), i) if id_key in names else None
                rejects.add(
                    "too_large", str(path), row + i, f"id {doc_id!r}: more than {max_text_bytes:,} bytes"
                )
            sizes = row_bytes(batch, columns)
            sizes[list(big)] = 0
            for start, stop in byte_slices(sizes):
                part = batch.slice(start, stop - start)
                ids = part.column(id_key).to_pylist() if id_key in names else [None] * part.num_rows
                skip = {i - start for i in big if start <= i < stop}
                yield _clean(
                    ids, _texts(part.column(text_key), skip), str(path), row + start, rejects, skip=skip
                )
            row += batch.num_rows


def _texts(column, skip: set[int]) -> list:
    """column.to_pylist() with the rows in `skip` left None, never decoded."""
    if not skip:
        return column.to_pylist()
    import pyarrow as pa

    keep = [i for i in range(len(column)) if i not in skip]
    values = iter(column.take(pa.array(keep, type=pa.int64())).to_pylist())
    return [None if i in skip else next(values) for i in range(len(column))]


def _jsonl_batches(
    path: Path, id_key: str, text_key: str, rejects: Rejects, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[list[str], list[str]]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        ids: list = []
        texts: list = []
        start = 0
        error: Exception | None = None
        lineno = -1
        try:
            while True:
                raw = fh.readline(max_line_bytes + 1)  # never more than the limit in memory
                if not raw:
                    break
                lineno += 1
                if len(raw) > max_line_bytes:
                    preview = raw[:2000].decode("utf-8", "replace")
                    while not raw.endswith(b"\n"):  # skip the rest of the line a window at a time
                        raw = fh.readline(1 << 20)
                        if not raw:
                            break
                    rejects.add(
                        "too_large", str(path), lineno, f"more than {max_line_bytes:,} bytes: {preview}"
                    )
                    continue
                line = raw.decode("utf-8", "replace")
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    if not isinstance(obj, dict):
                        raise ValueError("not an object")
                except ValueError:
                    rejects.add("bad_json", str(path), lineno, line)
                    continue
                ids.append(obj.get(id_key))
                texts.append(obj.get(text_key))
                if len(texts) == BATCH_ROWS:
                    yield _clean(ids, texts, str(path), start, rejects)
                    ids, texts, start = [], [], lineno + 1
        except (OSError, EOFError) as exc:  # truncated gzip: keep what was read, then report
            error = exc
        if texts:
            yield _clean(ids, texts, str(path), start, rejects)
        if error is not None:
            raise error


def _clean(
    ids: list, texts: list, source: str, first_row: int, rejects: Rejects, skip: set[int] = frozenset()
) -> tuple[list[str], list[str]]:
    """Drop (and count) rows without usable text; give id-less rows a content id. Rows in `skip`
    were counted by the caller already."""
    out_ids, out_texts = [], []
    for i, (doc_id, text) in enumerate(zip(ids, texts, strict=True)):
        if i in skip:
            continue
        if not isinstance(text, str) or not text:  # one reason; `detail` tells which
            detail = (
                "empty" if text == "" else "missing or null" if text is None else f"a {type(text).__name__}"
            )
            rejects.add("no_text", source, first_row + i, {"id": doc_id, "text": text, "detail": detail})
            continue
        out_ids.append(str(doc_id) if doc_id not in (None, "") else content_id(text))
        out_texts.append(text)
    return out_ids, out_texts


def iter_batches(
    path: Path,
    rejects: Rejects,
    id_key: str = "id",
    text_key: str = "text",
    row_groups: tuple[int, int] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[list[str], list[str]]]:
    """(ids, texts) batches of one input file; `row_groups` = [start, stop) of a Parquet file.

    A file that turns out to be unreadable part-way (corrupt Parquet, truncated gzip) keeps the
    batches read so far; the rest is counted as `unreadable_file` with the error, and the run goes on.
    """
    import pyarrow as pa

    try:
        if path.name.endswith(".parquet"):
            yield from _parquet_batches(path, id_key, text_key, row_groups, rejects, max_line_bytes)
        else:
            yield from _jsonl_batches(path, id_key, text_key, rejects, max_line_bytes)
    except (pa.ArrowException, OSError, EOFError, UnicodeDecodeError) as exc:
        rejects.add("unreadable_file", str(path), -1, f"{type(exc).__name__}: {exc}")


def iter_texts(
    paths: list[Path], rejects: Rejects, id_key: str = "id", text_key: str = "text"
) -> Iterator[tuple[str, str]]:
    """(id, text) of every usable document of every file, in order."""
    for path in paths:
        for ids, texts in iter_batches(path, rejects, id_key, text_key):
            yield from zip(ids, texts, strict=True)
