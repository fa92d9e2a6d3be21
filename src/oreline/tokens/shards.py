"""The packed token shard format: a file that checks itself.

Layout (little-endian), every section 8-byte aligned so it can be memory-mapped directly:

    offset  size  field
    0       8     magic b"ORETOK\\0\\0"
    8       4     format version (1)
    12      4     token dtype code (1 = uint16, 2 = uint32)
    16      8     token count N
    24      8     document count D
    32      8     vocabulary size the tokens were written for
    40      8     byte offset of the document index
    48      32    tokenizer fingerprint (sha256, raw bytes)
    80      8     header checksum: first 8 bytes of sha256(header[0:80])
    88      40    reserved (zero)
    128     N*w   tokens (w = 2 or 4 bytes), each document [BOS] + tokens + [EOS]
    ...     pad   zero bytes up to a multiple of 8
    index   8*(D+1) uint64 document start offsets (in tokens), the last one = N

The file size is implied by the header, so a truncated file is detected without reading it;
the header checksum catches a corrupted header; the sha256 of the whole file is kept in the
manifest, written from the finished file at tokenize time and checked again by
`oreline tokens verify` (`verify_shard`), not at each training launch. uint16 holds vocabularies up to 65,536
ids (Llama-2 style 32k); larger vocabularies (Llama-3's 128k) use uint32.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np

from oreline.errors import DataIntegrityError, FingerprintMismatch
from oreline.io import file_sha256, open_nofollow, refuse_planted

MAGIC = b"ORETOK\0\0"
VERSION = 1
HEADER_SIZE = 128
HEADER_CHECKED = 88  # the header's fields and their checksum (the reserved bytes are not checked)
_FIELDS = struct.Struct("<8sIIQQQQ32s")  # 80 bytes, then the 8-byte checksum
DTYPES = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
FIX = "re-run oreline tokenize to rebuild the shards"


def dtype_code_for(vocab_size: int) -> int:
    return 1 if vocab_size <= 65_536 else 2


def _align8(n: int) -> int:
    return -(-n // 8) * 8


@dataclass(frozen=True, slots=True)
class ShardHeader:
    dtype_code: int
    tokens: int
    documents: int
    vocab_size: int
    index_offset: int
    fingerprint: str  # hex

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.dtype_code]

    @property
    def file_size(self) -> int:
        return self.index_offset + 8 * (self.documents + 1)

    def pack(self) -> bytes:
        body = _FIELDS.pack(
            MAGIC,
            VERSION,
            self.dtype_code,
            self.tokens,
            self.documents,
            self.vocab_size,
            self.index_offset,
            bytes.fromhex(self.fingerprint),
        )
        return body + hashlib.sha256(body).digest()[:8] + bytes(HEADER_SIZE - _FIELDS.size - 8)


def read_header(path: Path) -> ShardHeader:
    """Parse and check the header and the file size; raises DataIntegrityError naming the file."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise DataIntegrityError(
            f"token shard {path} is truncated ({size} bytes, header needs {HEADER_SIZE})", FIX
        )
    if raw[:8] != MAGIC:
        raise DataIntegrityError(
            f"{path} is not an oreline token shard (magic {raw[:8]!r}, expected {MAGIC!r})", FIX
        )
    body, checksum = raw[: _FIELDS.size], raw[_FIELDS.size : _FIELDS.size + 8]
    if hashlib.sha256(body).digest()[:8] != checksum:
        raise DataIntegrityError(f"token shard {path} has a corrupted header (checksum mismatch)", FIX)
    _, version, code, tokens, docs, vocab, index_offset, fp = _FIELDS.unpack(body)
    if version != VERSION:
        raise DataIntegrityError(
            f"token shard {path} has format version {version}, this oreline reads {VERSION}", FIX
        )
    if code not in DTYPES:
        raise DataIntegrityError(f"token shard {path} has unknown token dtype code {code}", FIX)
    header = ShardHeader(code, tokens, docs, vocab, index_offset, fp.hex())
    if index_offset != _align8(HEADER_SIZE + tokens * header.dtype.itemsize):
        raise DataIntegrityError(f"token shard {path} has an inconsistent index offset", FIX)
    if size != header.file_size:
        what = "truncated" if size < header.file_size else "longer than its header says"
        raise DataIntegrityError(
            f"token shard {path} is {what} ({size} bytes, header implies {header.file_size})", FIX
        )
    return header


