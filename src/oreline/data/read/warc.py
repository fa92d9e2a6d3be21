"""Streaming WARC / WET / ARC reader: records with HTTP status, content type, charset, payload.

Why a small pure-Python parser rather than fastwarc: the promise here is "every intact record is
kept, the damage is recorded and skipped, nothing crashes". fastwarc and warcio end the file at
the first damage (a corrupt gzip member, garbage between records, a wrong Content-Length) or
raise, and the payload work (chunked transfer-encoding, gzip/deflate/brotli/zstd content
encoding, charset decoding) happens in Python either way. Framing speed, measured by
benchmarks/reader_throughput.py on the largest sample archives: this reader takes about 1.5x
fastwarc's time to frame them (it took 2.2-2.8x before issue 19's throughput work), most of it
inflating gzip (zlib-ng when installed: oreline.data.read.inflate). The undamaged path is kept
lean: the usual separator and header are recognised in one piece without copying the buffer,
and only what does not fit that shape takes the line-by-line path that says what is wrong.
(So fastwarc framing the undamaged parts, with a hand-over to this reader at damage, is not
needed: the output would have to be proven the same twice.)

Algorithm
1. Compression is detected from magic bytes, never the file name: gzip (1f 8b; one member per
   record *or* the whole file in one member; read a member at a time from the compressed bytes,
   so each member's file offset is known), zstd (28 b5 2f fd, read across frames), else plain.
   Decompression is incremental with a bounded output size, so a 50 MB record (or a
   decompression bomb) is skipped without holding it whole. The input is a path or a binary
   file object read forward only (no seek), e.g. an fsspec stream.
2. Records: a `WARC/<version>` line (0.17, 0.18, 1.0, 1.1 all share the named-field layout),
   header lines up to a blank line (folded continuation lines joined), `Content-Length` bytes of
   block, the separator. ARC v1/v2 files (`filedesc://` first line) are read too: one header
   line whose last field is the length. Only `record_types` are parsed and yielded (default:
   response, conversion, resource); the others are counted by type, and revisit records are
   counted on their own.
3. A record is passed on only once what follows its block confirms its Content-Length: the
   separator (a blank line) and the next header, or the end. A block that does not end where
   the next record starts is dropped as `read:content_length_mismatch` (in `report.rejected`
   with its id and URL), never passed on with wrong bytes.
4. HTTP responses: status line and headers are parsed; the body is de-chunked when
   `Transfer-Encoding: chunked` (kept as is when it is not actually chunked, as warcio does) and
   decoded per `Content-Encoding` (gzip, deflate in zlib or raw form, br, zstd). A body that fails
   to decode is kept raw and counted (`report.decoding`); one that decodes to more than
   `max_record_bytes` is dropped as `read:too_large` (decoding stops at the limit).
5. Damage is skipped, not the end of the file (resynchronisation). A gzip member that does not
   inflate (corrupt data or CRC, cut off) or bytes between members that are not gzip: the
   compressed bytes are scanned for the next `1f 8b 08` whose member inflates and starts with a
   record header that parses; the stream serves nothing past the damage until the record layer
   has recorded it, so no record joins bytes from both sides, and a record whose bytes came
   from the damaged member is dropped (a member's CRC is checked only at its end). Garbage
   between records, a header that does not parse (or runs into the next record's header), a
   truncated block or a wrong Content-Length: the decompressed stream is scanned for the next
   `WARC/x.y` line (ARC: the next record line) whose header parses, from the start of the bad
   block when its length was wrong. Each damaged span is one `report.errors` entry: {file,
   offset in the file, skipped_bytes, reason, error, record_id when known, and stream_offset
   for compressed files}. Limitation: inside one gzip member holding the whole file, damage that
   still inflates shows only at the member's end, after the records before it were passed on.

`Record.offset` is where a reader can seek to: for per-record gzip the file offset of the gzip
member that holds the record (as in CDX indexes), for plain files the exact byte offset, and for
whole-file gzip or zstd (one stream) the offset within the decompressed stream.

Time and memory are linear in the input and bounded per record (hostile input, issue 21): blank
separator lines are skipped in bulk (`_Stream.skip_blank_lines`; a line at a time, with the gap
built by `+=`, 1 MiB of newlines took 18.5 s and 64 MiB never finished), folded header lines
are joined once, decoded payloads stop at `max_record_bytes`, and resync scans go a window at
a time.

HTTP parsing, content decoding and charset decoding live in `oreline.data.read.payload`.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from oreline.data.read.inflate import PIECE, inflate_head, inflate_piece, member_decompressor
from oreline.data.read.inflate import error as inflate_error
from oreline.data.read.payload import (
    PayloadTooLarge,
    decode_payload,
    meta_charset,
    parse_http,
)
from oreline.document import Document, content_id

DEFAULT_RECORD_TYPES = ("response", "conversion", "resource")
DEFAULT_MAX_RECORD_BYTES = 50_000_000
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_CHUNK = 1 << 20  # raw bytes read at a time; decompressed output is bounded to 4x this per call
_MAX_LINE = 1 << 16
_MAX_HEADER_LINES = 2000
_BLANK = b" \t\r\n\x0b\x0c"  # what bytes.strip() removes


@dataclass(slots=True)
class Record:
    record_id: str
    record_type: str
    url: str
    date: str
    http_status: int | None
    content_type: str  # lowercased mime type without parameters ("" when unknown)
    charset: str | None  # charset declared by HTTP (or the WARC Content-Type of resource records)
    offset: int
    payload: bytes  # HTTP body after transfer/content decoding (or the block of non-HTTP records)
    source_file: str = ""
    warc_version: str = ""
    language: str | None = None  # WARC-Identified-Content-Language (CC WET files)
    truncated: str | None = None  # WARC-Truncated reason, when the crawler cut the payload


@dataclass
class ReadReport:
    """What reading saw: counts by record type, skips, drops, damage. Merge reports with `merge`.

    `errors` has one entry per damaged span: {file, offset (in the file), skipped_bytes, reason,
    error (the message), record_id (when known)}, plus `stream_offset` (the position in the
    decompressed stream) for compressed files. `rejected` lists the wanted records dropped whole
    ({file, offset, record_id, url, bytes, reason}) so the caller can keep them as rejects."""

    files: int = 0
    records: int = 0  # every record header parsed (all types)
    by_type: Counter = field(default_factory=Counter)
    yielded: int = 0
    revisits: int = 0
    damaged: int = 0  # records whose header was read but whose block was cut off or corrupt
    skipped: Counter = field(default_factory=Counter)  # record types not turned into documents
    dropped: Counter = field(default_factory=Counter)  # reason -> count ("read:too_large", ...)
    decoding: Counter = field(default_factory=Counter)  # transfer/content/charset decoding events
    replacement_chars: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)

    def error(
        self,
        file: str,
        offset: int | None,
        message: str,
        *,
        reason: str = "read:error",
        skipped_bytes: int = 0,
        record_id: str | None = None,
        stream_offset: int | None = None,
    ) -> None:
        entry: dict[str, Any] = {
            "file": file,
            "offset": None if offset is None else int(offset),
            "skipped_bytes": int(skipped_bytes),
            "reason": reason,
            "error": message,
        }
        if record_id:
            entry["record_id"] = record_id
        if stream_offset is not None:
            entry["stream_offset"] = int(stream_offset)
        self.errors.append(entry)

    def merge(self, other: ReadReport) -> ReadReport:
        for name in ("files", "records", "yielded", "revisits", "damaged", "replacement_chars"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("by_type", "skipped", "dropped", "decoding"):
            getattr(self, name).update(getattr(other, name))
        self.errors.extend(other.errors)
        self.rejected.extend(other.rejected)
        return self

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "records": self.records,
            "by_type": dict(self.by_type),
            "yielded": self.yielded,
            "revisits": self.revisits,
            "damaged": self.damaged,
            "skipped": dict(self.skipped),
            "dropped": dict(self.dropped),
            "decoding": dict(self.decoding),
            "replacement_chars": self.replacement_chars,
            "errors": list(self.errors),
            "rejected": list(self.rejected),
        }


# ---------------------------------------------------------------------------------------------
# decompressed byte stream


class _Damage(Exception):
    """Compressed input that cannot be read: where it starts in the file, how much was skipped to
    the next readable gzip member (or the end), and the first decompressed bytes of the damaged
    member when there were any (to name the record it held)."""

    def __init__(self, offset: int | None, message: str, reason: str, skipped: int = 0, head: bytes = b""):
        super().__init__(message)
        self.offset, self.message, self.reason, self.skipped, self.head = (
            offset,
            message,
            reason,
            skipped,
            head,
        )


_KEEP_RAW = 4 << 20  # compressed bytes of the current gzip member kept for resync (scan from its start)
_CANDIDATE_HEAD = 1 << 16  # decompressed bytes a resync candidate must start with a record header in
# a WARC version line, wherever it starts: garbage without a newline may run into the next header
_WARC_LINE = re.compile(rb"WARC/[0-9]\.[0-9]{1,2}\r?\n")
# an ARC v1/v2 record line: `url ip date(14 digits) mime ... length`
_ARC_LINE = re.compile(rb"(?m)^(?=[^\s:]{1,20}:[^\n]{0,4096}? (?:\d{1,3}\.){3}\d{1,3} \d{14} )")
_RECORD_ID = re.compile(rb"(?im)^WARC-Record-ID:[ \t]*<?([^>\r\n]*)>?")


class _Stream:
    """A decompressed view of a file with readline/read/unread/scan and gzip member file offsets.

    Gzip is read a member at a time from the compressed bytes (a decompressor per member: see
    oreline.data.read.inflate), so the file offset of every member is known. A member that fails
    to inflate (corrupt data or CRC, cut off) or bytes between members that are not gzip are
    *damage*: the stream scans the compressed bytes for the next `1f 8b 08` whose member inflates
    and starts with a record header, and stops serving bytes (`damage` is set) until the reader
    calls `resume()`, so no read ever joins bytes from both sides of the damage."""

    def __init__(self, f, kind: str):
        self.f, self.kind = f, kind
        self.buf = b""
        self.start = 0  # index of the first unconsumed byte in buf
        self.pos = 0  # decompressed offset of buf[start]
        self.produced = 0  # decompressed bytes produced so far (the offset where new output goes)
        self.eof = False
        self.damage: _Damage | None = None
        self.member_starts: list[int] = [0]  # decompressed offset where each gzip member's output starts
        self.member_offsets: list[int] = [0]  # ... and that member's offset in the file
        if kind == "gzip":
            self.raw = b""
            self.ri = 0  # next unconsumed index in raw
            self.raw_off = 0  # file offset of raw[0]
            self.member_off = 0  # file offset of the member being inflated
            self.dec = member_decompressor()
            self.member_fed = False
        elif kind == "zstd":
            import zstandard

            self.zreader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)

    # -- filling -------------------------------------------------------------------------------
    def _more(self) -> bytes:
        """The next piece of decompressed output (b"" at the end or at damage not yet resumed)."""
        if self.eof or self.damage is not None:
            return b""
        try:
            if self.kind == "gzip":
                out = self._more_gzip()
            elif self.kind == "zstd":
                out = self.zreader.read(_CHUNK)
            else:
                out = self.f.read(_CHUNK)
        except _Damage as exc:
            self.damage = exc
            return b""
        except Exception as exc:  # zstd.ZstdError, OSError: damage, never a crash; no resync inside zstd
            self.damage = _Damage(
                0 if self.kind == "zstd" else self.produced,
                f"{self.kind} stream error: {exc}",
                f"{self.kind}:error",
            )
            self.eof = True
            return b""
        if not out:
            self.eof = True
        self.produced += len(out)
        return out

    def resume(self) -> _Damage | None:
        """Serve bytes again after damage (from the resync point); returns the damage."""
        damage, self.damage = self.damage, None
        return damage

    def _read_raw(self) -> bool:
        """Append the next compressed chunk, dropping consumed bytes (the current member's are
        kept, up to _KEEP_RAW, so a resync can scan from its start)."""
        chunk = self.f.read(_CHUNK)
        if not chunk:
            return False
        keep = self.ri
        if self.member_fed and self.ri - (self.member_off - self.raw_off) <= _KEEP_RAW:
            keep = max(0, self.member_off - self.raw_off)
        self.raw_off += keep
        self.raw = self.raw[keep:] + chunk
        self.ri -= keep
        return True

    def _more_gzip(self) -> bytes:
        while True:
            if self.ri >= len(self.raw) and not self._read_raw():
                if self.member_fed:
                    self._gzip_damage(
                        self.member_off, "truncated gzip member (the file ends inside it)", "gzip:truncated"
                    )
                return b""
            if not self.member_fed:
                if len(self.raw) - self.ri < 3:
                    self._read_raw()
                if not self.raw.startswith(b"\x1f\x8b", self.ri):
                    if not self.raw[self.ri :].strip(b"\x00\r\n\t "):
                        self.ri = len(self.raw)  # padding after a member
                        continue
                    self._gzip_damage(
                        self.raw_off + self.ri, "bytes between gzip members are not gzip", "gzip:garbage"
                    )
                self.member_off = self.raw_off + self.ri
                if self.member_starts[-1] == self.produced:  # the last member gave no output
                    self.member_offsets[-1] = self.member_off
                else:
                    self.member_starts.append(self.produced)
                    self.member_offsets.append(self.member_off)
            try:
                out, used = inflate_piece(self.dec, memoryview(self.raw)[self.ri : self.ri + PIECE])
            except inflate_error as exc:
                self._gzip_damage(self.member_off, f"corrupt gzip member: {exc}", "gzip:corrupt")
            self.member_fed = True
            self.ri += used
            if self.dec.eof:
                self.dec = member_decompressor()
                self.member_fed = False
            if out:
                return out

    def _gzip_damage(self, offset: int, message: str, reason: str) -> None:
        """Salvage the damaged member's first bytes, move to the next member that inflates and
        starts with a record header (or to the end), and raise _Damage."""
        head = b""
        ms = self.member_off - self.raw_off
        if reason != "gzip:garbage" and ms >= 0:
            head = inflate_head(self.raw[ms : ms + PIECE], 4096, tolerant=True)
        self._reset_member()  # from here _read_raw keeps only what lies after the scan position
        self.ri = max(offset + 1 - self.raw_off, 0)
        while True:
            cand = self.raw.find(b"\x1f\x8b\x08", self.ri)
            if cand < 0:
                self.ri = max(self.ri, len(self.raw) - 2)
                if not self._read_raw():
                    self.ri = len(self.raw)
                    raise _Damage(offset, message, reason, self.raw_off + len(self.raw) - offset, head)
                continue
            self.ri = cand
            while len(self.raw) - self.ri < PIECE and self._read_raw():  # the candidate's head is here
                pass
            if _looks_like_record_start(inflate_head(self.raw[self.ri : self.ri + PIECE], _CANDIDATE_HEAD)):
                raise _Damage(offset, message, reason, self.raw_off + self.ri - offset, head)
            self.ri += 1

    def _reset_member(self) -> None:
        self.dec = member_decompressor()
        self.member_fed = False

    def _fill(self, need: int) -> bool:
        """Make at least `need` unconsumed bytes available if the stream has them."""
        while len(self.buf) - self.start < need:
            out = self._more()
            if not out:
                return False
            # nothing left (the usual case between gzip members): take the output without a copy
            self.buf = self.buf[self.start :] + out if self.start < len(self.buf) else out
            self.start = 0
        return True

    # -- reading -------------------------------------------------------------------------------
    def readline(self, limit: int = _MAX_LINE) -> bytes:
        while True:
            nl = self.buf.find(b"\n", self.start, self.start + limit)
            if nl >= 0:
                return self._take(nl + 1 - self.start)
            if len(self.buf) - self.start >= limit or not self._fill(len(self.buf) - self.start + 1):
                return self._take(min(limit, len(self.buf) - self.start))

    def read(self, n: int) -> bytes:
        """Up to n bytes (fewer at the end). Large reads collect pieces and join them once, so a
        50 MB block costs one copy rather than one per decompressed piece."""
        avail = len(self.buf) - self.start
        if avail >= n:
            return self._take(n)
        parts = [self._take(avail)]  # the buffer is now empty: pos is the offset of what comes next
        need = n - avail
        while need > 0:
            out = self._more()
            if not out:
                break
            if len(out) > need:
                parts.append(out[:need])
                self.buf, self.start = out, need
                self.pos += need
                break
            parts.append(out)
            self.buf, self.start = b"", 0
            self.pos += len(out)
            need -= len(out)
        return b"".join(parts)

    def unread(self, data: bytes) -> None:
        """Put back the bytes just read (a block whose Content-Length proved wrong is rescanned)."""
        if data:
            self.buf = data + self.buf[self.start :]
            self.start = 0
            self.pos -= len(data)

    def skip(self, n: int) -> int:
        """Consume up to n bytes without keeping them; returns how many were there."""
        done = 0
        while done < n:
            if self.start >= len(self.buf) and not self._fill(1):
                break
            step = min(n - done, len(self.buf) - self.start)
            self._take(step)
            done += step
        return done

    def _skip_buffered(self, n: int) -> None:
        """Consume n bytes known to be in the buffer, without copying them."""
        self.start += n
        self.pos += n
        if self.start > _CHUNK:
            self.buf, self.start = self.buf[self.start :], 0

    def _take(self, n: int) -> bytes:
        out = self.buf[self.start : self.start + n]
        self.start += n
        self.pos += n
        if self.start > _CHUNK:  # drop consumed bytes so the buffer stays small
            self.buf, self.start = self.buf[self.start :], 0
        return out

    def behind(self, n: int) -> bytes:
        """Up to n bytes just consumed (fewer when the buffer was trimmed)."""
        return self.buf[max(0, self.start - n) : self.start]

    def peek(self, n: int) -> bytes:
        self._fill(n)
        return self.buf[self.start : self.start + n]

    def scan(self, line_start: re.Pattern) -> tuple[int, bool]:
        """Consume bytes up to where `line_start` next matches; returns (bytes consumed, found).
        Stops at the end or at damage.
        Linear: a window at a time, keeping a tail that a line split across windows needs."""
        skipped = 0
        keep = 1 << 14
        while True:
            m = line_start.search(self.buf, self.start)
            if m is not None:
                n = m.start() - self.start
                self._take(n)
                return skipped + n, True
            avail = len(self.buf) - self.start
            if avail > keep:
                self._take(avail - keep)
                skipped += avail - keep
            if not self._fill(len(self.buf) - self.start + 1):
                rest = len(self.buf) - self.start
                self._take(rest)
                return skipped + rest, False

    def skip_blank_lines(self) -> int:
        """Consume the whole lines of whitespace at the read position in bulk; returns how many
        bytes that was.

        It takes what a loop of readline() calls would have taken as blank lines: the whitespace
        up to and including its last newline, so a line such as "  WARC/1.0" keeps its leading
        blanks (and is still reported as malformed). Linear in the gap, a window at a time."""
        if not self._fill(1):
            return 0
        if self.buf.startswith(b"\r\n\r\nWARC/", self.start):  # the usual separator
            self._skip_buffered(4)
            return 4
        # the common case first: the run (a record separator, or none) ends in the first bytes;
        # a window that short gives the same answer as the big one below without copying it
        head = self.buf[self.start : self.start + 64]
        rest = head.lstrip(_BLANK)
        if rest:
            nl = head.rfind(b"\n", 0, len(head) - len(rest))
            if nl >= 0:
                self._skip_buffered(nl + 1)
            return nl + 1
        skipped = 0
        while self._fill(1):
            window = self.buf[self.start : self.start + _CHUNK]
            rest = window.lstrip(_BLANK)
            nl = window.rfind(b"\n", 0, len(window) - len(rest))
            if rest:  # the run ends in this window: take its whole lines, keep the line it ends in
                if nl >= 0:
                    self._take(nl + 1)
                    skipped += nl + 1
                return skipped
            if len(window) < _CHUNK and self._fill(len(window) + 1):
                continue  # all blank so far: look at what follows before deciding
            # a full blank window (keep its last partial line for the next one), or the end
            cut = nl + 1 if nl >= 0 and len(window) == _CHUNK else len(window)
            self._take(cut)
            skipped += cut
        return skipped

    # -- offsets -------------------------------------------------------------------------------
    def file_offset(self, dpos: int) -> int | None:
        """The file offset of decompressed position dpos: itself for plain files, the start of
        the gzip member holding it, None inside a zstd stream (no member index)."""
        if self.kind == "plain":
            return dpos
        if self.kind == "gzip":
            i = bisect.bisect_right(self.member_starts, dpos) - 1
            return self.member_offsets[max(i, 0)]
        return None

    def file_position(self, dpos: int) -> int | None:
        """Like file_offset, but the end of the file for the end of the stream."""
        if self.kind == "gzip" and dpos >= self.produced and self.eof:
            return self.raw_off + len(self.raw)
        return self.file_offset(dpos)

    def seek_offset(self, dpos: int, gap: int) -> int:
        """The offset to report for a record starting at decompressed position dpos (after `gap`
        bytes of blank separator lines): the file offset of its gzip member when the member
        starts with this record (per-record gzip), else the decompressed position."""
        if self.kind == "gzip":
            i = bisect.bisect_right(self.member_starts, dpos) - 1
            if i >= 0 and dpos - self.member_starts[i] <= gap:
                return self.member_offsets[i]
        return dpos

    def forget_before(self, dpos: int) -> None:
        """Drop member index entries no offset question can reach any more (bounded memory)."""
        if len(self.member_starts) > 256:
            i = bisect.bisect_right(self.member_starts, dpos) - 1
            if i > 0:
                del self.member_starts[:i], self.member_offsets[:i]


def _looks_like_record_start(head: bytes) -> bool:
    """Whether decompressed bytes start with a WARC header that parses (or an ARC record line)."""
    head = head.lstrip(_BLANK)
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
    return nl > 0 and _ARC_LINE.match(head) is not None and _arc_fields(head[: nl + 1]) is not None


def detect_compression(head: bytes) -> str:
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    return "plain"


# ---------------------------------------------------------------------------------------------
# records


# the WARC fields that may appear more than once; any other WARC field (and Content-Length,
# Content-Type) appearing twice means a header cut short ran into the next record's header
_REPEATABLE_FIELDS = frozenset({"warc-concurrent-to", "warc-protocol"})
_KEEP_HEADER_BYTES = 1 << 20  # header bytes kept to put back when the header proves bad


def _parse_headers(src: _Stream) -> tuple[dict[str, str], str | None, bytes]:
    """Header lines up to a blank line: see _parse_header_lines. A header that is whole in the
    buffer and parses cleanly is read in one piece (one decode, one split: the common case,
    most of the framing time); anything else takes the line-by-line path, which says what is
    wrong with it."""
    fast = _parse_buffered_header(src)
    return fast if fast is not None else _parse_header_lines(src)


_HEADER_END = re.compile(rb"\n\r?\n")  # the end of a header's last line and the blank line after it


def _parse_buffered_header(src: _Stream) -> tuple[dict[str, str], None, bytes] | None:
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
        return None  # (every line is under _MAX_LINE: the header is under 64 KiB)
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


def _parse_header_lines(src: _Stream) -> tuple[dict[str, str], str | None, bytes]:
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
            long = len(line) >= _MAX_LINE
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


def _mime_and_charset(content_type: str) -> tuple[str, str | None]:
    parts = content_type.split(";")
    mime = parts[0].strip().lower()
    charset = None
    for p in parts[1:]:
        key, _, val = p.partition("=")
        if key.strip().lower() == "charset":
            charset = val.split(",")[0].strip().strip("\"'").lower() or None
    return mime, charset


class _Prepend:
    """A binary file object with bytes already read from it put back in front (the compression
    sniff must not need seek: the input may be a stream)."""

    def __init__(self, head: bytes, f):
        self.head, self.f = head, f

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self.f.read(n)
        if 0 <= n < len(self.head):
            out, self.head = self.head[:n], self.head[n:]
            return out
        head, self.head = self.head, b""
        return head + (self.f.read() if n < 0 else self.f.read(n - len(head)))


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
            src = _Stream(_Prepend(head, f), kind)
        except Exception as exc:  # e.g. zstandard missing, an unreadable stream
            report.error(name, 0, f"cannot read the file: {exc}", reason="read:cannot_open")
            return
        wanted = frozenset(t.lower() for t in record_types)
        yield from _WarcReader(src, name, max_record_bytes, report, wanted).records()
    finally:
        if owned:
            f.close()


@dataclass(slots=True)
class _Pending:
    """A record read whole whose Content-Length is confirmed only by what follows its block: the
    next record header, the end of the file, or a separator then garbage."""

    outcome: str  # "yield", "skip" (a type not wanted), "too_large"
    rtype: str
    rid: str
    url: str
    offset: int  # reported offset (seek offset)
    dpos: int  # decompressed position of its header
    length: int
    sep_ok: bool  # the block is followed by a blank line (the WARC separator)
    header_follows: bool  # ... and then directly by the next WARC/ line or the end
    end: int = 0  # decompressed position after its block
    record: Record | None = None
    encoding: str | None = None  # the content encoding that grew past the limit (too_large)


class _WarcReader:
    """The record loop with resynchronisation: garbage, a header that does not parse, a block
    that is cut off or whose Content-Length is wrong, and damaged gzip members are each recorded
    once in report.errors and skipped to the next record header that parses."""

    def __init__(self, src: _Stream, name: str, max_bytes: int, report: ReadReport, wanted):
        self.src, self.name, self.max_bytes, self.report, self.wanted = src, name, max_bytes, report, wanted
        self.compressed = src.kind != "plain"

    # -- reporting -----------------------------------------------------------------------------
    def error(self, dpos, message, reason, end, rid=None, offset=None) -> None:
        """One damaged span, from stream position dpos to end (where reading went on); its
        offset and length are in the file's bytes (gzip: member offsets, so a span inside one
        member of a whole-file gzip has length 0 and only its stream_offset says where)."""
        src = self.src
        start = src.file_offset(dpos) if offset is None else offset
        stop = src.file_position(end)
        skipped = end - dpos if start is None or stop is None or src.kind == "plain" else max(stop - start, 0)
        self.report.error(
            self.name,
            start,
            message,
            reason=reason,
            skipped_bytes=skipped,
            record_id=rid,
            stream_offset=dpos if self.compressed else None,
        )

    def damage(self, rid: str | None) -> None:
        """Record the compressed-input damage the stream stopped at, and read on past it."""
        at = self.src.pos
        d = self.src.resume()
        if d is None:
            return
        if not rid and d.head:
            m = _RECORD_ID.search(d.head)
            rid = m.group(1).decode("utf-8", "replace").strip() if m else None
        self.report.error(
            self.name,
            d.offset,
            d.message,
            reason=d.reason,
            skipped_bytes=d.skipped,
            record_id=rid,
            stream_offset=at if self.compressed else None,
        )

    def settle(self, p: _Pending, ok: bool) -> Record | None:
        """Count a pending record as confirmed (its record, if yielded) or as one whose
        Content-Length did not match its block (dropped with that reason, never passed on)."""
        report = self.report
        if not ok:
            if p.rtype in self.wanted:
                report.dropped["read:content_length_mismatch"] += 1
                report.rejected.append(self._reject(p, "read:content_length_mismatch"))
            else:
                report.damaged += 1
            return None
        if p.outcome == "yield":
            report.yielded += 1
            return p.record
        if p.outcome == "skip":
            report.skipped[p.rtype] += 1
        else:
            report.dropped["read:too_large"] += 1
            entry = self._reject(p, "read:too_large")
            if p.encoding:
                report.decoding[f"content_encoding_too_large:{p.encoding}"] += 1
                entry["content_encoding"] = p.encoding
            report.rejected.append(entry)
        return None

    def _in_damaged_member(self, p: _Pending) -> bool:
        """Whether the gzip member the stream stopped at holds bytes of p's block: a member is
        checked (CRC) only at its end, so its output before the damage is not to be trusted."""
        d, src = self.src.damage, self.src
        if d is None or src.kind != "gzip" or d.reason == "gzip:garbage" or d.offset is None:
            return False
        last = src.file_offset(max(p.end - 1, p.dpos))
        return last is not None and d.offset <= last

    def settle_at_damage(self, p: _Pending) -> tuple[Record | None, str | None]:
        """Settle p when the stream stopped at damage right after it: (its record, None), or
        (None, its id) when its bytes came from the damaged member (a damaged record)."""
        if self._in_damaged_member(p):
            self.report.damaged += 1
            return None, p.rid
        return self.settle(p, True), None

    def _reject(self, p: _Pending, reason: str) -> dict[str, Any]:
        return {
            "file": self.name,
            "offset": p.offset,
            "record_id": p.rid,
            "url": p.url,
            "bytes": p.length,
            "reason": reason,
        }

    # -- the loop ------------------------------------------------------------------------------
    def records(self) -> Iterator[Record]:
        src, report = self.src, self.report
        errors_before = len(report.errors)  # the report may be shared by several files
        first = True
        gap = 0  # bytes of blank separator lines before the record
        pending: _Pending | None = None
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
                yield from self.arc(line, offset, dpos)
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
            p = _Pending("skip", rtype, rid, url, offset, dpos, length, False, False, src.pos)
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

    def _file_offset(self, p: _Pending) -> int | None:
        return self._file_offset_at(p.dpos, p.offset)

    def _file_offset_at(self, dpos: int, offset: int) -> int | None:
        """A record's file offset: its seek offset when that is one (plain, per-record gzip)."""
        if self.src.kind == "plain":
            return offset
        return self.src.file_offset(dpos)

    # -- ARC -----------------------------------------------------------------------------------
    def arc(self, line: bytes, offset: int, dpos: int) -> Iterator[Record]:
        """ARC v1/v2: `url ip date mime [...] length` lines, each followed by `length` bytes."""
        src, report, name = self.src, self.report, self.name
        version2 = False
        while True:
            fields = _arc_fields(line, version2)
            if fields is None:
                src.scan(_ARC_LINE)
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
                        src.scan(_ARC_LINE)
                        self.error(
                            dpos,
                            f"truncated ARC record: {got} of {length} bytes present",
                            "read:truncated",
                            src.pos,
                            rid,
                            offset=self._file_offset_at(dpos, offset),
                        )
                elif not _arc_follows(src):
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
                    src.scan(_ARC_LINE)
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
        p = _Pending("too_large", rtype, rid, url, offset, 0, length, True, True)
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
        mime, charset = _mime_and_charset(mime)
        report.yielded += 1
        return Record(rid, rtype, url, date, status, mime, charset, offset, payload, self.name, "arc")


