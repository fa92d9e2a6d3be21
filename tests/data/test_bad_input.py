"""Bad input never crashes a run and never disappears; other documents are unaffected.

Everything here goes end to end through `run_data`: random bytes, empty files, a file that is not
a WARC, invalid UTF-8, a 50 MB record, HTML nested 100,000 levels deep, a document of control
characters only, a truncated gzip, a JSONL file with broken lines. Each must show up in
stats.json (errors, drop reasons) or in the rejects, with a reason.
"""

from __future__ import annotations

import gzip
import json
import os
import uuid
import zipfile

import pyarrow.parquet as pq
import pytest

from oreline.config import load_config
from oreline.data.pipeline.run import run_data


def warc_response(
    payload: bytes,
    uri: str,
    content_type: str = "text/html; charset=utf-8",
    status: int = 200,
    record_id: str | None = None,
) -> bytes:
    """One WARC/1.0 response record holding an HTTP response (what a crawler writes)."""
    http = (
        f"HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    rid = record_id or f"urn:uuid:{uuid.uuid4()}"
    head = (
        "WARC/1.0\r\nWARC-Type: response\r\n"
        f"WARC-Record-ID: <{rid}>\r\nWARC-Target-URI: {uri}\r\nWARC-Date: 2024-01-01T00:00:00Z\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n"
    ).encode()
    return head + http + b"\r\n\r\n"


def write_warc(path, records: list[bytes], gz: bool = True) -> None:
    if gz:  # one gzip member per record, as Common Crawl does
        with open(path, "wb") as fh:
            for rec in records:
                fh.write(gzip.compress(rec))
    else:
        path.write_bytes(b"".join(records))


def prose_pages(samples, n: int) -> list[tuple[str, str]]:
    """n HTML pages of real English prose (Austen's Emma, from the samples), as (record id, html)."""
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as z:
        text = z.read("gutenberg/austen-emma.txt").decode("utf-8", "replace")
    paras = [p.replace("\n", " ").strip() for p in text.split("\n\n") if len(p) > 300]
    pages = []
    for k in range(n):
        body = "".join(f"<p>{p}</p>\n" for p in paras[k * 6 : (k + 1) * 6])
        html = f"<!doctype html><html><head><title>Emma {k}</title></head><body><article>{body}</article></body></html>"
        pages.append((f"urn:uuid:00000000-0000-0000-0000-{k:012d}", html))
    return pages


def _cfg(**extra):
    return load_config(None, ["data.langid.languages=['en']"] + [f"{k}={v}" for k, v in extra.items()])


def _table(folder):
    files = sorted(folder.glob("*.parquet"))
    return pq.read_table(files).to_pylist() if files else []


@pytest.fixture(scope="module")
def bad_run(samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    good = prose_pages(samples, 6)
    inputs = root / "in"
    inputs.mkdir()
    # the good pages alone: the reference for "other documents are unaffected"
    write_warc(
        inputs / "good.warc.gz",
        [
            warc_response(h.encode(), f"https://good.example/{i}", record_id=rid)
            for i, (rid, h) in enumerate(good)
        ],
    )
    # the same WARC twice (same record ids in two files): each document must come out once
    (inputs / "copy-of-good.warc.gz").write_bytes((inputs / "good.warc.gz").read_bytes())
    bad_ids = {
        "invalid_utf8": "urn:uuid:bad-0001",
        "control_chars": "urn:uuid:bad-0002",
        "deep_html": "urn:uuid:bad-0003",
        "huge": "urn:uuid:bad-0004",
        "not_found": "urn:uuid:bad-0005",
        "image": "urn:uuid:bad-0006",
    }
    deep = b"<html><body>" + b"<div>" * 100_000 + b"deep" + b"</div>" * 100_000 + b"</body></html>"
    invalid = b"<html><body><p>" + bytes(range(0x80, 0x100)) * 40 + b"</p></body></html>"
    controls = "".join(chr(c) for c in range(1, 32) if c not in (9, 10, 13)).encode() * 50
    mixed = [
        warc_response(good[0][1].encode(), "https://mixed.example/0", record_id="urn:uuid:mixed-good-0"),
        warc_response(invalid, "https://bad.example/utf8", record_id=bad_ids["invalid_utf8"]),
        warc_response(
            controls,
            "https://bad.example/ctrl",
            "text/plain; charset=utf-8",
            record_id=bad_ids["control_chars"],
        ),
        warc_response(deep, "https://bad.example/deep", record_id=bad_ids["deep_html"]),
        warc_response(b"x" * 50_000_100, "https://bad.example/huge", "text/plain", record_id=bad_ids["huge"]),
        warc_response(
            b"<html>gone</html>", "https://bad.example/404", status=404, record_id=bad_ids["not_found"]
        ),
        warc_response(
            b"\x89PNG\r\n\x1a\n" + os.urandom(500),
            "https://bad.example/png",
            "image/png",
            record_id=bad_ids["image"],
        ),
        warc_response(good[1][1].encode(), "https://mixed.example/1", record_id="urn:uuid:mixed-good-1"),
    ]
    write_warc(inputs / "mixed.warc.gz", mixed)
    (inputs / "random.warc").write_bytes(os.urandom(20_000))
    (inputs / "empty.warc.gz").write_bytes(b"")
    (inputs / "notes.wet").write_text("This is a plain note, not a WARC file at all.\n")
    whole = gzip.compress(b"".join(mixed[:2]))
    (inputs / "truncated.warc.gz").write_bytes(whole[: len(whole) // 2])
    (inputs / "lines.jsonl").write_text(
        json.dumps({"id": "j1", "text": "\x00\x01\x02"})
        + "\n{not json\n"
        + json.dumps([1, 2])
        + "\n"
        + json.dumps({"id": "j2", "body": "no text key"})
        + "\n"
    )
    (inputs / "photo.jpeg").write_bytes(os.urandom(100))

    cfg = _cfg()
    reference = run_data([str(inputs / "good.warc.gz")], root / "ref", cfg, workers=1)
    stats = run_data([str(inputs)], root / "out", cfg, workers=1)
    return root, inputs, stats, reference, bad_ids


def test_run_completes_and_reports_damaged_files(bad_run):
    root, inputs, stats, _, _ = bad_run
    assert (root / "out" / "_SUCCESS").is_file()
    errors = {os.path.basename(e["file"]): e["error"] for e in stats["errors"]}
    for name in ("random.warc", "empty.warc.gz", "notes.wet", "truncated.warc.gz"):
        assert name in errors, f"{name} damage not reported: {errors}"
    assert "empty" in errors["empty.warc.gz"]
    assert [u["file"] for u in stats["inputs"]["unknown"]] == [str(inputs / "photo.jpeg")]


def test_every_bad_record_is_rejected_with_a_reason(bad_run):
    root, _, stats, _, bad_ids = bad_run
    rejects = {r["id"]: r for r in _table(root / "out" / "rejects")}
    kept = {r["id"]: r for r in _table(root / "out" / "docs")}
    for what, rid in bad_ids.items():
        assert rid in rejects or rid in kept, f"{what} disappeared"
        if rid in rejects:
            assert rejects[rid]["reason"] and rejects[rid]["step"]
    assert rejects[bad_ids["huge"]]["reason"] == "read:too_large"
    assert rejects[bad_ids["not_found"]]["reason"] == "http:status_404"
    assert rejects[bad_ids["image"]]["reason"].startswith("http:content_type")
    assert rejects[bad_ids["control_chars"]]["reason"] == "normalize:empty"
    assert (
        bad_ids["deep_html"] in rejects
    )  # 'deep' is no document: extraction fails, times out or leaves nothing
    dropped = {r for st in stats["steps"] for r in st["dropped"]}
    assert {"read:bad_json", "read:not_an_object", "read:no_text", "normalize:empty"} <= dropped


def test_rejects_account_for_every_drop(bad_run):
    root, _, stats, _, _ = bad_run
    rejects = _table(root / "out" / "rejects")
    assert len(rejects) == sum(sum(st["dropped"].values()) for st in stats["steps"])
    assert all(r["step"] and r["reason"] and r["source_file"] for r in rejects)


def test_other_documents_are_unaffected(bad_run):
    root, _, _, reference, _ = bad_run
    ref = {r["id"]: r["text"] for r in _table(root / "ref" / "docs")}
    out = {r["id"]: r["text"] for r in _table(root / "out" / "docs")}
    assert reference["output"]["docs"] == len(ref) >= 4
    for doc_id, text in ref.items():
        assert out.get(doc_id) == text
    # the two good pages inside the damaged WARC repeat good pages 0 and 1: dedup keeps the originals
    kept_ids = set(out)
    assert "urn:uuid:mixed-good-0" not in kept_ids and "urn:uuid:mixed-good-1" not in kept_ids
    assert all(text.strip() for text in out.values())
    ids = [r["id"] for r in _table(root / "out" / "docs")]
    assert len(ids) == len(set(ids))  # the copied WARC's records are not kept twice
