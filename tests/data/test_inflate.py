"""oreline.data.read.inflate: zlib-ng inflates the reader's gzip members (the dev set-up installs
it), and the reader's output does not depend on which zlib inflates them: inflate_piece gives the
output, bytes used and error of one decompress call, with CPython's zlib and with zlib-ng alike,
on every member of a real archive and on damaged members; a reader forced onto CPython's zlib
(ORELINE_INFLATE=zlib) reads damaged archives to the same records and report."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zlib

import pytest
from zlib_ng import zlib_ng

from oreline.data.read import inflate
from oreline.data.read.record import ReadReport
from oreline.data.read.warc import iter_records

IA = "web-archives/ia-blackbook-2008/IAH-20080430204825-00000-blackbook.warc.gz"
EVERY = ("warcinfo", "response", "request", "revisit", "resource", "metadata", "conversion")


def test_zlib_ng_inflates_the_members():
    assert inflate.ENGINE == "zlib-ng" and inflate.engine is zlib_ng
    assert inflate.member_decompressor().__class__.__module__.startswith("zlib_ng")


def member_starts(data: bytes) -> list[int]:
    starts, i = [], 0
    while i < len(data):
        starts.append(i)
        dec = zlib.decompressobj(31)
        dec.decompress(data[i:])
        i = len(data) - len(dec.unused_data)
    return starts


def one_call(dec, piece):
    try:
        out = dec.decompress(piece, inflate.OUTPUT_LIMIT)
    except Exception as exc:
        return "error", str(exc)
    return out, len(piece) - len(dec.unused_data if dec.eof else dec.unconsumed_tail)


def two_calls(dec, piece):
    try:
        return inflate.inflate_piece(dec, memoryview(piece))
    except Exception as exc:
        return "error", str(exc)


def damaged_members(data: bytes, starts: list[int]):
    """Members of the archive as they are, and with bytes flipped early, late and in the CRC."""
    ends = [*starts[1:], len(data)]
    for a, b in zip(starts, ends, strict=True):
        member = data[a:b]
        yield member + data[b : b + 100]  # the next member's first bytes follow, as in the file
        if len(member) > 64:
            for at in (20, len(member) // 2, len(member) - 8):
                bad = bytearray(member)
                bad[at] ^= 0x55
                yield bytes(bad)


def test_inflate_piece_is_one_decompress_call_with_either_zlib(samples):
    data = (samples / IA).read_bytes()
    starts = member_starts(data)
    assert len(starts) > 800
    errors = 0
    for member in damaged_members(data, starts):
        piece = member[: inflate.PIECE]
        expected = one_call(zlib.decompressobj(31), piece)
        errors += expected[0] == "error"
        assert two_calls(zlib.decompressobj(31), piece) == expected
        assert two_calls(zlib_ng.decompressobj(31), piece) == expected  # zlib-ng: same bytes, same message
        assert one_call(zlib_ng.decompressobj(31), piece) == expected
    assert errors > 1000  # the damaged members did fail, and failed alike


DUMP = """
import hashlib, json, sys
from oreline.data.read.record import ReadReport
from oreline.data.read.warc import iter_records
out = []
for path in sys.argv[1:]:
    report = ReadReport()
    recs = [(r.record_id, r.offset, hashlib.sha1(r.payload).hexdigest())
            for r in iter_records(path, report=report, record_types=TYPES)]
    out.append([recs, report.as_dict()])
print(json.dumps(out, default=str))
""".replace("TYPES", repr(EVERY))


def test_reader_with_cpython_zlib_reads_damaged_archives_alike(samples, tmp_path):
    data = (samples / IA).read_bytes()
    starts = member_starts(data)
    a, b = starts[400], starts[401]
    copies = {
        "cut": data[: (a + b) // 2] + data[b:],
        "flipped": data[: b - 40] + bytes(x ^ 0x5A for x in data[b - 40 : b - 32]) + data[b - 32 :],
        "crc": data[: b - 8] + bytes([data[b - 8] ^ 0xFF]) + data[b - 7 :],
        "garbage": data[:b] + bytes(range(32, 96)) + data[b:],
    }
    paths = []
    for name, content in copies.items():
        paths.append(tmp_path / f"{name}.warc.gz")
        paths[-1].write_bytes(content)
    here = []
    for path in paths:
        report = ReadReport()
        recs = [
            (r.record_id, r.offset, hashlib.sha1(r.payload).hexdigest())
            for r in iter_records(str(path), report=report, record_types=EVERY)
        ]
        assert report.errors
        here.append([recs, report.as_dict()])
    env = {**os.environ, "ORELINE_INFLATE": "zlib"}
    probe = subprocess.run(
        [sys.executable, "-c", "from oreline.data.read import inflate; print(inflate.ENGINE)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "zlib"
    run = subprocess.run(
        [sys.executable, "-c", DUMP, *map(str, paths)], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(run.stdout) == json.loads(json.dumps(here, default=str))


@pytest.mark.parametrize("size", [0, 1, inflate.FIRST_CALL - 1, inflate.FIRST_CALL, inflate.FIRST_CALL + 1])
def test_inflate_piece_at_the_first_call_boundary(size):
    """A member that ends exactly at, just before or just after the first call's bytes."""
    import random

    rng = random.Random(size)
    for payload_len in range(0, 3 * inflate.FIRST_CALL, 997):
        member = zlib_ng.compress(rng.randbytes(payload_len), wbits=31) if payload_len else b""
        piece = (member + b"\x1f\x8b" + bytes(size))[: inflate.PIECE]
        if not member:
            continue
        assert two_calls(zlib_ng.decompressobj(31), piece) == one_call(zlib.decompressobj(31), piece)


def test_content_decoding_gives_the_same_bodies_with_either_zlib(monkeypatch):
    """HTTP Content-Encoding gzip/deflate goes through the same engine: the bodies, the refusals
    (None) and the size limit are those of CPython's zlib."""
    import gzip

    from oreline.data.read.payload import PayloadTooLarge, decode_content

    text = b"".join(f"<p>line {i} of a page that compresses well</p>\n".encode() for i in range(4000))
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    raw_deflate = raw.compress(text) + raw.flush()
    cases = [
        (gzip.compress(text), "gzip"),
        (gzip.compress(text) + b"trailing junk", "x-gzip"),
        (zlib.compress(text), "deflate"),
        (raw_deflate, "deflate"),
        (gzip.compress(text)[:-40], "gzip"),  # cut inside the stream
        (b"\x1f\x8b\x08\x00garbage that is not deflate", "gzip"),
        (b"\x78\x9c" + bytes(range(200)), "deflate"),
    ]

    def decoded(engine):
        monkeypatch.setattr(inflate, "engine", engine)
        monkeypatch.setattr(inflate, "error", engine.error)
        out = []
        for body, encoding in cases:
            out.append(decode_content(body, encoding))
            try:
                out.append(decode_content(body, encoding, max_bytes=1000))
            except PayloadTooLarge as exc:
                out.append(("too large", str(exc)))
        return out

    with_ng, with_zlib = decoded(zlib_ng), decoded(zlib)
    assert with_ng == with_zlib
    assert with_ng[0] == text and with_ng[1][0] == "too large"