_SEPARATOR_THEN_HEADER = (b"\r\n\r\nWARC/", b"\n\nWARC/")


def _after_block(src: _Stream) -> tuple[bool, bool]:
    """What follows a record's block, peeked without consuming: (the WARC separator, a blank
    line, comes right after it; the next WARC/ line or the end comes after the blanks, as it
    must). Strict on purpose: one byte too many or too few leaves "\n\r\n" or "x\r\n\r\n"
    behind the block, and a header with no separator at all must start right at its end."""
    src._fill(256)
    if src.buf.startswith(_SEPARATOR_THEN_HEADER, src.start):
        return True, True  # the usual case, decided without copying the window
    window = src.peek(256)
    rest = window.lstrip(_BLANK)
    blanks = window[: len(window) - len(rest)]
    # a stray newline before the separator is tolerated (warcio's example-wrong-chunks has one)
    sep_ok = blanks.startswith((b"\r\n\r\n", b"\n\n")) or blanks.count(b"\n") >= 3
    if rest:
        follows = rest.startswith(b"WARC/") and (sep_ok or not blanks)
    else:  # blanks to the end (or to damage): a single trailing newline is a common ending; none
        # at all is not, and a Content-Length that runs exactly to the end swallowed something
        follows = len(window) < 256 and (sep_ok or blanks in (b"\n", b"\r\n"))
    return sep_ok, follows


