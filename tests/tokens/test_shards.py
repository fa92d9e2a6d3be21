"""The token shard format: round trip in both dtypes and every self-check failing loudly."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from oreline.errors import DataIntegrityError, FingerprintMismatch
from oreline.io import file_sha256
from oreline.tokens import shards as fmt

FP = hashlib.sha256(b"tokenizer").hexdigest()
OTHER_FP = hashlib.sha256(b"another tokenizer").hexdigest()


def _write(path, docs, vocab_size=1024):
    w = fmt.ShardWriter(path, FP, vocab_size, bos_id=1, eos_id=2)
    for i in range(0, len(docs), 2):  # several add calls: offsets must continue across calls
        w.add_documents(docs[i : i + 2])
    return w.close()


@pytest.mark.parametrize(
    "vocab_size, dtype", [(1024, np.uint16), (65_536, np.uint16), (65_537, np.uint32), (128_256, np.uint32)]
)
def test_round_trip_and_dtype(tmp_path, vocab_size, dtype):
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, vocab_size, size=n).tolist() for n in (5, 0, 17, 1, 300)]
    docs[2][-1] = vocab_size - 1  # the largest id must survive the chosen dtype
    header = _write(tmp_path / "s.tok", docs, vocab_size)
    shard = fmt.open_shard(tmp_path / "s.tok", FP, file_sha256(tmp_path / "s.tok"))
    assert shard.tokens.dtype == dtype and header.documents == 5
    assert header.tokens == sum(len(d) + 2 for d in docs) == len(shard.tokens)
    for i, d in enumerate(docs):
        assert shard.document(i).tolist() == [1] + d + [2]
    assert (tmp_path / "s.tok").stat().st_size == header.file_size
    assert int(shard.tokens.max()) == vocab_size - 1


def test_id_outside_vocabulary_is_refused(tmp_path):
    w = fmt.ShardWriter(tmp_path / "s.tok", FP, 100, 1, 2)
    with pytest.raises(ValueError, match="outside vocabulary"):
        w.add_documents([[5, 100]])
    w.abort()
    assert not list(tmp_path.iterdir())


@pytest.fixture()
def shard_path(tmp_path):
    path = tmp_path / "train-x.tok"
    _write(path, [[5, 6, 7], [8, 9], list(range(10, 60))])
    return path


def test_truncated_shard(shard_path):
    data = shard_path.read_bytes()
    shard_path.write_bytes(data[:-3])
    with pytest.raises(DataIntegrityError, match=r"truncated.*re-run oreline tokenize") as err:
        fmt.open_shard(shard_path)
    assert str(shard_path) in str(err.value)
    shard_path.write_bytes(data[:50])
    with pytest.raises(DataIntegrityError, match="truncated"):
        fmt.open_shard(shard_path)


def test_bad_magic(shard_path):
    data = bytearray(shard_path.read_bytes())
    data[:8] = b"GARBAGE!"
    shard_path.write_bytes(bytes(data))
    with pytest.raises(DataIntegrityError, match="not an oreline token shard"):
        fmt.open_shard(shard_path)


def test_header_checksum_mismatch(shard_path):
    data = bytearray(shard_path.read_bytes())
    data[16] ^= 0x01  # token count: the size check would also fire, the checksum must fire first
    shard_path.write_bytes(bytes(data))
    with pytest.raises(DataIntegrityError, match="checksum"):
        fmt.open_shard(shard_path)


def test_payload_corruption_is_caught_by_sha256(shard_path):
    good = file_sha256(shard_path)
    data = bytearray(shard_path.read_bytes())
    data[fmt.HEADER_SIZE + 2] ^= 0xFF
    shard_path.write_bytes(bytes(data))
    fmt.open_shard(shard_path, FP)  # header-only checks cannot see a payload bit flip ...
    with pytest.raises(DataIntegrityError, match="sha256"):
        fmt.open_shard(shard_path, FP, good)  # ... the manifest checksum does


def test_tokenizer_fingerprint_mismatch(shard_path):
    with pytest.raises(FingerprintMismatch, match=r"built with tokenizer .* re-run oreline tokenize"):
        fmt.open_shard(shard_path, OTHER_FP)


def test_unfinished_writer_leaves_no_shard(tmp_path):
    w = fmt.ShardWriter(tmp_path / "s.tok", FP, 1024, 1, 2)
    w.add_documents([[4, 5]])
    assert not (tmp_path / "s.tok").exists()  # only the hidden temporary exists until close()
    w.abort()
    assert list(tmp_path.iterdir()) == []
