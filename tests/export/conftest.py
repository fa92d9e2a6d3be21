"""Fixtures shared by the export tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from oreline.config import TokenizerConfig
from oreline.tokens.train_bpe import train_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(samples, tmp_path_factory) -> Path:
    """A real 512-token byte-level BPE trained on Tiny Shakespeare by oreline's own trainer."""
    root = tmp_path_factory.mktemp("tok")
    with gzip.open(samples / "english-prose" / "tinyshakespeare.txt.gz", "rt", encoding="utf-8") as fh:
        text = fh.read(200_000)
    with open(root / "docs.jsonl", "w", encoding="utf-8") as fh:
        for i, para in enumerate(p for p in text.split("\n\n") if p.strip()):
            fh.write(json.dumps({"id": f"d{i}", "text": para}) + "\n")
    train_tokenizer(
        [root / "docs.jsonl"], root / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=10)
    )
    return root / "tokenizer"


@pytest.fixture(scope="session")
def demo_model(samples, tokenizer_dir):
    """A demo-like Llama (tied, GQA) trained briefly on `[BOS] text [EOS]` documents, as oreline trains:
    unlike a random one it continues a prompt differently with and without the BOS in front."""
    import torch

    from oreline.model.llama import Llama, ModelArgs
    from oreline.tokens.train_bpe import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    with gzip.open(samples / "english-prose" / "tinyshakespeare.txt.gz", "rt", encoding="utf-8") as fh:
        paras = [p for p in fh.read(200_000).split("\n\n") if p.strip()]
    stream = torch.tensor([t for p in paras for t in [tok.bos_id, *tok.encode(p), tok.eos_id]])
    args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=tok.vocab_size,
        ffn_dim=192,
        max_seq_len=256,
        tie_embeddings=True,
    )
    torch.manual_seed(0)
    model = Llama(args)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is as fast, and immune to a busy machine
    try:
        for _ in range(80):
            starts = torch.randint(0, len(stream) - 65, (8,), generator=gen)
            x = torch.stack([stream[s : s + 64] for s in starts])
            y = torch.stack([stream[s + 1 : s + 65] for s in starts])
            y = y.masked_fill(y == tok.bos_id, -100)  # the loader's rule: BOS is never a target
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), tok
