"""Property tests: the reader never raises and always ends; normalize_text is idempotent and clean."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oreline.data.filters.normalize import REMOVED_CATEGORIES, normalize_text, normalize_with_counts
from oreline.data.read.warc import ReadReport, iter_records, record_to_document
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


def read_all(data: bytes) -> ReadReport:
    """Read every record type and decode each record to a document; neither may raise."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.warc"
        path.write_bytes(data)
        report = ReadReport()
        records = list(iter_records(path, report=report, max_record_bytes=1_000_000, record_types=ALL_TYPES))
        accounted = (
            report.yielded + sum(report.skipped.values()) + report.dropped["read:too_large"] + report.damaged
        )
        assert accounted == report.records and report.yielded == len(records)
        for rec in records:
            doc = record_to_document(rec, report)
            assert doc is None or isinstance(doc, Document)
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
    read_all(bytes(seed))


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
