"""The ARC v1/v2 record loop: `url ip date mime [...] length` lines, each followed by `length` bytes.

Entered by the WARC reader (`oreline.data.read.warc.iter_records`) when a file starts with
`filedesc://`. Damage is handled as for WARC: a record line that does not parse, a truncated
block or a length that does not end where the next record line starts is recorded once and
skipped to the next record line; a record a few bytes short at the very end of the file whose
HTTP body is whole by its own Content-Length is kept, as warcio does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from oreline.data.read.payload import PayloadTooLarge, parse_http
from oreline.data.read.record import Pending, Record, RecordLoop, mime_and_charset
from oreline.data.read.stream import BLANK, Stream
from oreline.document import content_id

# an ARC v1/v2 record line: `url ip date(14 digits) mime ... length`
ARC_LINE = re.compile(rb"(?m)^(?=[^\s:]{1,20}:[^\n]{0,4096}? (?:\d{1,3}\.){3}\d{1,3} \d{14} )")


class ArcReader(RecordLoop):
    """The ARC v1/v2 record loop, entered by the WARC reader when a file starts with `filedesc://`."""

    def records(self, line: bytes, offset: int, dpos: int) -> Iterator[Record]:
        """ARC v1/v2: `url ip date mime [...] length` lines, each followed by `length` bytes."""
        src, report, name = self.src, self.report, self.name
        version2 = False
        while True:
            fields = arc_fields(line, version2)
            if fields is None:
                src.scan(ARC_LINE)
                self.error(dpos, f"invalid ARC header line {line[:80]!r}", "read:bad_header", src.pos)
            else:
                url, date, mime, length = fields
                is_desc = url.startswith("filedesc://")
                rtype = "warcinfo" if is_desc else "response"
                rid = content_id(f"{Path(name).name}:{offset}", prefix="arc:")
                report.records += 1
                report.by_type[rtype] += 1
                if length > self.max_bytes and not is_desc:
                    got, block = src.skip(length), b""
                else:
                    block = src.read(length)
                    got = len(block)
                    if is_desc:  # the version block starts with the ARC major version
                        version2 = block.lstrip().startswith(b"2")
                ok = got == length
                if not ok and src.damage is None and rtype in self.wanted and _http_body_complete(block):
                    # a few bytes short at the very end but the HTTP body is whole: kept, as warcio does
                    self.error(
                        dpos,
                        f"ARC record is {length - got} bytes shorter than its declared length at the end "
                        "of the file; its HTTP body is complete, so it is kept",
                        "read:arc_short_at_end",
                        dpos,
                        rid,
                        offset=self._file_offset_at(dpos, offset),
                    )
                    ok = True
                elif not ok:
                    report.damaged += 1
                    if src.damage is not None:
                        self.damage(rid)
                    else:
                        src.unread(block)
                        src.scan(ARC_LINE)
                        self.error(
                            dpos,
                            f"truncated ARC record: {got} of {length} bytes present",
                            "read:truncated",
                            src.pos,
                            rid,
                            offset=self._file_offset_at(dpos, offset),
                        )
                elif not arc_follows(src):
                    ok = False
                    if rtype in self.wanted:
                        report.dropped["read:content_length_mismatch"] += 1
                        report.rejected.append(
                            {
                                "file": name,
                                "offset": offset,
                                "record_id": rid,
                                "url": url,
                                "bytes": length,
                                "reason": "read:content_length_mismatch",
                            }
                        )
                    else:
                        report.damaged += 1
                    src.unread(block)
                    src.scan(ARC_LINE)
                    self.error(
                        dpos,
                        f"ARC length {length} does not match the record (the next record line is not where "
                        "it says): dropped",
                        "read:content_length_mismatch",
                        src.pos,
                        rid,
                        offset=self._file_offset_at(dpos, offset),
                    )
                if ok:
                    rec = self._arc_record(block, rtype, rid, url, date, mime, offset, length)
                    if rec is not None:
                        yield rec
            while True:  # separator lines, then the next header (or the end)
                gap = src.skip_blank_lines()
                dpos = src.pos
                line = src.readline()
                if src.damage is not None and not line.endswith(b"\n"):
                    self.damage(None)
                    continue
                if not line:
                    return
                if line.strip():
                    offset = src.seek_offset(dpos, gap)
                    break

    def _arc_record(self, block, rtype, rid, url, date, mime, offset, length) -> Record | None:
        report = self.report
        if rtype not in self.wanted:
            report.skipped[rtype] += 1
            return None
        p = Pending("too_large", rtype, rid, url, offset, 0, length, True, True)
        if length > self.max_bytes:
            self.settle(p, True)
            return None
        status, payload = None, block
        try:
            if block.startswith(b"HTTP/"):
                status, http_headers, payload = parse_http(block, report.decoding, self.max_bytes)
                mime = http_headers.get("content-type", mime)
        except PayloadTooLarge as exc:
            p.encoding = exc.encoding
            self.settle(p, True)
            return None
        mime, charset = mime_and_charset(mime)
        report.yielded += 1
        return Record(rid, rtype, url, date, status, mime, charset, offset, payload, self.name, "arc")


def arc_follows(src: Stream) -> bool:
    """Whether the next non-blank line after an ARC block is an ARC record line (or the end)."""
    window = src.peek(8192)
    rest = window.lstrip(BLANK)
    if not rest:
        return len(window) < 8192
    return ARC_LINE.match(rest) is not None


def arc_fields(line: bytes, version2: bool = False) -> tuple[str, str, str, int] | None:
    """(url, date, mime, length) of an ARC record line, or None when it is not one."""
    parts = line.decode("utf-8", "replace").split()
    try:
        length = int(parts[-1])
    except (ValueError, IndexError):
        return None
    if length < 0 or len(parts) < 5:
        return None
    if version2 and not parts[0].startswith("filedesc://"):
        return parts[0], parts[2], parts[3], length
    # v1: the URL may contain spaces, so read the fixed fields from the right
    return " ".join(parts[:-4]), parts[-3], parts[-2], length


def _http_body_complete(block: bytes) -> bool:
    """Whether an HTTP response's body is all there by its own Content-Length."""
    if not block.startswith(b"HTTP/"):
        return False
    end = re.search(rb"\r?\n\r?\n", block)
    if end is None:
        return False
    m = re.search(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$", block[: end.start() + 1])
    return m is not None and len(block) - end.end() >= int(m.group(1))
