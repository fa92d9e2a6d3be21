"""Reading Parquet files that someone else wrote, in bounded memory.

Arrow decodes a row group's column chunks whole, whatever batch size is asked for (measured: 48
rows of 4 MB in one row group peaked at 274 MB in Arrow's pool with batches of 1 and of 1,024
rows), and a file of a few MB may state a row group of many GB. So readers check each row group's
uncompressed size, as the file's metadata states it, before they decode it (`row_group_bytes`),
and size their batches by bytes, not rows (`batch_rows`), which bounds the Python objects made
from a batch.
"""

from __future__ import annotations

from collections.abc import Sequence

BATCH_BYTES = 64 << 20  # uncompressed bytes of one batch, as the row group's metadata averages them
MAX_BATCH_ROWS = 1024
MAX_ROW_GROUP_BYTES = 2 << 30  # = data.read.max_row_group_bytes by default


def row_group_bytes(pf, group: int, columns: Sequence[str] | None = None) -> int:
    """Uncompressed bytes of row group `group` of ParquetFile `pf` (only `columns`, when given)."""
    meta = pf.metadata.row_group(group)
    if columns is None:
        return meta.total_byte_size
    wanted = set(columns)
    return sum(
        meta.column(i).total_uncompressed_size
        for i in range(meta.num_columns)
        if meta.column(i).path_in_schema.split(".")[0] in wanted
    )


def batch_rows(rows: int, uncompressed_bytes: int) -> int:
    """Rows per batch for a row group of `rows` rows and `uncompressed_bytes`: ~BATCH_BYTES of it,
    1 to MAX_BATCH_ROWS rows (a fixed 1,024 rows of a 50 MB text column would be 50 GB)."""
    per_row = max(1, uncompressed_bytes // max(rows, 1))
    return int(min(MAX_BATCH_ROWS, max(1, BATCH_BYTES // per_row)))