def _arc_follows(src: _Stream) -> bool:
    """Whether the next non-blank line after an ARC block is an ARC record line (or the end)."""
    window = src.peek(8192)
    rest = window.lstrip(_BLANK)
    if not rest:
        return len(window) < 8192
    return _ARC_LINE.match(rest) is not None


def _arc_fields(line: bytes, version2: bool = False) -> tuple[str, str, str, int] | None:
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


def _make_record(headers, block, rtype, rid, offset, name, version, report, max_bytes) -> Record:
    wct = headers.get("content-type", "")
    status = None
    if block.startswith(b"HTTP/") and (rtype == "response" or "application/http" in wct.lower()):
        status, http_headers, payload = parse_http(block, report.decoding, max_bytes)
        mime, charset = _mime_and_charset(http_headers.get("content-type", ""))
    else:
        payload = block
        mime, charset = _mime_and_charset(wct)
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


# ---------------------------------------------------------------------------------------------
# documents


def _is_textual(content_type: str) -> bool:
    if not content_type or content_type.startswith("text/"):
        return True
    return any(k in content_type for k in ("xml", "json", "javascript", "ecmascript", "html", "unk"))


def _looks_like_html(payload: bytes) -> bool:
    head = payload[:1024].lstrip().lower()
    return (
        head.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml"))
        and b"<html" in payload[:4096].lower()
    )


