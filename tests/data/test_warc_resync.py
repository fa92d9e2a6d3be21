"""The reader reads on past damage (issue 19): damaged copies of real sample archives give every
intact record before and after the damage with its exact payload, and each damaged span is one
`errors` entry with its offset in the file, the bytes skipped and the record it hit.

Each case damages one record (or the gap after it) in the middle of a real file: a gzip member cut
short, flipped bytes inside a member, a flipped CRC, garbage between gzip members and between
plain records, Content-Length +100 / -100 in plain and gzip files. The expected records are the
undamaged file's, less the damaged one."""

from __future__ import annotations

import gzip
import io
import re

import pytest

from oreline.config import load_config
from oreline.data.pipeline.runner import run_source
from oreline.data.pipeline.tasks import Reader
from oreline.data.read.record import ReadReport
from oreline.data.read.warc import iter_records
from oreline.executors.progress import Progress

EVERY = ("warcinfo", "response", "request", "revisit", "resource", "metadata", "conversion")
IA = "web-archives/ia-blackbook-2008/IAH-20080430204825-00000-blackbook.warc.gz"
CC_GZ = "web-archives/commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz"
CC_PLAIN = "web-archives/commoncrawl-samples/eugeneware-CC-MAIN-20140820021334-00006-ip-10-180-136-8.ec2.internal.warc"
GARBAGE = bytes(range(0x20, 0x60))  # 64 bytes: no newline, no gzip magic, no "WARC/"


def read(path, **kw):
    report = ReadReport()
    records = list(iter_records(path, report=report, **{"record_types": EVERY, **kw}))
    return records, report


def key(rec):
    return (rec.record_id, rec.record_type, rec.url, rec.http_status, rec.content_type, rec.payload)


@pytest.fixture(scope="module")
def archives(samples):
    """(bytes, records) of the undamaged files; records carry their file offsets."""
    out = {}
    for name in (IA, CC_GZ, CC_PLAIN):
        records, report = read(samples / name)
        assert not report.errors
        out[name] = ((samples / name).read_bytes(), records)
    return out


def damaged(tmp_path, archives, name, edit):
    """Write a damaged copy: edit(data, records) -> (new bytes, index of the record it damages)."""
    data, records = archives[name]
    new, hit = edit(data, records)
    path = tmp_path / ("damaged" + ("" if name.endswith(".warc") else ".warc.gz"))
    path.write_bytes(new)
    got, report = read(path)
    return data, records, got, report, hit, len(new)


def middle(records):
    return len(records) // 2


def member(data, records, i):
    start = records[i].offset
    end = records[i + 1].offset if i + 1 < len(records) else len(data)
    return start, end


# -- gzip ---------------------------------------------------------------------------------------


