"""Property tests: the reader never raises and always ends; normalize_text is idempotent and clean."""

from __future__ import annotations

import gzip
import io
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oreline.data.filters.normalize import REMOVED_CATEGORIES, normalize_text, normalize_with_counts
from oreline.data.read.record import ReadReport, record_to_document
from oreline.data.read.stream import Stream
from oreline.data.read.warc import (
    _parse_buffered_header,
    _parse_header_lines,
    iter_records,
    looks_like_record_start,
)
from oreline.document import Document

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ALL_TYPES = ("warcinfo", "response", "request", "revisit", "resource", "metadata", "conversion")


class Seeds(list):
    """Real archive bytes to mutate (short repr: hypothesis prints the arguments of a failure)."""

    def __repr__(self) -> str:
        return f"<{len(self)} seed archives>"


@pytest.fixture(scope="module")
def seeds(samples) -> Seeds:
    edge = samples / "web-archives" / "warcio-edge-cases"
    plain = (edge / "example.warc").read_bytes()
    return Seeds(
        [
            plain,
            (edge / "example.warc.gz").read_bytes(),
            gzip.compress(plain),
            (edge / "example.arc").read_bytes(),
            (edge / "example-iana.org-chunked.warc").read_bytes(),
        ]
    )


def read_all(data: bytes, records_out: list | None = None) -> ReadReport:
    """Read every record type and decode each record to a document; neither may raise."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.warc"
        path.write_bytes(data)
        report = ReadReport()
        records = list(iter_records(path, report=report, max_record_bytes=1_000_000, record_types=ALL_TYPES))
        dropped = report.dropped["read:too_large"] + report.dropped["read:content_length_mismatch"]
        accounted = report.yielded + sum(report.skipped.values()) + dropped + report.damaged
        assert accounted == report.records and report.yielded == len(records)
        for rec in records:
            doc = record_to_document(rec, report)
            assert isinstance(doc, Document) or doc == "read:empty_payload"
        for err in report.errors:  # every damaged span is located in the file
            assert err["offset"] is None or 0 <= err["offset"] <= len(data)
            assert 0 <= err["skipped_bytes"] <= len(data)
        if records_out is not None:
            records_out.extend(records)
        return report


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_never_raise(data):
    report = read_all(data)
    assert report.files == 1
    assert report.errors or report.records  # either something parsed or the failure is recorded


@FUZZ
@given(st.data())
def test_mutated_real_warcs_never_raise(seeds, data):
    seed = bytearray(seeds[data.draw(st.integers(0, len(seeds) - 1), label="seed index")])
    read_all(_mutate(data, seed))


def _mutate(data, seed: bytearray) -> bytes:
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(seed) - 1, 0)))
        if op == "flip" and seed:
            seed[pos] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del seed[pos:]
        elif op == "insert":
            seed[pos:pos] = data.draw(st.binary(min_size=1, max_size=64))
        elif op == "delete":
            del seed[pos : pos + data.draw(st.integers(1, 64))]
    return bytes(seed)


LETTERS = b"ABCDEFGH"


def _lettered(letter: int, n: int) -> bytes:
    block = bytes([letter]) * n
    head = (
        f"WARC/1.0\r\nWARC-Type: resource\r\nWARC-Record-ID: <urn:x:{chr(letter)}>\r\n"
        f"WARC-Target-URI: http://x.test/{chr(letter)}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {n}\r\n\r\n"
    )
    return head.encode() + block + b"\r\n\r\n"


@pytest.fixture(scope="module")
def lettered() -> Seeds:
    """Archives whose record i's payload is letter i repeated: a payload holding runs of two
    letters, or header text, joins bytes of two records. Plain and one gzip member per record:
    a gzip member is verified (CRC) only at its end, so inside a whole-file member a damaged
    stream can inflate to plausible records before the damage shows (test_mutated_real_warcs
    covers that layout for crashes)."""
    records = [_lettered(c, 40 + 37 * i) for i, c in enumerate(LETTERS)]
    return Seeds([b"".join(records), b"".join(gzip.compress(r) for r in records)])


@FUZZ
@given(st.data())
def test_resync_never_joins_two_records(lettered, data):
    seed = bytearray(lettered[data.draw(st.integers(0, len(lettered) - 1), label="seed index")])
    records: list = []
    read_all(_mutate(data, seed), records)
    for rec in records:
        runs = {c for c in LETTERS if bytes([c]) * 8 in rec.payload}
        assert len(runs) <= 1, (rec.record_id, rec.payload[:200])
        assert b"WARC/" not in rec.payload and b"Content-Length" not in rec.payload, rec.payload[:200]
        intact = re.fullmatch(r"urn:x:([A-H])", rec.record_id)
        if runs and intact and rec.url == f"http://x.test/{intact[1]}":  # id and URL name its letter
            assert runs == {ord(intact[1])}, (rec.record_id, rec.payload[:200])


_NAMES = st.sampled_from(
    [
        "WARC-Type",
        "warc-type",
        "Content-Length",
        "WARC-Concurrent-To",
        "X-Thing",
        "",
        " Content-Type",
        "WARC-Date\t",
    ]
)
_VALUES = st.one_of(
    st.sampled_from(
        ["response", "12", " 12 ", "<urn:uuid:1>", "http://x.test/a:b", "", "\x0b", "\u00a0v\u00a0"]
    ),
    st.text(max_size=12).filter(lambda t: "\n" not in t and "\r" not in t),
)
_HEADER_LINE = st.one_of(
    st.builds(
        lambda name, colon, value, end: (name + colon + value).encode("utf-8", "surrogatepass") + end,
        _NAMES,
        st.sampled_from([":", ": ", ":\t", " : "]),
        _VALUES,
        st.sampled_from([b"\r\n", b"\n"]),
    ),
    st.sampled_from([b" folded: on\r\n", b"\tfolded\r\n", b"no colon\r\n", b"\xff\xfe: x\r\n", b"  \r\n"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_HEADER_LINE, min_size=1, max_size=8), st.sampled_from([b"\r\n", b"\n"]))
def test_header_fast_path_agrees_with_the_line_by_line_parser(lines, blank):
    """The one-piece header parser (the common case) returns a header only when the line-by-line
    parser, which names every problem, reads the same fields from it and stops at the same byte."""
    data = b"".join(lines) + blank + b"block"
    fast_src, slow_src = (
        Stream(io.BytesIO(data), "plain", looks_like_record_start),
        Stream(io.BytesIO(data), "plain", looks_like_record_start),
    )
    fast = _parse_buffered_header(fast_src)
    slow = _parse_header_lines(slow_src)
    if fast is not None:
        assert slow[1] is None and fast[0] == slow[0] and fast_src.pos == slow_src.pos, (fast, slow)


def test_header_fast_path_takes_the_usual_header():
    data = (
        b"WARC-Type: response\r\nContent-Length: 5\r\nWARC-Concurrent-To: <b>\r\nX-Dup: 1\r\nX-Dup: 2\r\n\r\n"
    )
    fast = _parse_buffered_header(Stream(io.BytesIO(data + b"block"), "plain", looks_like_record_start))
    assert fast is not None and fast[0] == {
        "warc-type": "response",
        "content-length": "5",
        "warc-concurrent-to": "<b>",
        "x-dup": "2",
    }
    for bad in (
        b"WARC-Type: a\r\n folded\r\n\r\n",
        b"no colon\r\n\r\n",
        b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ):
        assert _parse_buffered_header(Stream(io.BytesIO(bad), "plain", looks_like_record_start)) is None, bad


_INVISIBLE = set(
    "\x00\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064\ufeff"
)
_INVISIBLE |= {chr(c) for c in range(0x20) if c not in (0x09, 0x0A)} | {chr(c) for c in range(0x7F, 0xA0)}
_TRICKY = st.sampled_from(
    sorted(_INVISIBLE)
    + [
        " ",
        "\t",
        "\n",
        "\r",
        "\u00a0",
        "\u3000",
        "\u2028",
        "\u2029",
        "e\u0301",
        "\ud800",
        "\udfff",
        "ﬁ",
        "a",
        "Z",
        "中",
        "\U0001f600",
    ]
)
TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=8)), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.sampled_from(["NFC", "NFKC", "none"]))
def test_normalize_is_idempotent_and_clean(text, form):
    out, counts = normalize_with_counts(text, form=form)
    assert normalize_text(out, form=form) == out
    out.encode("utf-8")  # valid UTF-8: no lone surrogates left
    assert not (_INVISIBLE & set(out))
    assert "\r" not in out and "\n\n\n" not in out and out == out.strip()
    assert all(not line.endswith((" ", "\t")) for line in out.split("\n"))
    assert set(counts) <= set(REMOVED_CATEGORIES) | {
        "carriage_return",
        "line_separator",
        "whitespace_collapsed",
    }
