"""Check a fastText model file (`.bin`, `.ftz`) against its own sizes before fastText loads it.

fastText's C++ loader (`FastText::loadModel`, fastText 0.9's src/fasttext.cc) believes every count
the file states. A dictionary that ends before its stated number of words makes
`Dictionary::load` call `in.get()` at end of file forever, appending char(-1) to a string until the
process runs out of memory; a matrix header that states m × n makes `DenseMatrix::load` allocate
m·n floats before reading any; a `maxn` above 0 with `bucket` 0 divides by zero (SIGFPE) while the
dictionary computes its subwords. A classifier folder is somebody else's file (a download, an
ablation's output on a shared disk), and every data worker loads it, so `check_model_file` walks
the whole layout first, in Python, without allocating anything the file does not hold:

    int32 magic 793712314, int32 version (11 or 12)
    args: int32 dim, ws, epoch, minCount, neg, wordNgrams, loss, model, bucket, minn, maxn,
          lrUpdateRate; float64 t
    dictionary: int32 size, nwords, nlabels; int64 ntokens, pruneidx_size;
          size × (NUL-terminated word, int64 count, int8 type 0 word / 1 label);
          max(pruneidx_size, 0) × (int32 hash, int32 row)
    bool quant_input; input matrix
    bool qout; output matrix (quantized only when quant_input and qout)
    dense matrix: int64 m, n; m·n float32
    quantized matrix: bool qnorm; int64 m, n; int32 codesize; codesize bytes; product quantizer
          (int32 dim, nsubq, dsub, lastdsub; dim·256 float32); with qnorm, m norm codes and a
          second product quantizer

Every count is checked against the bytes left before anything of that size is read or skipped,
the file must end where the output matrix ends, and the shapes must be the ones the dictionary
and the arguments imply (input rows nwords + bucket, or for a pruned model every pruned row
inside the matrix; output rows nlabels for a supervised model, nwords otherwise; columns dim),
so that no row fastText later looks up lies outside its matrix. The subwords fastText computes
per word at load time are bounded too (`MAX_SUBWORDS`). The file is read through mmap: the walk
costs page cache, not process memory, and a FIFO or device named model.bin is refused unread.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from oreline.errors import InputError

MAGIC = 793712314
VERSIONS = (11, 12)  # fastText 0.9 writes 12 and still reads 11
KSUB = 256  # centroids per sub-quantizer (ProductQuantizer's ksub_, fixed by its 8-bit codes)
LOSSES = {1: "hs", 2: "ns", 3: "softmax", 4: "ova"}
MODELS = {1: "cbow", 2: "sg", 3: "sup"}
# Subword ids fastText computes and keeps while loading (Dictionary::initNgrams): a word of L
# bytes yields at most (L + 2)·(maxn - minn + 1) n-grams. 100M of them (400 MB of int32) is far
# beyond any real model (a supervised one has maxn 0: none) and keeps the load bounded.
MAX_SUBWORDS = 100_000_000
ARGS = struct.Struct("<12id")
DICT_HEAD = struct.Struct("<3i2q")
ENTRY_TAIL = struct.Struct("<qb")
HINT = "retrain it with `oreline quality train-classifier` (or fetch it again from its source)"


class _Reader:
    """Sequential reads from the mapped file, each checked against the bytes left."""

    def __init__(self, data: Any, path: Path):
        self.data, self.pos, self.size, self.path = data, 0, len(data), path

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.path} is not a usable fastText model: {what}", HINT)

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(
                f"{what} needs {n:,} bytes at offset {self.pos:,}, the file holds {self.size - self.pos:,} more"
            )

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        self.need(fmt.size, what)
        values = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return values

    def int32(self, what: str) -> int:
        return self.unpack(struct.Struct("<i"), what)[0]

    def int64(self, what: str) -> int:
        return self.unpack(struct.Struct("<q"), what)[0]

    def flag(self, what: str) -> bool:
        (value,) = self.unpack(struct.Struct("<B"), what)
        if value > 1:
            raise self.fail(f"{what} is {value}, not a bool (0 or 1)")
        return bool(value)

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n


def _dense(r: _Reader, what: str) -> tuple[int, int]:
    m, n = r.int64(f"the {what} matrix's rows"), r.int64(f"the {what} matrix's columns")
    if m < 0 or n < 0:
        raise r.fail(f"the {what} matrix states {m} × {n}")
    r.skip(m * n * 4, f"the {what} matrix ({m:,} × {n:,} float32)")
    return m, n


def _quantizer(r: _Reader, what: str) -> int:
    dim, nsubq, dsub, lastdsub = (r.int32(f"the {what} quantizer's sizes") for _ in range(4))
    if min(dim, nsubq, dsub, lastdsub) < 1 or (nsubq - 1) * dsub + lastdsub != dim or lastdsub > dsub:
        raise r.fail(
            f"the {what} quantizer states dim {dim}, {nsubq} subquantizers of {dsub} ({lastdsub} last)"
        )
    r.skip(dim * KSUB * 4, f"the {what} quantizer's centroids ({dim:,} × {KSUB} float32)")
    return nsubq


def _quantized(r: _Reader, what: str) -> tuple[int, int]:
    qnorm = r.flag(f"the {what} matrix's qnorm")
    m, n = r.int64(f"the {what} matrix's rows"), r.int64(f"the {what} matrix's columns")
    codesize = r.int32(f"the {what} matrix's code size")
    if m < 0 or n < 0 or codesize < 0:
        raise r.fail(f"the quantized {what} matrix states {m} × {n}, {codesize} code bytes")
    r.skip(codesize, f"the {what} matrix's codes")
    nsubq = _quantizer(r, what)
    if codesize != m * nsubq:  # every row's codes are looked up (QuantMatrix::addToVector)
        raise r.fail(f"the {what} matrix holds {codesize:,} code bytes for {m:,} rows of {nsubq} codes")
    if qnorm:
        r.skip(m, f"the {what} matrix's norm codes")
        if _quantizer(r, f"{what} norm") != 1:
            raise r.fail(f"the {what} norm quantizer has more than one subquantizer")
    return m, n


def check_model_file(path: str | Path) -> dict[str, Any]:
    """Walk a fastText model file (module docstring) and return what it holds; InputError naming
    the file and the first inconsistency when any count or shape does not fit the file."""
    from oreline.io import open_regular

    path = Path(path)
    with open_regular(path) as fh:
        if fh.seek(0, 2) == 0:
            raise InputError(f"{path} is empty, not a fastText model", HINT)
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _walk(_Reader(data, path))


def _walk(r: _Reader) -> dict[str, Any]:
    magic, version = r.unpack(struct.Struct("<2i"), "the header")
    if magic != MAGIC:
        raise r.fail(f"magic {magic}, not fastText's {MAGIC}")
    if version not in VERSIONS:
        raise r.fail(f"version {version}, fastText 0.9 reads {VERSIONS}")
    dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr_rate, _t = r.unpack(
        ARGS, "the arguments"
    )
    if loss not in LOSSES or model not in MODELS:
        raise r.fail(f"loss {loss} / model {model} are not fastText's ({LOSSES}, {MODELS})")
    if version == 11 and MODELS[model] == "sup":
        maxn = 0  # what fastText does for version 11 supervised models
    if dim < 1 or bucket < 0 or minn < 0 or maxn < 0:
        raise r.fail(f"dim {dim}, bucket {bucket}, minn {minn}, maxn {maxn}")
    if bucket == 0 and (maxn > 0 or word_ngrams > 1):  # n-gram hashes are taken modulo bucket
        raise r.fail(f"bucket 0 with maxn {maxn} / wordNgrams {word_ngrams} (a division by zero)")
    size, nwords, nlabels, _ntokens, pruneidx_size = r.unpack(DICT_HEAD, "the dictionary's header")
    if min(size, nwords, nlabels) < 0 or size != nwords + nlabels:
        raise r.fail(f"the dictionary states {size} entries, {nwords} words and {nlabels} labels")
    # each entry takes at least 10 bytes (an empty word's NUL, count, type): checked before the loop
    r.need(size * (1 + ENTRY_TAIL.size), f"the dictionary's {size:,} entries")
    types = [0, 0]
    ngram_span = max(0, maxn - max(minn, 1) + 1)
    subwords = 0
    for i in range(size):
        end = r.data.find(b"\0", r.pos)
        if end < 0:
            raise r.fail(
                f"dictionary entry {i:,} of {size:,} has no terminating NUL before the end of the file"
            )
        length = end - r.pos
        r.pos = end + 1
        _count, kind = r.unpack(ENTRY_TAIL, f"dictionary entry {i:,}")
        if kind not in (0, 1):
            raise r.fail(f"dictionary entry {i:,} has type {kind}, not 0 (word) or 1 (label)")
        if kind == 1 and i < nwords or kind == 0 and i >= nwords:  # fastText finds labels at index ≥ nwords
            raise r.fail(
                f"dictionary entry {i:,} is a {('word', 'label')[kind]} among the {('labels', 'words')[kind]}"
            )
        types[kind] += 1
        subwords += (length + 2) * ngram_span if kind == 0 else 0
    if subwords > MAX_SUBWORDS:
        raise r.fail(
            f"its words yield up to {subwords:,} subwords (minn {minn}, maxn {maxn}), over {MAX_SUBWORDS:,}"
        )
    pruned_rows: list[int] = []
    if pruneidx_size > 0:
        r.need(pruneidx_size * 8, f"the dictionary's {pruneidx_size:,} pruned n-grams")
        rows = struct.unpack_from(f"<{2 * pruneidx_size}i", r.data, r.pos)
        r.pos += pruneidx_size * 8
        pruned_rows = list(rows[1::2])
    quant_input = r.flag("the input matrix's quantization flag")
    m_in, n_in = (_quantized if quant_input else _dense)(r, "input")
    qout = r.flag("the output matrix's quantization flag")
    m_out, n_out = (_quantized if quant_input and qout else _dense)(r, "output")
    if r.pos != r.size:
        raise r.fail(f"{r.size - r.pos:,} bytes follow the output matrix (a model ends there)")
    if n_in != dim or n_out != dim:
        raise r.fail(f"its matrices have {n_in} and {n_out} columns, its dim is {dim}")
    if pruneidx_size >= 0:  # a pruned (quantized) model: its n-gram rows follow the words'
        if not quant_input:
            raise r.fail("a pruned dictionary with a dense input matrix (fastText refuses those)")
        if m_in < nwords or any(not 0 <= row < m_in - nwords for row in pruned_rows):
            raise r.fail(f"pruned n-gram rows fall outside the input matrix's {m_in:,} rows")
    elif m_in != nwords + bucket:
        raise r.fail(
            f"its input matrix has {m_in:,} rows, its {nwords:,} words and {bucket:,} buckets need that many"
        )
    want_out = nlabels if MODELS[model] == "sup" else nwords
    if m_out != want_out:
        raise r.fail(
            f"its output matrix has {m_out:,} rows, a {MODELS[model]} model of it needs {want_out:,}"
        )
    return {
        "version": version,
        "dim": dim,
        "model": MODELS[model],
        "loss": LOSSES[loss],
        "words": nwords,
        "labels": nlabels,
        "quantized": quant_input,
        "input_rows": m_in,
        "bytes": r.size,
    }