class ShardWriter:
    """Streams documents into a shard under a temporary name; `close()` finalizes and renames.

    Tokens are appended as they come (memory holds one batch plus the document lengths); the
    header is written last, so a crashed writer never leaves a file that passes the checks.
    """

    def __init__(self, path: Path, fingerprint: str, vocab_size: int, bos_id: int, eos_id: int):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self.fingerprint = fingerprint
        self.vocab_size = vocab_size
        self.code = dtype_code_for(vocab_size)
        self.dtype = DTYPES[self.code]
        self.bos = np.array([bos_id], dtype=self.dtype)
        self.eos = np.array([eos_id], dtype=self.dtype)
        self.tokens = 0
        self.starts: list[int] = []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        refuse_planted(self.path)
        self.fh = open_nofollow(self.tmp)  # (closed in close()/abort()); never through a planted link
        self.fh.write(bytes(HEADER_SIZE))

    def add_documents(self, docs: list[list[int]]) -> None:
        """Append documents as [BOS] + ids + [EOS] each (ids without specials)."""
        if not docs:
            return
        lengths = np.fromiter((len(d) + 2 for d in docs), dtype=np.int64, count=len(docs))
        flat = np.empty(int(lengths.sum()), dtype=self.dtype)
        starts = np.zeros(len(docs), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        flat[starts] = self.bos[0]
        flat[starts + lengths - 1] = self.eos[0]
        body = np.fromiter(
            chain.from_iterable(docs), dtype=np.int64, count=int(lengths.sum()) - 2 * len(docs)
        )
        if body.size and (body.max() >= self.vocab_size or body.min() < 0):
            raise ValueError(f"token id {int(body.max())} outside vocabulary of {self.vocab_size}")
        mask = np.ones(flat.size, dtype=bool)
        mask[starts] = False
        mask[starts + lengths - 1] = False
        flat[mask] = body
        self.starts.extend((starts + self.tokens).tolist())
        self.tokens += flat.size
        self.fh.write(flat.tobytes())

    @property
    def documents(self) -> int:
        return len(self.starts)

    def close(self) -> ShardHeader:
        header = ShardHeader(
            self.code,
            self.tokens,
            len(self.starts),
            self.vocab_size,
            _align8(HEADER_SIZE + self.tokens * self.dtype.itemsize),
            self.fingerprint,
        )
        self.fh.write(bytes(header.index_offset - HEADER_SIZE - self.tokens * self.dtype.itemsize))
        self.fh.write(np.array(self.starts + [self.tokens], dtype="<u8").tobytes())
        self.fh.seek(0)
        self.fh.write(header.pack())
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.path)
        return header

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


@dataclass
class Shard:
    """An opened shard: `tokens` (N,) memory-mapped from the file, `offsets` (D+1,) read into memory."""

    path: Path
    header: ShardHeader
    tokens: np.ndarray
    offsets: np.ndarray

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def check_header(
    path: Path, tokenizer_fingerprint: str | None = None, entry: dict | None = None
) -> ShardHeader:
    """The checks that cost one 128-byte read: the file exists, its header (checksum, version,
    dtype, offsets), its size, its tokenizer fingerprint and (given its manifest entry) its counts."""
    path = Path(path)
    if not path.is_file():
        raise DataIntegrityError(f"token shard {path} is missing", FIX)
    header = read_header(path)
    if tokenizer_fingerprint is not None and header.fingerprint != tokenizer_fingerprint:
        raise FingerprintMismatch(
            f"token shard {path} was built with tokenizer {header.fingerprint[:12]}…, this run uses {tokenizer_fingerprint[:12]}…",
            "re-run oreline tokenize with the tokenizer in use",
        )
    if entry is not None:
        check_counts(path, header, entry)
    return header


