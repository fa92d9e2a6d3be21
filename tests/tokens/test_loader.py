"""The loader: packing, determinism, exact resume, rank sharding, eval order, refusals."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc

import numpy as np
import pytest
import torch

from oreline.errors import ConfigError, DataIntegrityError, FingerprintMismatch, InputError, ShardDamaged
from oreline.tokens import shards as fmt
from oreline.tokens.loader import IGNORE_INDEX, MAX_OPEN_SHARDS, TokenLoader
from oreline.tokens.order import FeistelOrder
from oreline.tokens.tokenize import read_manifest
from oreline.tokens.verify import verify_tokens

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


def test_each_epoch_is_a_seeded_bijection_of_its_own(tokens_dir):
    loader = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=5)
    n = loader.num_sequences
    second = loader.global_indices(n, n)
    assert second == FeistelOrder(n, seed=5, epoch=1).permute(np.arange(n)).tolist()
    assert sorted(second) == list(range(n)) and second != loader.global_indices(0, n)


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


def test_sha256_is_checked_by_tokens_verify_not_at_each_launch(damaged):
    copy, shard = damaged
    assert verify_tokens(copy)["bad"] == []  # fresh from tokenize: every shard passes
    data = bytearray(shard.read_bytes())
    data[fmt.HEADER_SIZE + 10] ^= 0x01  # one token changed, header and size intact
    shard.write_bytes(bytes(data))
    TokenLoader(copy, seq_len=T).next_batch()  # a launch reads headers only
    with pytest.raises(DataIntegrityError, match="sha256"):
        TokenLoader(copy, seq_len=T, verify="full")
    result = verify_tokens(copy)
    assert [name for name, _ in result["bad"]] == [shard.name]
    assert "sha256" in result["bad"][0][1] and "re-run oreline tokenize" in result["bad"][0][1]
    assert result["shards"] == len(read_manifest(copy)["shards"])


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


def test_state_of_the_stored_permutation_order_is_refused_with_the_way_out(tokens_dir):
    loader = TokenLoader(tokens_dir, seq_len=T, micro_batch=B, seed=1)
    old = {**loader.state_dict(), "version": 1}
    with pytest.raises(ConfigError, match="version 1") as err:
        loader.load_state_dict(old)
    assert "--resume none" in str(err.value) and "cannot continue" in str(err.value)


def _linked_copies(tokens_dir, dest, copies):
    """A token folder whose train split is `copies` hard links of each train shard (val as is)."""
    dest.mkdir()
    m = read_manifest(tokens_dir)
    shards = [s for s in m["shards"] if s["split"] == "val"]
    for s in shards:
        (dest / s["name"]).hardlink_to(tokens_dir / s["name"])
    for c in range(copies):
        for s in (s for s in m["shards"] if s["split"] == "train"):
            name = f"c{c:04d}-{s['name']}"
            (dest / name).hardlink_to(tokens_dir / s["name"])
            shards.append({**s, "name": name})
    (dest / "manifest.json").write_text(json.dumps({**m, "shards": shards}))
    return dest


def _open_descriptors():
    return len(os.listdir("/proc/self/fd"))


def test_open_shards_are_bounded_by_an_lru(tokens_dir, tmp_path):
    many = _linked_copies(tokens_dir, tmp_path / "many", 30)
    before = _open_descriptors()
    loader = TokenLoader(many, seq_len=T, micro_batch=64, seed=4)
    assert loader.num_shards > 2 * MAX_OPEN_SHARDS and loader.open_shards == 0  # opening maps nothing
    most = 0
    for _ in range(loader.num_sequences // 64):  # one epoch: every shard is read
        loader.next_batch()
        most = max(most, _open_descriptors() - before)
    assert loader.open_shards == MAX_OPEN_SHARDS and most <= MAX_OPEN_SHARDS
    # the LRU changes what is mapped, never what is read
    tight = TokenLoader(many, seq_len=T, micro_batch=64, seed=4, max_open_shards=1)
    wide = TokenLoader(many, seq_len=T, micro_batch=64, seed=4, max_open_shards=10_000)
    assert same(batches(tight, 20), batches(wide, 20)) and tight.open_shards == 1


def _sparse_tokens(folder, shards, tokens, documents, vocab_size=256):
    """A token folder of `shards` hard links to one sparse shard of `tokens` zero ids: a corpus of
    any size that costs no disk. Its document index holds only its required ends (0 … N)."""
    folder.mkdir()
    fp = "ab" * 32
    header = fmt.ShardHeader(
        fmt.dtype_code_for(vocab_size),
        tokens,
        documents,
        vocab_size,
        fmt._align8(fmt.HEADER_SIZE + tokens * fmt.DTYPES[fmt.dtype_code_for(vocab_size)].itemsize),
        fp,
    )
    first = folder / "train-0000000000-00000-000.tok"
    with open(first, "wb") as fh:
        fh.write(header.pack())
        fh.truncate(header.file_size)
        fh.seek(header.file_size - 8)
        fh.write(np.array([tokens], dtype="<u8").tobytes())
    entries = []
    for k in range(shards):
        path = folder / f"train-0000000000-{k:05d}-000.tok"
        if k:
            path.hardlink_to(first)
        entry = {"name": path.name, "split": "train", "tokens": tokens, "documents": documents}
        entries.append({**entry, "sha256": "0" * 64, "bytes": header.file_size})
    manifest = {
        "shards": entries,
        "tokenizer_fingerprint": fp,
        "data_fingerprint": "cd" * 32,
        "bos_id": 1,
        "eos_id": 2,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_loader_memory_is_o_shards_not_o_sequences(tmp_path):
    # 8 shards of 10^8 tokens and 10^6 documents: 8·10^8 tokens, 1.25·10^7 sequences of 64
    tokens = _sparse_tokens(tmp_path / "big", 8, 100_000_000, 1_000_000)
    tracemalloc.start()
    try:
        loader = TokenLoader(tokens, seq_len=64, micro_batch=8, seed=0)
        loader.next_batch()
        loader.load_state_dict({**loader.state_dict(), "consumed_sequences": loader.num_sequences - 4})
        loader.next_batch()  # across the epoch boundary: the next epoch's order costs nothing either
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a stored permutation would be 100 MB, the document indexes 64 MB
    assert loader.num_sequences == 12_499_999 and peak < 2_000_000, peak


def test_a_shard_rewritten_after_start_up_is_refused_when_mapped(damaged):
    copy, shard = damaged
    loader = TokenLoader(copy, seq_len=T, micro_batch=B)
    shard.write_bytes(shard.read_bytes()[:-8] + b"\0" * 16)  # 8 bytes longer: another file now
    with pytest.raises(DataIntegrityError, match="changed after it was opened") as err:
        for _ in range(loader.num_sequences // B + 1):
            loader.next_batch()
    assert shard.name in str(err.value)


def _one_epoch(loader):
    for _ in range(loader.num_sequences // B + 1):
        loader.next_batch()


def test_a_shard_rewritten_in_place_under_a_running_loader_stops_it_before_the_new_bytes(damaged):
    """64 bytes of the token area XORed with 1 (ids still inside the vocabulary, so no id check
    can see it) after the loader has read the shard: the next read of that shard stops it."""
    copy, shard = damaged
    loader = TokenLoader(copy, seq_len=T, micro_batch=B)
    _one_epoch(loader)  # every shard read and open
    with open(shard, "r+b") as fh:
        fh.seek(fmt.HEADER_SIZE + 1000)
        flipped = bytes(b ^ 1 for b in fh.read(64))
        fh.seek(fmt.HEADER_SIZE + 1000)
        fh.write(flipped)
    with pytest.raises(ShardDamaged, match="changed after it was opened .rewritten in place") as err:
        _one_epoch(loader)
    assert err.value.kind == "changed" and err.value.path == str(shard)


def test_a_shard_replaced_by_another_of_the_same_size_stops_the_loader(damaged, tmp_path):
    """Another file of the same size and header renamed over the shard (a colleague re-tokenizing
    into the folder): the open descriptor still reads the old file, the path names a new one."""
    copy, shard = damaged
    loader = TokenLoader(copy, seq_len=T, micro_batch=B)
    loader.next_batch()
    other = tmp_path / "other.tok"
    data = bytearray(shard.read_bytes())
    data[fmt.HEADER_SIZE : fmt.HEADER_SIZE + 64] = bytes(64)  # other tokens, same size
    other.write_bytes(bytes(data))
    os.replace(other, shard)
    with pytest.raises(ShardDamaged, match="replaced by another file"):
        _one_epoch(loader)


CUT = """
import os, sys
from oreline.errors import ShardDamaged
from oreline.tokens import shards as fmt
from oreline.tokens.loader import TokenLoader
loader = TokenLoader(sys.argv[1], seq_len=32, micro_batch=4)
for _ in range(loader.num_sequences // 4 + 1):
    loader.next_batch()
os.truncate(sys.argv[2], fmt.HEADER_SIZE + 64)
try:
    for _ in range(loader.num_sequences // 4 + 1):
        loader.next_batch()
except ShardDamaged as exc:
    print("error:", exc)
"""


def test_a_shard_cut_under_a_running_loader_is_a_named_error_not_a_crash(damaged):
    """A mapping of a file that shrank kills the process with SIGBUS (exit -7, no message) at the
    next read of a lost page; the loader reads with pread after a size check: an error naming the
    shard. (In a child process: a SIGBUS must not take the test run with it.)"""
    import subprocess
    import sys

    copy, shard = damaged
    proc = subprocess.run([sys.executable, "-c", CUT, str(copy), str(shard)], capture_output=True, text=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert f"token shard {shard} changed after it was opened" in proc.stdout, proc.stdout
    assert "bytes at start-up, 192 now" in proc.stdout, proc.stdout
