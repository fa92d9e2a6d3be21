"""HTTP payloads of archive records: status and headers, transfer/content decoding, text decoding.

HTTP responses: the status line and headers are parsed; the body is de-chunked when
`Transfer-Encoding: chunked` (kept as is when it is not actually chunked, as warcio does: many
archivers store the de-chunked body and keep the header) and decoded per `Content-Encoding`
(gzip, deflate in zlib or raw form, br, zstd). A body that fails to decode, or that evidently
was stored decoded, is kept raw and counted.

Bounds (hostile input, issue 21): every content decoder stops once its output passes
`max_bytes` (= `data.read.max_record_bytes`) and raises `PayloadTooLarge`; the reader drops the
record as `read:too_large`. Measured before this bound: a 751-byte brotli body expanded to 5.1 GB
of RSS, a zstd one to 2.2 GB. The HTTP head is parsed from its first MAX_HTTP_HEAD bytes only
(repeated header names are joined once, not by repeated concatenation: 2.6 MB of headers took
20 s that way).

Text decoding (`decode_payload`) follows the WHATWG order in spirit: BOM, then the HTTP
charset, then `<meta charset>` / http-equiv, then detection (UTF-8 if it is valid, else
charset_normalizer when installed, else cp1252). gb2312/gbk are read as their superset gb18030,
latin-1/ascii as cp1252 (WHATWG encoding labels). Only text encodings are accepted as labels: a
label naming a bytes-to-bytes codec (base64, hex, zlib, rot13, ...) or one that cannot decode
arbitrary bytes (idna, punycode, undefined) counts as unknown, so detection decides. A declared single-byte charset on bytes that
are valid multi-byte UTF-8 is a wrong label and is overridden. Replacement characters are
counted so the pipeline can drop mojibake (`data.normalize.max_replacement_ratio`).
"""

from __future__ import annotations

import codecs
import re
from collections import Counter

from oreline.data.read import inflate

DEFAULT_MAX_BYTES = 50_000_000  # bound on decoded output (= data.read.max_record_bytes by default)
# Real HTTP heads are a few KB (servers refuse requests with more than 8-64 KB of headers); only
# this much of a block is searched for the end of the head and parsed as header lines.
MAX_HTTP_HEAD = 1 << 20
# RFC 9659: zstd content coding uses windows of at most 8 MB, and decoders may refuse larger ones
# (browsers do); a larger declared window would make the decoder allocate it.
ZSTD_MAX_WINDOW = 1 << 23


class PayloadTooLarge(Exception):
    """A body whose Content-Encoding decodes to more than `max_bytes`: the record is dropped
    (`read:too_large`), never decoded whole."""

    def __init__(self, encoding: str, max_bytes: int):
        super().__init__(f"Content-Encoding {encoding} decodes to more than {max_bytes:,} bytes")
        self.encoding, self.max_bytes = encoding, max_bytes


def parse_http(block: bytes, counts: Counter, max_bytes: int = DEFAULT_MAX_BYTES):
    """(status, lowercased headers, decoded body) of an HTTP response block; decoding events are
    counted in `counts` (a ReadReport's `decoding` Counter). Raises PayloadTooLarge when a
    Content-Encoding decodes to more than max_bytes."""
    ends = [
        i
        for i in (block.find(b"\r\n\r\n", 0, MAX_HTTP_HEAD), block.find(b"\n\n", 0, MAX_HTTP_HEAD))
        if i >= 0
    ]
    if ends:
        cut = min(ends)
        head, body = block[:cut], block[cut + (4 if block[cut : cut + 4] == b"\r\n\r\n" else 2) :]
    else:
        if len(block) > MAX_HTTP_HEAD:  # no end of head where one can be: no body either
            counts["http_head_too_long"] += 1
        head, body = block[:MAX_HTTP_HEAD], b""
    lines = head.decode("latin-1").splitlines()
    status = None
    parts = lines[0].split(None, 2) if lines else []
    if len(parts) >= 2 and parts[1].isdigit():
        status = int(parts[1])
    else:
        counts["http_status_unparsed"] += 1
    values: dict[str, list[str]] = {}
    for raw in lines[1:]:
        name, sep, value = raw.partition(":")
        if sep:
            values.setdefault(name.strip().lower(), []).append(value.strip())
    headers = {key: ", ".join(vals) for key, vals in values.items()}
    if "chunked" in headers.get("transfer-encoding", "").lower():
        dechunked = dechunk(body)
        if dechunked is None:
            counts["chunked_invalid_kept_raw"] += 1
        else:
            counts["chunked"] += 1
            body = dechunked
    encodings = [e.strip().lower() for e in headers.get("content-encoding", "").split(",") if e.strip()]
    for enc in reversed(encodings if body else []):  # applied in order listed, so undone in reverse
        if enc in ("identity", "none"):
            continue
        if enc not in _CONTENT_ENCODINGS:
            counts[f"content_encoding_unknown:{enc[:20]}"] += 1
            break
        if enc in ("gzip", "x-gzip", "deflate") and body[:1] in _DECODED_START:
            counts[f"content_encoding_already_decoded:{enc}"] += 1
            break
        decoded = decode_content(body, enc, max_bytes)
        if decoded is None:
            counts[f"content_encoding_failed:{enc}"] += 1
            break  # keep raw: many archivers store the decoded body but keep the header
        counts[f"content_encoding:{enc}"] += 1
        body = decoded
    return status, headers, body