def _cut_member(data, records):
    i = middle(records)
    start, end = member(data, records, i)
    return data[: start + (end - start) // 2] + data[end:], i  # its second half is gone


def _flip_inside_member(data, records):
    i = middle(records)
    start, end = member(data, records, i)
    at = start + (end - start) * 3 // 4
    return data[:at] + bytes(b ^ 0x5A for b in data[at : at + 8]) + data[at + 8 :], i


def _flip_crc(data, records):
    i = middle(records)
    _, end = member(data, records, i)
    return data[: end - 8] + bytes([data[end - 8] ^ 0xFF]) + data[
        end - 7 :
    ], i  # CRC32 is 8 bytes from the end


def _garbage_between_members(data, records):
    i = middle(records)
    _, end = member(data, records, i)
    return data[:end] + GARBAGE + data[end:], None


def _gzip_content_length(delta):
    def edit(data, records):
        i = middle(records)
        while records[i].record_type != "response":
            i += 1
        start, end = member(data, records, i)
        plain = gzip.decompress(data[start:end])
        plain = re.sub(
            rb"(?i)(\r\ncontent-length: *)(\d+)",
            lambda m: m[1] + str(int(m[2]) + delta).encode(),
            plain,
            count=1,
        )
        return data[:start] + gzip.compress(plain) + data[end:], i

    return edit


GZIP_CASES = {
    "cut inside a member": _cut_member,
    "bytes flipped inside a member": _flip_inside_member,
    "flipped CRC": _flip_crc,
    "garbage between members": _garbage_between_members,
    "Content-Length +100": _gzip_content_length(100),
    "Content-Length -100": _gzip_content_length(-100),
}


@pytest.mark.parametrize("name", [IA, CC_GZ])
@pytest.mark.parametrize("case", list(GZIP_CASES))
def test_gzip_damage_is_skipped_to_the_next_member(tmp_path, archives, name, case):
    data, records, got, report, hit, size = damaged(tmp_path, archives, name, GZIP_CASES[case])
    expected = [key(r) for i, r in enumerate(records) if i != hit]
    assert [key(r) for r in got] == expected  # every intact record, exact payloads, in order
    (err,) = report.errors
    assert 0 <= err["offset"] < size and err["skipped_bytes"] > 0
    if hit is None:  # garbage after member i: the next member starts right after it
        assert err["reason"] == "gzip:garbage" and err["skipped_bytes"] == len(GARBAGE)
        assert data[err["offset"] - len(GARBAGE) : err["offset"]] != GARBAGE
        return
    start, _ = member(data, records, hit)
    assert err["offset"] == start  # the damaged member's offset in the file
    assert err["offset"] + err["skipped_bytes"] == got[hit].offset  # skipped up to the next member
    if case.startswith("Content-Length"):
        assert err["reason"] == "read:content_length_mismatch"
        assert report.dropped["read:content_length_mismatch"] == 1
    else:
        assert err["reason"].startswith("gzip:")
        assert report.records == len(records) - 1  # its header was in the damaged member: never parsed
    if case != "cut inside a member":  # the member's header inflated before the damage: it names the record
        assert err["record_id"] == records[hit].record_id


def test_whole_file_offsets_are_in_the_file_not_the_stream(tmp_path, archives):
    """Before: a corrupt member of the 135,896-byte CC excerpt was reported at decompressed offset 308,217."""
    data, records, got, report, hit, size = damaged(tmp_path, archives, CC_GZ, _flip_inside_member)
    (err,) = report.errors
    assert err["offset"] == records[hit].offset < size and err["stream_offset"] > size


def test_gzip_damage_in_a_stream_without_seek(archives):
    data, records = archives[IA]
    new, hit = _flip_crc(data, records)

    class Forward(io.RawIOBase):  # read() only, like a network stream
        def __init__(self, b):
            self.b = io.BytesIO(b)

        def read(self, n=-1):
            return self.b.read(n)

    report = ReadReport()
    got = list(iter_records(Forward(new), report=report, record_types=EVERY))
    assert [key(r) for r in got] == [key(r) for i, r in enumerate(records) if i != hit]
    assert report.errors[0]["offset"] == records[hit].offset and report.errors[0]["file"] == "<stream>"


# -- plain --------------------------------------------------------------------------------------


def _plain_garbage(data, records):
    i = middle(records)
    return data[: records[i].offset] + GARBAGE + data[records[i].offset :], None


def _plain_content_length(delta):
    def edit(data, records):
        i = middle(records)
        while records[i].record_type != "response":  # a block longer than 100 bytes
            i += 1
        start = records[i].offset
        head_end = data.index(b"\r\n\r\n", start)
        head = re.sub(
            rb"(?i)(\r\ncontent-length: *)(\d+)",
            lambda m: m[1] + str(int(m[2]) + delta).encode(),
            data[start:head_end],
        )
        return data[:start] + head + data[head_end:], i

    return edit


def _plain_cut(data, records):
    i = middle(records)
    start, end = records[i].offset, records[i + 1].offset
    return data[: start + (end - start) // 2] + data[end:], i


PLAIN_CASES = {
    "garbage between records": _plain_garbage,
    "Content-Length +100": _plain_content_length(100),
    "Content-Length -100": _plain_content_length(-100),
    "record cut in the middle": _plain_cut,
}


@pytest.mark.parametrize("case", list(PLAIN_CASES))
def test_plain_damage_is_skipped_to_the_next_header(tmp_path, archives, case):
    data, records, got, report, hit, size = damaged(tmp_path, archives, CC_PLAIN, PLAIN_CASES[case])
    assert [key(r) for r in got] == [key(r) for i, r in enumerate(records) if i != hit]
    (err,) = report.errors
    if hit is None:
        at = records[middle(records)].offset
        assert err["reason"] == "read:garbage" and (err["offset"], err["skipped_bytes"]) == (at, len(GARBAGE))
        return
    assert err["offset"] == records[hit].offset and err["record_id"] == records[hit].record_id
    assert err["offset"] + err["skipped_bytes"] == got[hit].offset  # up to the next record's header
    if case.startswith("Content-Length"):
        assert err["reason"] == "read:content_length_mismatch"
        assert report.dropped["read:content_length_mismatch"] == 1 and len(report.rejected) == 1
    else:  # its header runs into the next record's: "WARC-Type appears twice"
        assert err["reason"] == "read:bad_header"


def test_damage_at_every_record_of_a_plain_file(tmp_path, archives):
    """Content-Length +1 on each record in turn: only that record is lost."""
    data, records = archives[CC_PLAIN]
    for i, rec in enumerate(records):
        head_end = data.index(b"\r\n\r\n", rec.offset)
        head = re.sub(
            rb"(?i)(\r\ncontent-length: *)(\d+)",
            lambda m: m[1] + str(int(m[2]) + 1).encode(),
            data[rec.offset : head_end],
        )
        path = tmp_path / f"plus1-{i}.warc"
        path.write_bytes(data[: rec.offset] + head + data[head_end:])
        got, report = read(path)
        assert [key(r) for r in got] == [key(r) for j, r in enumerate(records) if j != i], i
        assert [e["record_id"] for e in report.errors] == [rec.record_id]


# -- fidelity -----------------------------------------------------------------------------------


def test_file_ending_inside_a_header_says_so(samples, tmp_path):
    data = (samples / "web-archives/warcio-edge-cases/example.warc").read_bytes()
    second = data.index(b"WARC/1.0", 10)
    path = tmp_path / "cut.warc"
    path.write_bytes(data[: second + 60])  # inside the second record's header
    got, report = read(path)
    assert got == [] or all(r.offset < second for r in got)
    (err,) = report.errors
    assert "file ends inside a record header" in err["error"] and err["offset"] == second


def test_arc_record_short_at_the_end_with_a_whole_http_body_is_kept(samples):
    records, report = read(samples / "web-archives/warcio-edge-cases/example-space-in-url.arc")
    rec = records[-1]
    assert rec.url.startswith("http://example.com/index.cfm?FuseAction=Email&EmailTitle=Examples From")
    assert rec.http_status == 200 and rec.payload.rstrip().endswith(b"</html>")
    assert len(rec.payload.rstrip(b"\n")) == 1270 - 1  # the HTTP Content-Length: the body is whole
    (err,) = report.errors
    assert err["reason"] == "read:arc_short_at_end" and err["record_id"] == rec.record_id


def _reader_rejects(path, **overrides):
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    rejects = []
    reader = Reader(path, "warc", cfg, Progress(0))
    docs = list(run_source(reader, reader.stats, lambda doc, step, reason: rejects.append((doc, reason))))
    return docs, rejects, reader


@pytest.mark.parametrize(
    "name",
    [
        "warcio-edge-cases/example.warc.gz",
        "warcio-edge-cases/example.arc",
        "warcio-edge-cases/example-trunc.warc",
    ],
)
def test_records_dropped_whole_keep_their_url_and_id_in_the_rejects(samples, name):
    path = samples / "web-archives" / name
    small = "trunc" not in name
    docs, rejects, reader = _reader_rejects(path, **({"data.read.max_record_bytes": 100} if small else {}))
    (doc, reason), *_ = [
        (d, r) for d, r in rejects if r.startswith(("read:too_large", "read:content_length"))
    ]
    assert reason == ("read:too_large" if small else "read:content_length_mismatch")
    assert doc.url == "http://example.com/" and doc.id and doc.metadata["record_id"] == doc.id
    if not small:
        (err,) = reader.errors
        assert err["record_id"] == doc.id and err["offset"] == doc.metadata["offset"]


def test_inflate_of_a_candidate_member_is_what_decides(tmp_path):
    """A 1f 8b 08 inside damaged bytes that does not inflate to a record header is no resync point."""
    rec = b"WARC/1.0\r\nWARC-Type: resource\r\nWARC-Record-ID: <urn:x:%d>\r\nContent-Length: 3\r\n\r\nab%d\r\n\r\n"
    one, two = gzip.compress(rec % (1, 1)), gzip.compress(rec % (2, 2))
    fake = b"\x1f\x8b\x08\x00" + bytes(20)  # magic, then nothing that inflates
    not_a_record = gzip.compress(b"no header here\r\n")
    (tmp_path / "c.warc.gz").write_bytes(one[:20] + fake + not_a_record + two)
    got, report = read(tmp_path / "c.warc.gz")
    assert [r.payload for r in got] == [b"ab2"]
    (err,) = report.errors
    assert err["offset"] == 0 and err["skipped_bytes"] == 20 + len(fake) + len(not_a_record)


def test_arc_record_whose_length_is_wrong_is_dropped_and_the_next_one_read(samples, tmp_path):
    data = (samples / "web-archives/warcio-edge-cases/example.arc").read_bytes()
    (orig,), _ = read(samples / "web-archives/warcio-edge-cases/example.arc", record_types=("response",))
    at = data.index(b"http://example.com/ ")
    line_end = data.index(b"\n", at)
    wrong = data[at:line_end].replace(b" 1591", b" 1596")  # 5 bytes into the next record's line
    (tmp_path / "wrong.arc").write_bytes(data[:at] + wrong + data[line_end:] + data[at:])
    got, report = read(tmp_path / "wrong.arc", record_types=("response",))
    assert [(r.url, r.http_status, r.payload) for r in got] == [(orig.url, orig.http_status, orig.payload)]
    (err,) = report.errors
    assert err["reason"] == "read:content_length_mismatch" and err["offset"] == at
    assert err["offset"] + err["skipped_bytes"] == got[0].offset == len(data)


def test_stats_json_errors_name_the_damaged_span_in_the_file(tmp_path, archives):
    """End to end: a damaged member of the CC excerpt is one stats.json error with its file offset
    (before: an offset in the decompressed stream, 308,217 in a 135,910-byte file, and the rest
    of the file lost)."""
    from oreline.data.pipeline.run import run_data

    data, records = archives[CC_GZ]
    new, hit = _flip_crc(data, records)
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "cc.warc.gz"
    path.write_bytes(new)
    cfg = load_config(None, ["data.langid.languages=['en']"])
    stats = run_data([str(path)], tmp_path / "out", cfg, workers=1)
    (err,) = stats["errors"]
    start, end = member(data, records, hit)
    assert (err["file"], err["offset"], err["skipped_bytes"]) == (str(path), start, end - start)
    assert err["record_id"] == records[hit].record_id and err["reason"] == "gzip:corrupt"
    facts = stats["inputs"]["files"][str(path)]
    assert (
        facts["records"] == len(records) - 1 and facts["documents"] == 16
    )  # all 16 pages: the lost one is a request
