"""Hostile inputs (issue 21): peak memory and wall time of the real pipeline on each, under a cap.

Each case writes a small hostile input (a decompression bomb, a gap of blank lines, a page that
is slow or huge to parse, a charset label naming no text codec, ...) next to a few good
documents, runs `run_data` (or the token layer's JSONL reader) on it in a child process whose
address space is capped with RLIMIT_AS, and prints the input size, the child's peak RSS
(including the extraction child it started), the wall time and the outcome: whether the hostile
record was dropped with the expected reason while the good documents went through. The cases of
issue 32 (kind "call") run another command's function instead: `tokenizer train`, `train`,
`tokenize`, `eval`, `export`, `checkpoint verify` (forged sizes, planted checkpoints, a tokenizer
that panics) or `doctor run` + `report` (a FIFO, a huge GGUF array, a 1 GB metrics line). Where
the tree fails, the outcome says how: the exception that ended the child, or what the command did
instead of refusing.

    .venv/bin/python benchmarks/hostile_inputs.py [--cap-gib 3] [--timeout 120] [CASE ...]

For the numbers of an older tree, point PYTHONPATH at its `src` (the child imports whatever
`oreline` that finds). tests/data/test_hostile_inputs.py runs the same cases (`-m hostile`)
with a 1.5 GiB cap and asserts the outcome and a time bound; tests/test_hostile_bounds.py runs
the "call" cases so.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1 << 20
GiB = 1 << 30
BOMB_BYTES = 2 * GiB  # decoded size of every bomb (the tests use 1 GiB: enough to pass their cap)
BAD_CHARSETS = (
    "rot13",
    "base64",
    "hex",
    "zlib",
    "bz2",
    "uu",
    "quopri",
    "idna",
    "punycode",
    "undefined",
    "x-no-such-charset",
)

# ---------------------------------------------------------------------------------------------
# building blocks


def prose_paragraphs(n: int) -> list[str]:
    """n paragraphs of real English prose (Austen's Emma, from the samples)."""
    from oreline.config import samples_dir  # ORELINE_SAMPLES

    with zipfile.ZipFile(samples_dir() / "english-prose" / "nltk-gutenberg.zip") as z:
        text = z.read("gutenberg/austen-emma.txt").decode("utf-8", "replace")
    paras = [p.replace("\n", " ").strip() for p in text.split("\n\n") if len(p) > 300]
    if len(paras) < n:
        raise RuntimeError(f"only {len(paras)} long paragraphs in the sample, {n} wanted")
    return paras[:n]


def html_page(paragraphs: list[str], title: str) -> bytes:
    body = "".join(f"<p>{p}</p>\n" for p in paragraphs)
    return f"<!doctype html><html><head><title>{title}</title></head><body><article>{body}</article></body></html>".encode()


def good_pages(n: int, per_page: int = 3) -> list[bytes]:
    paras = prose_paragraphs(n * per_page)
    return [html_page(paras[k * per_page : (k + 1) * per_page], f"page {k}") for k in range(n)]


def warc_response(
    body: bytes,
    uri: str,
    http_headers: str = "Content-Type: text/html; charset=utf-8",
    record_id: str | None = None,
    warc_headers: str = "",
) -> bytes:
    """One WARC/1.0 response record holding an HTTP response."""
    http = f"HTTP/1.1 200 OK\r\n{http_headers}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    rid = record_id or f"urn:uuid:{uuid.uuid4()}"
    head = (
        f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <{rid}>\r\nWARC-Target-URI: {uri}\r\n"
        f"WARC-Date: 2024-01-01T00:00:00Z\r\n{warc_headers}Content-Type: application/http; msgtype=response\r\n"
        f"Content-Length: {len(http)}\r\n\r\n"
    ).encode()
    return head + http + b"\r\n\r\n"


def write_warc(path: Path, records: list[bytes]) -> Path:
    """One gzip member per record, as Common Crawl writes them."""
    with open(path, "wb") as fh:
        for rec in records:
            fh.write(gzip.compress(rec, 6))
    return path


def good_records(n: int, site: str) -> list[bytes]:
    return [warc_response(p, f"https://{site}.example/{k}") for k, p in enumerate(good_pages(n))]


def repeated_gzip(piece: bytes, times: int) -> bytes:
    """`piece` * times as gzip members (readers of .gz files read them all): cheap to build."""
    return gzip.compress(piece, 9) * times


def deflate_bomb(size: int, byte: bytes = b"a", piece: int = 16 * MiB) -> bytes:
    """One raw deflate stream of `size` bytes of `byte`, built by repeating a fully flushed
    block (identical after a full flush) instead of compressing gigabytes."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = byte * piece
    first = comp.compress(chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    return first + again * (size // piece - 1) + comp.flush()


def gzip_single_member_bomb(size: int) -> bytes:
    """One gzip member of `size` zero bytes; the CRC is left 0 (no reader that stops at a limit
    ever checks it, and an unbounded one runs out of memory before it gets there)."""
    return (
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
        + deflate_bomb(size, b"\0")
        + struct.pack("<II", 0, size % (1 << 32))
    )


def write_zip(path: Path, members: list[tuple[str, bytes, int, int]]) -> Path:
    """A zip of raw-deflated members (name, deflate stream, crc32, uncompressed size)."""
    local, central, offset = [], [], 0
    for name, data, crc, size in members:
        fname = name.encode()
        head = (
            struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(data), size, len(fname), 0)
            + fname
        )
        central.append(
            struct.pack(
                "<4s6H3L5H2L",
                b"PK\x01\x02",
                20,
                20,
                0,
                8,
                0,
                0,
                crc,
                len(data),
                size,
                len(fname),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + fname
        )
        local.append(head + data)
        offset += len(head) + len(data)
    cd = b"".join(central)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(cd), offset, 0)
    path.write_bytes(b"".join(local) + cd + end)
    return path


def raw_deflate(data: bytes) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    return comp.compress(data) + comp.flush()


def jsonl_bomb(path: Path, good: int) -> Path:
    """A .jsonl.gz whose first line is a 2 GiB JSON string (2 MB on disk), then good lines."""
    paras = prose_paragraphs(4 * good)
    lines = [
        json.dumps({"id": f"good-{k}", "text": "\n\n".join(paras[4 * k : 4 * k + 4])}) + "\n"
        for k in range(good)
    ]
    path.write_bytes(
        gzip.compress(b'{"id": "bomb", "text": "')
        + repeated_gzip(b"a" * (16 * MiB), BOMB_BYTES // (16 * MiB))
        + gzip.compress(b'"}\n' + "".join(lines).encode())
    )
    return path


# ---------------------------------------------------------------------------------------------
# the cases


@dataclass
class Case:
    name: str
    what: str  # the hostile part, in words
    make: Callable[[Path], list[Path]]
    expect_reason: str | None  # the drop reason the hostile record must get ("a|b": either)
    expect_docs: int = 0  # good documents that must come out (data) or be read (tokens)
    kind: str = "data"  # "data": run_data; "tokens": tokens.inputs.iter_texts
    overrides: list[str] = field(default_factory=list)
    max_seconds: float = 30.0  # time bound asserted by the tests (the child's wall time)
    max_rss_mb: float = 1000.0  # memory bound asserted by the tests (pipeline + extraction child)
    call: str | None = (
        None  # kind "call": the function of this module the child runs (inputs, out) -> summary
    )


def _bomb_warc(encoding: str) -> Callable[[Path], list[Path]]:
    def make(d: Path) -> list[Path]:
        if encoding == "br":
            import brotli

            comp = brotli.Compressor(quality=1, lgwin=24)
            body = (
                b"".join(comp.process(b"\0" * (16 * MiB)) for _ in range(BOMB_BYTES // (16 * MiB)))
                + comp.finish()
            )
        elif encoding == "zstd":
            import zstandard

            comp = zstandard.ZstdCompressor(level=1).compressobj()
            body = (
                b"".join(comp.compress(b"\0" * (16 * MiB)) for _ in range(BOMB_BYTES // (16 * MiB)))
                + comp.flush()
            )
        else:
            body = gzip_single_member_bomb(BOMB_BYTES)
        good = good_records(2, encoding)
        bomb = warc_response(
            body,
            "https://bomb.example/",
            f"Content-Type: text/html\r\nContent-Encoding: {encoding}",
            record_id="urn:uuid:bomb",
        )
        return [write_warc(d / f"{encoding}-bomb.warc.gz", [good[0], bomb, good[1]])]

    return make


def _blank_lines(size: int) -> Callable[[Path], list[Path]]:
    def make(d: Path) -> list[Path]:
        good = good_records(2, "gap")
        path = d / "blank-lines.warc.gz"
        path.write_bytes(
            gzip.compress(good[0]) + repeated_gzip(b"\n" * MiB, size // MiB) + gzip.compress(good[1])
        )
        return [path]

    return make


def _page(body: bytes, name: str) -> Callable[[Path], list[Path]]:
    def make(d: Path) -> list[Path]:
        good = good_records(2, name)
        page = warc_response(body, f"https://{name}.example/", record_id=f"urn:uuid:{name}")
        return [write_warc(d / f"{name}.warc.gz", [good[0], page, good[1]])]

    return make


def _header_flood(d: Path) -> list[Path]:
    good = good_records(2, "headers")
    flood = "\r\n".join(["X-Flood: abcdefgh"] * 600_000)  # 11 MB of HTTP headers with one name
    rec = warc_response(
        good_pages(1)[0],
        "https://headers.example/flood",
        f"Content-Type: text/html\r\n{flood}",
        record_id="urn:uuid:header-flood",
    )
    return [write_warc(d / "header-flood.warc.gz", [good[0], rec, good[1]])]


def _folded_warc_headers(d: Path) -> list[Path]:
    good = good_records(2, "folded")
    folded = "X-Folded: start\r\n" + "".join(f" {'f' * 60_000}\r\n" for _ in range(1_900))
    rec = warc_response(
        # page 3: page 2's kept lines hold two sentences ("Mr. Woodhouse" ends none), which C4 drops
        good_pages(4)[3],
        "https://folded.example/",
        warc_headers=folded,
        record_id="urn:uuid:folded",
    )
    return [write_warc(d / "folded.warc.gz", [good[0], rec, good[1]])]


def _charsets(d: Path) -> list[Path]:
    paras = prose_paragraphs(90 + len(BAD_CHARSETS))
    records = []
    for k, p in enumerate(paras):
        label = BAD_CHARSETS[k // 9] if k % 9 == 1 and k // 9 < len(BAD_CHARSETS) else "utf-8"
        records.append(
            warc_response(
                html_page([p], f"p{k}"),
                f"https://charset.example/{k}",
                f"Content-Type: text/html; charset={label}",
            )
        )
    return [write_warc(d / "charsets.warc.gz", records[:101])]


def _txt_gz(d: Path) -> list[Path]:
    (d / "bomb.txt.gz").write_bytes(repeated_gzip(b"a" * (16 * MiB), BOMB_BYTES // (16 * MiB)))
    (d / "good.txt").write_text("\n\n".join(prose_paragraphs(4)))
    return [d / "bomb.txt.gz", d / "good.txt"]


def _zip(d: Path) -> list[Path]:
    good = "\n\n".join(prose_paragraphs(4)).encode()
    size = BOMB_BYTES
    crc = 0
    for _ in range(size // (16 * MiB)):
        crc = zlib.crc32(b"a" * (16 * MiB), crc)
    return [
        write_zip(
            d / "bomb.zip",
            [
                ("bomb.txt", deflate_bomb(size), crc, size),
                ("good.txt", raw_deflate(good), zlib.crc32(good), len(good)),
            ],
        )
    ]


def _jsonl(d: Path) -> list[Path]:
    return [jsonl_bomb(d / "bomb.jsonl.gz", 3)]


CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case("br-bomb", "Content-Encoding: br body, 2 GiB decoded", _bomb_warc("br"), "read:too_large", 2),
        Case(
            "zstd-bomb", "Content-Encoding: zstd body, 2 GiB decoded", _bomb_warc("zstd"), "read:too_large", 2
        ),
        Case(
            "gzip-bomb", "Content-Encoding: gzip body, 2 GiB decoded", _bomb_warc("gzip"), "read:too_large", 2
        ),
        Case("blank-lines-1MiB", "1 MiB of newlines between two records", _blank_lines(MiB), None, 2),
        Case("blank-lines-64MiB", "64 MiB of newlines between two records", _blank_lines(64 * MiB), None, 2),
        Case("header-flood", "11 MB of repeated HTTP header lines", _header_flood, "read:empty_payload", 2),
        Case("folded-warc-header", "1,900 folded 60 KB WARC header lines", _folded_warc_headers, None, 3),
        Case(
            "html-p-48MB",
            "48 MB page of <p>x (12M elements)",
            # which limit comes first, 2 s or 512 MB, depends on the machine's speed
            _page(b"<html><body>" + b"<p>x" * 12_000_000, "p-tags"),
            "extract:timeout|extract:too_large",
            2,
            overrides=["data.extract.timeout_s=2", "data.extract.max_memory_mb=512"],
        ),
        Case(
            "html-attributes",
            "one element with 100,000 distinct attributes (690 KB)",
            _page(
                b"<html><body><p" + b"".join(b" a%d" % i for i in range(100_000)) + b">x</p></body></html>",
                "attrs",
            ),
            "extract:timeout",
            2,
            overrides=["data.extract.timeout_s=2", "data.extract.max_memory_mb=512"],
        ),
        Case(
            "charset-labels",
            f"101 records, {len(BAD_CHARSETS)} with charset={'/'.join(BAD_CHARSETS[:3])}/...",
            _charsets,
            None,
            0,
        ),
        Case("txt-gz-bomb", ".txt.gz of 2 MB holding 2 GiB", _txt_gz, "read:too_large", 1),
        Case("zip-bomb", ".zip member of 2 GiB (2 MB on disk) next to a good one", _zip, "read:too_large", 1),
        Case(
            "jsonl-gz-bomb", ".jsonl.gz whose first line is 2 GiB (2 MB on disk)", _jsonl, "read:too_large", 3
        ),
        Case(
            "tokens-jsonl-gz-bomb",
            "the same file read by the token layer",
            _jsonl,
            "too_large",
            3,
            kind="tokens",
        ),
    ]
}

# ---------------------------------------------------------------------------------------------
# issue 32 items 9-10: sizes that are the attacker's word, files that are not regular files, and
# unbounded readers. Each runs the real command's function in the capped child (kind "call", or
# "data" for the Parquet inputs of run_data).

WORD_CHARS = 10 * MiB  # the one "word" of tokenizer-long-word (the tests use 1 MiB)
GGUF_ARRAY_ITEMS = 60_000_000  # uint8 items of the GGUF metadata array (a 60 MB file)
METRICS_LINE_BYTES = GiB  # the one line of report-metrics-line
FORGED_MAX_SEQ_LEN = 10**12


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n >> 7:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        else:
            out.append(n)
            return bytes(out)


def understate_footer(path: Path, stated: int) -> None:
    """Rewrite the row group and column sizes in a Parquet footer as `stated` bytes, in place: each
    value's varint (Thrift compact, zigzag) becomes a same-length, non-minimal one of `stated`."""
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata.row_group(0)
    values = {md.total_byte_size} | {md.column(i).total_uncompressed_size for i in range(md.num_columns)}
    data = path.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - n : -8]
    for v in values:
        old = _varint(v << 1)  # zigzag of a positive i64
        new = _varint(stated << 1)
        assert len(new) <= len(old) and footer.count(old) == 1, (v, footer.count(old))
        padded = bytes(b | 0x80 for b in new) + b"\x80" * (len(old) - len(new) - 1) + b"\x00"
        footer = footer.replace(old, padded if len(new) < len(old) else new)
    path.write_bytes(data[: -8 - n] + footer + data[-8:])