_CONTENT_ENCODINGS = frozenset({"gzip", "x-gzip", "deflate", "br", "zstd"})
# first bytes of markup/JSON/text, never of a gzip or zlib stream (a brotli stream can start
# with any of them, so brotli is always tried)
_DECODED_START = b"<{[ \t\r\n"


def dechunk(body: bytes) -> bytes | None:
    """Undo HTTP/1.1 chunked transfer-encoding; None when the body is not actually chunked."""
    out, pos = [], 0
    while True:
        nl = body.find(b"\n", pos)
        if nl < 0:
            return b"".join(out) if out else None  # truncated chunk stream: keep what parsed
        size_text = body[pos:nl].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return b"".join(out) if out and not size_text else None
        if size == 0:
            return b"".join(out)
        out.append(body[nl + 1 : nl + 1 + size])
        pos = nl + 1 + size
        if body[pos : pos + 2] == b"\r\n":
            pos += 2
        elif body[pos : pos + 1] == b"\n":
            pos += 1


def decode_content(body: bytes, encoding: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | None:
    """Undo one Content-Encoding; None when it does not apply. Raises PayloadTooLarge as soon as
    the output passes max_bytes: each decoder is asked for at most max_bytes + 1 bytes, so a
    decompression bomb costs max_bytes of memory, not its decoded size.

    A gzip/deflate body that already looks like markup or text (archivers often store the decoded
    body and keep the header) is not fed to zlib: raw deflate in particular can turn such bytes
    into garbage without an error. Only the first gzip member / zstd frame is decoded, as before."""
    if not body or body[:1] in _DECODED_START and encoding in ("gzip", "x-gzip", "deflate"):
        return None
    try:
        out = _decode_content(body, encoding, max_bytes + 1)
    except Exception:  # brotli.error, zstd.ZstdError: undecodable body, kept raw by the caller
        return None
    if out is not None and len(out) > max_bytes:
        raise PayloadTooLarge(encoding, max_bytes)
    return out


def _decode_content(body: bytes, encoding: str, limit: int) -> bytes | None:
    """At most about `limit` bytes of decoded output (more means: too large)."""
    if encoding in ("gzip", "x-gzip", "deflate"):
        for wbits in (47,) if encoding != "deflate" else (15, -15, 47):
            try:  # zlib-ng when installed (oreline.data.read.inflate): the same output, ~2/3 the time
                return inflate.engine.decompressobj(wbits).decompress(body, limit)
            except inflate.error:
                continue
        return None
    if encoding == "br":
        import brotli

        # the output buffer stops growing once it holds `limit` bytes (brotli >= 1.2)
        return brotli.Decompressor().process(body, output_buffer_limit=limit)
    if encoding == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(body)
        parts, size = [], 0
        while size < limit:
            piece = reader.read(min(limit - size, 1 << 22))
            if not piece:
                break
            parts.append(piece)
            size += len(piece)
        return b"".join(parts)
    return None


# ---------------------------------------------------------------------------------------------
# text decoding

_CHARSET_ALIASES = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "x-gbk": "gb18030",
    "gb_2312-80": "gb18030",
    "csgb2312": "gb18030",
    "chinese": "gb18030",
    "iso-8859-1": "cp1252",
    "iso8859-1": "cp1252",
    "latin1": "cp1252",
    "latin-1": "cp1252",
    "l1": "cp1252",
    "us-ascii": "cp1252",
    "ascii": "cp1252",
    "windows-1252": "cp1252",
    "utf8": "utf-8",
    "unicode-1-1-utf-8": "utf-8",
    "shift_jis": "cp932",
    "shift-jis": "cp932",
    "sjis": "cp932",
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "euc-kr": "cp949",
    "ks_c_5601-1987": "cp949",
    "big5": "big5hkscs",
    "tis-620": "cp874",
    "iso-8859-11": "cp874",
    "iso-8859-9": "cp1254",
    "x-user-defined": "cp1252",
}
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]{2,40})""", re.I)
_ERRORS = "oreline_count"
_ASCII = bytes(range(128))
_DETECTABLE = frozenset(
    {
        "utf-8",
        "gb18030",
        "big5hkscs",
        "big5",
        "cp932",
        "shift_jis",
        "euc_jp",
        "iso2022_jp",
        "cp949",
        "euc_kr",
        "cp1250",
        "cp1251",
        "cp1253",
        "cp1254",
        "cp1255",
        "cp1256",
        "cp1257",
        "cp1258",
        "koi8-r",
        "koi8-u",
        "cp874",
        "iso8859-2",
        "iso8859-5",
        "iso8859-7",
        "iso8859-8",
        "iso8859-9",
        "utf-16",
        "utf-16-le",
        "utf-16-be",
    }
)
_error_count = [0, 0]  # errors in the last _decode call, start of the first one


def _count_and_replace(exc: UnicodeDecodeError):
    if not _error_count[0]:
        _error_count[1] = exc.start if exc.end == len(exc.object) else -1
    _error_count[0] += 1
    return "\ufffd", exc.end


codecs.register_error(_ERRORS, _count_and_replace)


# text codecs that still cannot decode arbitrary bytes (they raise whatever the error handler)
# or that are no charset of a web page
_NOT_A_CHARSET = frozenset({"idna", "punycode", "undefined", "unicode-escape", "raw-unicode-escape"})


def normalize_charset(label: str | None) -> str | None:
    """A Python codec name for a charset label (WHATWG-style aliases), None when unknown or when
    the label names no text encoding (base64, zlib, rot13, idna, ...: see the module docstring)."""
    if not label:
        return None
    label = label.strip().strip("\"'").lower()
    label = _CHARSET_ALIASES.get(label, label)
    try:
        info = codecs.lookup(label)
    except LookupError:
        return None
    # CodecInfo._is_text_encoding is how str.decode itself refuses bytes-to-bytes codecs
    if not getattr(info, "_is_text_encoding", True) or info.name in _NOT_A_CHARSET:
        return None
    return info.name


def meta_charset(payload: bytes) -> str | None:
    m = _META_CHARSET.search(payload[:4096])
    return m.group(1).decode("ascii").lower() if m else None


def _decode(payload: bytes, codec: str) -> tuple[str, int]:
    """Text and number of undecodable sequences (each became U+FFFD).

    A single bad sequence in the last 3 bytes is a character cut off by a truncated payload, not
    evidence against the codec, so it does not count. A codec that raises anyway (none of the
    accepted ones is known to) counts as failing on every byte, so the next candidate wins."""
    _error_count[0] = 0
    try:
        text = payload.decode(codec, _ERRORS)
    except (UnicodeError, LookupError, TypeError, ValueError):
        return "\ufffd", len(payload) + 1
    errors = _error_count[0]
    if errors == 1 and _error_count[1] >= max(len(payload) - 3, 0):
        errors = 0
    return text, errors


def _is_single_byte(codec: str) -> bool:
    return codec.startswith(("cp12", "iso8859", "koi8", "mac-", "cp874", "cp437", "cp85"))


def decode_payload(payload: bytes, http_charset: str | None, content_type: str = "") -> tuple[str, str, int]:
    """(text, encoding used, replacement characters in the text) for an HTTP/WARC payload."""
    for bom, codec in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if payload.startswith(bom):
            text, _ = _decode(payload, codec)
            return text, codec.replace("-sig", ""), text.count("\ufffd")
    declared = [c for c in (normalize_charset(http_charset), normalize_charset(meta_charset(payload))) if c]
    # a few bad sequences (0.5% of the non-ASCII bytes) do not make a label wrong
    tolerance = (len(payload) - len(payload.translate(None, _ASCII))) // 200
    best: tuple[str, str, int] | None = None
    for codec in dict.fromkeys(declared):
        text, errors = _decode(payload, codec)
        if errors <= tolerance:
            if _is_single_byte(codec) and not payload.isascii():
                utf8, utf8_errors = _decode(payload, "utf-8")
                if utf8_errors == 0:  # valid multi-byte UTF-8 under a single-byte label: the label is wrong
                    return utf8, "utf-8", utf8.count("\ufffd")
            return text, codec, text.count("\ufffd")
        if best is None or errors < best[2]:
            best = (text, codec, errors)
    text, errors = _decode(payload, "utf-8")
    if errors <= tolerance:
        return text, "utf-8", text.count("\ufffd")
    if best is None or errors < best[2]:
        best = (text, "utf-8", errors)
    guess = _detect_charset(payload)
    if guess:
        text, errors = _decode(payload, guess)
        if errors < best[2]:
            best = (text, guess, errors)
    if best[2] > tolerance and not declared:
        text, errors = _decode(payload, "cp1252")
        if errors < best[2]:
            best = (text, "cp1252", errors)
    return best[0], best[1], best[0].count("\ufffd")


def _detect_charset(payload: bytes) -> str | None:
    try:
        from charset_normalizer import from_bytes
    except ImportError:
        return None
    match = from_bytes(payload[:65536]).best()
    codec = normalize_charset(match.encoding) if match else None
    # on short or mostly-ASCII input charset_normalizer likes exotic code pages (cp775, cp1006
    # for French); trust it for the encodings the web actually uses, else fall back to cp1252
    return codec if codec in _DETECTABLE else None
