"""HTTP payload decoding: chunked transfer, content encodings, charsets."""

from __future__ import annotations

import gzip
import zlib
from collections import Counter

import brotli
import zstandard

from oreline.data.payload import dechunk, decode_payload, normalize_charset, parse_http


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
        "gzip": gzip.compress(html), "deflate": zlib.compress(html),
        "br": brotli.compress(html), "zstd": zstandard.ZstdCompressor().compress(html),
    }
    bodies_raw_deflate = raw_deflate.compress(html) + raw_deflate.flush()
    for enc, body in [*bodies.items(), ("deflate", bodies_raw_deflate)]:
        counts = Counter()
        block = f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: {enc}\r\n\r\n".encode() + body
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