def _good_parquet(d: Path, n: int = 2) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paras = prose_paragraphs(3 * n)
    texts = ["\n\n".join(paras[3 * k : 3 * k + 3]) for k in range(n)]
    pq.write_table(pa.table({"id": [f"good-{k}" for k in range(n)], "text": texts}), d / "good.parquet")
    return d / "good.parquet"


def _parquet_understated(d: Path) -> list[Path]:
    """100 rows of 10 MB in one row group (zstd, 1 MB pages: a 100 KB file), the footer saying 1 KB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = d / "understated.parquet"
    rows = 100
    table = pa.table({"id": [f"big-{k}" for k in range(rows)], "text": ["a" * (10 * MiB)] * rows})
    pq.write_table(table, path, compression="zstd", use_dictionary=False, row_group_size=rows)
    del table
    understate_footer(path, 1000)
    return [path, _good_parquet(d)]


def _parquet_dictionary(d: Path) -> list[Path]:
    """2,000 rows all naming one 1 MB dictionary entry: a 5 KB file whose footer honestly states
    1 MB (the dictionary) and whose rows decode to 2 GB. No Arrow schema is stored, so a reader
    gets plain strings unless it asks for dictionaries."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 2000
    text = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["b" * (1 << 20)]))
    table = pa.table({"id": [f"rep-{k}" for k in range(rows)], "text": text})
    pq.write_table(table, d / "dictionary.parquet", compression="zstd", store_schema=False)
    return [d / "dictionary.parquet", _good_parquet(d)]


