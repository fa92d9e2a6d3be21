"""The loader: packing, determinism, exact resume, rank sharding, eval order, refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from oreline.errors import ConfigError, DataIntegrityError, FingerprintMismatch, InputError
from oreline.tokens import shards as fmt
from oreline.tokens.loader import IGNORE_INDEX, TokenLoader
from oreline.tokens.tokenize import read_manifest

T, B = 32, 4


def stream(tokens_dir, split="train"):
    m = read_manifest(tokens_dir)
    return np.concatenate(
        [fmt.open_shard(tokens_dir / s["name"]).tokens for s in m["shards"] if s["split"] == split]
    ).astype(np.int64)


def batches(loader, n):
    return [loader.next_batch() for _ in range(n)]


def same(a, b):
    return all(
        torch.equal(x.input_ids, y.input_ids) and torch.equal(x.labels, y.labels)
        for x, y in zip(a, b, strict=True)
    )


def test_sequences_are_stream_slices_with_shift_and_bos_masked(tokens_dir):
    loader = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=3, doc_mask=True)
    s = stream(tokens_dir)
    assert loader.num_sequences == (len(s) - 1) // T and loader.tokens_per_batch == B * T
    assert len(read_manifest(tokens_dir)["shards"]) > 2  # sequences cross shard boundaries below
    batch = loader.next_batch()
    assert batch.input_ids.shape == (B, T) and batch.input_ids.dtype == torch.int64
    assert batch.labels.dtype == torch.int64 and batch.doc_ids.dtype == torch.int32
    for row, seq in enumerate(loader.global_indices(0, B)):
        window = torch.from_numpy(s[seq * T : seq * T + T + 1])
        assert torch.equal(batch.input_ids[row], window[:-1])
        want = window[1:].clone()
        want[want == loader.bos_id] = IGNORE_INDEX
        assert torch.equal(batch.labels[row], want)
        assert torch.equal(batch.doc_ids[row], torch.cumsum(window[:-1] == loader.bos_id, 0).to(torch.int32))
    # every sequence boundary is visited: all sequences of an epoch, each once
    assert sorted(loader.global_indices(0, loader.num_sequences)) == list(range(loader.num_sequences))


def test_bos_targets_ignored_eos_targets_kept(tokens_dir):
    loader = TokenLoader(tokens_dir, seq_len=T, micro_batch=16, seed=0)
    batch = loader.next_batch()
    after_eos = batch.input_ids == loader.eos_id
    assert after_eos.any()
    assert (batch.labels[after_eos] == IGNORE_INDEX).all()  # EOS is followed by the next BOS
    assert (batch.labels == loader.eos_id).any()


def test_deterministic_and_seeded(tokens_dir):
    a = batches(TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=7), 5)
    b = batches(TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=7), 5)
    c = batches(TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=8), 5)
    assert same(a, b) and not same(a, c)


def test_epochs_use_seed_plus_epoch(tokens_dir):
    loader = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=5)
    n = loader.num_sequences
    assert loader.global_indices(n, n) == np.random.default_rng(6).permutation(n).tolist()
    assert loader.global_indices(n, n) != loader.global_indices(0, n)


def test_resume_mid_epoch_equals_uninterrupted(tokens_dir):
    full = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=1)
    n_steps = full.num_sequences // B + 6  # runs into the second epoch
    reference = batches(full, n_steps)
    first = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=1)
    head = batches(first, 9)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    resumed = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=1)
    resumed.load_state_dict(state)
    assert same(head + batches(resumed, n_steps - 9), reference)
    assert resumed.epoch == 1 and resumed.state_dict()["consumed_sequences"] == n_steps * B


def _union(tokens_dir, world, micro, steps, state=None):
    """Per step, the concatenation over ranks of each rank's batch."""
    loaders = [
        TokenLoader(tokens_dir, seq_len=T, micro_batch=micro, seed=2, rank=r, world_size=world)
        for r in range(world)
    ]
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    out = []
    for _ in range(steps):
        out.append(torch.cat([loader.next_batch().input_ids for loader in loaders]))
    return out, loaders[0].state_dict()


def test_rank_sharding_union_matches_single_rank(tokens_dir):
    one, _ = _union(tokens_dir, 1, 8, 10)
    two, _ = _union(tokens_dir, 2, 4, 10)
    four, _ = _union(tokens_dir, 4, 2, 10)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(one, two, four, strict=True))
    rows = torch.cat(one)
    assert len({tuple(r.tolist()) for r in rows}) == len(rows)  # no overlap within the epoch


def test_resume_at_a_different_world_size(tokens_dir):
    reference, _ = _union(tokens_dir, 1, 8, 12)
    _, state = _union(tokens_dir, 2, 4, 5)
    rest, _ = _union(tokens_dir, 4, 2, 7, state=state)
    assert all(torch.equal(a, b) for a, b in zip(reference[5:], rest, strict=True))


