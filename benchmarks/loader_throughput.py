"""Loader batches per second at seq_len 2048, batch 8, and its share of a training step.

Tokens: the Gutenberg + Shakespeare corpus of tokenize_throughput.py, tokenized with a
byte-level BPE (vocab 8192) by `oreline tokenize` (~1.6M tokens in shards of 400k tokens, so
sequences cross shard boundaries). Measured in the same run:

- `TokenLoader.next_batch()` (shuffled global order, memory-mapped shards), with and without
  doc_ids, and resume cost (`load_state_dict` + first batch).
- one training step (forward + backward + AdamW) of a small Llama of the same shape as the
  demo preset (dim 256, 4 layers, vocab 8192) — `oreline.model.llama` when importable, else a
  plain 2-layer torch transformer — on the same batch, fp32, on this CPU.

Printed: batches/s, ms per batch, and loader ms / step ms (target < 1%). On a GPU a step is
much faster than here, so the share printed is for this machine; the ms per batch is the figure
to compare with a GPU step time. Run: .venv/bin/python benchmarks/loader_throughput.py
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

from oreline.config import TokenizeConfig, TokenizerConfig
from oreline.tokens.loader import TokenLoader
from oreline.tokens.tokenize import tokenize_corpus
from oreline.tokens.train_bpe import load_tokenizer, train_tokenizer

SEQ_LEN, BATCH = 2048, 8


def _build_corpus(folder: Path, max_bytes: int):
    spec = importlib.util.spec_from_file_location(
        "tokenize_throughput", Path(__file__).with_name("tokenize_throughput.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_corpus(folder, max_bytes)


def make_model(vocab_size: int) -> tuple[torch.nn.Module, str]:
    try:
        from oreline.model.llama import Llama, ModelArgs

        args = ModelArgs(
            dim=256,
            n_layers=4,
            n_heads=8,
            n_kv_heads=4,
            vocab_size=vocab_size,
            ffn_dim=768,
            max_seq_len=SEQ_LEN,
        )
        return Llama(args), f"oreline Llama (dim 256, 4 layers, GQA 8/4, vocab {vocab_size})"
    except ImportError:

        class Tiny(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(vocab_size, 256)
                layer = torch.nn.TransformerEncoderLayer(256, 8, 768, batch_first=True, norm_first=True)
                self.body = torch.nn.TransformerEncoder(layer, 2)
                self.head = torch.nn.Linear(256, vocab_size, bias=False)

            def forward(self, x, doc_ids=None):
                mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
                return self.head(self.body(self.emb(x), mask=mask, is_causal=True))

        return Tiny(), f"plain torch transformer (dim 256, 2 layers, vocab {vocab_size})"


def time_loader(loader: TokenLoader, n: int) -> float:
    loader.next_batch()  # warm the page cache and the permutation
    t0 = time.perf_counter()
    for _ in range(n):
        loader.next_batch()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        _build_corpus(tmp / "docs", 6_000_000)
        train_tokenizer(
            [tmp / "docs"], tmp / "tok", TokenizerConfig(vocab_size=8192, max_train_docs=600, heldout_docs=50)
        )
        tok = load_tokenizer(tmp / "tok")
        manifest = tokenize_corpus(
            [tmp / "docs"],
            tmp / "tok",
            tmp / "tokens",
            TokenizeConfig(val_fraction=0.01, max_shard_tokens=400_000),
            workers=2,
        )
        train = manifest["splits"]["train"]
        print(
            f"tokens: {train['tokens']:,} train tokens in {train['shards']} shards; seq_len {SEQ_LEN}, micro batch {BATCH}"
        )

        t_open = time.perf_counter()
        loader = TokenLoader(
            tmp / "tokens", seq_len=SEQ_LEN, micro_batch=BATCH, seed=1, tokenizer_fingerprint=tok.fingerprint
        )
        t_open = time.perf_counter() - t_open
        per_batch = time_loader(loader, args.batches)
        masked = TokenLoader(
            tmp / "tokens", seq_len=SEQ_LEN, micro_batch=BATCH, seed=1, doc_mask=True, verify="header"
        )
        per_batch_mask = time_loader(masked, args.batches)
        state = loader.state_dict()
        t_resume = time.perf_counter()
        resumed = TokenLoader(tmp / "tokens", seq_len=SEQ_LEN, micro_batch=BATCH, seed=1, verify="header")
        resumed.load_state_dict(state)
        resumed.next_batch()
        t_resume = time.perf_counter() - t_resume

        model, name = make_model(tok.vocab_size)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = loader.next_batch()

        def step():
            logits = model(batch.input_ids)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), batch.labels.reshape(-1), ignore_index=-100
            )
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        per_step = (time.perf_counter() - t0) / args.steps

        print(f"open (verify=full, {train['shards']} shards sha256): {t_open * 1e3:8.1f} ms")
        print(
            f"next_batch:                {per_batch * 1e3:8.3f} ms  = {1 / per_batch:10,.0f} batches/s  ({BATCH * SEQ_LEN / per_batch / 1e6:,.1f} M tokens/s)"
        )
        print(
            f"next_batch with doc_ids:   {per_batch_mask * 1e3:8.3f} ms  = {1 / per_batch_mask:10,.0f} batches/s"
        )
        print(f"resume (open + load_state_dict + first batch, verify=header): {t_resume * 1e3:.1f} ms")
        print(f"training step of {name}, fp32, {torch.get_num_threads()} threads: {per_step * 1e3:,.0f} ms")
        print(
            f"loader share of a step = {per_batch / per_step:.4%} (doc_ids: {per_batch_mask / per_step:.4%}; target < 1%)"
        )


if __name__ == "__main__":
    main()
