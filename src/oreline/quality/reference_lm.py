"""Training reference LMs (`oreline quality train-reference`), and the `llama` kind: a tiny oreline
Llama with its own BPE tokenizer, trained on trusted text.

`train_reference(docs, out, kind)` trains either kind into a self-describing folder:
`reference.json` names the kind, the tokenizer, a fingerprint (sha256 over the model files), the
normalization, the inputs and the training facts (held-out perplexity among them). The n-gram
kind is estimated by `oreline.quality.ngram_lm` (model.arpa).

It sits above `oreline.train`: it is the one place where data-side code trains a model.

Training the llama kind reuses the rest of oreline, so nothing here is a second implementation of anything:

1. the trusted documents are cut into pieces of about `PIECE_CHARS` characters at paragraph
   boundaries (books are single documents; the token loader and the val split want many) and
   written to `corpus.jsonl` in the `work` subfolder of DIR; every `HELDOUT_EVERY`-th piece goes to `heldout.jsonl`
   instead and is never trained on;
2. a byte-level BPE tokenizer is trained on the corpus with `oreline.tokens.train_bpe`
   (`DIR/tokenizer/`), and the corpus is packed into token shards with `oreline.tokens.tokenize`;
3. `oreline.train.loop.train` trains a small `oreline.model.llama.Llama` for a bounded number of
   steps from a generated `Config` whose run directory is that `work` subfolder (metrics.jsonl and the
   model-only snapshot stay there for inspection); the final weights are copied to
   `DIR/model.safetensors`.

Scoring with the trained model is data-side: `oreline.data.filters.llama_scorer` (llama) and
`oreline.data.filters.ngram_scorer` (n-gram), both normalized per word (`oreline.data.filters.words`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from oreline.data.filters.ngram_scorer import TOKENIZER_VERSION, ArpaModel
from oreline.data.filters.words import paragraphs, sentences
from oreline.data.read.inputs import iter_text_documents
from oreline.document import Document
from oreline.errors import ConfigError, InputError
from oreline.io import file_sha256, write_lines_atomic
from oreline.quality.ngram_lm import estimate_kneser_ney, write_arpa

PIECE_CHARS = 2000
HELDOUT_EVERY = 20

# CPU-sized defaults: 0.3M parameters, 450 steps of 2,048 tokens (~0.9M tokens, ~30 s on an idle
# core). Measured on the samples (benchmarks/perplexity_filter.py): a 128-dim, 2,048-vocabulary
# model for 300 steps separated shuffled prose worse (AUC 0.955) and scored 2x slower.
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 1024,
    "dim": 96,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "ffn_dim": 256,
    "seq_len": 128,
    "micro_batch": 16,
    "steps": 450,
    "lr": 6e-3,
    "max_train_chars": 8_000_000,
    "seed": 1234,
}


def _pieces(text: str, size: int = PIECE_CHARS) -> Iterable[str]:
    """Consecutive paragraphs joined until a piece reaches `size` characters."""
    buf: list[str] = []
    n = 0
    for p in paragraphs(text):
        buf.append(p)
        n += len(p) + 1
        if n >= size:
            yield "\n".join(buf)
            buf, n = [], 0
    if buf:
        yield "\n".join(buf)


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    write_lines_atomic(path, (json.dumps(row, ensure_ascii=False) for row in rows), errors="surrogatepass")


# ---------------------------------------------------------------------------------------------
# training either kind


def train_reference(
    docs: list[str],
    out: str | Path,
    kind: str = "ngram",
    console: Any = None,
    order: int = 3,
    heldout_every: int = 20,
    **llama: Any,
) -> dict[str, Any]:
    """Train a reference LM on trusted text into `out`, described by out/reference.json.

    kind "ngram": a KN model (out/model.arpa); every `heldout_every`-th sentence is held out to
    report held-out perplexity. kind "llama": a tiny oreline Llama with its own BPE tokenizer
    (`reference_lm.train_llama_reference`; `llama` overrides its LLAMA_DEFAULTS, e.g. steps=200).
    reference.json: kind, tokenizer, fingerprint (sha256 over the model files), normalization,
    inputs and training facts. `out` is claimed first as oreline's "reference" folder: a non-empty
    folder oreline did not create is refused (`oreline.outdir.claim_folder`).
    """
    from oreline.outdir import claim_folder

    out = Path(out)
    claim_folder(
        out, "reference", "oreline quality train-reference", legacy=lambda d: (d / "reference.json").is_file()
    )
    if kind == "llama":
        facts = train_llama_reference(iter_text_documents(docs), out, console, **llama)
        files = ["model.safetensors", "tokenizer/tokenizer.json"]
        meta = {"kind": "llama", "tokenizer": "tokenizer/ (byte-level BPE, oreline.tokens)", **facts}
    elif kind == "ngram":
        if llama:
            raise ConfigError(
                f"settings {sorted(llama)} apply to --kind llama only", "drop them or use --kind llama"
            )
        meta = _train_ngram(docs, out, console, order, heldout_every)
        files = ["model.arpa"]
    else:
        raise ConfigError(f"unknown reference kind {kind!r}", "use --kind ngram or --kind llama")
    h = hashlib.sha256(kind.encode())
    for name in files:
        h.update(file_sha256(out / name).encode())
    meta = {
        **meta,
        "fingerprint": h.hexdigest(),
        "inputs": [str(d) for d in docs],
        "normalization": "perplexity per word: exp(total NLL / words), words = \\w+ runs and punctuation marks "
        "(lowercased, digits as 0) plus one end-of-sentence per sentence",
    }
    from oreline.io import write_json_atomic

    write_json_atomic(out / "reference.json", meta)
    return meta


def _train_ngram(docs: list[str], out: Path, console: Any, order: int, heldout_every: int) -> dict[str, Any]:
    train, held = [], []
    n_docs = 0
    for doc in iter_text_documents(docs):
        n_docs += 1
        for i, toks in enumerate(sentences(doc.text)):
            (held if heldout_every and i % heldout_every == heldout_every - 1 else train).append(toks)
    model = estimate_kneser_ney(train, order)
    write_arpa(model, out / "model.arpa")
    ref = ArpaModel(out / "model.arpa")
    log10 = sum(ref.sentence_log10(t) for t in held)
    n_held = sum(len(t) + 1 for t in held)
    meta = {
        "kind": "ngram",
        "smoothing": "interpolated modified Kneser-Ney",
        "order": order,
        "tokenizer": TOKENIZER_VERSION,
        "documents": n_docs,
        "train_tokens": sum(len(t) + 1 for t in train),
        "heldout_tokens": n_held,
        "heldout_perplexity": round(10 ** (-log10 / n_held), 3) if n_held else None,
        "vocab": len(model["words"]),
        "ngrams": {n: len(model["keys"][n]) for n in range(1, order + 1)},
        "discounts": {n: [round(d, 4) for d in ds] for n, ds in model["discounts"].items()},
    }
    if console is not None:
        console.print(
            f"reference {order}-gram KN model: {meta['train_tokens']:,} training tokens from {n_docs} documents, "
            f"vocab {meta['vocab']:,}, held-out perplexity {meta['heldout_perplexity']} → {out / 'model.arpa'}"
        )
    return meta


# ---------------------------------------------------------------------------------------------
# the llama kind


def train_llama_reference(
    docs: Iterable[Document], out: Path, console: Any = None, **overrides: Any
) -> dict[str, Any]:
    """Train the tokenizer and the tiny Llama into `out`; returns the facts for reference.json."""
    from rich.console import Console

    from oreline.config import (
        CheckpointConfig,
        Config,
        EvalConfig,
        ModelConfig,
        OptimConfig,
        RunConfig,
        TokenizeConfig,
        TokenizerConfig,
        TrainConfig,
    )
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.tokens.train_bpe import train_tokenizer
    from oreline.train.checkpoint.load import load_model_state
    from oreline.train.loop import train

    unknown = set(overrides) - set(LLAMA_DEFAULTS)
    if unknown:
        raise InputError(
            f"unknown llama reference settings {sorted(unknown)}", f"use any of {sorted(LLAMA_DEFAULTS)}"
        )
    hp = {**LLAMA_DEFAULTS, **{k: v for k, v in overrides.items() if v is not None}}
    work = out / "work"
    from oreline.outdir import remove_tree

    # a previous training's run dir: never resumed from; a link there (refused at the claim) is not followed
    if not remove_tree(out, work):
        raise InputError(
            f"{work} is a symbolic link or a file, not oreline's folder", f"remove {work} and run again"
        )
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    train_rows: list[dict[str, str]] = []
    held_rows: list[dict[str, str]] = []
    n_docs = chars = 0
    for doc in docs:
        n_docs += 1
        for j, piece in enumerate(_pieces(doc.text)):
            if chars >= hp["max_train_chars"]:
                break
            row = {"id": f"{doc.id}#{j}", "text": piece}
            if (len(train_rows) + len(held_rows)) % HELDOUT_EVERY == HELDOUT_EVERY - 1:
                held_rows.append(row)
            else:
                train_rows.append(row)
                chars += len(piece)
    if not train_rows:
        raise InputError(
            "no text to train the reference model on", "pass trusted .txt/.zip/JSONL/Parquet text"
        )
    _write_jsonl(work / "corpus.jsonl", train_rows)
    _write_jsonl(work / "heldout.jsonl", held_rows)

    tok_stats = train_tokenizer(
        [work / "corpus.jsonl"],
        out / "tokenizer",
        TokenizerConfig(vocab_size=hp["vocab_size"], heldout_docs=0),
    )
    manifest = tokenize_corpus(
        [work / "corpus.jsonl"],
        out / "tokenizer",
        work / "tokens",
        TokenizeConfig(val_fraction=0.02, workers=1),
    )
    steps = int(hp["steps"])
    cfg = Config(
        run=RunConfig(name="train", runs_dir=str(work), seed=hp["seed"]),
        model=ModelConfig(
            preset=None,
            dim=hp["dim"],
            n_layers=hp["n_layers"],
            n_heads=hp["n_heads"],
            n_kv_heads=hp["n_kv_heads"],
            ffn_dim=hp["ffn_dim"],
            max_seq_len=hp["seq_len"],
            tie_embeddings=True,
        ),
        train=TrainConfig(
            tokens=str(work / "tokens"),
            tokenizer=str(out / "tokenizer"),
            seq_len=hp["seq_len"],
            micro_batch=hp["micro_batch"],
            steps=steps,
            seed=hp["seed"],
            log_every=max(1, steps // 5),
            eval_every=0,
            eval_sequences=4 * hp["micro_batch"],
            optim=OptimConfig(
                lr=hp["lr"], min_lr=hp["lr"] / 10, warmup_steps=max(1, steps // 20), warmup_ratio=None
            ),
        ),
        checkpoint=CheckpointConfig(every=0, model_only_every=steps, keep_last=1),
        eval=EvalConfig(prompts=[]),
    )
    quiet = Console(file=open(os.devnull, "w"), stderr=False)  # noqa: SIM115 - the loop prints per step
    try:
        summary = train(cfg, resume="none", console=quiet)
    finally:
        quiet.file.close()
    from safetensors.torch import save_file

    from oreline.data.filters.llama_scorer import LlamaScorer

    sd, args, _meta = load_model_state(work / "train" / "checkpoints")
    from oreline.io import write_with

    tensors = {k: v.contiguous() for k, v in sd.items()}
    write_with(out / "model.safetensors", lambda tmp: save_file(tensors, str(tmp)))

    scorer = LlamaScorer(out, args=args)
    scores = scorer.score_texts([r["text"] for r in held_rows]) if held_rows else []
    nll = sum(s["nll"] for s in scores)
    words = sum(s["words"] for s in scores)
    facts = {
        "model_args": args.to_dict(),
        "seq_len": hp["seq_len"],
        "settings": hp,
        "tokenizer_fingerprint": tok_stats["fingerprint"],
        "tokens_fingerprint": manifest["data_fingerprint"],
        "documents": n_docs,
        "train_pieces": len(train_rows),
        "heldout_pieces": len(held_rows),
        "train_chars": chars,
        "train_tokens_seen": summary["tokens_seen"],
        "steps": summary["step"],
        "final_train_loss": summary["final_train_loss"],
        "final_val_loss": summary["final_val_loss"],
        "heldout_perplexity": round(math.exp(nll / words), 3) if words else None,
        "train_seconds": round(time.perf_counter() - t0, 2),
    }
    if console is not None:
        console.print(
            f"reference llama: {args.dim}-dim × {args.n_layers} layers, vocab {args.vocab_size}, "
            f"{summary['step']} steps / {summary['tokens_seen']:,} tokens on {len(train_rows)} pieces of "
            f"{n_docs} documents in {facts['train_seconds']:.1f} s; val loss {summary['final_val_loss']:.3f}, "
            f"held-out perplexity per word {facts['heldout_perplexity']}"
        )
    return facts