def _prose_jsonl(path: Path, n: int = 60) -> Path:
    paras = prose_paragraphs(n)
    with open(path, "w", encoding="utf-8") as fh:
        for k, p in enumerate(paras):
            fh.write(json.dumps({"id": f"emma-{k}", "text": p}) + "\n")
    return path


def _long_word(d: Path) -> list[Path]:
    import random
    import string

    path = _prose_jsonl(d / "docs.jsonl")
    word = "".join(random.Random(0).choices(string.ascii_lowercase, k=WORD_CHARS))
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "word", "text": word}) + "\n")
    return [path]


def tokenizer_train(inputs: list[str], out: str) -> dict:
    """(child) `oreline tokenizer train` on the inputs, 512 tokens."""
    from oreline.config import TokenizerConfig
    from oreline.tokens.train_bpe import train_tokenizer

    stats = train_tokenizer(
        [Path(p) for p in inputs], Path(out) / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=0)
    )
    cut = stats.get("long_runs_cut", 0)
    return {"dropped": {"long_runs_cut": cut} if cut else {}, "docs": stats["train_docs"], "errors": []}


_TRAINED: dict[str, Path] = {}  # one small trained run per process, copied by the cases that need it


def _run_config(root: Path, **dotted):
    from oreline.config import config_from_dict, load_config, to_dict

    tree = to_dict(load_config())
    settings = {
        "run.runs_dir": str(root),
        "run.name": "run",
        "model.preset": "debug",
        "train.tokens": str(root / "tokens"),
        "train.tokenizer": str(root / "tokenizer"),
        "train.seq_len": 64,
        "train.micro_batch": 2,
        "train.steps": 2,
        "train.log_every": 1,
        "train.eval_every": 2,
        "train.eval_sequences": 2,
        "train.optim.warmup_steps": 1,
        "checkpoint.every": 2,
        "eval.max_new_tokens": 4,
        "eval.prompts": ["Emma"],
    } | dotted
    for key, value in settings.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return config_from_dict(tree)


def trained_run(d: Path) -> Path:
    """A copy under d of a real run (tokenizer, tokens, 2 training steps, a full checkpoint)."""
    import atexit
    import shutil

    if "root" not in _TRAINED:
        from oreline.config import TokenizeConfig, TokenizerConfig
        from oreline.tokens.tokenize import tokenize_corpus
        from oreline.tokens.train_bpe import train_tokenizer
        from oreline.train.loop import train

        root = Path(tempfile.mkdtemp(prefix="hostile-trained-"))
        atexit.register(shutil.rmtree, root, True)
        docs = _prose_jsonl(root / "docs.jsonl", 400)
        train_tokenizer([docs], root / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=5))
        tokenize_corpus(
            [docs], root / "tokenizer", root / "tokens", TokenizeConfig(val_fraction=0.1, workers=1)
        )
        with open(os.devnull, "w") as quiet:
            from rich.console import Console

            train(_run_config(root), resume="none", console=Console(file=quiet))
        _TRAINED["root"] = root
    dest = d / "trained"
    shutil.copytree(_TRAINED["root"], dest, symlinks=True)
    return dest


