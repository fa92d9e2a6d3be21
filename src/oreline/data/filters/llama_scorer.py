"""Scoring documents with a llama reference LM (the `llama` kind of `oreline quality train-reference`).

Scoring (`LlamaScorer.score_texts`) is batched over documents: every document is split into
paragraphs (non-empty lines), each paragraph is encoded (with its newline), the ids of a document
are `<s>` + paragraphs + `</s>`, cut into windows of `seq_len` targets; the windows of all documents
of a batch run through the model together (right-padded, padding masked out of the loss). A
document is scored up to `max_tokens` BPE tokens; paragraphs after that get no score.

Normalization (the same scale as the n-gram kind, so thresholds read alike; `data/filters/words.py`):

    ppl = exp( Σ NLL of its BPE tokens, in nats / number of its words )

A paragraph cut by `max_tokens` counts its words in proportion to the tokens that were scored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from oreline.data.filters.words import paragraphs, word_count
from oreline.errors import InputError


class LlamaScorer:
    """Per-word perplexity of documents and their paragraphs under a trained llama reference."""

    kind = "llama"

    def __init__(
        self,
        folder: str | Path,
        args: Any = None,
        max_tokens: int = 1024,
        batch_windows: int = 32,
        device: str | None = None,
        threads: int | None = 1,
    ):
        import torch
        from safetensors.torch import load_file

        from oreline.model.llama import Llama, ModelArgs, check_shapes
        from oreline.model.presets import check_model_memory
        from oreline.tokens.train_bpe import load_tokenizer

        folder = Path(folder)
        if args is None:
            ref = json.loads((folder / "reference.json").read_text())
            args = ModelArgs.from_dict(ref["model_args"])
        weights = folder / "model.safetensors"
        if not weights.is_file():
            raise InputError(
                f"no model weights at {weights}",
                "train the reference with `oreline quality train-reference --kind llama`",
            )
        self.tok = load_tokenizer(folder / "tokenizer")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        state = load_file(str(weights))
        # reference.json's model_args are the file's word: shapes and memory checked before building
        check_shapes(state, args, source=str(weights))
        check_model_memory(args, self.device, str(folder / "reference.json"))
        self.model = Llama(args)
        self.model.load_state_dict(state, strict=True)
        self.model.to(self.device).eval()
        self.seq_len = args.max_seq_len
        self.max_tokens = max_tokens
        self.batch_windows = batch_windows
        # One thread by default: the pipeline parallelizes over worker processes, and on a shared
        # CPU two torch threads per process ran 6x slower than one (measured: 8.8 s vs 1.35 s).
        self.threads = threads
        self.batch_docs = 32

    def _doc_ids(self, text: str) -> tuple[list[int], list[tuple[int, int, float]], int]:
        """Ids `<s>` + paragraphs (each with its newline) + `</s>`, and per paragraph
        (first target index, end target index, words), cut at max_tokens targets."""
        paras = paragraphs(text)
        encoded = self.tok.encode_batch([p + "\n" for p in paras]) if paras else []
        ids = [self.tok.bos_id]
        spans: list[tuple[int, int, float]] = []
        for p, e in zip(paras, encoded, strict=True):
            room = self.max_tokens - (len(ids) - 1)
            if room <= 0:
                break
            words = word_count(p)
            take = e[:room]
            spans.append((len(ids) - 1, len(ids) - 1 + len(take), words * len(take) / max(len(e), 1)))
            ids.extend(take)
        if spans and len(ids) - 1 < self.max_tokens:  # </s> counts with the last paragraph
            s, _e, w = spans[-1]
            ids.append(self.tok.eos_id)
            spans[-1] = (s, len(ids) - 1, w)
        return ids, spans, len(paras)

    def score_texts(self, texts: list[str]) -> list[dict[str, Any]]:
        """Per text: {"perplexity", "words", "nll", "paragraphs": [ppl or None per paragraph]}."""
        import torch

        L = self.seq_len
        docs = [self._doc_ids(t) for t in texts]
        windows: list[tuple[int, int, list[int]]] = []  # (doc, first target index, ids incl. the last target)
        for d, (ids, _spans, _n) in enumerate(docs):
            for start in range(0, len(ids) - 1, L):
                windows.append((d, start, ids[start : start + L + 1]))
        nll = [torch.zeros(max(len(ids) - 1, 0), dtype=torch.float64) for ids, _, _ in docs]
        threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            self._forward(windows, nll)
        finally:
            torch.set_num_threads(threads)
        out = []
        for (_ids, spans, n_paras), per_tok in zip(docs, nll, strict=True):
            para = [(float(per_tok[s:e].sum()), w) for s, e, w in spans]
            total, words = sum(p for p, _ in para), sum(w for _, w in para)
            ppl = math.exp(total / words) if words else math.inf
            scored = [math.exp(p / w) if w else None for p, w in para]
            out.append(
                {
                    "perplexity": ppl,
                    "words": words,
                    "nll": total,
                    "paragraphs": scored + [None] * (n_paras - len(scored)),
                }
            )
        return out

    def _forward(self, windows: list[tuple[int, int, list[int]]], nll: list[Any]) -> None:
        """Per-target NLL (nats) of every window into nll[doc][first target …], batch_windows rows at a time."""
        import torch
        import torch.nn.functional as F

        order = sorted(range(len(windows)), key=lambda k: -len(windows[k][2]))  # similar lengths together
        with torch.inference_mode():
            for b in range(0, len(order), self.batch_windows):
                chunk = [windows[k] for k in order[b : b + self.batch_windows]]
                T = max(len(w[2]) for w in chunk) - 1
                x = torch.full((len(chunk), T), self.tok.pad_id, dtype=torch.long)
                y = torch.full((len(chunk), T), -100, dtype=torch.long)
                for r, (_d, _s, w) in enumerate(chunk):
                    x[r, : len(w) - 1] = torch.tensor(w[:-1])
                    y[r, : len(w) - 1] = torch.tensor(w[1:])
                logits = self.model(x.to(self.device))  # (B, T, vocab), fp32
                loss = (
                    F.cross_entropy(
                        logits.flatten(0, 1), y.to(self.device).flatten(), ignore_index=-100, reduction="none"
                    )
                    .view(len(chunk), T)
                    .double()
                    .cpu()
                )
                for r, (d, s, w) in enumerate(chunk):
                    nll[d][s : s + len(w) - 1] = loss[r, : len(w) - 1]
