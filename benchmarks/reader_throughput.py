"""Records per second reading WARC files: oreline's reader vs fastwarc vs warcio, in one run.

The same files (the largest sample archives: the Servo captures, the Internet Archive 2008
crawl, pywb's IANA capture, the Common Crawl excerpts; `--files N` picks how many) are read
whole, every record type, by:

- framing (no HTTP parsing, no decoding: each record's block is read as bytes):
  fastwarc `ArchiveIterator(parse_http=False)` + `record.reader.read()`,
  warcio `ArchiveIterator` + `record.raw_stream.read()`,
  oreline `iter_records(record_types=())` (every block read and checked, no Record built);
- decoding (HTTP headers parsed, transfer and content encoding undone):
  warcio `content_stream().read()`, oreline `iter_records` with every record type (Record
  objects with de-chunked, decompressed payloads); fastwarc only parses the HTTP headers here
  (`parse_http=True, auto_decode="none"`): its decoding modes stop on the Servo captures.

Each configuration runs `--repeat` times over all files, interleaved, and the best time counts
(other processes share the machine). Figures: records/s and MB/s of file bytes, and oreline's
ratio to each peer. Record counts must agree, or the row says so.

A second table reads damaged copies of the Internet Archive sample (822 records, one gzip member
per record) and the plain Common Crawl WARC (13 records), damaged in the middle: records each
reader returns before it stops (or in all, for oreline, which skips the damage) and whether it
raised.

Run: .venv/bin/python benchmarks/reader_throughput.py [--files 8] [--repeat 3]
warcio is a dev dependency; fastwarc a runtime one. oreline inflates gzip with zlib-ng (a runtime
dependency); ORELINE_INFLATE=zlib runs it on CPython's zlib instead.

Measured on the development machine (2 cores shared with other work; see the commit messages for
the load): oreline's framing took 2.2-2.8x fastwarc's time before issue 19's throughput work, and
about 1.5-1.7x after it (1.3x fastwarc's instructions under valgrind, which load does not skew).
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from oreline.config import samples_dir
from oreline.data.read.inflate import ENGINE as INFLATE_ENGINE
from oreline.data.read.record import ReadReport
from oreline.data.read.warc import iter_records

EVERY = ("warcinfo", "response", "request", "revisit", "resource", "metadata", "conversion", "continuation")


def oreline_framing(path: Path) -> int:
    report = ReadReport()
    for _ in iter_records(path, report=report, record_types=()):
        pass
    return report.records


def oreline_decoding(path: Path) -> int:
    report = ReadReport()
    for _ in iter_records(path, report=report, record_types=EVERY):
        pass
    return report.records


def fastwarc_framing(path: Path) -> int:
    from fastwarc.warc import ArchiveIterator

    n = 0
    for rec in ArchiveIterator(str(path), parse_http=False, fsspec_args=False):
        rec.reader.read()
        n += 1
    return n


def fastwarc_decoding(path: Path) -> int:
    """HTTP headers parsed, body read as stored: fastwarc 2.0's auto_decode ("all", "content")
    stops the whole file with OSError ("Invalid chunk header") on the Servo captures, whose
    bodies are stored de-chunked under a kept Transfer-Encoding: chunked header."""
    from fastwarc.warc import ArchiveIterator

    n = 0
    for rec in ArchiveIterator(str(path), parse_http=True, auto_decode="none", fsspec_args=False):
        rec.reader.read()
        n += 1
    return n


def warcio_framing(path: Path) -> int:
    from warcio.archiveiterator import ArchiveIterator

    n = 0
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f, arc2warc=True):
            rec.raw_stream.read()
            n += 1
    return n


def warcio_decoding(path: Path) -> int:
    from warcio.archiveiterator import ArchiveIterator

    n = 0
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f, arc2warc=True):
            try:
                rec.content_stream().read()
            except AttributeError:  # warcio 1.8's brotli hook does not fit brotli >= 1.1: read as stored
                rec.raw_stream.read()
            n += 1
    return n


READERS: dict[str, dict[str, Callable[[Path], int]]] = {
    "framing": {"oreline": oreline_framing, "fastwarc": fastwarc_framing, "warcio": warcio_framing},
    "decoding": {"oreline": oreline_decoding, "fastwarc": fastwarc_decoding, "warcio": warcio_decoding},
}


def largest_archives(n: int) -> list[Path]:
    root = samples_dir() / "web-archives"
    files = [
        p
        for p in root.rglob("*")
        if p.is_file() and p.name.endswith((".warc", ".warc.gz")) and "edge-cases" not in str(p)
    ]
    by_size = sorted(files, key=lambda p: p.stat().st_size, reverse=True)
    plain = [p for p in by_size if p.name.endswith(".warc")][:1]  # and the largest uncompressed one
    return by_size[:n] + [p for p in plain if p not in by_size[:n]]


# -- damaged copies -----------------------------------------------------------------------------


def _bump_length(head: bytes, delta: int) -> bytes:
    return re.sub(
        rb"(?i)(\r\ncontent-length: *)(\d+)", lambda m: m[1] + str(int(m[2]) + delta).encode(), head, count=1
    )


def damaged_copies() -> list[tuple[str, bytes, int]]:
    """(label, bytes, intact record count) for each damage, from the embedded samples."""
    root = samples_dir() / "web-archives"
    ia = (root / "ia-blackbook-2008/IAH-20080430204825-00000-blackbook.warc.gz").read_bytes()
    cc = next((root / "commoncrawl-samples").glob("eugeneware-*.warc")).read_bytes()
    out = []
    report = ReadReport()
    starts = [r.offset for r in iter_records(io.BytesIO(ia), report=report, record_types=EVERY)]
    a, b = starts[411], starts[412]  # one member in the middle
    out.append(("IA: gzip member cut in half", ia[: (a + b) // 2] + ia[b:], len(starts) - 1))
    out.append(
        (
            "IA: 8 bytes flipped in a member",
            ia[: b - 40] + bytes(x ^ 0x5A for x in ia[b - 40 : b - 32]) + ia[b - 32 :],
            len(starts) - 1,
        )
    )
    out.append(("IA: flipped CRC", ia[: b - 8] + bytes([ia[b - 8] ^ 0xFF]) + ia[b - 7 :], len(starts) - 1))
    out.append(("IA: 64 garbage bytes between members", ia[:b] + bytes(range(32, 96)) + ia[b:], len(starts)))
    member = _bump_length(gzip.decompress(ia[a:b]), 100)
    out.append(("IA: Content-Length +100", ia[:a] + gzip.compress(member) + ia[b:], len(starts) - 1))
    report = ReadReport()
    starts = [r.offset for r in iter_records(io.BytesIO(cc), report=report, record_types=EVERY)]
    a = starts[len(starts) // 2]
    out.append(
        ("CC plain: 64 garbage bytes between records", cc[:a] + bytes(range(32, 96)) + cc[a:], len(starts))
    )
    end = cc.index(b"\r\n\r\n", a)
    for delta in (100, -100):
        out.append(
            (
                f"CC plain: Content-Length {delta:+d}",
                cc[:a] + _bump_length(cc[a:end], delta) + cc[end:],
                len(starts) - 1,
            )
        )
    return out


def recovered(fn: Callable[[bytes], int], data: bytes) -> str:
    try:
        return str(fn(data))
    except Exception as exc:  # the peers raise at the damage: say how many came before
        return f"{getattr(exc, 'records', '?')} + {type(exc).__name__}"


def _counting(it) -> int:
    n = 0
    try:
        for _ in it:
            n += 1
    except Exception as exc:
        exc.records = n
        raise
    return n


def recovery_table() -> None:
    from fastwarc.warc import ArchiveIterator as FastIterator
    from warcio.archiveiterator import ArchiveIterator as WarcioIterator

    def ore(data: bytes) -> int:
        return sum(1 for _ in iter_records(io.BytesIO(data), report=ReadReport(), record_types=EVERY))

    def fast(data: bytes) -> int:
        return _counting(r.reader.read() for r in FastIterator(io.BytesIO(data), parse_http=False))

    def warcio(data: bytes) -> int:
        return _counting(r.raw_stream.read() for r in WarcioIterator(io.BytesIO(data)))

    print()
    print(f"{'damaged copy':<44} {'intact':>6} {'oreline':>8} {'fastwarc':>18} {'warcio':>26}")
    for label, data, intact in damaged_copies():
        cells = [recovered(fn, data) for fn in (ore, fast, warcio)]
        print(f"{label:<44} {intact:>6} {cells[0]:>8} {cells[1]:>18} {cells[2]:>26}")
    print("(n + Error: n records, then the reader raised; warcio may also pass a record with wrong bytes on,")
    print(" warning 'Content-Length is invalid'; oreline drops that record and reads on)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files = largest_archives(args.files)
    nbytes = sum(p.stat().st_size for p in files)
    print(f"{len(files)} files, {nbytes / 1e6:.1f} MB (samples: {samples_dir()}), best of {args.repeat}")
    for p in files:
        print(f"  {p.stat().st_size / 1e6:6.2f} MB  {p.relative_to(samples_dir())}")
    best: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], int] = {}
    for _ in range(args.repeat):
        for mode, readers in READERS.items():
            for name, fn in readers.items():
                t0 = time.perf_counter()
                n = sum(fn(p) for p in files)
                dt = time.perf_counter() - t0
                best[mode, name] = min(dt, best.get((mode, name), dt))
                counts[mode, name] = n
    print()
    print(
        f"{'mode':<9} {'reader':<9} {'records':>8} {'seconds':>8} {'records/s':>10} {'MB/s':>7}  oreline vs it"
    )
    for mode, readers in READERS.items():
        ore = best[mode, "oreline"]
        for name in readers:
            dt, n = best[mode, name], counts[mode, name]
            ratio = "" if name == "oreline" else f"  {dt / ore:.2f}x"
            note = (
                ""
                if n == counts[mode, "oreline"]
                else f"  (record count differs: oreline {counts[mode, 'oreline']})"
            )
            print(
                f"{mode:<9} {name:<9} {n:>8} {dt:>8.3f} {n / dt:>10,.0f} {nbytes / 1e6 / dt:>7.1f}{ratio}{note}"
            )
    fw = best["framing", "fastwarc"]
    print()
    print(
        f"oreline framing takes {best['framing', 'oreline'] / fw:.2f}x fastwarc's raw framing time "
        f"(target: within 2x); oreline with decoding {best['decoding', 'oreline'] / fw:.2f}x."
    )
    print(
        f"(gzip members inflated by {INFLATE_ENGINE}, ORELINE_INFLATE=zlib for CPython's zlib; cpu count "
        f"{os.cpu_count()}, load average {os.getloadavg()[0]:.2f}: other processes inflate all figures alike)"
    )
    recovery_table()


if __name__ == "__main__":
    main()