def _train_inputs(d: Path) -> list[Path]:
    root = trained_run(d)
    return [root]


def train_max_seq_len(inputs: list[str], out: str) -> dict:
    """(child) `oreline train` with model.max_seq_len = FORGED_MAX_SEQ_LEN: refused before allocating."""
    from oreline.errors import ConfigError
    from oreline.train.loop import train

    cfg = _run_config(Path(inputs[0]), **{"run.name": "long", "model.max_seq_len": FORGED_MAX_SEQ_LEN})
    try:
        with open(os.devnull, "w") as quiet:
            from rich.console import Console

            train(cfg, resume="none", console=Console(file=quiet))
    except ConfigError as exc:
        ok = "RoPE" in str(exc)
        return {"dropped": {"refused": 1} if ok else {}, "docs": 0, "errors": [] if ok else [str(exc)[:300]]}
    return {"dropped": {}, "docs": 0, "errors": ["trained with max_seq_len 10^12"]}


def _forge_meta(edit: Callable[[dict], None]) -> Callable[[Path], list[Path]]:
    """A trained run whose checkpoint meta.json's model_args are edited, checksums rewritten to
    match (anyone who can write the folder can do as much)."""

    def make(d: Path) -> list[Path]:
        from oreline.train.checkpoint.format import write_checksums

        root = trained_run(d)
        (ckpt,) = [p for p in (root / "run" / "checkpoints").iterdir() if p.name.startswith("step-")]
        meta = json.loads((ckpt / "meta.json").read_text())
        edit(meta["model_args"])
        (ckpt / "meta.json").write_text(json.dumps(meta))
        write_checksums(ckpt)
        return [ckpt]

    return make


def eval_checkpoint(inputs: list[str], out: str) -> dict:
    """(child) `oreline eval CHECKPOINT`: a forged meta.json is refused before the model is built."""
    from oreline.errors import OrelineError
    from oreline.eval.evaluate import evaluate_cli

    try:
        with open(os.devnull, "w") as quiet:
            from rich.console import Console

            evaluate_cli(Path(inputs[0]), out=Path(out) / "eval.json", console=Console(file=quiet))
    except OrelineError as exc:
        return {"dropped": {"refused": 1}, "docs": 0, "errors": [], "message": str(exc)[:300]}
    return {"dropped": {}, "docs": 0, "errors": ["evaluated a forged checkpoint"]}


def _run_with_export(d: Path, write: Callable[[Path], None]) -> Path:
    """A minimal run folder (config, one metrics record) with export/model.gguf made by `write`."""
    run = d / "run"
    (run / "export").mkdir(parents=True)
    (run / "config.toml").write_text('[run]\nname = "hostile"\n[train]\nseq_len = 64\n')
    (run / "metrics.jsonl").write_text(json.dumps({"type": "train", "step": 1, "loss": 5.0}) + "\n")
    (run / "tokens").mkdir()
    (run / "tokens" / "manifest.json").write_text(json.dumps({"bos_id": 1, "eos_id": 2}))
    write(run / "export" / "model.gguf")
    return run


def _gguf_fifo(d: Path) -> list[Path]:
    return [_run_with_export(d, lambda p: os.mkfifo(p))]


def _gguf_big_array(d: Path) -> list[Path]:
    """A GGUF (v3, no tensors) whose metadata holds a uint8 array of GGUF_ARRAY_ITEMS items."""

    def kv(key: str, kind: int, payload: bytes) -> bytes:
        return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + payload

    def write(path: Path) -> None:
        with open(path, "wb") as fh:
            fh.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 3))
            fh.write(kv("tokenizer.ggml.add_bos_token", 7, b"\x01"))
            fh.write(kv("llama.context_length", 4, struct.pack("<I", 64)))
            fh.write(kv("hostile.array", 9, struct.pack("<IQ", 0, GGUF_ARRAY_ITEMS)))
            block = b"\0" * (1 << 20)
            for start in range(0, GGUF_ARRAY_ITEMS, len(block)):
                fh.write(block[: min(len(block), GGUF_ARRAY_ITEMS - start)])

    return [_run_with_export(d, write)]


