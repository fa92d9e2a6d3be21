"""Deterministic, resumable batch loader over packed token shards.

The shards of one split, in manifest order, form one token stream (documents back to back,
each `[BOS] ... [EOS]`). Sequence i is stream[i*T : i*T + T + 1] (T = seq_len; the +1 is the
shift between inputs and labels), so there are (N - 1) // T sequences and consecutive ones
share one boundary token. Shards are memory-mapped; a sequence that spans two shards is
stitched from both.

Global order: epoch e visits all sequences in the order of a permutation seeded with seed + e.
The only state is `consumed` (sequences of the global order handed out so far, over all ranks);
epoch = consumed // num_sequences. Each `next_batch()` takes the next micro_batch * world_size
sequences of the global order (crossing into the next epoch when one ends) and rank r keeps
slice [r*micro_batch, (r+1)*micro_batch). Therefore the union over ranks of one step equals the
single-rank global batch, with no overlap and no gap, and a run resumed at another world size
with the same global batch continues the very same order. Resume is O(1): `load_state_dict`
sets `consumed`; no data is re-read.

Labels: labels[t] = stream[t + 1], except that a target equal to BOS is set to -100 (ignored by
cross-entropy): after an EOS, which document comes next is decided by the packing order, not
by language, so predicting the next BOS is not a language-modelling target. EOS targets are
kept: ending a document is. With `doc_mask=True`, `doc_ids` (B, T) int32 numbers the documents
within each sequence (it increases at every BOS) so the model can build block-diagonal causal
masks (tokens attend only within their document).

Integrity: every shard's header, size and tokenizer fingerprint are checked on open, and with
verify="full" (the default) also its sha256 against the manifest and every token id against the
vocabulary in its header (an id past the embedding is an IndexError on CPU, a device assert on
CUDA). For corpora so large that reading everything at start-up hurts, verify="header" keeps the
header, size and fingerprint checks, and the ids are checked per batch instead (~5 µs a batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from oreline.errors import ConfigError, DataIntegrityError, FingerprintMismatch, InputError
from oreline.tokens import shards as fmt
from oreline.tokens.tokenize import read_manifest

IGNORE_INDEX = -100
STATE_VERSION = 1


@dataclass(slots=True)
class Batch:
    input_ids: torch.Tensor  # (B, T) int64
    labels: torch.Tensor  # (B, T) int64, -100 where the target is BOS
    doc_ids: torch.Tensor | None = None  # (B, T) int32 when doc_mask=True


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
        verify: Literal["full", "header"] = "full",
    ):
        if not 0 <= rank < world_size:
            raise ConfigError(
                f"rank {rank} is outside world size {world_size}", "launch with torchrun so RANK < WORLD_SIZE"
            )
        if verify not in ("full", "header"):
            raise ConfigError(f"verify={verify!r}", 'use verify="full" or verify="header"')
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
        self.shards = []
        for s in entries:
            shard = fmt.open_shard(
                self.dir / s["name"], expected_fp, s["sha256"] if verify == "full" else None
            )
            if shard.header.tokens != s["tokens"] or shard.header.documents != s["documents"]:
                raise DataIntegrityError(
                    f"token shard {shard.path} holds {shard.header.tokens} tokens, the manifest says {s['tokens']}",
                    fmt.FIX,
                )
            # the id check trusts the header's vocabulary: it must be the one the folder was made for
            if shard.header.vocab_size != m.get("vocab_size", shard.header.vocab_size):
                raise DataIntegrityError(
                    f"token shard {shard.path} declares a vocabulary of {shard.header.vocab_size}, "
                    f"its manifest {m['vocab_size']}",
                    fmt.FIX,
                )
            if verify == "full":  # the file was just read for its hash: 2 tokens a document more
                fmt.check_boundaries(shard, m["bos_id"], m["eos_id"])
            self.shards.append(shard)
        # verify="full" checked every id on open; otherwise each batch is checked (_make_batch)
        self._vocab_limit = None if verify == "full" else min(s.header.vocab_size for s in self.shards)
        # plain ndarray views of the mappings: slicing a np.memmap subclass costs more than the copy
        self._arrays = [np.asarray(s.tokens) for s in self.shards]
        self.bos_id, self.eos_id = m["bos_id"], m["eos_id"]
        self._starts = np.cumsum(
            [0] + [s.header.tokens for s in self.shards]
        )  # global token offset of each shard
        self.total_tokens = int(self._starts[-1])
        self._num_sequences = max(0, (self.total_tokens - 1) // seq_len)
        if self._num_sequences == 0:
            raise InputError(
                f"the {split!r} split of {self.dir} has {self.total_tokens} tokens, fewer than seq_len + 1 = {seq_len + 1}",
                "lower train.seq_len or tokenize more documents",
            )
        self.consumed = 0
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None

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
        return max(s.header.vocab_size for s in self.shards)

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

    def _window(self, start: int, out: np.ndarray) -> None:
        """Copy stream[start : start + len(out)] into `out` (int64), stitched across shard boundaries."""
        k = int(np.searchsorted(self._starts, start, side="right")) - 1
        done = 0
        while done < len(out):
            local = start + done - int(self._starts[k])
            piece = self._arrays[k][local : local + len(out) - done]
            out[done : done + len(piece)] = piece
            done += len(piece)
            k += 1

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng(self.seed + epoch).permutation(self._num_sequences)
            self._perm_epoch = epoch
        return self._perm

    def _make_batch(self, seq_indices: list[int]) -> Batch:
        T = self.seq_len
        rows = np.empty((len(seq_indices), T + 1), dtype=np.int64)  # (B, T+1)
        for row, i in zip(rows, seq_indices, strict=True):
            self._window(i * T, row)
        if self._vocab_limit is not None and rows.size and rows.max() >= self._vocab_limit:
            for shard in self.shards:  # error path only: name the shard that holds the bad id
                fmt.check_ids(shard.path, shard.header, int(shard.tokens.max()))
        inputs = torch.from_numpy(rows[:, :-1].copy())
        labels = torch.from_numpy(rows[:, 1:].copy())
        labels[labels == self.bos_id] = IGNORE_INDEX
        doc_ids = torch.cumsum(inputs == self.bos_id, dim=1, dtype=torch.int32) if self.doc_mask else None
        return Batch(inputs, labels, doc_ids)

    def global_indices(self, start: int, count: int) -> list[int]:
        """Sequence indices at global-order positions [start, start + count), across epochs."""
        n = self._num_sequences
        out = []
        pos = start
        while len(out) < count:
            epoch, offset = divmod(pos, n)
            take = min(count - len(out), n - offset)
            out.extend(self._permutation(epoch)[offset : offset + take].tolist())
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
