"""Scoring with an n-gram reference LM (ARPA): per-word perplexity of documents and paragraphs.

The ARPA file (written by `oreline.quality.ngram_lm`) holds log10 p(w|h) of every seen n-gram and
log10 γ(h) as the backoff of each context, so ARPA backoff lookup (p(w|h) = p*(hw) if seen, else
b(h)·p(w|h')) gives exactly the interpolated Kneser-Ney model. `kenlm`
(`pip install oreline[ngram]`) queries it fast when installed; the same file is otherwise read by
`ArpaModel`, a dict-based query in pure Python (identical scores).

Normalization (both reference kinds, so documents of any length and both kinds read on one scale):
perplexity *per word*, where the words are the tokens of `oreline.data.filters.words` plus one
</s> per sentence. For the n-gram model that is 10 ** (-Σ log10 p / words); the llama kind
(`llama_scorer`) divides the NLL of its BPE tokens by the same word count. Scores are per
paragraph (non-empty line, CCNet's unit) and per document (Σ over its paragraphs).
`load_scorer` picks the scorer a reference folder's reference.json names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from oreline.data.filters.words import paragraphs, sentences
from oreline.errors import InputError

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
TOKENIZER_VERSION = "words-v1"


class ArpaModel:
    """Backoff query of an ARPA file in pure Python: {gram: log10 p} and {context: log10 b} per order."""

    def __init__(self, path: str | Path):
        self.prob: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.order = 0
        section = 0
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.rstrip("\n")
                if not line or line.startswith("ngram ") or line == "\\data\\":
                    continue
                if line.startswith("\\") and line.endswith("-grams:"):
                    section = int(line[1:].split("-")[0])
                    self.order = max(self.order, section)
                    continue
                if line == "\\end\\":
                    break
                parts = line.split("\t")
                self.prob[parts[1]] = float(parts[0])
                if len(parts) > 2:
                    self.backoff[parts[1]] = float(parts[2])
        if UNK not in self.prob:
            raise InputError(
                f"{path} has no <unk> unigram", "train the model with oreline quality train-reference"
            )

    def word_log10(self, context: list[str], w: str) -> float:
        """log10 p(w | context) by ARPA backoff: the longest seen (h, w), plus the backoffs of longer h."""
        prob, backoff = self.prob, self.backoff
        if w not in prob:
            w = UNK
        context = context[len(context) - self.order + 1 :] if self.order > 1 else []
        acc = 0.0
        for start in range(len(context)):
            h = " ".join(context[start:])
            p = prob.get(f"{h} {w}")
            if p is not None:
                return p + acc
            acc += backoff.get(h, 0.0)
        return prob[w] + acc

    def sentence_log10(self, toks: list[str]) -> float:
        """Σ log10 p of the tokens and </s>, starting from <s>."""
        prob = self.prob
        context = [BOS]
        total = 0.0
        for w in (*toks, EOS):
            total += self.word_log10(context, w)
            context.append(w if w in prob else UNK)
            if len(context) >= self.order:
                del context[0]
        return total


class KenlmModel:
    """The same ARPA file queried with the kenlm package (C++)."""

    def __init__(self, path: str | Path):
        import kenlm

        self.model = kenlm.Model(str(path))
        self.order = self.model.order

    def sentence_log10(self, toks: list[str]) -> float:
        return self.model.score(" ".join(toks), bos=True, eos=True)


def load_reference(folder: str | Path, backend: str = "auto") -> ArpaModel | KenlmModel:
    """The reference model in folder (model.arpa): kenlm when importable (auto), else ArpaModel."""
    arpa = Path(folder) / "model.arpa"
    if not arpa.is_file():
        raise InputError(
            f"no reference model at {arpa}", "train one with `oreline quality train-reference TEXT -o FOLDER`"
        )
    if backend in ("auto", "kenlm"):
        try:
            return KenlmModel(arpa)
        except ImportError:
            if backend == "kenlm":
                raise InputError(
                    "the kenlm package is not installed", "pip install 'oreline[ngram]'"
                ) from None
    return ArpaModel(arpa)


def doc_perplexity(model: ArpaModel | KenlmModel, text: str) -> tuple[float, int]:
    """(perplexity per token, predicted tokens incl. </s>); (inf, 0) for text without tokens."""
    log10, n = 0.0, 0
    for toks in sentences(text):
        log10 += model.sentence_log10(toks)
        n += len(toks) + 1
    return (10 ** (-log10 / n), n) if n else (math.inf, 0)


class NgramScorer:
    """Per-word perplexity of documents and their paragraphs under the n-gram reference."""

    kind = "ngram"
    batch_docs = 64  # no gain from batching; the step API is the same for both kinds

    def __init__(self, folder: str | Path, backend: str = "auto"):
        self.model = load_reference(folder, backend)

    def score_texts(self, texts: list[str]) -> list[dict[str, Any]]:
        """Per text: {"perplexity", "words", "nll" (nats), "paragraphs": [ppl or None per paragraph]}."""
        out = []
        for text in texts:
            log10, n, per = 0.0, 0, []
            for para in paragraphs(text):
                pl, pn = 0.0, 0
                for toks in sentences(para):
                    pl += self.model.sentence_log10(toks)
                    pn += len(toks) + 1
                per.append(10 ** (-pl / pn) if pn else None)
                log10, n = log10 + pl, n + pn
            out.append(
                {
                    "perplexity": 10 ** (-log10 / n) if n else math.inf,
                    "words": n,
                    "nll": -log10 * math.log(10),
                    "paragraphs": per,
                }
            )
        return out


def load_scorer(folder: str | Path, backend: str = "auto") -> NgramScorer | Any:
    """The scorer of a reference folder, by the kind its reference.json names (model.arpa alone: ngram)."""
    folder = Path(folder)
    ref_file = folder / "reference.json"
    kind = json.loads(ref_file.read_text()).get("kind") if ref_file.is_file() else "ngram"
    if kind == "ngram":
        return NgramScorer(folder, backend)
    if kind == "llama":
        from oreline.data.filters.llama_scorer import LlamaScorer  # imports torch: only when asked for

        return LlamaScorer(folder)
    raise InputError(
        f"{ref_file} names an unknown reference kind {kind!r}",
        "retrain it with oreline quality train-reference",
    )


_SCORERS: dict[tuple, Any] = {}


def _cached_scorer(folder: str) -> Any:
    """One scorer per worker process: a pipeline task per input file would otherwise reload the
    model for every file (seconds for a large ARPA file). Keyed by the files' mtimes, so a
    retrained model is reloaded."""
    path = Path(folder)
    stamp = tuple(
        (path / n).stat().st_mtime_ns if (path / n).exists() else None
        for n in ("reference.json", "model.arpa", "model.safetensors")
    )
    key = (str(path.resolve()), stamp)
    if key not in _SCORERS:
        _SCORERS.clear()
        _SCORERS[key] = load_scorer(path)
    return _SCORERS[key]


def reference_fingerprint(folder: str | Path) -> str | None:
    ref = Path(folder) / "reference.json"
    return json.loads(ref.read_text()).get("fingerprint") if ref.is_file() else None
