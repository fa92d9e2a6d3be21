"""A decompressed, forward-only view of a crawl file, with gzip member offsets and damage that stops it.

Compression is detected from magic bytes, never the file name: gzip (1f 8b; one member per record
*or* the whole file in one member), zstd (28 b5 2f fd, read across frames), else plain. Gzip is
read a member at a time from the compressed bytes (oreline.data.read.inflate, zlib-ng when
installed), so each member's file offset is known. Decompression is incremental with a bounded
output size, so a 50 MB record (or a decompression bomb) is skipped without holding it whole. The
input is a binary file object read forward only (no seek), e.g. an fsspec stream.

Damage: a gzip member that does not inflate (corrupt data or CRC, cut off) or bytes between
members that are not gzip. The stream scans the compressed bytes for the next `1f 8b 08` whose
member inflates and starts with a record (`record_start`, given by the record reader), and serves
nothing past the damage until the reader has recorded it (`resume`), so no record joins bytes
from both sides. Time and memory are linear in the input: blank separator lines are skipped in
bulk (`skip_blank_lines`) and scans go a window at a time.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

from oreline.data.read.inflate import PIECE, inflate_head, inflate_piece, member_decompressor
from oreline.data.read.inflate import error as inflate_error

CHUNK = 1 << 20  # raw bytes read at a time; decompressed output is bounded to 4x this per call
MAX_LINE = 1 << 16
BLANK = b" \t\r\n\x0b\x0c"  # what bytes.strip() removes


class Damage(Exception):
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


class Stream:
    """A decompressed view of a file with readline/read/unread/scan and gzip member file offsets.

    Gzip is read a member at a time from the compressed bytes (a decompressor per member: see
    oreline.data.read.inflate), so the file offset of every member is known. A member that fails
    to inflate (corrupt data or CRC, cut off) or bytes between members that are not gzip are
    *damage*: the stream scans the compressed bytes for the next `1f 8b 08` whose member inflates
    and starts with a record header, and stops serving bytes (`damage` is set) until the reader
    calls `resume()`, so no read ever joins bytes from both sides of the damage."""

    def __init__(self, f, kind: str, record_start: Callable[[bytes], bool]):
        self.f, self.kind = f, kind
        self.record_start = record_start  # whether decompressed bytes start a record (resync)
        self.buf = b""
        self.start = 0  # index of the first unconsumed byte in buf
        self.pos = 0  # decompressed offset of buf[start]
        self.produced = 0  # decompressed bytes produced so far (the offset where new output goes)
        self.eof = False
        self.damage: Damage | None = None
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
                out = self.zreader.read(CHUNK)
            else:
                out = self.f.read(CHUNK)
        except Damage as exc:
            self.damage = exc
            return b""
        except Exception as exc:  # zstd.ZstdError, OSError: damage, never a crash; no resync inside zstd
            self.damage = Damage(
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

    def resume(self) -> Damage | None:
        """Serve bytes again after damage (from the resync point); returns the damage."""
        damage, self.damage = self.damage, None
        return damage

    def _read_raw(self) -> bool:
        """Append the next compressed chunk, dropping consumed bytes (the current member's are
        kept, up to _KEEP_RAW, so a resync can scan from its start)."""
        chunk = self.f.read(CHUNK)
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
        starts with a record header (or to the end), and raise Damage."""
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
                    raise Damage(offset, message, reason, self.raw_off + len(self.raw) - offset, head)
                continue
            self.ri = cand
            while len(self.raw) - self.ri < PIECE and self._read_raw():  # the candidate's head is here
                pass
            if self.record_start(inflate_head(self.raw[self.ri : self.ri + PIECE], _CANDIDATE_HEAD)):
                raise Damage(offset, message, reason, self.raw_off + self.ri - offset, head)
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
    def readline(self, limit: int = MAX_LINE) -> bytes:
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
        if self.start > CHUNK:
            self.buf, self.start = self.buf[self.start :], 0

    def _take(self, n: int) -> bytes:
        out = self.buf[self.start : self.start + n]
        self.start += n
        self.pos += n
        if self.start > CHUNK:  # drop consumed bytes so the buffer stays small
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
        rest = head.lstrip(BLANK)
        if rest:
            nl = head.rfind(b"\n", 0, len(head) - len(rest))
            if nl >= 0:
                self._skip_buffered(nl + 1)
            return nl + 1
        skipped = 0
        while self._fill(1):
            window = self.buf[self.start : self.start + CHUNK]
            rest = window.lstrip(BLANK)
            nl = window.rfind(b"\n", 0, len(window) - len(rest))
            if rest:  # the run ends in this window: take its whole lines, keep the line it ends in
                if nl >= 0:
                    self._take(nl + 1)
                    skipped += nl + 1
                return skipped
            if len(window) < CHUNK and self._fill(len(window) + 1):
                continue  # all blank so far: look at what follows before deciding
            # a full blank window (keep its last partial line for the next one), or the end
            cut = nl + 1 if nl >= 0 and len(window) == CHUNK else len(window)
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


def detect_compression(head: bytes) -> str:
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    return "plain"


class Prepend:
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
