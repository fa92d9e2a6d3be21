"""Inflating gzip members a piece at a time, with the fastest zlib that is installed.

zlib-ng (the `zlib-ng` package, a runtime dependency) inflates the sample archives' gzip
members in about two thirds of the time CPython's zlib takes (benchmarks/reader_throughput.py
prints both); inflating is most of the reader's framing time. It has the same API, the same
error messages and the same output as zlib, so the reader behaves the same with either: when
it is not importable (a platform without its wheel), CPython's zlib is used.
`ORELINE_INFLATE=zlib` forces CPython's zlib (to compare the two).
"""

from __future__ import annotations

import os
import zlib

if os.environ.get("ORELINE_INFLATE", "") == "zlib":
    engine = zlib
else:
    try:
        from zlib_ng import zlib_ng as engine
    except ImportError:  # no wheel for this platform: the standard library's zlib
        engine = zlib

ENGINE = "zlib-ng" if engine is not zlib else "zlib"
error = engine.error
GZIP_WBITS = 31  # a gzip header and trailer around the deflate stream

PIECE = 1 << 16  # compressed bytes inflated per step: bounds the copy zlib makes of what is left
FIRST_CALL = 1 << 12  # ... of which the first call gets this much (see inflate_piece)
OUTPUT_LIMIT = 4 << 20  # decompressed bytes one step may produce (bombs stop here)


def member_decompressor():
    """A decompressor for one gzip member (it stops at the member's end: `eof`, `unused_data`)."""
    return engine.decompressobj(GZIP_WBITS)


def inflate_piece(dec, piece: memoryview) -> tuple[bytes, int]:
    """Inflate one piece of compressed bytes: (output, bytes of the piece used).

    The same output, the same bytes used and the same error as one `decompress(piece)` call, but
    fed in two calls: most gzip members of a per-record file are far smaller than a piece
    (median 620 bytes on the sample archives), and at a member's end zlib copies what is left of
    the piece into `unused_data` (63 KiB per small member fed a 64 KiB piece). A member that goes
    on past the first call's bytes gets the rest in the second call, whose failure drops the
    first call's output too, as the single call would have."""
    first = piece[:FIRST_CALL]
    out = dec.decompress(first, OUTPUT_LIMIT)
    if dec.eof:
        return out, len(first) - len(dec.unused_data)
    tail = dec.unconsumed_tail
    if tail or len(piece) <= len(first) or len(out) >= OUTPUT_LIMIT:
        return out, len(first) - len(tail)
    more = dec.decompress(piece[len(first) :], OUTPUT_LIMIT - len(out))
    return out + more, len(piece) - len(dec.unused_data if dec.eof else dec.unconsumed_tail)


def inflate_head(data: bytes, limit: int, tolerant: bool = False) -> bytes:
    """Up to `limit` decompressed bytes of the gzip member that starts `data`; b"" when it does
    not inflate, unless `tolerant`: then what came out before the error (a damaged member's
    header names its record), found by replaying the failing piece a byte at a time."""
    dec = member_decompressor()
    step = 512 if tolerant else max(len(data), 1)
    out: list[bytes] = []
    n = 0
    for i in range(0, len(data), step):
        saved = dec.copy() if tolerant else dec
        try:
            piece = dec.decompress(data[i : i + step], limit - n)
        except error:
            if not tolerant:
                return b""
            dec = saved
            for j in range(i, min(i + step, len(data))):
                try:
                    out.append(dec.decompress(data[j : j + 1], limit - n))
                except error:
                    break
                n += len(out[-1])
            break
        out.append(piece)
        n += len(piece)
        if n >= limit or dec.eof:
            break
    return b"".join(out)
