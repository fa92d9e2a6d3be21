"""HTTP payload decoding: chunked transfer, content encodings, charsets."""

from __future__ import annotations

import gzip
import time
import zlib
from collections import Counter

import brotli
import pytest
import zstandard

from oreline.data.read.payload import (
    PayloadTooLarge,
    dechunk,
    decode_content,
    decode_payload,
    normalize_charset,
    parse_http,
)


def test_decode_payload_order():
    text = "Привет, мир"
    assert decode_payload(text.encode("cp1251"), "windows-1251") == (text, "cp1251", 0)
    meta = b'<html><head><meta http-equiv="Content-Type" content="text/html; charset=gbk"></head>'
    zh = "中文网页内容"
    got, enc, n = decode_payload(meta + zh.encode("gbk"), None)
    assert zh in got and enc == "gb18030" and n == 0
    # a single-byte label on valid multi-byte UTF-8 is a wrong label
    assert decode_payload("café déjà vu".encode(), "iso-8859-1")[:2] == ("café déjà vu", "utf-8")
    assert decode_payload("naïve".encode("cp1252"), None)[0] == "naïve"
    assert decode_payload(b"\xef\xbb\xbfbom text", "cp1251")[:2] == ("bom text", "utf-8")
    garbage, _, n = decode_payload(b"ok \xff\xfe\xfd" * 10, "utf-8")
    assert n == garbage.count("\ufffd")


def test_content_encodings_and_already_decoded_bodies():
    html = b"<html><body><p>hello encoded world</p></body></html>"
    raw_deflate = zlib.compressobj(wbits=-15)
    bodies = {
        "gzip": gzip.compress(html),
        "deflate": zlib.compress(html),
        "br": brotli.compress(html),
        "zstd": zstandard.ZstdCompressor().compress(html),
    }
    bodies_raw_deflate = raw_deflate.compress(html) + raw_deflate.flush()
    for enc, body in [*bodies.items(), ("deflate", bodies_raw_deflate)]:
        counts = Counter()
        block = (
            f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: {enc}\r\n\r\n".encode() + body
        )
        status, headers, payload = parse_http(block, counts)
        assert (status, payload) == (200, html), enc
        assert counts[f"content_encoding:{enc}"] == 1
    counts = Counter()
    block = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n" + html
    assert parse_http(block, counts)[2] == html  # stored decoded and de-chunked: kept as is, and counted
    assert counts == {"chunked_invalid_kept_raw": 1, "content_encoding_already_decoded:gzip": 1}


def test_dechunk():
    assert dechunk(b"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n") == b"Wikipedia"
    assert dechunk(b"4;ext=1\nWiki\n0\n\n") == b"Wiki"
    assert dechunk(b"<html>not chunked</html>") is None


def test_charset_labels():
    assert normalize_charset("GB2312") == "gb18030" and normalize_charset("gbk") == "gb18030"
    assert normalize_charset("ISO-8859-1") == "cp1252" and normalize_charset('"utf8"') == "utf-8"
    assert normalize_charset("no-such-charset") is None and normalize_charset(None) is None


def test_content_decoding_stops_at_the_limit():
    """A body that decodes past max_bytes raises PayloadTooLarge (the reader drops the record as
    read:too_large); before, br and zstd bodies were decoded whole and gzip silently cut."""
    html = b"<html><body><p>" + b"bounded " * 2_000 + b"</p></body></html>"
    bodies = {
        "gzip": gzip.compress(html),
        "br": brotli.compress(html),
        "zstd": zstandard.ZstdCompressor().compress(html),
    }
    for enc, body in bodies.items():
        assert decode_content(body, enc, len(html)) == html, enc
        with pytest.raises(PayloadTooLarge):
            decode_content(body, enc, len(html) - 1)
        block = f"HTTP/1.1 200 OK\r\nContent-Encoding: {enc}\r\n\r\n".encode() + body
        with pytest.raises(PayloadTooLarge):
            parse_http(block, Counter(), 1_000)
    # a brotli bomb: 256 MiB of zeros in a few KB, stopped at 1 MB without decoding the rest
    comp = brotli.Compressor(quality=1, lgwin=24)
    bomb = b"".join(comp.process(b"\0" * (16 << 20)) for _ in range(16)) + comp.finish()
    with pytest.raises(PayloadTooLarge):
        decode_content(bomb, "br", 1_000_000)


def test_labels_that_name_no_text_codec_fall_back_to_detection():
    text = "Crème brûlée, déjà vu."
    for label in ("rot13", "base64", "hex", "zlib", "bz2", "uu", "quopri", "idna", "punycode", "undefined"):
        assert normalize_charset(label) is None, label
        assert decode_payload(text.encode(), label)[:2] == (text, "utf-8"), label
        meta = f'<html><head><meta charset="{label}"></head><body>{text}</body></html>'.encode()
        assert text in decode_payload(meta, None)[0], label


def test_http_head_is_bounded_and_repeated_headers_joined():
    counts = Counter()
    flood = b"HTTP/1.1 200 OK\r\n" + b"X-Flood: abcdefgh\r\n" * 300_000 + b"\r\n<html>body</html>"
    start = time.perf_counter()
    status, headers, body = parse_http(flood, counts)
    assert time.perf_counter() - start < 2  # was quadratic: 2.6 MB of repeated headers took 20 s
    assert (status, body, counts["http_head_too_long"]) == (200, b"", 1)
    status, headers, body = parse_http(
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a\r\nset-cookie: b\r\n\r\nx", Counter()
    )
    assert headers["set-cookie"] == "a, b" and body == b"x"
