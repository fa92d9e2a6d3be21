"""Streaming WARC / WET reader: the record state machine with resynchronisation past damage.

Why a small pure-Python parser rather than fastwarc: the promise here is "every intact record is
kept, the damage is recorded and skipped, nothing crashes". fastwarc and warcio end the file at
the first damage (a corrupt gzip member, garbage between records, a wrong Content-Length) or
raise, and the payload work (chunked transfer-encoding, content encoding, charset decoding)
happens in Python either way. The undamaged path is kept lean: the usual separator and header
are recognised in one piece without copying the buffer, and only what does not fit that shape
takes the line-by-line path that says what is wrong (speed: benchmarks/reader_throughput.py).

1. Bytes come from `oreline.data.read.stream` (decompression, gzip member offsets, damage).
2. Records: a `WARC/<version>` line (0.17, 0.18, 1.0, 1.1 all share the named-field layout),
   header lines up to a blank line (folded continuation lines joined), `Content-Length` bytes of
   block, the separator. A file starting with `filedesc://` is read by `oreline.data.read.arc`.
   Only `record_types` are parsed and yielded (default: response, conversion, resource); the
   others are counted by type, and revisit records are counted on their own.
3. A record is passed on only once what follows its block confirms its Content-Length: the
   separator (a blank line) and the next header, or the end (`oreline.data.read.record`).
4. HTTP responses: status line and headers parsed, the body de-chunked and content-decoded
   (`oreline.data.read.payload`); a body that decodes past `max_record_bytes` is dropped as
   `read:too_large`.
5. Damage is skipped, not the end of the file. Garbage between records, a header that does not
   parse (or runs into the next record's header), a truncated block or a wrong Content-Length:
   the decompressed stream is scanned for the next `WARC/x.y` line whose header parses, from
   the start of the bad block when its length was wrong; a record whose bytes came from a
   damaged gzip member is dropped (a member's CRC is checked only at its end). Limitation:
   inside one gzip member holding the whole file, damage that still inflates shows only at the
   member's end, after the records before it were passed on.

Time and memory are linear in the input and bounded per record: folded header lines are joined
once, decoded payloads stop at `max_record_bytes`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import BinaryIO

from oreline.data.read.arc import ARC_LINE, ArcReader, arc_fields
from oreline.data.read.payload import PayloadTooLarge, parse_http
from oreline.data.read.record import Pending, ReadReport, Record, RecordLoop, mime_and_charset
from oreline.data.read.stream import BLANK, MAX_LINE, Prepend, Stream, detect_compression

DEFAULT_RECORD_TYPES = ("response", "conversion", "resource")
DEFAULT_MAX_RECORD_BYTES = 50_000_000
_MAX_HEADER_LINES = 2000

# a WARC version line, wherever it starts: garbage without a newline may run into the next header
_WARC_LINE = re.compile(rb"WARC/[0-9]\.[0-9]{1,2}\r?\n")


def looks_like_record_start(head: bytes) -> bool:
    """Whether decompressed bytes start with a WARC header that parses (or an ARC record line)."""
    head = head.lstrip(BLANK)
    if head.startswith(b"WARC/"):
        end = re.search(rb"\r?\n\r?\n", head)
        if end is None:
            return False
        lines = head[: end.start()].split(b"\n")[1:]
        for line in lines:
            name, sep, value = line.partition(b":")
            if not sep and not line[:1].isspace():
                return False
            if name.strip().lower() == b"content-length":
                return value.strip().isdigit()
        return False
    nl = head.find(b"\n")
    return nl > 0 and ARC_LINE.match(head) is not None and arc_fields(head[: nl + 1]) is not None


# ---------------------------------------------------------------------------------------------
# records


# the WARC fields that may appear more than once; any other WARC field (and Content-Length,
# Content-Type) appearing twice means a header cut short ran into the next record's header
_REPEATABLE_FIELDS = frozenset({"warc-concurrent-to", "warc-protocol"})
_KEEP_HEADER_BYTES = 1 << 20  # header bytes kept to put back when the header proves bad


def _parse_headers(src: Stream) -> tuple[dict[str, str], str | None, bytes]:
    """Header lines up to a blank line: see _parse_header_lines. A header that is whole in the
    buffer and parses cleanly is read in one piece (one decode, one split: the common case,
    most of the framing time); anything else takes the line-by-line path, which says what is
    wrong with it."""
    fast = _parse_buffered_header(src)
    return fast if fast is not None else _parse_header_lines(src)


_HEADER_END = re.compile(rb"\n\r?\n")  # the end of a header's last line and the blank line after it


def _parse_buffered_header(src: Stream) -> tuple[dict[str, str], None, bytes] | None:
    src._fill(1 << 14)
    buf, start = src.buf, src.start
    if buf.startswith((b"\r\n", b"\n"), start):
        return None  # an empty header: rare, the slow path has it
    m = _HEADER_END.search(buf, start, start + (1 << 16))
    if m is None:
        return None
    end = m.start() + 1  # the blank line starts here
    text = buf[start:end].decode("utf-8", "replace")
    lines = text.split("\n")
    lines.pop()  # "" after the last newline
    if len(lines) > _MAX_HEADER_LINES:
        return None  # (every line is under MAX_LINE: the header is under 64 KiB)
    headers = {}
    for line in lines:  # a loop, not a comprehension over partitions: 15% fewer instructions
        if line[0] in " \t":  # a folded line (lines are not empty: the first blank one ends the header)
            return None  # the slow path joins them
        name, sep, value = line.partition(":")
        if not sep:  # a line without a colon (a blank line has none either): the slow path reports it
            return None
        headers[name.strip().lower()] = value.strip()
    if len(headers) < len(lines) and any(
        k.startswith(("warc-", "content-"))
        for k in _repeated(line.partition(":")[0].strip().lower() for line in lines)
    ):
        return None  # a repeated field: the slow path applies its rule
    src._skip_buffered(m.end() - start)
    return headers, None, b""


def _repeated(keys) -> set[str]:
    seen: set[str] = set()
    again: set[str] = set()
    for k in keys:
        (again if k in seen else seen).add(k)
    return again


def _parse_header_lines(src: Stream) -> tuple[dict[str, str], str | None, bytes]:
    """Header lines up to a blank line: (headers, problem or None, the bytes read). The bytes are
    what a resync puts back and rescans when the header is bad, since the next record may start
    inside them (a header cut short runs into the next record's "WARC/1.0" line; only the last
    line is kept past 1 MiB of header). A field that may appear once appearing twice is such
    a run-on, as is a line without a colon."""
    # each header's parts are joined once at the end: `+=` on a dict value copies the whole
    # value per folded line (2,000 folded 64 KB lines: 128 GB of copying)
    parts: dict[str, list[str]] = {}
    lines: list[bytes] = []
    kept = 0
    last = None
    problem: str | None = "too many header lines"
    line = b""
    for _ in range(_MAX_HEADER_LINES):
        line = src.readline()
        if kept <= _KEEP_HEADER_BYTES:
            lines.append(line)
            kept += len(line)
        if not line.endswith(b"\n"):
            long = len(line) >= MAX_LINE
            problem = "header line too long" if long else "file ends inside a record header"
            break
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if not text.strip():
            problem = None
            break
        if text[0] in " \t" and last:  # folded continuation line
            parts[last].append(text.strip())
            continue
        name, sep, value = text.partition(":")
        if not sep:
            problem = f"malformed header line {text[:80]!r}"
            break
        last = name.strip().lower()
        if last in parts and last.startswith(("warc-", "content-")) and last not in _REPEATABLE_FIELDS:
            problem = f"{name.strip()} appears twice (a header cut short runs into the next one?)"
            break
        parts[last] = [value.strip()]  # a repeated name keeps its last value, as before
    consumed = b"".join(lines) if kept <= _KEEP_HEADER_BYTES else line
    return {key: " ".join(p) for key, p in parts.items()}, problem, consumed


def iter_records(
    source: str | os.PathLike | BinaryIO,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    report: ReadReport,
    record_types: tuple[str, ...] | list[str] = DEFAULT_RECORD_TYPES,
) -> Iterator[Record]:
    """Stream the wanted records of one WARC/WET/ARC file (a path or a binary file object, which
    is read forward only and not closed); damage is skipped to the next readable record and
    recorded in `report.errors`."""
    owned = not hasattr(source, "read")
    name = str(source) if owned else str(getattr(source, "name", "<stream>"))
    report.files += 1
    if owned:
        try:
            f = open(source, "rb")  # noqa: SIM115 - closed in finally, the generator may stop early
        except OSError as exc:
            report.error(name, 0, f"cannot open: {exc}", reason="read:cannot_open")
            return
    else:
        f = source
    try:
        try:
            head = f.read(4)
            kind = detect_compression(head)
            src = Stream(Prepend(head, f), kind, looks_like_record_start)
        except Exception as exc:  # e.g. zstandard missing, an unreadable stream
            report.error(name, 0, f"cannot read the file: {exc}", reason="read:cannot_open")
            return
        wanted = frozenset(t.lower() for t in record_types)
        yield from _WarcReader(src, name, max_record_bytes, report, wanted).records()
    finally:
        if owned:
            f.close()


class _WarcReader(RecordLoop):
    """The record loop with resynchronisation: garbage, a header that does not parse, a block
    that is cut off or whose Content-Length is wrong, and damaged gzip members are each recorded
    once in report.errors and skipped to the next record header that parses."""

    # -- the loop ------------------------------------------------------------------------------
    def records(self) -> Iterator[Record]:
        src, report = self.src, self.report
        errors_before = len(report.errors)  # the report may be shared by several files
        first = True
        gap = 0  # bytes of blank separator lines before the record
        pending: Pending | None = None
        while True:
            gap += src.skip_blank_lines()
            dpos = src.pos
            line = src.readline()
            if src.damage is not None and not line.endswith(b"\n"):
                # damaged compressed input at a record boundary
                rid = None
                if pending is not None:
                    (rec, rid), pending = self.settle_at_damage(pending), None
                    if rec is not None:
                        yield rec
                self.damage(rid)
                first, gap = False, 0
                continue
            if not line:
                if pending is not None:
                    rec = self.settle(pending, True)
                    if rec is not None:
                        yield rec
                if first and len(report.errors) == errors_before:
                    report.error(self.name, 0, "empty file (no records)", reason="read:empty_file")
                return
            if not line.strip():  # a blank line longer than a window: rare, but the same gap
                gap += len(line)
                continue
            offset = src.seek_offset(dpos, gap)
            gap = 0
            if first and line.startswith(b"filedesc://"):
                yield from ArcReader(src, self.name, self.max_bytes, report, self.wanted).records(
                    line, offset, dpos
                )
                return
            first = False
            headers: dict[str, str] = {}
            last = b""
            length = -1
            if line.startswith(b"WARC/"):
                headers, problem, last = _parse_headers(src)
                if problem is None:
                    try:
                        length = int(headers.get("content-length", ""))
                    except ValueError:
                        length = -1
                    if length < 0:
                        problem = f"invalid Content-Length {headers.get('content-length')!r}"
                if problem and src.damage is not None:  # the header was cut by damaged compression
                    rid = None
                    if pending is not None:
                        (rec, rid), pending = self.settle_at_damage(pending), None
                        if rec is not None:
                            yield rec
                    self.damage(headers.get("warc-record-id", "").strip("<>") or rid)
                    continue
                reason = "read:bad_header"
            else:
                problem = f"expected a WARC/<version> line, found {line[:40]!r} (not a WARC record)"
                reason = "read:garbage"
            if problem:
                # put back what may hold the next header: the header lines read (the WARC/
                # line itself stays read), or all of a garbage line but its first byte
                src.unread(last if line.startswith(b"WARC/") else line[1:])
                _, found = src.scan(_WARC_LINE)
                if pending is not None and self._in_damaged_member(pending):
                    report.damaged += 1
                    pending = None
                if pending is not None:
                    # garbage after a block that ended on a separator is garbage between records;
                    # a span that itself ends like a record (a blank line right before the next
                    # header) is the rest of the pending block: its Content-Length was short
                    tail = src.behind(4)
                    looks_like_tail = (
                        found and reason == "read:garbage" and tail.endswith((b"\n\n", b"\n\r\n"))
                    )
                    keep = pending.header_follows or (pending.sep_ok and not looks_like_tail)
                    rec = self.settle(pending, keep)
                    if not keep:
                        self.error(
                            pending.dpos,
                            f"Content-Length {pending.length} does not match the {pending.rtype} record's block "
                            "(the next record header is not where it says): dropped",
                            "read:content_length_mismatch",
                            src.pos,
                            pending.rid,
                            offset=self._file_offset(pending),
                        )
                        pending = None
                        if src.damage is not None:
                            self.damage(None)
                        continue
                    pending = None
                    if rec is not None:
                        yield rec
                rid = headers.get("warc-record-id", "").strip("<>") or None
                self.error(dpos, f"{problem}: skipped to the next record", reason, src.pos, rid)
                if src.damage is not None:
                    self.damage(None)
                continue
            if pending is not None:
                rec, pending = self.settle(pending, True), None
                if rec is not None:
                    yield rec
            src.forget_before(dpos)
            rtype = headers.get("warc-type", "").lower() or "unknown"
            report.records += 1
            report.by_type[rtype] += 1
            if rtype == "revisit":
                report.revisits += 1
            rid = headers.get("warc-record-id", "").strip("<>")
            url = headers.get("warc-target-uri", "").strip("<>")
            if length > self.max_bytes:
                got, block = src.skip(length), b""
            else:
                block = src.read(length)
                got = len(block)
            if got < length:
                report.damaged += 1
                if src.damage is not None:  # damaged compression inside the block
                    self.damage(rid)
                    continue
                # the file ends inside the block; a wrong Content-Length may have swallowed
                # whole records, so the block is scanned for record headers
                src.unread(block)
                src.scan(_WARC_LINE)
                self.error(
                    dpos,
                    f"truncated {rtype} record: {got} of {length} bytes present",
                    "read:truncated",
                    src.pos,
                    rid,
                    offset=self._file_offset_at(dpos, offset),
                )
                continue
            p = Pending("skip", rtype, rid, url, offset, dpos, length, False, False, src.pos)
            p.sep_ok, p.header_follows = _after_block(src)
            if not (p.sep_ok or p.header_follows):
                # the block does not end where the next record starts: the Content-Length is wrong
                self.settle(p, False)
                src.unread(block)
                src.scan(_WARC_LINE)
                self.error(
                    dpos,
                    f"Content-Length {length} does not match the {rtype} record's block "
                    "(the next record header is not where it says): dropped",
                    "read:content_length_mismatch",
                    src.pos,
                    rid,
                    offset=self._file_offset_at(dpos, offset),
                )
                continue
            if rtype in self.wanted:
                if length > self.max_bytes:
                    p.outcome = "too_large"
                else:
                    try:
                        p.record = _make_record(
                            headers,
                            block,
                            rtype,
                            rid,
                            offset,
                            self.name,
                            line[5:].strip().decode("ascii", "replace"),
                            report,
                            self.max_bytes,
                        )
                        p.outcome = "yield"
                    except PayloadTooLarge as exc:
                        p.outcome, p.encoding = "too_large", exc.encoding
            pending = p


_SEPARATOR_THEN_HEADER = (b"\r\n\r\nWARC/", b"\n\nWARC/")


def _after_block(src: Stream) -> tuple[bool, bool]:
    """What follows a record's block, peeked without consuming: (the WARC separator, a blank
    line, comes right after it; the next WARC/ line or the end comes after the blanks, as it
    must). Strict on purpose: one byte too many or too few leaves "\n\r\n" or "x\r\n\r\n"
    behind the block, and a header with no separator at all must start right at its end."""
    src._fill(256)
    if src.buf.startswith(_SEPARATOR_THEN_HEADER, src.start):
        return True, True  # the usual case, decided without copying the window
    window = src.peek(256)
    rest = window.lstrip(BLANK)
    blanks = window[: len(window) - len(rest)]
    # a stray newline before the separator is tolerated (warcio's example-wrong-chunks has one)
    sep_ok = blanks.startswith((b"\r\n\r\n", b"\n\n")) or blanks.count(b"\n") >= 3
    if rest:
        follows = rest.startswith(b"WARC/") and (sep_ok or not blanks)
    else:  # blanks to the end (or to damage): a single trailing newline is a common ending; none
        # at all is not, and a Content-Length that runs exactly to the end swallowed something
        follows = len(window) < 256 and (sep_ok or blanks in (b"\n", b"\r\n"))
    return sep_ok, follows


def _make_record(headers, block, rtype, rid, offset, name, version, report, max_bytes) -> Record:
    wct = headers.get("content-type", "")
    status = None
    if block.startswith(b"HTTP/") and (rtype == "response" or "application/http" in wct.lower()):
        status, http_headers, payload = parse_http(block, report.decoding, max_bytes)
        mime, charset = mime_and_charset(http_headers.get("content-type", ""))
    else:
        payload = block
        mime, charset = mime_and_charset(wct)
    return Record(
        record_id=rid,
        record_type=rtype,
        url=headers.get("warc-target-uri", "").strip("<>"),
        date=headers.get("warc-date", ""),
        http_status=status,
        content_type=mime,
        charset=charset,
        offset=offset,
        payload=payload,
        source_file=name,
        warc_version=version,
        language=headers.get("warc-identified-content-language"),
        truncated=headers.get("warc-truncated"),
    )
