"""Deterministic, resumable batch loader over packed token shards.

The shards of one split, in manifest order, form one token stream (documents back to back,
each `[BOS] ... [EOS]`). Sequence i is stream[i*T : i*T + T + 1] (T = seq_len; the +1 is the
shift between inputs and labels), so there are (N - 1) // T sequences and consecutive ones
share one boundary token. Shards are memory-mapped; a sequence that spans two shards is
stitched from both.

Global order: epoch e visits all sequences in the order of a seeded bijection of [0, n)
computed per position (`tokens/order.py`: a Feistel network with cycle-walking, keyed by seed
and epoch), never a materialised permutation, so the loader's memory is O(shards) and not
O(sequences). The only state is `consumed` (sequences of the global order handed out so far, over
all ranks); epoch = consumed // num_sequences. Each `next_batch()` takes the next
micro_batch * world_size sequences of the global order (crossing into the next epoch when one
ends) and rank r keeps slice [r*micro_batch, (r+1)*micro_batch). Therefore the union over ranks
of one step equals the single-rank global batch, with no overlap and no gap, and a run resumed
at another world size with the same global batch continues the very same order. Resume is O(1):
`load_state_dict` sets `consumed`; no data is re-read. State version 2 is this order; a version 1
state (the stored permutation of oreline before it) is refused, since its order cannot be
continued.

Training reads a mixture of token folders through `oreline.tokens.mixture.MixtureLoader`, which
uses this loader per source (its reading, its per-epoch order) and maps each global position to a
source first; a one-source mixture is exactly the order described here.

Labels: labels[t] = stream[t + 1], except that a target equal to BOS is set to -100 (ignored by
cross-entropy): after an EOS, which document comes next is decided by the packing order, not
by language, so predicting the next BOS is not a language-modelling target. EOS targets are
kept: ending a document is. With `doc_mask=True`, `doc_ids` (B, T) int32 numbers the documents
within each sequence (it increases at every BOS) so the model can build block-diagonal causal
masks (tokens attend only within their document).

Integrity, and what start-up costs: the start-up cost must not grow with the corpus, so opening a
loader reads the manifest and each shard's 128-byte header only (~50 µs a shard): header
checksum, file size, tokenizer fingerprint and the manifest's token and document counts. No shard
is hashed, opened or has its document index read. A shard's sha256 is checked once, not per
launch: `oreline tokenize` hashes each shard from the finished file into the manifest, and
`oreline tokens verify` re-checks every shard (sha256, index, every id) after a copy or a transfer
(verify="full" does the same here, for small corpora and tests). Every batch's ids are checked
against the vocabulary (~5 µs a batch; an id past the embedding is an IndexError on CPU, a device
assert on CUDA) and the error names the shard.

Reading under a running job. Shards live on shared filesystems where a colleague re-tokenizes into
the folder or a copy fails half-way, so the file a job reads can change under it. Shards are read
with `os.preadv` from an open descriptor, not memory-mapped: a mapping of a file that shrank
kills the process with SIGBUS on the next read of a lost page (no exception, no message, and a
Python signal handler cannot help: the faulting copy would fault again), while a short read is
an ordinary, named error. Each shard's identity (device, inode, size, mtime) is taken at start-up,
and every read of a shard checks it first with one `os.stat`: a shard replaced, cut,
grown or rewritten in place since launch stops the run before a byte of the new file is trained on
(`ShardDamaged`, kind "changed"); a descriptor opened later must show that identity and header
too. Damage that keeps the identity (bytes flipped with the mtime put back, a disk fault) shows
only as an id outside the vocabulary: `ShardDamaged` of kind "content", with the time the shard
was last verified (when tokenize hashed it into the manifest, or this launch with
verify="full"), from which the training loop names the checkpoints written since
(oreline.train.shard_damage). Descriptors are kept in an LRU of at most `max_open_shards`, so a
corpus of any number of shards runs under `ulimit -n 1024`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from oreline.errors import ConfigError, DataIntegrityError, FingerprintMismatch, InputError, ShardDamaged
from oreline.tokens import shards as fmt
from oreline.tokens.order import FeistelOrder
from oreline.tokens.tokenize import read_manifest

IGNORE_INDEX = -100
STATE_VERSION = 2  # 2: the per-position Feistel order; 1: a materialised permutation (refused)
MAX_OPEN_SHARDS = 64


@dataclass(slots=True)
class Batch:
    input_ids: torch.Tensor  # (B, T) int64
    labels: torch.Tensor  # (B, T) int64, -100 where the target is BOS
    doc_ids: torch.Tensor | None = None  # (B, T) int32 when doc_mask=True


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What makes a shard the file the run opened: device, inode, size, modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class TokenLoader:
    def __init__(
        self,
        tokens_dir: str | Path,
        split: str = "train",
        seq_len: int = 256,
        micro_batch: int = 8,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        tokenizer_fingerprint: str | None = None,
        doc_mask: bool = False,
        verify: Literal["full", "header"] = "header",
        max_open_shards: int = MAX_OPEN_SHARDS,
    ):
        if not 0 <= rank < world_size:
            raise ConfigError(
                f"rank {rank} is outside world size {world_size}", "launch with torchrun so RANK < WORLD_SIZE"
            )
        if verify not in ("full", "header"):
            raise ConfigError(f"verify={verify!r}", 'use verify="full" or verify="header"')
        if max_open_shards < 1:
            raise ConfigError(f"max_open_shards={max_open_shards}", "keep at least one shard open")
        self.dir = Path(tokens_dir)
        self.split = split
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.doc_mask = doc_mask
        self._manifest = read_manifest(self.dir)
        m = self._manifest
        if tokenizer_fingerprint is not None and m["tokenizer_fingerprint"] != tokenizer_fingerprint:
            raise FingerprintMismatch(
                f"token shards in {self.dir} were built with tokenizer {m['tokenizer_fingerprint'][:12]}…, "
                f"this run uses {tokenizer_fingerprint[:12]}…",
                "re-run oreline tokenize with the tokenizer in use",
            )
        entries = [s for s in m["shards"] if s["split"] == split]
        if not entries:
            hint = (
                "raise tokenize.val_fraction and re-run oreline tokenize"
                if split == "val"
                else "re-run oreline tokenize with more documents"
            )
            raise InputError(f"no {split!r} shards in {self.dir}", hint)
        expected_fp = m["tokenizer_fingerprint"]
        self._paths = [self.dir / s["name"] for s in entries]
        self._headers = []
        self._ids: list[tuple[int, int, int, int]] = []  # each shard's identity at start-up
        self.verify = verify
        self.opened_at = time.time()
        for path, s in zip(self._paths, entries, strict=True):
            if verify == "full":  # reads every byte: sha256, document index, ids, BOS/EOS of each document
                header = fmt.verify_shard(path, expected_fp, s, m["bos_id"], m["eos_id"])
            else:  # one 128-byte read
                header = fmt.check_header(path, expected_fp, s)
            # the id check trusts the header's vocabulary: it must be the one the folder was made for
            if header.vocab_size != m.get("vocab_size", header.vocab_size):
                raise DataIntegrityError(
                    f"token shard {path} declares a vocabulary of {header.vocab_size}, its manifest {m['vocab_size']}",
                    fmt.FIX,
                )
            self._headers.append(header)
            self._ids.append(_identity(os.stat(path)))
        self._vocab_limit = min(h.vocab_size for h in self._headers)
        self.max_open_shards = max_open_shards
        self._open: OrderedDict[int, int] = OrderedDict()  # shard number → its open descriptor
        self.bos_id, self.eos_id = m["bos_id"], m["eos_id"]
        self._starts = np.cumsum([0] + [h.tokens for h in self._headers])  # global token offset of each shard
        self.total_tokens = int(self._starts[-1])
        self._num_sequences = max(0, (self.total_tokens - 1) // seq_len)
        if self._num_sequences == 0:
            raise InputError(
                f"the {split!r} split of {self.dir} has {self.total_tokens} tokens, fewer than seq_len + 1 = {seq_len + 1}",
                "lower train.seq_len or tokenize more documents",
            )
        self.consumed = 0
        self._order: FeistelOrder | None = None
        self._order_epoch = -1

    # -- properties ----------------------------------------------------------------------------

    @property
    def manifest(self) -> dict:
        return self._manifest

    @property
    def data_fingerprint(self) -> str:
        return self._manifest["data_fingerprint"]

    @property
    def vocab_size(self) -> int:
        """The vocabulary the shards were written for: every id is below it (checked)."""
        return max(h.vocab_size for h in self._headers)

    def check_fits(self, vocab_size: int, bos_id: int, eos_id: int, model: str) -> None:
        """DataIntegrityError unless the tokens fit `model` (an embedding of vocab_size rows) and
        its tokenizer's BOS/EOS ids (what loss masking and evaluation rely on)."""
        m = self._manifest
        if self.vocab_size > vocab_size:
            raise DataIntegrityError(
                f"token shards in {self.dir} hold ids up to {self.vocab_size - 1}, {model} embeds {vocab_size}",
                "use the token folder made with this model's tokenizer, or re-run oreline tokenize",
            )
        if (m["bos_id"], m["eos_id"]) != (bos_id, eos_id):
            raise DataIntegrityError(
                f"{self.dir / 'manifest.json'} names BOS/EOS ids {m['bos_id']}/{m['eos_id']}, the tokenizer "
                f"{bos_id}/{eos_id}",
                fmt.FIX,
            )

    @property
    def num_sequences(self) -> int:
        return self._num_sequences

    @property
    def tokens_per_batch(self) -> int:
        """Tokens this rank gets per next_batch() (inputs, not counting the shift token)."""
        return self.micro_batch * self.seq_len

    @property
    def epoch(self) -> int:
        return self.consumed // self._num_sequences

    # -- reading -------------------------------------------------------------------------------

    @property
    def num_shards(self) -> int:
        return len(self._headers)

    @property
    def open_shards(self) -> int:
        """Shards open now (one file descriptor each); at most max_open_shards."""
        return len(self._open)

    def _fd(self, k: int) -> int:
        """Shard k's descriptor, opened on first use and checked (identity and header as at start-up);
        the least recently used one is closed first."""
        fd = self._open.get(k)
        if fd is not None:
            self._open.move_to_end(k)
            return fd
        if len(self._open) >= self.max_open_shards:
            os.close(self._open.popitem(last=False)[1])
        path, header = self._paths[k], self._headers[k]
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise self._changed(k, f"cannot be opened now ({exc.strerror})") from None
        checked = fmt.HEADER_CHECKED
        if _identity(os.fstat(fd)) != self._ids[k] or os.pread(fd, checked, 0) != header.pack()[:checked]:
            os.close(fd)
            raise self._changed(k, "its header or size differ now")
        self._open[k] = fd
        return fd

    def _changed(self, k: int, what: str) -> ShardDamaged:
        return ShardDamaged(
            f"token shard {self._paths[k]} changed after it was opened ({what}): the run stopped before "
            "reading any of the changed file",
            "do not rewrite token shards while a run reads them; put the shard back as it was (or re-run "
            "oreline tokenize into a new folder and start a new run)",
            str(self._paths[k]),
            "changed",
        )

    def _check_identity(self, k: int) -> None:
        """ShardDamaged unless shard k is the file that was opened at start-up (one stat)."""
        try:
            st = os.stat(self._paths[k])
        except OSError as exc:
            raise self._changed(k, f"it is gone: {exc.strerror}") from None
        now, then = _identity(st), self._ids[k]
        if now != then:
            dev, ino, size, mtime = then
            what = (
                "replaced by another file"
                if now[:2] != (dev, ino)
                else f"{size:,} bytes at start-up, {now[2]:,} now"
                if now[2] != size
                else "rewritten in place: its modification time changed"
            )
            raise self._changed(k, what)

    def _read(self, k: int, local: int, out: np.ndarray) -> None:
        """Tokens [local, local + len(out)) of shard k into `out`, after checking the shard's identity."""
        self._check_identity(k)
        header = self._headers[k]
        buf = np.empty(len(out), dtype=header.dtype)
        got = os.preadv(self._fd(k), [buf], fmt.HEADER_SIZE + local * header.dtype.itemsize)
        if got != buf.nbytes:  # cut between the check and the read
            raise self._changed(k, f"it ended {buf.nbytes - got:,} bytes early while being read")
        out[:] = buf

    def close(self) -> None:
        """Close every shard descriptor (also done when the loader is dropped)."""
        while self._open:
            os.close(self._open.popitem()[1])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (at interpreter shutdown os may be gone)
            self.close()

    def content_verified_at(self, k: int) -> float | None:
        """When shard k's content was last verified in full: this launch (verify="full"), else when
        tokenize hashed it into the manifest (None when unknown)."""
        if self.verify == "full":
            return self.opened_at
        try:
            return (self.dir / "manifest.json").stat().st_mtime
        except OSError:
            return None

    def _pieces(self, start: int, length: int) -> Iterator[tuple[int, int, int]]:
        """(shard, offset in the shard, length) of stream[start : start + length], in order."""
        k = int(np.searchsorted(self._starts, start, side="right")) - 1
        done = 0
        while done < length:
            local = start + done - int(self._starts[k])
            take = min(length - done, int(self._starts[k + 1]) - start - done)
            if take > 0:
                yield k, local, take
                done += take
            k += 1

    def _window(self, start: int, out: np.ndarray) -> None:
        """Copy stream[start : start + len(out)] into `out` (int64), stitched across shard boundaries."""
        done = 0
        for k, local, take in self._pieces(start, len(out)):
            self._read(k, local, out[done : done + take])
            done += take

    def _name_bad_id(self, seq_indices: list[int]) -> None:
        """Error path: raise naming the shard that holds an id past the vocabulary (reads only the
        pieces of this batch, never the whole corpus)."""
        T = self.seq_len
        for i in seq_indices:
            for k, local, take in self._pieces(i * T, T + 1):
                piece = np.empty(take, dtype=np.int64)
                self._read(k, local, piece)
                try:
                    fmt.check_ids(self._paths[k], self._headers[k], int(piece.max()))
                except DataIntegrityError as exc:
                    # its identity is the one opened: the bytes changed without it (the mtime put
                    # back, a disk fault), or were wrong at start-up, when only headers are read
                    raise ShardDamaged(
                        exc.message, exc.hint, str(self._paths[k]), "content", self.content_verified_at(k)
                    ) from None

    def _make_batch(self, seq_indices: list[int]) -> Batch:
        T = self.seq_len
        rows = np.empty((len(seq_indices), T + 1), dtype=np.int64)  # (B, T+1)
        for row, i in zip(rows, seq_indices, strict=True):
            self._window(i * T, row)
        if rows.size and rows.max() >= self._vocab_limit:
            self._name_bad_id(seq_indices)
        inputs = torch.from_numpy(rows[:, :-1].copy())
        labels = torch.from_numpy(rows[:, 1:].copy())
        labels[labels == self.bos_id] = IGNORE_INDEX
        doc_ids = torch.cumsum(inputs == self.bos_id, dim=1, dtype=torch.int32) if self.doc_mask else None
        return Batch(inputs, labels, doc_ids)

    def order(self, epoch: int) -> FeistelOrder:
        """The bijection of epoch `epoch` (position in the epoch → sequence index)."""
        if self._order is None or self._order_epoch != epoch:
            self._order, self._order_epoch = FeistelOrder(self._num_sequences, self.seed, epoch), epoch
        return self._order

    def global_indices(self, start: int, count: int) -> list[int]:
        """Sequence indices at global-order positions [start, start + count), across epochs."""
        n = self._num_sequences
        out = []
        pos = start
        while len(out) < count:
            epoch, offset = divmod(pos, n)
            take = min(count - len(out), n - offset)
            out.extend(self.order(epoch).permute(np.arange(offset, offset + take)).tolist())
            pos += take
        return out

    def next_batch(self) -> Batch:
        step = self.micro_batch * self.world_size
        mine = self.consumed + self.rank * self.micro_batch
        self.consumed += step
        return self._make_batch(self.global_indices(mine, self.micro_batch))

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def iter_eval_batches(self, max_batches: int | None = None) -> Iterator[Batch]:
        """Sequences in stream order (unshuffled, no state change), identical on every call.

        Each eval step covers micro_batch * world_size consecutive sequences; this rank gets its
        slice. Stops at max_batches or when a full global batch no longer fits.
        """
        step = self.micro_batch * self.world_size
        n_batches = self._num_sequences // step
        if n_batches == 0:
            raise InputError(
                f"the {self.split!r} split of {self.dir} has {self._num_sequences} sequences of {self.seq_len} tokens, "
                f"fewer than one batch of {step}",
                "raise tokenize.val_fraction, or lower train.seq_len / micro_batch",
            )
        if max_batches is not None:
            n_batches = min(n_batches, max_batches)
        for b in range(n_batches):
            first = b * step + self.rank * self.micro_batch
            yield self._make_batch(list(range(first, first + self.micro_batch)))

    def eval_set_size(self, sequences: int) -> int:
        """How many sequences `iter_eval_set(sequences)` scores: `sequences`, or the whole split
        when it holds fewer (never none: the constructor refuses a split without one sequence)."""
        return min(sequences, self._num_sequences)

    def iter_eval_set(self, sequences: int) -> Iterator[Batch]:
        """This rank's batches of the validation set: the first `sequences` sequences of the split
        in stream order (`eval_set_size`), the same set whatever micro_batch, accumulation and
        number of ranks score it.

        The set is cut into world_size consecutive blocks of ceil(n / world_size) sequences, and
        this rank scores its block in batches of micro_batch rows (the last one may be shorter).
        A block that comes up short (the last ranks', when world_size does not divide n) is
        filled with padding rows whose labels are all IGNORE_INDEX: they weigh nothing in a
        token-weighted sum, and every rank runs the same number of forwards of the same shapes
        (FSDP2's all-gathers are collectives: a rank that stopped early would hang the others).
        """
        n = self.eval_set_size(sequences)
        per_rank = -(-n // self.world_size)
        first = self.rank * per_rank
        mine = list(range(first, min(n, first + per_rank)))
        padding = per_rank - len(mine)
        rows: list[int | None] = [*mine, *([None] * padding)]
        for b in range(0, per_rank, self.micro_batch):
            chunk = rows[b : b + self.micro_batch]
            batch = self._make_batch([0 if i is None else i for i in chunk])
            pad = torch.tensor([i is None for i in chunk])
            if bool(pad.any()):
                batch.labels[pad] = IGNORE_INDEX
            yield batch

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "consumed_sequences": self.consumed,
            "epoch": self.epoch,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "split": self.split,
            "data_fingerprint": self.data_fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue at the exact next batch of the global order (world size may differ)."""
        if state.get("version") == 1:
            raise ConfigError(
                "loader state version 1 comes from an oreline that stored the data order as a permutation; "
                f"this oreline computes the order per position (version {STATE_VERSION}) and cannot continue "
                "that order",
                "finish this run with the oreline version that wrote the checkpoint, or start a new run "
                "(--resume none): its data order will differ",
            )
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"loader state version {state.get('version')} is not {STATE_VERSION}",
                "resume with the oreline version that wrote it",
            )
        if state["data_fingerprint"] != self.data_fingerprint:
            raise FingerprintMismatch(
                f"loader state is for token data {state['data_fingerprint'][:12]}…, {self.dir} holds {self.data_fingerprint[:12]}…",
                "resume with the token shards the run started with, or start a new run",
            )
        for key in ("seq_len", "seed", "split"):
            if state[key] != getattr(self, key):
                raise ConfigError(
                    f"loader state has {key}={state[key]!r}, this loader {key}={getattr(self, key)!r}",
                    f"resume with the same {key} (or pass --allow-config-change and start a new data order)",
                )
        self.consumed = int(state["consumed_sequences"])