def open_shard(path: Path, tokenizer_fingerprint: str | None = None, sha256: str | None = None) -> Shard:
    """Open and check a shard: header, size, tokenizer fingerprint, and (when given) the file sha256
    and every token id below the header's vocabulary size."""
    path = Path(path)
    header = check_header(path, tokenizer_fingerprint)
    if sha256 is not None:
        actual = file_sha256(path)
        if actual != sha256:
            raise DataIntegrityError(
                f"token shard {path} has sha256 {actual[:12]}…, the manifest says {sha256[:12]}…", FIX
            )
    tokens = (
        np.memmap(path, dtype=header.dtype, mode="r", offset=HEADER_SIZE, shape=(header.tokens,))
        if header.tokens
        else np.empty(0, header.dtype)
    )
    # The index is small (8 bytes per document): read it, so a shard holds one mapping (one file
    # descriptor) however many shards a corpus has.
    offsets = np.fromfile(path, dtype="<u8", count=header.documents + 1, offset=header.index_offset)
    if offsets[-1] != header.tokens or (header.documents and offsets[0] != 0):
        raise DataIntegrityError(
            f"token shard {path} has a document index that does not match its token count", FIX
        )
    # Every document is [BOS] + ids + [EOS]: its start offsets rise by 2 or more. An index that
    # falls back or jumps past the tokens would cut documents anywhere (8 bytes a document to check).
    steps = np.diff(offsets.astype(np.int64))
    if steps.size and int(steps.min()) < 2:
        bad = int(np.argmax(steps < 2))
        raise DataIntegrityError(
            f"token shard {path} has a broken document index: document {bad} starts at token "
            f"{int(offsets[bad])} and ends at {int(offsets[bad + 1])}",
            FIX,
        )
    if sha256 is not None and header.tokens:
        # The file was just read for its hash, so it is in the page cache: the max costs ~6% of
        # the hash (5 ms per 100 MB here). An id ≥ vocab_size would index past the embedding.
        check_ids(path, header, int(tokens.max()))
    return Shard(path, header, tokens, offsets)


def check_boundaries(shard: Shard, bos_id: int, eos_id: int) -> None:
    """DataIntegrityError unless every document of the shard starts with BOS and ends with EOS, the
    ids its manifest names (reads 2 tokens a document)."""
    if not shard.header.documents:
        return
    starts, ends = shard.offsets[:-1].astype(np.int64), shard.offsets[1:].astype(np.int64) - 1
    for where, ids, want, name in (
        (starts, shard.tokens[starts], bos_id, "BOS"),
        (ends, shard.tokens[ends], eos_id, "EOS"),
    ):
        wrong = np.flatnonzero(ids != want)
        if wrong.size:
            k = int(wrong[0])
            raise DataIntegrityError(
                f"token shard {shard.path}: document {k} has token {int(ids[k])} at {int(where[k])} where its "
                f"manifest's {name} id {want} belongs ({wrong.size} of {shard.header.documents} documents): "
                "the document index or the manifest's special ids do not fit the tokens",
                FIX,
            )


def verify_shard(
    path: Path, tokenizer_fingerprint: str, entry: dict, bos_id: int | None = None, eos_id: int | None = None
) -> ShardHeader:
    """The full check of one shard against its manifest entry: header, size, tokenizer, sha256 of
    the whole file, the document index and every token id, and with the manifest's special ids the
    BOS and EOS of every document. Reads the whole file once."""
    shard = open_shard(path, tokenizer_fingerprint, entry["sha256"])
    check_counts(shard.path, shard.header, entry)
    if bos_id is not None and eos_id is not None:
        check_boundaries(shard, bos_id, eos_id)
    return shard.header


def check_counts(path: Path, header: ShardHeader, entry: dict) -> None:
    """DataIntegrityError when a shard's header and its manifest entry disagree on its counts."""
    if header.tokens != entry["tokens"] or header.documents != entry["documents"]:
        raise DataIntegrityError(
            f"token shard {path} holds {header.tokens} tokens and {header.documents} documents, "
            f"the manifest says {entry['tokens']} and {entry['documents']}",
            FIX,
        )


def check_ids(path: Path, header: ShardHeader, max_id: int) -> None:
    """DataIntegrityError when a shard holds an id outside the vocabulary its header declares."""
    if max_id >= header.vocab_size:
        raise DataIntegrityError(
            f"token shard {path} holds token id {max_id}, outside its vocabulary of "
            f"{header.vocab_size} (ids 0..{header.vocab_size - 1}): no embedding row has it",
            FIX,
        )