def test_eval_batches_are_fixed_and_unshuffled(tokens_dir):
    loader = TokenLoader(tokens_dir, split="val", seq_len=T, micro_batch=B, seed=9)
    first = list(loader.iter_eval_batches(3))
    loader.next_batch()
    second = list(loader.iter_eval_batches(3))
    assert len(first) == 3 and same(first, second)
    s = stream(tokens_dir, "val")
    assert torch.equal(first[0].input_ids[1], torch.from_numpy(s[T : 2 * T]))
    halves = [
        list(
            TokenLoader(
                tokens_dir, split="val", seq_len=T, micro_batch=B // 2, rank=r, world_size=2
            ).iter_eval_batches(3)
        )
        for r in (0, 1)
    ]
    assert all(
        torch.equal(torch.cat([h0.input_ids, h1.input_ids]), f.input_ids)
        for h0, h1, f in zip(*halves, first, strict=True)
    )


def test_refuses_other_tokenizer(tokens_dir):
    with pytest.raises(FingerprintMismatch, match="re-run oreline tokenize"):
        TokenLoader(tokens_dir, tokenizer_fingerprint="0" * 64)
    fp = read_manifest(tokens_dir)["tokenizer_fingerprint"]
    TokenLoader(tokens_dir, seq_len=T, tokenizer_fingerprint=fp)


@pytest.fixture()
def damaged(tokens_dir, tmp_path):
    copy = tmp_path / "tokens"
    shutil.copytree(tokens_dir, copy)
    name = next(s["name"] for s in read_manifest(copy)["shards"] if s["split"] == "train")
    return copy, copy / name


def test_refuses_truncated_shard(damaged):
    copy, shard = damaged
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(DataIntegrityError, match="truncated") as err:
        TokenLoader(copy, seq_len=T)
    assert shard.name in str(err.value) and "re-run oreline tokenize" in str(err.value)


def test_refuses_bad_magic(damaged):
    copy, shard = damaged
    shard.write_bytes(b"NOTATOK\0" + shard.read_bytes()[8:])
    with pytest.raises(DataIntegrityError, match="magic"):
        TokenLoader(copy, seq_len=T)


def test_refuses_checksum_mismatch_unless_header_only(damaged):
    copy, shard = damaged
    data = bytearray(shard.read_bytes())
    data[fmt.HEADER_SIZE + 10] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(DataIntegrityError, match="sha256"):
        TokenLoader(copy, seq_len=T)
    TokenLoader(copy, seq_len=T, verify="header")  # documented trade-off for huge corpora


def test_refuses_shard_swapped_from_another_tokenizer(damaged):
    copy, shard = damaged
    data = bytearray(shard.read_bytes())
    header = fmt.read_header(shard)
    forged = fmt.ShardHeader(
        header.dtype_code, header.tokens, header.documents, header.vocab_size, header.index_offset, "ab" * 32
    )
    data[: fmt.HEADER_SIZE] = forged.pack()
    shard.write_bytes(bytes(data))
    with pytest.raises(FingerprintMismatch, match=shard.name):
        TokenLoader(copy, seq_len=T, verify="header")


def test_state_from_other_data_or_settings_is_refused(tokens_dir):
    loader = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=1)
    state = loader.state_dict()
    with pytest.raises(FingerprintMismatch):
        TokenLoader(tokens_dir, seq_len=T, seed=1).load_state_dict({**state, "data_fingerprint": "f" * 64})
    with pytest.raises(ConfigError, match="seq_len"):
        TokenLoader(tokens_dir, seq_len=2 * T, seed=1).load_state_dict(state)


def test_too_little_data_and_bad_rank(tokens_dir):
    with pytest.raises(InputError, match="seq_len"):
        TokenLoader(tokens_dir, split="val", seq_len=10_000_000)
    with pytest.raises(ConfigError, match="rank"):
        TokenLoader(tokens_dir, rank=2, world_size=2)
    val = TokenLoader(tokens_dir, split="val", seq_len=T, micro_batch=B)
    with pytest.raises(InputError, match="fewer than one batch"):
        next(
            TokenLoader(
                tokens_dir, split="val", seq_len=T, micro_batch=val.num_sequences + 1
            ).iter_eval_batches()
        )


def test_whole_stream_is_served_across_shard_boundaries(tokens_dir):
    loader = TokenLoader(tokens_dir, seq_len=T, micro_batch=64)
    rows = torch.cat([b.input_ids for b in loader.iter_eval_batches()]).reshape(-1)
    assert torch.equal(rows, torch.from_numpy(stream(tokens_dir)[: len(rows)]))
    assert len(rows) > read_manifest(tokens_dir)["shards"][0]["tokens"] * 2


def test_rank_union_holds_across_the_epoch_boundary(tokens_dir):
    n = TokenLoader(tokens_dir, seq_len=T, micro_batch=B).num_sequences
    state = {
        **TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=2).state_dict(),
        "consumed_sequences": n - 5,
    }
    one, _ = _union(tokens_dir, 1, 8, 2, state=state)
    four, end = _union(tokens_dir, 4, 2, 2, state=state)
    assert all(torch.equal(a, b) for a, b in zip(one, four, strict=True))
    assert end["epoch"] == 1 and end["consumed_sequences"] == n - 5 + 16