def record_to_document(record: Record, report: ReadReport) -> Document | None:
    """A Document holding the decoded text (HTML still as HTML; see metadata["is_html"])."""
    if not record.payload:
        report.dropped["read:empty_payload"] += 1
        return None
    if _is_textual(record.content_type):
        text, encoding, n_repl = decode_payload(record.payload, record.charset, record.content_type)
        report.replacement_chars += n_repl
        report.decoding[f"charset:{encoding}"] += 1
    else:  # images, fonts, video: no charset detection; the protocol step drops them by type
        text, encoding, n_repl = record.payload.decode("utf-8", "replace"), "binary", 0
    is_html = record.content_type in HTML_TYPES or (
        record.content_type in ("", "text/plain", "application/octet-stream", "unk")
        and _looks_like_html(record.payload)
    )
    meta: dict[str, Any] = {
        "source_file": record.source_file,
        "offset": record.offset,
        "record_id": record.record_id,
        "record_type": record.record_type,
        "crawl_date": record.date,
        "http_status": record.http_status,
        "content_type": record.content_type,
        "charset": encoding,
        "declared_charset": record.charset or (meta_charset(record.payload) if is_html else None),
        "replacement_chars": n_repl,
        "is_html": is_html,
    }
    if record.language:
        meta["warc_language"] = record.language
    if record.truncated:
        meta["warc_truncated"] = record.truncated
    doc_id = record.record_id or content_id(f"{Path(record.source_file).name}:{record.offset}")
    return Document(id=doc_id, text=text, url=record.url, metadata=meta)


def protocol_reason(record: Record | dict[str, Any], cfg) -> str | None:
    """Drop reason from HTTP status and content type ("http:status_404", "http:content_type_image/png").

    Records without an HTTP status (resource, conversion) pass the status check; a missing
    content type is reported as "http:content_type_none". `cfg` is `cfg.data.protocol`.
    """
    if not cfg.enabled:
        return None
    if isinstance(record, dict):
        status, ctype = record.get("http_status"), record.get("content_type") or ""
    else:
        status, ctype = record.http_status, record.content_type
    if status is not None and status not in cfg.statuses:
        return f"http:status_{status}"
    if cfg.content_types and ctype not in cfg.content_types:
        return f"http:content_type_{ctype or 'none'}"
    return None
