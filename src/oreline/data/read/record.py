"""What reading yields and reports: a `Record`, the `ReadReport`, the bookkeeping the WARC and ARC
loops share, and a record's `Document`.

A record is passed on only once what follows its block confirms its length (`RecordLoop.settle`);
one whose block does not end where the next record starts is dropped as
`read:content_length_mismatch`, one past `max_record_bytes` as `read:too_large` (both in
`report.rejected`, so the caller keeps them as rejects). Each damaged span is one
`report.errors` entry: {file, offset in the file, skipped_bytes, reason, error, record_id when
known, and stream_offset for compressed files}.

`Record.offset` is where a reader can seek to: for per-record gzip the file offset of the gzip
member that holds the record (as in CDX indexes), for plain files the exact byte offset, and for
whole-file gzip or zstd (one stream) the offset within the decompressed stream.

`record_to_document` returns the record's Document (HTML still as HTML; see
metadata["is_html"]) or the reason it has none; the step runner counts and rejects it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oreline.data.read.payload import decode_payload, meta_charset
from oreline.data.read.stream import Stream
from oreline.document import Document, content_id

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
RECORD_ID = re.compile(rb"(?im)^WARC-Record-ID:[ \t]*<?([^>\r\n]*)>?")


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
    # records dropped whole by reason ("read:too_large", ...), each also in `rejected`; the funnel
    # counts them when the step runner reads them as rejects
    dropped: Counter = field(default_factory=Counter)
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


@dataclass(slots=True)
class Pending:
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


def mime_and_charset(content_type: str) -> tuple[str, str | None]:
    parts = content_type.split(";")
    mime = parts[0].strip().lower()
    charset = None
    for p in parts[1:]:
        key, _, val = p.partition("=")
        if key.strip().lower() == "charset":
            charset = val.split(",")[0].strip().strip("\"'").lower() or None
    return mime, charset


class RecordLoop:
    """What the WARC and the ARC record loops share: counting a record once what follows its block
    confirms it (`settle`), and recording each damaged span once in the report (`error`, `damage`)."""

    def __init__(self, src: Stream, name: str, max_bytes: int, report: ReadReport, wanted):
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
            m = RECORD_ID.search(d.head)
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

    def settle(self, p: Pending, ok: bool) -> Record | None:
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

    def _in_damaged_member(self, p: Pending) -> bool:
        """Whether the gzip member the stream stopped at holds bytes of p's block: a member is
        checked (CRC) only at its end, so its output before the damage is not to be trusted."""
        d, src = self.src.damage, self.src
        if d is None or src.kind != "gzip" or d.reason == "gzip:garbage" or d.offset is None:
            return False
        last = src.file_offset(max(p.end - 1, p.dpos))
        return last is not None and d.offset <= last

    def settle_at_damage(self, p: Pending) -> tuple[Record | None, str | None]:
        """Settle p when the stream stopped at damage right after it: (its record, None), or
        (None, its id) when its bytes came from the damaged member (a damaged record)."""
        if self._in_damaged_member(p):
            self.report.damaged += 1
            return None, p.rid
        return self.settle(p, True), None

    def _reject(self, p: Pending, reason: str) -> dict[str, Any]:
        return {
            "file": self.name,
            "offset": p.offset,
            "record_id": p.rid,
            "url": p.url,
            "bytes": p.length,
            "reason": reason,
        }

    def _file_offset(self, p: Pending) -> int | None:
        return self._file_offset_at(p.dpos, p.offset)

    def _file_offset_at(self, dpos: int, offset: int) -> int | None:
        """A record's file offset: its seek offset when that is one (plain, per-record gzip)."""
        if self.src.kind == "plain":
            return offset
        return self.src.file_offset(dpos)


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


def record_to_document(record: Record, report: ReadReport) -> Document | str:
    """A Document holding the decoded text (HTML still as HTML; see metadata["is_html"]), or the
    reason the record has none ("read:empty_payload"), which the caller's step runner counts."""
    if not record.payload:
        return "read:empty_payload"
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
