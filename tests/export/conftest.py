"""Fixtures shared by the export tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from oreline.config import TokenizerConfig
from oreline.tokens.train_bpe import train_tokenizer

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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
    import importlib.util

    import torch

    from oreline.tokens.train_bpe import load_tokenizer

    spec = importlib.util.spec_from_file_location("oreline_bench_clients", BENCHMARKS / "clients.py")
    clients = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clients)
    tok = load_tokenizer(tokenizer_dir)
    with gzip.open(samples / "english-prose" / "tinyshakespeare.txt.gz", "rt", encoding="utf-8") as fh:
        paras = [p for p in fh.read(200_000).split("\n\n") if p.strip()]
    args = clients.tiny_args(tok.vocab_size, dim=64, n_layers=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is as fast, and immune to a busy machine
    try:
        model, _ = clients.train_demo_like(paras, tok, args, steps=80, batch=8, seq_len=64)
    finally:
        torch.set_num_threads(threads)
    return model, tok
