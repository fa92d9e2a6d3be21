"""read_gguf_metadata: a GGUF's metadata in bounded memory and time, regular files only (issue 32
item 10). gguf's own reader parsed a 60M-item metadata array item by item (minutes, 3.8 GB) and
blocked forever on a FIFO named model.gguf."""

from __future__ import annotations

import os
import struct
import threading
import time

import pytest

from oreline.errors import DataIntegrityError, InputError
from oreline.export.gguf import GGUF_MAX_ARRAY_ITEMS, read_gguf_metadata


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + payload


def _gguf(path, *kvs: bytes, tail: bytes = b"") -> None:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs) + tail)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    outcome: list = []

    def read() -> None:
        try:
            read_gguf_metadata(fifo)
        except InputError as exc:
            outcome.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # the old open() blocks until a writer comes: be one, so the thread ends
        with open(fifo, "wb"):
            pass
        pytest.fail("read_gguf_metadata blocked on a FIFO")
    assert outcome and "is a FIFO" in outcome[0]


def test_a_large_array_of_numbers_is_skipped_unread_and_the_scalars_after_it_are_read(tmp_path):
    items = 20_000_000  # a 20 MB file: seeking over it takes no time
    path = tmp_path / "big.gguf"
    with open(path, "wb") as fh:
        fh.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 3))
        fh.write(_kv("tokenizer.ggml.add_bos_token", 7, b"\x01"))
        fh.write(_kv("hostile.array", 9, struct.pack("<IQ", 0, items)))
        fh.truncate(fh.tell() + items)
        fh.seek(0, 2)
        fh.write(_kv("llama.context_length", 4, struct.pack("<I", 64)))
    t0 = time.perf_counter()
    meta = read_gguf_metadata(path)
    assert time.perf_counter() - t0 < 1.0
    assert meta == {
        "tokenizer.ggml.add_bos_token": True,
        "hostile.array": ("array", items),
        "llama.context_length": 64,
    }
    assert read_gguf_metadata(path, lambda k: k.startswith("llama.")) == {"llama.context_length": 64}


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (
            _kv("tokens", 9, struct.pack("<IQ", 8, GGUF_MAX_ARRAY_ITEMS + 1)),
            "a metadata array of 4,194,305 items",
        ),
        (_kv("name", 8, struct.pack("<Q", 1 << 40)), "a string of 1,099,511,627,776 bytes"),
        (_kv("numbers", 9, struct.pack("<IQ", 10, 1 << 40)), "truncated"),
    ],
)
def test_stated_counts_past_the_bounds_or_the_file_are_refused(tmp_path, payload, why):
    _gguf(tmp_path / "m.gguf", payload)
    with pytest.raises(DataIntegrityError, match=why):
        read_gguf_metadata(tmp_path / "m.gguf")