def _metrics_line(d: Path) -> list[Path]:
    """A run whose metrics.jsonl holds one METRICS_LINE_BYTES line (a JSON string) between two records."""
    run = _run_with_export(d, lambda p: None)
    with open(run / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"type": "train", "step": 2, "note": "')
        block = b"x" * (16 * MiB)
        for _ in range(METRICS_LINE_BYTES // len(block)):
            fh.write(block)
        fh.write(b'"}\n' + json.dumps({"type": "train", "step": 3, "loss": 4.0}).encode() + b"\n")
    return [run]


def doctor_and_report(inputs: list[str], out: str) -> dict:
    """(child) `oreline doctor run` and `oreline report` on the run folder."""
    from oreline.doctor.run import diagnose_run
    from oreline.report.html import render_report

    findings = diagnose_run(inputs[0])
    html = render_report(inputs[0])
    dropped = {}
    for f in findings:
        if f.check == "metrics_unreadable":
            dropped["metrics_unreadable"] = 1
        if f.check == "export_format":  # the GGUF was read (and judged), or refused as unreadable
            dropped["gguf_refused" if "unreadable" in f.evidence else "gguf_read"] = 1
    return {
        "dropped": dropped,
        "docs": 1 if "oreline report" in html else 0,  # the report was rendered
        "errors": [],
        "findings": [f"{f.check}: {f.evidence[:200]}" for f in findings],
    }


CASES.update(
    {
        c.name: c
        for c in [
            Case(
                "parquet-understated-footer",
                "Parquet row group of 1 GB (100 KB file), footer saying 1 KB",
                _parquet_understated,
                "read:too_large",
                2,
                overrides=["data.read.max_row_group_bytes=268435456"],
            ),
            Case(
                "parquet-dictionary-rows",
                "2,000 Parquet rows naming one 1 MB dictionary entry (5 KB file, 2 GB decoded)",
                _parquet_dictionary,
                "read:too_large",
                2,
                overrides=["data.read.max_record_bytes=100000"],
            ),
            Case(
                "tokenizer-long-word",
                "tokenizer train on prose plus one 10 MB word",
                _long_word,
                "long_runs_cut",
                60,
                kind="call",
                call="tokenizer_train",
                # cut into pieces, 10 MB of random letters cost what 10 MB of random short words cost
                # the trainer (measured in one process: 8-letter words 9.8 s and 1,153 MB RSS)
                max_seconds=120.0,
                max_rss_mb=1500.0,
            ),
            Case(
                "train-max-seq-len",
                "oreline train with model.max_seq_len=10^12",
                _train_inputs,
                "refused",
                kind="call",
                call="train_max_seq_len",
            ),
            Case(
                "eval-forged-vocab",
                "oreline eval of a checkpoint whose meta.json says vocab_size 2^30",
                _forge_meta(lambda a: a.update(vocab_size=1 << 30)),
                "refused",
                kind="call",
                call="eval_checkpoint",
            ),
            Case(
                "eval-forged-max-seq-len",
                "oreline eval of a checkpoint whose meta.json says max_seq_len 10^12",
                _forge_meta(lambda a: a.update(max_seq_len=FORGED_MAX_SEQ_LEN)),
                "refused",
                kind="call",
                call="eval_checkpoint",
            ),
            Case(
                "doctor-gguf-fifo",
                "doctor run + report on a run whose export/model.gguf is a FIFO",
                _gguf_fifo,
                "gguf_refused",
                1,
                kind="call",
                call="doctor_and_report",
            ),
            Case(
                "doctor-gguf-array",
                "doctor run + report on a GGUF holding a 60M-item metadata array",
                _gguf_big_array,
                "gguf_read",
                1,
                kind="call",
                call="doctor_and_report",
            ),
            Case(
                "report-metrics-line",
                "doctor run + report on a metrics.jsonl with one 1 GB line",
                _metrics_line,
                "metrics_unreadable",
                1,
                kind="call",
                call="doctor_and_report",
            ),
        ]
    }
)

# ---------------------------------------------------------------------------------------------
# issue 32 items 3, 4 and 11: a checkpoint index that alters torch's own objects, a checkpoint item
# behind DCP's zstd stream transform (a decompression bomb), a tokenizer whose regex makes Oniguruma
# give up. The builders are shared with the tests (tests/train/test_checkpoint_hostile.py and
# tests/tokens/test_bad_token_files.py load this file), so the table measures what they assert.

CKPT_BOMB_BYTES = BOMB_BYTES  # decoded size of the zstd item (the test uses 256 MiB)
EMBED = "model.model.embed_tokens.weight"  # the checkpoint item the planters replace


def _metadata(folder: Path):
    import pickle

    with open(folder / ".metadata", "rb") as fh:  # the benchmark's own, trusted file
        return pickle.load(fh)


def plant_zstd_item(folder: Path, decoded: int, fqn: str = EMBED) -> int:
    """The item `fqn` replaced by a zstd stream of `decoded` zero bytes, declared with DCP's
    `stream.zstd/1` transform (DCP's stock reader decodes it whole before torch.load). Its size.
    Checksums are left to the caller."""
    import pickle

    import zstandard
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    comp = zstandard.ZstdCompressor(level=1).compressobj()
    piece = 16 * MiB
    blob = b"".join(comp.compress(b"\0" * piece) for _ in range(decoded // piece)) + comp.flush()
    md = _metadata(folder)
    data = folder / "__0_0.distcp"
    offset = data.stat().st_size
    with open(data, "ab") as fh:
        fh.write(blob)
    for index in list(md.storage_data):
        if index.fqn == fqn:
            md.storage_data[index] = _StorageInfo("__0_0.distcp", offset, len(blob), ["stream.zstd/1"])
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return len(blob)


def pickle_str(text: str) -> bytes:
    """A BINUNICODE opcode pushing `text`."""
    return b"X" + len(text.encode()).to_bytes(4, "little") + text.encode()


MEM_FORMAT_ENCODING = b"ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n"
# each leaves the stack as it found it (BUILD, then POP): appended to a real index, the file still
# unpickles to that index, and verification and loading go on as if it were the original
METADATA_SIDE_EFFECTS = {
    # enum member TORCH_CONTIGUOUS_FORMAT (got by calling the enum, as DCP's pickles do) gets
    # _value_ = 7: every later save pickles its tensors' memory format as _MEM_FORMAT_ENCODING(7),
    # which no reader can load
    "enum-value": MEM_FORMAT_ENCODING + b"K\x00\x85R}" + pickle_str("_value_") + b"K\x07sb0",
    # _get_layout's __module__/__qualname__ (kept outside its __dict__) become posix.system: every
    # later pickle of torch.strided (each save's .metadata) then reads `posix.system("torch.strided")`
    "layout-qualname": b"ctorch.serialization\n_get_layout\nN}("
    + pickle_str("__module__")
    + pickle_str("posix")
    + pickle_str("__qualname__")
    + pickle_str("system")
    + b"u\x86b0",
}


def plant_metadata_side_effect(folder: Path, effect: str) -> None:
    """The checkpoint's real index, re-pickled with one of METADATA_SIDE_EFFECTS before its STOP."""
    import pickle

    data = pickle.dumps(_metadata(folder), protocol=2)
    (folder / ".metadata").write_bytes(data[:-1] + METADATA_SIDE_EFFECTS[effect] + b".")


def _planted_checkpoint(plant: Callable[[Path], object]) -> Callable[[Path], list[Path]]:
    """A trained run's checkpoint planted by `plant`, checksums rewritten to match (xxh3 is no secret)."""

    def make(d: Path) -> list[Path]:
        from oreline.train.checkpoint.format import write_checksums

        root = trained_run(d)
        (ckpt,) = [p for p in (root / "run" / "checkpoints").iterdir() if p.name.startswith("step-")]
        plant(ckpt)
        (ckpt / "checksums.json").unlink()
        write_checksums(ckpt)
        return [ckpt]

    return make


def _ckpt_outcome(ckpt: str, refused: Callable[[str], bool], run: Callable[[], object], what: str) -> dict:
    """(child) run one command on the planted checkpoint `ckpt`: refused (an OrelineError that
    `refused` recognises), or what it did instead (an error while loading, with the checkpoint's
    path left out of it; an exception of another kind ends the child: the outcome column says which)."""
    from oreline.errors import OrelineError

    try:
        result = run()
    except OrelineError as exc:
        message = " ".join(str(exc).split())
        if refused(message):
            return {"dropped": {"refused": 1}, "docs": 0, "errors": [], "message": message[:300]}
        short = message.replace(f"{ckpt}/", "").replace(ckpt, "CHECKPOINT")
        return {"dropped": {}, "docs": 0, "errors": [f"{what} failed while loading: {short[:120]}"]}
    return {"dropped": {}, "docs": 0, "errors": [f"{what} {result}"]}


def _verify(path: Path) -> tuple[int, str]:
    """`oreline checkpoint verify PATH`: its exit status and output."""
    import io

    from rich.console import Console

    from oreline.train.checkpoint.commands import verify_cli

    console = Console(record=True, width=250, file=io.StringIO())
    code = verify_cli(path, console)
    return code, " ".join(console.export_text().split())


def _zstd_refused(message: str) -> bool:
    return "stream.zstd/1" in message


def zstd_verify(inputs: list[str], out: str) -> dict:
    """(child) `oreline checkpoint verify` of the checkpoint with a stream.zstd/1 item."""
    code, text = _verify(Path(inputs[0]))
    if code == 1 and _zstd_refused(text):
        return {"dropped": {"refused": 1}, "docs": 0, "errors": [], "message": text[-300:]}
    return {"dropped": {}, "docs": 0, "errors": [f"verify passed it (exit {code})"]}


def zstd_eval(inputs: list[str], out: str) -> dict:
    """(child) `oreline eval` of the checkpoint with a stream.zstd/1 item."""
    from rich.console import Console

    from oreline.eval.evaluate import evaluate_cli

    def run() -> str:
        with open(os.devnull, "w") as quiet:
            evaluate_cli(Path(inputs[0]), out=Path(out) / "eval.json", batches=1, console=Console(file=quiet))
        return "evaluated it"

    return _ckpt_outcome(inputs[0], _zstd_refused, run, "eval")


def zstd_export(inputs: list[str], out: str) -> dict:
    """(child) `oreline export` of the checkpoint with a stream.zstd/1 item."""
    from rich.console import Console

    from oreline.export.hf import export_hf

    def run() -> str:
        with open(os.devnull, "w") as quiet:
            export_hf(Path(inputs[0]), Path(out) / "hf", console=Console(file=quiet))
        return "exported it"

    return _ckpt_outcome(inputs[0], _zstd_refused, run, "export")


def _torch_layout() -> str:
    import torch

    layout = torch.serialization._get_layout
    return f"{layout.__module__}.{layout.__qualname__}"


def metadata_side_effect_verify(inputs: list[str], out: str) -> dict:
    """(child) `oreline checkpoint verify` of a real index that renames torch's _get_layout to
    posix.system: refused, torch untouched; or passed, and the process's later saves would pickle
    torch.strided as a call of posix.system."""
    before = _torch_layout()
    code, text = _verify(Path(inputs[0]))
    after = _torch_layout()
    altered = [] if after == before else [f"_get_layout is now {after}"]
    if code == 1 and "refused setting the state of" in text and not altered:
        return {"dropped": {"refused": 1}, "docs": 0, "errors": [], "message": text[-300:]}
    return {"dropped": {}, "docs": 0, "errors": [f"verify exit {code}", *altered]}


def backtracking_tokenizer(src: Path, dest: Path) -> Path:
    """A copy of the tokenizer at src with a pre-tokenizer regex that backtracks exponentially:
    `(a+)+b` on a run of 40 a's not followed by b exhausts Oniguruma's retry limit, and tokenizers
    panics."""
    import shutil

    shutil.copytree(src, dest)
    file = dest / "tokenizer.json"
    config = json.loads(file.read_text(encoding="utf-8"))
    config["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated", "invert": False},
            config["pre_tokenizer"],
        ],
    }
    file.write_text(json.dumps(config), encoding="utf-8")
    return dest


def _panicking_tokenizer(d: Path) -> list[Path]:
    """60 prose documents with one `a`*40 + `c` among them, and a trained tokenizer made to backtrack."""
    from oreline.config import TokenizerConfig
    from oreline.tokens.train_bpe import train_tokenizer

    docs = _prose_jsonl(d / "docs.jsonl")
    train_tokenizer([docs], d / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=0))
    lines = docs.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(30, json.dumps({"id": "backtrack", "text": "a" * 40 + "c"}) + "\n")
    docs.write_text("".join(lines), encoding="utf-8")
    return [docs, backtracking_tokenizer(d / "tokenizer", d / "backtracking-tokenizer")]


def tokenize_docs(inputs: list[str], out: str) -> dict:
    """(child) `oreline tokenize DOCS -t TOKENIZER`, one worker."""
    from oreline.config import TokenizeConfig
    from oreline.tokens.tokenize import tokenize_corpus

    manifest = tokenize_corpus([inputs[0]], inputs[1], Path(out) / "tokens", TokenizeConfig(), workers=1)
    return {
        "dropped": dict(manifest.get("rejected", {})),
        "docs": sum(s["documents"] for s in manifest["shards"]),
        "errors": [],
    }


CASES.update(
    {
        c.name: c
        for c in [
            Case(
                "ckpt-metadata-alters-torch",
                "checkpoint verify of a real .metadata that also renames torch's _get_layout posix.system",
                _planted_checkpoint(lambda ckpt: plant_metadata_side_effect(ckpt, "layout-qualname")),
                "refused",
                kind="call",
                call="metadata_side_effect_verify",
            ),
            *(
                Case(
                    f"ckpt-zstd-{command}",
                    f"oreline {'checkpoint verify' if command == 'verify' else command} of a checkpoint "
                    f"item behind stream.zstd/1, {CKPT_BOMB_BYTES // GiB} GiB decoded",
                    _planted_checkpoint(lambda ckpt: plant_zstd_item(ckpt, CKPT_BOMB_BYTES)),
                    "refused",
                    kind="call",
                    call=f"zstd_{command}",
                )
                for command in ("verify", "eval", "export")
            ),
            Case(
                "tokenize-regex-panic",
                "oreline tokenize of 61 documents, one making the tokenizer's (a+)+b exhaust Oniguruma",
                _panicking_tokenizer,
                "encode_error",
                60,
                kind="call",
                call="tokenize_docs",
            ),
        ]
    }
)

# ---------------------------------------------------------------------------------------------
# issue 45 items 3, 6 and 8: a quality classifier's model.bin whose counts are the attacker's word,
# `eval --tasks` of a forged max_seq_len, a loader state's mixture weight that Fraction() would
# compute forever, and a task folder with one huge line.

FASTTEXT_MATRIX_ROWS = 1 << 26  # × dim 64 float32: the 16 GiB input matrix the 151-byte file states
TASK_LINE_BYTES = 2 * GiB  # the one line of task-long-line (the tests use 1 GiB)
FORGED_WEIGHT = "1e999999999"  # Fraction() of it computes 10^999999999


def fasttext_header(size: int, nwords: int, nlabels: int, bucket: int = 100_000, dim: int = 64) -> bytes:
    """A fastText 0.9 model's header: magic, version 12, the args of a supervised softmax model
    (oreline's defaults), and a dictionary header stating `size` entries."""
    args = struct.pack("<12id", dim, 5, 5, 1, 5, 2, 3, 3, bucket, 0, 0, 100, 1e-4)
    return struct.pack("<2i", 793712314, 12) + args + struct.pack("<3i2q", size, nwords, nlabels, 0, -1)


def _labels(*names: str) -> bytes:
    return b"".join(name.encode() + b"\0" + struct.pack("<qb", 1, 1) for name in names)


def fasttext_short_dictionary() -> bytes:
    """92 bytes: a dictionary that states two labels and ends there (fastText reads on at EOF)."""
    return fasttext_header(2, 0, 2)


def fasttext_matrix_bomb() -> bytes:
    """151 bytes: two labels, then a dense input matrix stated as 2^26 × 64 float32 (16 GiB), no data."""
    return (
        fasttext_header(2, 0, 2, bucket=FASTTEXT_MATRIX_ROWS)
        + _labels("__label__hq", "__label__lq")
        + b"\0"
        + struct.pack("<2q", FASTTEXT_MATRIX_ROWS, 64)
    )


def _classifier_folder(model: Callable[[], bytes]) -> Callable[[Path], list[Path]]:
    def make(d: Path) -> list[Path]:
        folder = d / "classifier"
        folder.mkdir()
        (folder / "model.bin").write_bytes(model())
        return [write_warc(d / "pages.warc.gz", good_records(2, "clf")), folder]

    return make


def data_with_classifier(inputs: list[str], out: str) -> dict:
    """(child) `oreline data WARC` with data.quality.classifier = the planted folder."""
    from oreline.config import Config
    from oreline.data.pipeline.run import run_data
    from oreline.errors import OrelineError

    cfg = Config.model_validate(
        {"data": {"quality": {"classifier": inputs[1]}, "langid": {"languages": ["en"]}}}
    )
    try:
        with open(os.devnull, "w") as quiet:
            from rich.console import Console

            run_data([inputs[0]], out, cfg, workers=1, console=Console(file=quiet))
    except OrelineError as exc:
        ok = "model.bin" in str(exc) and "fastText" in str(exc)
        message = " ".join(str(exc).split())[:300]
        return {"dropped": {"refused": 1} if ok else {}, "docs": 0, "errors": [] if ok else [message]}
    return {"dropped": {}, "docs": 0, "errors": ["the data run loaded the model"]}


def _forged_loader_state(d: Path) -> list[Path]:
    """A trained run whose checkpoint's loader state gives its one source the weight FORGED_WEIGHT."""
    from oreline.train.checkpoint.format import write_checksums

    root = trained_run(d)
    (ckpt,) = [p for p in (root / "run" / "checkpoints").iterdir() if p.name.startswith("step-")]
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["loader"]["phases"][0]["weights"][0][1] = FORGED_WEIGHT
    (ckpt / "meta.json").write_text(json.dumps(meta))
    (ckpt / "checksums.json").unlink()
    write_checksums(ckpt)
    return [root]


def resume_training(inputs: list[str], out: str) -> dict:
    """(child) `oreline train --resume auto` of the run, two steps on: the loader state is refused."""
    from oreline.errors import OrelineError
    from oreline.train.loop import train

    cfg = _run_config(Path(inputs[0]), **{"train.steps": 4})
    try:
        with open(os.devnull, "w") as quiet:
            from rich.console import Console

            # the copy moved the run: its paths, and two more steps, are the changes allowed
            moved = ["run.runs_dir", "train.steps", "train.tokenizer", "train.tokens"]
            train(cfg, resume="auto", allow_config_change=moved, console=Console(file=quiet))
    except OrelineError as exc:
        ok = "mixture weight" in str(exc)
        message = " ".join(str(exc).split())[:300]
        return {"dropped": {"refused": 1} if ok else {}, "docs": 0, "errors": [] if ok else [message]}
    return {"dropped": {}, "docs": 0, "errors": ["resumed with the forged weight"]}


def _task_long_line(d: Path) -> list[Path]:
    """A trained run's checkpoint and a task folder: 20 COPA items with one TASK_LINE_BYTES line among them."""
    root = trained_run(d)
    (ckpt,) = [p for p in (root / "run" / "checkpoints").iterdir() if p.name.startswith("step-")]
    from oreline.model.tasks import SHIPPED_DIR

    task = d / "long-task"
    task.mkdir()
    (task / "task.json").write_text(json.dumps({"name": "long", "kind": "multiple_choice"}))
    items = (SHIPPED_DIR / "copa" / "items.jsonl").read_bytes().splitlines(keepends=True)[:20]
    with open(task / "items.jsonl", "wb") as fh:
        fh.writelines(items[:10])
        fh.write(b'{"context": "')
        block = b"x" * (16 * MiB)
        for _ in range(TASK_LINE_BYTES // len(block)):
            fh.write(block)
        fh.write(b'", "choices": ["a", "b"], "gold": 0}\n')
        fh.writelines(items[10:])
    return [ckpt, task]


def eval_tasks(inputs: list[str], out: str) -> dict:
    """(child) `oreline eval CHECKPOINT --tasks FOLDER` (or copa): scored, or refused with an OrelineError."""
    from oreline.errors import OrelineError
    from oreline.eval.downstream import downstream_cli

    spec = inputs[1] if len(inputs) > 1 else "copa"
    try:
        result = downstream_cli(Path(inputs[0]), spec, out=Path(out) / "tasks.json", max_items=20)
    except OrelineError as exc:
        ok = "RoPE tables" in str(exc)  # the memory check's arithmetic
        message = " ".join(str(exc).split())[:300]
        return {"dropped": {"refused": 1} if ok else {}, "docs": 0, "errors": [] if ok else [message]}
    (name,) = result["tasks"]
    skipped = result["task_info"][name]["skipped"]
    return {
        "dropped": {"item_skipped": skipped} if skipped else {},
        "docs": result["tasks"][name]["items"],
        "errors": [],
    }


CASES.update(
    {
        c.name: c
        for c in [
            Case(
                "fasttext-short-dictionary",
                "oreline data with a 92-byte classifier model.bin whose dictionary ends early",
                _classifier_folder(fasttext_short_dictionary),
                "refused",
                kind="call",
                call="data_with_classifier",
            ),
            Case(
                "fasttext-matrix-16GiB",
                "oreline data with a 151-byte classifier model.bin stating a 2^26 × 64 input matrix",
                _classifier_folder(fasttext_matrix_bomb),
                "refused",
                kind="call",
                call="data_with_classifier",
            ),
            Case(
                "loader-state-fraction",
                f"oreline train --resume of a checkpoint whose loader state weighs its source {FORGED_WEIGHT!r}",
                _forged_loader_state,
                "refused",
                kind="call",
                call="resume_training",
                max_seconds=60.0,  # a resume's start-up (torch, the checkpoint): ~2 s warm, 43 s at load 27
            ),
            Case(
                "task-long-line",
                f"oreline eval --tasks FOLDER whose items.jsonl holds one {TASK_LINE_BYTES // GiB} GiB line among 20",
                _task_long_line,
                "item_skipped",
                20,
                kind="call",
                call="eval_tasks",
                max_seconds=60.0,
            ),
            Case(
                "eval-tasks-forged-max-seq-len",
                "oreline eval --tasks copa of a checkpoint whose meta.json says max_seq_len 10^12",
                _forge_meta(lambda a: a.update(max_seq_len=FORGED_MAX_SEQ_LEN)),
                "refused",
                kind="call",
                call="eval_tasks",
            ),
        ]
    }
)


# ---------------------------------------------------------------------------------------------
# running one case in a capped child


CHILD = r"""
import json, os, resource, sys
# Arrow's mimalloc reserves 1 GiB of address space on its first allocation (RSS stays ~0): under
# RLIMIT_AS that reservation, not memory, would fail the Parquet cases. 64 MiB arenas instead.
os.environ.setdefault("MIMALLOC_ARENA_RESERVE", "64MiB")
args = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (args["cap"], args["cap"]))
summary = {}
if args["kind"] == "data":
    from oreline.config import load_config
    from oreline.data.pipeline.run import run_data
    from oreline.config import Config
    def known(key):  # an older tree lacks newer keys: its run goes without them
        model = Config
        for part in key.split("."):
            field = model.model_fields.get(part)
            if field is None:
                return False
            model = field.annotation
        return True
    overrides = [o for o in args["overrides"] if known(o.split("=", 1)[0])]
    cfg = load_config(None, ["data.langid.languages=['en']"] + overrides)
    stats = run_data(args["inputs"], args["out"], cfg, workers=1)
    dropped = {}
    for step in stats["steps"]:
        for reason, n in step["dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + n
    read = stats["steps"][0]
    summary = {"dropped": dropped, "docs": stats["output"]["docs"], "errors": stats["errors"],
               "read_in": read["docs_in"], "read_out": read["docs_out"]}
elif args["kind"] == "call":  # a function of this module: (inputs, out) -> summary
    import importlib.util
    spec = importlib.util.spec_from_file_location("oreline_hostile_call", args["module"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    summary = getattr(module, args["call"])(args["inputs"], args["out"])
else:
    from pathlib import Path
    from oreline.tokens.inputs import Rejects, iter_texts
    rejects = Rejects()
    n = sum(1 for _ in iter_texts([Path(p) for p in args["inputs"]], rejects))
    summary = {"dropped": dict(rejects.counts), "docs": n, "errors": [], "read_in": n, "read_out": n}
with open(args["summary"], "w") as fh:
    json.dump(summary, fh)
"""


def _session_rss(session: int, peaks: dict[int, int]) -> None:
    """Update peaks[pid] with VmHWM (kB) of every live process of the session (the pipeline
    child and the extraction child it starts). Read from /proc while they run: the rusage of a
    child counts the RSS of the forked parent image before exec, so it cannot be used."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != session:  # field 6 of stat: the session id
                continue
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        peaks[int(entry)] = max(peaks.get(int(entry), 0), int(line.split()[1]))
                        break
        except (OSError, ValueError, IndexError):
            continue  # the process ended meanwhile


@dataclass
class Result:
    case: str
    input_bytes: int
    peak_rss_mb: float  # sum of the peaks of the pipeline process and its extraction child
    seconds: float
    cpu_seconds: float
    outcome: str  # "ok: ..." or what went wrong
    ok: bool
    summary: dict | None


def check(case: Case, summary: dict) -> tuple[bool, str]:
    dropped, problems = summary["dropped"], []
    found = [r for r in (case.expect_reason or "").split("|") if dropped.get(r, 0)]
    if case.expect_reason and not found:
        problems.append(f"no {case.expect_reason} (dropped: {dropped})")
    if summary["docs"] < case.expect_docs:
        problems.append(f"{summary['docs']} of {case.expect_docs} good documents")
    if case.name == "charset-labels" and summary["read_out"] != 101:
        problems.append(f"{summary['read_out']} of 101 records read")
    if summary["errors"]:
        problems.append(f"errors: {str(summary['errors'])[:200]}")
    if problems:
        return False, "; ".join(problems)
    return True, f"ok: {' '.join(found) or 'all records read'}, {summary['docs']} good docs"


def _input_bytes(path: Path) -> int:
    """Bytes of an input file, or of the regular files under an input folder (a run, a checkpoint)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


def run_case(case: Case, root: Path, cap_bytes: int, timeout_s: float, env: dict | None = None) -> Result:
    """Build the case's input under root and run it in a child capped at cap_bytes of address space."""
    inputs_dir, out = root / "in", root / "out"
    inputs_dir.mkdir(parents=True, exist_ok=True)
    inputs = case.make(inputs_dir)
    size = sum(_input_bytes(p) for p in inputs)
    args = {
        "cap": cap_bytes,
        "kind": case.kind,
        "inputs": [str(p) for p in inputs],
        "out": str(out),
        "overrides": case.overrides,
        "summary": str(root / "summary.json"),
        "call": case.call,
        "module": str(Path(__file__).resolve()),
    }
    log = open(root / "child.log", "wb")  # noqa: SIM115 - closed below; a pipe could fill and stall the child
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        stdout=log,
        stderr=log,
        start_new_session=True,
        env=env,
    )
    timed_out = False
    peaks: dict[int, int] = {}
    cpu0 = os.times()
    while True:
        _session_rss(proc.pid, peaks)  # a new session: its id is the child's pid
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t0 > timeout_s:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the child and its extraction child
            pid, status = os.waitpid(proc.pid, 0)
            break
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    cpu1 = os.times()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # an extraction child left behind
    log.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak = sum(peaks.values()) / 1024
    cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    summary = None
    if timed_out:
        ok, outcome = False, f"killed after {timeout_s:.0f} s"
    elif proc.returncode != 0:
        tail = (root / "child.log").read_bytes().decode("utf-8", "replace").strip().splitlines()[-1:]
        ok, outcome = False, f"exit {proc.returncode}: {tail[0][:120] if tail else ''}"
    else:
        summary = json.loads((root / "summary.json").read_text())
        ok, outcome = check(case, summary)
        if ok and seconds > case.max_seconds:
            ok, outcome = False, f"{outcome}, but {seconds:.0f} s (bound {case.max_seconds:.0f} s)"
        if ok and peak > case.max_rss_mb:
            ok, outcome = False, f"{outcome}, but {peak:.0f} MB (bound {case.max_rss_mb:.0f} MB)"
    return Result(case.name, size, peak, seconds, cpu, outcome, ok, summary)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"cases to run (default: all): {', '.join(CASES)}")
    ap.add_argument("--cap-gib", type=float, default=3.0, help="RLIMIT_AS of each child, GiB (default 3)")
    ap.add_argument(
        "--timeout", type=float, default=120.0, help="seconds before a child is killed (default 120)"
    )
    args = ap.parse_args()
    names = args.cases or list(CASES)
    print(
        f"python {sys.executable}; PYTHONPATH={os.environ.get('PYTHONPATH', '')}; cap {args.cap_gib} GiB, "
        f"timeout {args.timeout:.0f} s"
    )
    print(
        "| case | input | input bytes | peak RSS MB | wall s | CPU s | outcome |\n|---|---|---:|---:|---:|---:|---|"
    )
    for name in names:
        case = CASES[name]
        with tempfile.TemporaryDirectory(prefix=f"hostile-{name}-") as tmp:
            r = run_case(case, Path(tmp), int(args.cap_gib * GiB), args.timeout)
        print(
            f"| {name} | {case.what} | {r.input_bytes:,} | {r.peak_rss_mb:,.0f} | {r.seconds:.1f} | "
            f"{r.cpu_seconds:.1f} | {r.outcome} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
