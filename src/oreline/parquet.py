"""Reading Parquet files that someone else wrote, in bounded memory.

Arrow decodes a row group's column chunks whole, whatever batch size is asked for, and a file of
a few MB may hold a row group of many GB. The sizes in the footer are the writer's word: a footer
can understate them, and a dictionary-encoded column is stated at its dictionary's size however
often the rows repeat it (the cases found, with their sizes: docs/measurements.md). So readers
bound what is decoded, not what is stated:

- `row_group_bytes` sums the uncompressed sizes in the page headers of the column chunks
  (Arrow refuses a page that does not decompress to its header's size, so these cannot lie)
  and takes the larger of that and the footer's figure, before anything is decoded;
- string columns are read as dictionaries (`string_columns`, ParquetFile's read_dictionary), so
  Arrow never expands a repeated entry, and `byte_lengths` measures each row's real length
  from the dictionary before a row becomes a Python string;
- `byte_slices` cuts a batch into runs of rows of ~BATCH_BYTES real bytes, which bounds the
  Python objects made from it whatever the footer's averages say.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

BATCH_BYTES = 64 << 20  # real bytes of the Python strings made from one slice of a batch
MAX_BATCH_ROWS = 1024
MAX_ROW_GROUP_BYTES = 2 << 30  # = data.read.max_row_group_bytes by default


# ---------------------------------------------------------------------------------------------
# page headers (Thrift compact protocol), read for their sizes only


class _Compact:
    """Just enough of Thrift's compact protocol to walk a PageHeader and skip what it does not need."""

    def __init__(self, fh) -> None:
        self.fh = fh

    def byte(self) -> int:
        b = self.fh.read(1)
        if not b:
            raise ValueError("page header ends early")
        return b[0]

    def varint(self) -> int:
        n = shift = 0
        while True:
            b = self.byte()
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 63:
                raise ValueError("page header varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 32:
            raise ValueError("page header nested too deeply")
        if kind in (1, 2):  # booleans: in the field header itself
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.fh.seek(8, 1)
        elif kind == 8:
            self.fh.seek(self.varint(), 1)
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.byte() if head & 0x0F in (1, 2) else self.skip(head & 0x0F, depth + 1)
        elif kind == 11:
            size = self.varint()
            types = self.byte() if size else 0
            for _ in range(size):
                self.skip(types >> 4, depth + 1)
                self.skip(types & 0x0F, depth + 1)
        elif kind == 12:
            self.struct(lambda _fid, kind: self.skip(kind, depth + 1))
        else:
            raise ValueError(f"page header holds an unknown Thrift type {kind}")

    def struct(self, field) -> None:
        """Call field(id, type) for each field; field must consume the value."""
        fid = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            fid = fid + delta if delta else self.zigzag()
            field(fid, kind)


def _page_sizes(fh) -> tuple[int, int]:
    """(uncompressed, compressed) bytes of the page whose header starts at fh's position."""
    proto, sizes = _Compact(fh), {}

    def field(fid: int, kind: int) -> None:
        if fid in (2, 3) and kind == 5:  # uncompressed_page_size, compressed_page_size (i32)
            sizes[fid] = proto.zigzag()
        else:
            proto.skip(kind)

    proto.struct(field)
    if 2 not in sizes or 3 not in sizes or min(sizes.values()) < 0:
        raise ValueError("page header without valid page sizes")
    return sizes[2], sizes[3]


def page_bytes(
    path: str | Path, pf, group: int, columns: Sequence[str] | None = None, stop_above: int | None = None
) -> int:
    """Uncompressed bytes of the pages of row group `group` (only `columns`, when given), summed
    from the page headers: what Arrow decompresses to read it. Walking stops once the sum passes
    `stop_above`. ValueError when a header cannot be read (Arrow cannot read the group either)."""
    meta = pf.metadata.row_group(group)
    wanted = None if columns is None else set(columns)
    total = 0
    with open(path, "rb") as fh:
        for i in range(meta.num_columns):
            col = meta.column(i)
            if wanted is not None and col.path_in_schema.split(".")[0] not in wanted:
                continue
            # where Arrow starts the chunk (ComputeColumnChunkRange): the dictionary page, when before
            start = col.data_page_offset
            if col.has_dictionary_page and 0 < (col.dictionary_page_offset or 0) < start:
                start = col.dictionary_page_offset
            end = start + col.total_compressed_size
            pos = start
            while pos < end:
                fh.seek(pos)
                uncompressed, compressed = _page_sizes(fh)
                total += uncompressed
                if stop_above is not None and total > stop_above:
                    return total
                pos = fh.tell() + compressed
    return total


def row_group_bytes(
    pf,
    group: int,
    columns: Sequence[str] | None = None,
    path: str | Path | None = None,
    stop_above: int | None = None,
) -> int:
    """Uncompressed bytes of row group `group` of ParquetFile `pf` (only `columns`, when given): the
    larger of the footer's figure and, when `path` is given, the page headers' sum (page_bytes)."""
    meta = pf.metadata.row_group(group)
    if columns is None:
        stated = meta.total_byte_size
    else:
        wanted = set(columns)
        stated = sum(
            meta.column(i).total_uncompressed_size
            for i in range(meta.num_columns)
            if meta.column(i).path_in_schema.split(".")[0] in wanted
        )
    if path is None:
        return stated
    return max(stated, page_bytes(path, pf, group, columns, stop_above))


# ---------------------------------------------------------------------------------------------
# real lengths, before anything becomes a Python string


def string_columns(schema, columns: Sequence[str] | None = None) -> list[str]:
    """The string/binary columns of an Arrow schema (among `columns`): the ones to read as dictionaries."""
    import pyarrow as pa

    def stringy(t) -> bool:
        if pa.types.is_dictionary(t):
            t = t.value_type
        return (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
        )

    names = set(columns) if columns is not None else None
    return [f.name for f in schema if (names is None or f.name in names) and stringy(f.type)]


def byte_lengths(array):
    """Bytes of each row of a string/binary column (dictionary-encoded or not) as a numpy int64
    array, nulls 0; a dictionary's entries are measured once and taken by index, never expanded."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        entry = pc.fill_null(pc.binary_length(array.dictionary), 0).to_numpy(zero_copy_only=False)
        idx = array.indices
        if entry.size == 0:  # an all-null column has an empty dictionary: every row is 0 bytes
            return np.zeros(len(array), dtype=np.int64)
        out = entry[pc.fill_null(idx, 0).to_numpy(zero_copy_only=False)].astype(np.int64)
        if idx.null_count:
            out[idx.is_null().to_numpy(zero_copy_only=False)] = 0
        return out
    return pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def small_value(array, i: int, limit: int = 1024):
    """array[i] as a Python value (an id quoted in a message), None when it is a string of more
    than `limit` bytes: a hostile id column is never decoded whole for a message."""
    import pyarrow as pa

    one = array.slice(i, 1)
    if string_columns(pa.schema([pa.field("v", one.type)])) and byte_lengths(one)[0] > limit:
        return None
    return one.to_pylist()[0]


def row_bytes(batch, columns: Sequence[str] | None = None):
    """Real bytes of each row of a record batch, counting its string/binary columns."""
    import numpy as np

    total = np.zeros(batch.num_rows, dtype=np.int64)
    for name in string_columns(batch.schema, columns):
        total += byte_lengths(batch.column(name))
    return total


def byte_slices(sizes, budget: int = BATCH_BYTES) -> Iterator[tuple[int, int]]:
    """(start, stop) runs of rows whose `sizes` sum to at most `budget` (a larger row alone)."""
    start, acc = 0, 0
    for i, size in enumerate(sizes.tolist()):
        if i > start and acc + size > budget:
            yield start, i
            start, acc = i, 0
        acc += size
    if start < len(sizes):
        yield start, len(sizes)


def batch_rows(rows: int, uncompressed_bytes: int) -> int:
    """Rows per batch for a row group of `rows` rows and `uncompressed_bytes`: ~BATCH_BYTES of it,
    1 to MAX_BATCH_ROWS rows (a fixed 1,024 rows of a 50 MB text column would be 50 GB)."""
    per_row = max(1, uncompressed_bytes // max(rows, 1))
    return int(min(MAX_BATCH_ROWS, max(1, BATCH_BYTES // per_row)))
