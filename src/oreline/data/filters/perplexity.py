"""Model-based quality: a reference n-gram LM estimated by oreline (ARPA), perplexity scoring for
both reference kinds, and the pipeline's perplexity step with CCNet-style buckets.

Idea (Wenzek et al. 2020, "CCNet", §3.3): a language model trained on trusted text (Wikipedia
there, any clean prose here) gives low perplexity to text that looks like it and high perplexity
to boilerplate, spam, lists and gibberish; documents are then cut by an absolute perplexity or
sorted into head / middle / tail buckets by percentiles of the crawl's own distribution.

Model. Interpolated modified Kneser-Ney (Chen & Goodman 1998, "An Empirical Study of Smoothing
Techniques for Language Modeling", §3–4; the estimate KenLM's lmplz makes, Heafield et al. 2013):

- tokens: lowercased `\\w+` words and single printable punctuation marks, digits mapped to 0 (as CCNet);
  a sentence ends after [.!?] followed by whitespace, or at a blank line; each gets <s> … </s>.
- adjusted counts a(g): raw counts for the highest order and for n-grams starting with <s>,
  otherwise the number of distinct words seen to the left of g (continuation counts).
- discounts per order from counts-of-counts n1..n4 of a: Y = n1/(n1+2 n2), D1 = 1-2Y n2/n1,
  D2 = 2-3Y n3/n2, D3+ = 3-4Y n4/n3.
- p(w|h) = (a(hw) - D(a(hw))) / Σ_x a(hx) + γ(h) p(w|h'), γ(h) = (D1 N1(h·) + D2 N2(h·) +
  D3+ N3+(h·)) / Σ_x a(hx), h' = h without its first word; unigrams interpolate with the uniform
  distribution over the vocabulary plus <unk>.

The ARPA file holds log10 p(w|h) of every seen n-gram and log10 γ(h) as the backoff of each
context, so ARPA backoff lookup (p(w|h) = p*(hw) if seen, else b(h)·p(w|h')) gives exactly the
interpolated model. `kenlm` (`pip install oreline[ngram]`) queries it fast when installed; the
same file is otherwise read by `ArpaModel`, a dict-based query in pure Python (identical scores).

Normalization (both kinds, so documents of any length and both kinds read on one scale):
perplexity *per word*, where the words are the tokens above plus one </s> per sentence. For the
n-gram model that is 10 ** (-Σ log10 p / words); the llama kind (`reference_lm`) divides the NLL
of its BPE tokens by the same word count. Scores are per paragraph (non-empty line, CCNet's unit)
and per document (Σ over its paragraphs).

In `oreline data` (`data.quality.perplexity_model = DIR`), three parts:

- phase 1, step "quality:perplexity" (batched: the llama kind scores batches of documents):
  metadata "perplexity" and "perplexity_paragraphs"; drops "perplexity:no_tokens" and, with
  `perplexity_max`, "perplexity:>MAX";
- without `perplexity_max`, a global phase after phase 1 computes the CCNet cut-offs (p30 and
  p60) from a deterministic sample of this run's own phase-1 survivors: each task draws its
  bottom-k sample (k smallest id hashes, a job on the run's executor) and the driver merges
  them one at a time (bottom-k samples are mergeable), written to work/perplexity/cutoffs.json
  and to stats.json "perplexity";
- phase 3, step "quality:perplexity_buckets" (before dedup): head ≤ p30 < middle ≤ p60 < tail,
  metadata "perplexity_bucket", buckets outside `perplexity_keep_buckets` dropped as
  "perplexity:<bucket>".
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from oreline.config import DataConfig, QualityConfig
from oreline.data.filters.words import paragraphs, sentences
from oreline.document import Document
from oreline.errors import ConfigError, InputError
from oreline.io import atomic_open

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
TOKENIZER_VERSION = "words-v1"
BUCKET_PERCENTILES = (30, 60)  # CCNet: head below the 30th, tail above the 60th percentile


# ---------------------------------------------------------------------------------------------
# estimation


def _discounts(adjusted: np.ndarray) -> tuple[float, float, float]:
    coc = np.bincount(adjusted[adjusted <= 4].astype(np.int64), minlength=5)
    n1, n2, n3, n4 = (int(coc[k]) for k in (1, 2, 3, 4))  # n-grams whose adjusted count is exactly k
    if not (n1 and n2 and n3 and n4):  # tiny corpora: fall back to absolute discounting
        return 0.5, 1.0, 1.5
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    return tuple(float(min(max(x, 0.01), k)) for x, k in zip(d, (1, 2, 3), strict=True))  # type: ignore[return-value]


def _encode(sents: Iterable[list[str]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Vocabulary (id 0 = <s>, 1 = </s>), the padded id stream and each position's sentence number."""
    vocab: dict[str, int] = {BOS: 0, EOS: 1}
    ids: list[int] = []
    sid: list[int] = []
    counter = iter(range(2, 1 << 62))
    for k, toks in enumerate(sents):
        ids.append(0)
        ids.extend(vocab.setdefault(t, next(counter)) if t not in vocab else vocab[t] for t in toks)
        ids.append(1)
        sid.extend([k] * (len(toks) + 2))
    words = [""] * len(vocab)
    for w, i in vocab.items():
        words[i] = w
    return words, np.array(ids, dtype=np.int64), np.array(sid, dtype=np.int64)


def estimate_kneser_ney(sents: Iterable[list[str]], order: int = 3) -> dict[str, Any]:
    """Interpolated modified Kneser-Ney, vectorized over n-gram keys.

    An n-gram is one int64 key: its word ids packed in `bits` bits each, first word highest, so
    sorted keys group n-grams by context and `key >> bits` is the context, `key & mask` the suffix.
    Returns {"order", "words", "bits", "discounts", "keys": [per order], "log10p": [...], "log10b": [...]}.
    """
    words, seq, sid = _encode(sents)
    if len(words) <= 2:
        raise InputError(
            "no text to train the reference model on", "pass trusted .txt/.zip/JSONL/Parquet text"
        )
    bits = max(1, int(len(words) - 1).bit_length())
    if bits * order > 63:
        raise ConfigError(
            f"a {order}-gram model over {len(words):,} words does not fit 64-bit keys", "lower the order"
        )
    keys, raw = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    key = np.zeros(len(seq), dtype=np.int64)
    for n in range(1, order + 1):
        m = len(seq) - n + 1
        key = (key[:m] << bits) | seq[n - 1 :]
        valid = sid[:m] == sid[n - 1 :]  # n-grams never cross sentences
        k, c = np.unique(key[valid], return_counts=True)
        keys.append(k)
        raw.append(c)
    adjusted = [None] * (order + 1)
    adjusted[order] = raw[order]
    for n in range(order - 1, 0, -1):
        suffix, left = np.unique(keys[n + 1] & ((1 << (n * bits)) - 1), return_counts=True)
        pos = np.searchsorted(suffix, keys[n])
        found = (pos < len(suffix)) & (suffix[np.minimum(pos, len(suffix) - 1)] == keys[n])
        cont = np.where(found, left[np.minimum(pos, len(suffix) - 1)], 0)
        starts_bos = (keys[n] >> ((n - 1) * bits)) == 0
        adjusted[n] = np.where(starts_bos, raw[n], cont)  # nothing precedes <s>: raw counts
    uniform = 1.0 / len(words)  # every word but <s>, plus <unk>
    discounts, log10p, log10b = {}, [None] * (order + 1), [None] * (order + 1)
    prob = [None] * (order + 1)
    gammas = [None] * (order + 1)  # (context keys, gamma) of order n
    for n in range(1, order + 1):
        a = adjusted[n].astype(np.float64)
        if n == 1:
            a[keys[1] == 0] = 0.0  # <s> is never predicted
        d = _discounts(adjusted[n][a > 0])
        discounts[n] = d
        disc = np.where(a == 0, 0.0, np.where(a == 1, d[0], np.where(a == 2, d[1], d[2])))
        ctx = keys[n] >> bits
        uctx, inv = np.unique(ctx, return_inverse=True)
        total = np.bincount(inv, weights=a)
        gamma = np.bincount(inv, weights=disc) / total
        gammas[n] = (uctx, gamma)
        if n == 1:
            lower = uniform
        else:
            lower = prob[n - 1][np.searchsorted(keys[n - 1], keys[n] & ((1 << ((n - 1) * bits)) - 1))]
        prob[n] = (a - disc) / total[inv] + gamma[inv] * lower
    for n in range(1, order + 1):
        with np.errstate(divide="ignore"):
            log10p[n] = np.log10(prob[n])
        if n == 1:
            log10p[1][keys[1] == 0] = -99.0
        b = np.zeros(len(keys[n]))
        if n < order:
            uctx, gamma = gammas[n + 1]
            pos = np.searchsorted(uctx, keys[n])
            hit = (pos < len(uctx)) & (uctx[np.minimum(pos, len(uctx) - 1)] == keys[n])
            b[hit] = np.log10(gamma[pos[hit]])
        log10b[n] = b
    unk = float(np.log10(gammas[1][1][0] * uniform))
    return {
        "order": order,
        "words": words,
        "bits": bits,
        "discounts": discounts,
        "keys": keys,
        "log10p": log10p,
        "log10b": log10b,
        "unk_log10p": unk,
    }


def write_arpa(model: dict[str, Any], path: str | Path) -> None:
    """ARPA text: \\data\\ counts, then one section per order of `log10p  gram  [log10 backoff]`."""
    order, words, bits = model["order"], np.array(model["words"], dtype=object), model["bits"]
    mask = (1 << bits) - 1
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write("\\data\\\n")
        for n in range(1, order + 1):
            fh.write(f"ngram {n}={len(model['keys'][n]) + (n == 1)}\n")
        for n in range(1, order + 1):
            fh.write(f"\n\\{n}-grams:\n")
            keys = model["keys"][n]
            cols = [words[(keys >> ((n - 1 - j) * bits)) & mask] for j in range(n)]
            grams = cols[0] if n == 1 else [" ".join(t) for t in zip(*cols, strict=True)]
            if n == 1:
                fh.write(f"{model['unk_log10p']:.6f}\t{UNK}\n")
            for gram, p, b in zip(
                grams, model["log10p"][n].tolist(), model["log10b"][n].tolist(), strict=True
            ):
                fh.write(f"{p:.6f}\t{gram}\t{b:.6f}\n" if b != 0.0 else f"{p:.6f}\t{gram}\n")
        fh.write("\n\\end\\\n")


# ---------------------------------------------------------------------------------------------
# query


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


# ---------------------------------------------------------------------------------------------
# scorers: one interface for both kinds


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


# ---------------------------------------------------------------------------------------------
# the pipeline: score in phase 1, cut-offs from the run's own documents, buckets in phase 3


def _finite(x: float | None, digits: int) -> float | None:
    return round(x, digits) if x is not None and math.isfinite(x) else None


def perplexity_filter_factory(cfg: QualityConfig):
    """The phase-1 step "quality:perplexity" (a batched Step): scores every document.

    Writes metadata["perplexity"] (per word, see the module docstring) and
    metadata["perplexity_paragraphs"] (one per non-empty line, None where nothing was scored).
    Drops "perplexity:no_tokens" and, with perplexity_max set, "perplexity:>MAX". Without an
    absolute cut-off the buckets are applied in phase 3 (`bucket_step`), once the cut-offs have
    been computed from this run's own documents (`compute_cutoffs`).
    """
    from oreline.data.pipeline.runner import Step

    if not cfg.perplexity_model:
        raise ConfigError(
            "data.quality.perplexity_model is not set",
            "train a model with oreline quality train-reference and set its folder",
        )
    from oreline.config import expand

    scorer = _cached_scorer(expand(cfg.perplexity_model))
    limit = cfg.perplexity_max

    def judge(doc: Document, s: dict[str, Any]) -> str | None:
        doc.metadata["perplexity"] = _finite(s["perplexity"], 2) if s["words"] else None
        doc.metadata["perplexity_paragraphs"] = [_finite(p, 1) for p in s["paragraphs"]]
        if not s["words"]:
            return "perplexity:no_tokens"
        if limit is not None and s["perplexity"] > limit:
            return f"perplexity:>{limit:g}"
        return None

    def batch(docs: list[Document]) -> list[str | None]:
        return [judge(d, s) for d, s in zip(docs, scorer.score_texts([d.text for d in docs]), strict=True)]

    return Step(
        "quality:perplexity",
        lambda doc: batch([doc])[0],
        batch_fn=batch,
        batch_size=getattr(scorer, "batch_docs", 32),
    )


def bucket_mode(cfg) -> bool:
    """CCNet buckets (cut-offs from this run) instead of an absolute perplexity cut-off."""
    q = cfg.data.quality
    return bool(q.enabled and q.perplexity_model and q.perplexity_max is None)


def cutoffs_path(work: Path) -> Path:
    return Path(work) / "perplexity" / "cutoffs.json"


def perplexity_phase(work: Path, task_dirs: list[Path], cfg, executor=None) -> dict[str, Any] | None:
    """The global phase between 1 and 3: stats.json's "perplexity" (bucket cut-offs or the absolute cut-off).

    The cut-offs' sample is drawn per task, as jobs on `executor` (the run's; inline without one),
    and merged here one task's sample at a time: memory 2·k pairs, whatever the number of tasks."""
    q = cfg.data.quality
    if not (q.enabled and q.perplexity_model):
        return None
    if not bucket_mode(cfg):
        return {
            "mode": "max",
            "perplexity_max": q.perplexity_max,
            "model": q.perplexity_model,
            "model_fingerprint": reference_fingerprint(_expand(q.perplexity_model)),
        }
    out_file = cutoffs_path(work)
    if out_file.is_file():
        return json.loads(out_file.read_text())
    t0 = time.perf_counter()
    k = q.perplexity_sample_docs
    jobs = [
        (
            [str(p) for p in sorted(Path(d).glob("kept-*.parquet"))],
            str(out_file.parent / "samples" / f"{Path(d).name}.json"),
            k,
        )
        for d in task_dirs
    ]
    if executor is None:
        results = [task_sample(*job) for job in jobs]
    else:
        from oreline.executors.interface import TaskCrashed

        results = executor.map(task_sample, jobs, label="perplexity sample")
        crashed = [r for r in results if isinstance(r, TaskCrashed)]
        if crashed:
            from oreline.errors import DataIntegrityError

            raise DataIntegrityError(
                f"{len(crashed)} perplexity sample job(s) crashed their worker twice ({crashed[0].error})",
                "run the same command again: finished jobs are kept and the crashed ones retried",
            )
    sample: list[tuple[int, float]] = []
    for r in results:
        sample = merge_bottom_k(sample, _read_sample(r["path"]), k)
    return _write_cutoffs(sum(r["scored"] for r in results), sample, out_file, cfg, t0)


def _sample_key(doc_id: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
    )


def merge_bottom_k(a: list[tuple[int, float]], b: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    """The k smallest (key, perplexity) of two samples: bottom-k samples merge into the bottom-k of the union."""
    import heapq

    return heapq.nsmallest(k, a + b)


def bottom_k(kept_files: list[str] | list[Path], k: int) -> tuple[int, list[tuple[int, float]]]:
    """(scored documents, their k smallest (hash of id, perplexity)) over some kept files.

    A bottom-k sample: uniform, independent of task order and worker count, memory bounded by k,
    and mergeable (`merge_bottom_k`), so each task draws its own and the driver merges them."""
    import heapq

    import pyarrow.parquet as pq

    heap: list[tuple[int, float]] = []  # max-heap by (key, ppl), negated: the k smallest seen
    seen = 0
    for path in kept_files:
        table = pq.read_table(path, columns=["id", "perplexity"])
        for doc_id, ppl in zip(
            table.column("id").to_pylist(), table.column("perplexity").to_pylist(), strict=True
        ):
            if ppl is None or not math.isfinite(ppl):
                continue
            seen += 1
            item = (-_sample_key(doc_id), -ppl)
            if len(heap) < k:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)
    return seen, sorted((-key, -ppl) for key, ppl in heap)


def task_sample(kept_files: list[str], out: str, k: int) -> dict[str, Any]:
    """Job: one task's bottom-k sample, written to `out` (skipped when it exists)."""
    path = Path(out)
    if path.is_file():
        return {"scored": json.loads(path.read_text())["scored"], "path": out}
    seen, sample = bottom_k(kept_files, k)
    from oreline.io import write_json_atomic

    write_json_atomic(path, {"scored": seen, "sample": [list(x) for x in sample]})
    return {"scored": seen, "path": out}


def _read_sample(path: str) -> list[tuple[int, float]]:
    return [(int(key), float(ppl)) for key, ppl in json.loads(Path(path).read_text())["sample"]]


def compute_cutoffs(kept_files: list[Path], out_file: Path, cfg) -> dict[str, Any]:
    """Cut-offs of the head/middle/tail buckets from a deterministic sample of these documents.

    The sample is the `perplexity_sample_docs` scored documents with the smallest hash of their
    id (ties: the smaller perplexity), so it does not depend on the files' order. Written once to
    `out_file` (the phase's marker) and returned for stats.json. One process; the pipeline draws
    the same sample per task and merges (`perplexity_phase`)."""
    if out_file.is_file():
        return json.loads(out_file.read_text())
    t0 = time.perf_counter()
    seen, sample = bottom_k(kept_files, cfg.data.quality.perplexity_sample_docs)
    return _write_cutoffs(seen, sample, out_file, cfg, t0)


def _write_cutoffs(
    seen: int, sample: list[tuple[int, float]], out_file: Path, cfg, t0: float
) -> dict[str, Any]:
    values = np.array([p for _, p in sample])
    lo, hi = BUCKET_PERCENTILES
    result = {
        "mode": "buckets",
        "percentiles": [lo, hi],
        "scored_docs": seen,
        "sample_docs": int(values.size),
        "cutoffs": [float(np.percentile(values, lo)), float(np.percentile(values, hi))]
        if values.size
        else None,
        "sample_median": float(np.median(values)) if values.size else None,
        "keep": list(cfg.data.quality.perplexity_keep_buckets),
        "model": cfg.data.quality.perplexity_model,
        "model_fingerprint": reference_fingerprint(_expand(cfg.data.quality.perplexity_model)),
        "seconds": round(time.perf_counter() - t0, 6),
    }
    from oreline.io import write_json_atomic

    write_json_atomic(out_file, result)
    return result


def _expand(path: str) -> str:
    from oreline.config import expand

    return expand(path)


def bucket_step(cutoffs_file: Path, cfg):
    """The phase-3 step "quality:perplexity_buckets": head ≤ p30 < middle ≤ p60 < tail.

    Sets metadata["perplexity_bucket"]; drops buckets not in perplexity_keep_buckets with the
    reason "perplexity:<bucket>". None when not in bucket mode.
    """
    if not bucket_mode(cfg) or not cutoffs_file.is_file():
        return None
    from oreline.data.pipeline.runner import Step

    info = json.loads(cutoffs_file.read_text())
    cuts = info["cutoffs"]
    keep = set(cfg.data.quality.perplexity_keep_buckets)

    def bucket(doc: Document) -> str | None:
        ppl = doc.metadata.get("perplexity")
        if cuts is None or ppl is None:  # no sample at all: nothing to cut by
            return None
        name = "head" if ppl <= cuts[0] else "middle" if ppl <= cuts[1] else "tail"
        doc.metadata["perplexity_bucket"] = name
        return None if name in keep else f"perplexity:{name}"

    return Step("quality:perplexity_buckets", bucket)


def cutoff_line(info: dict[str, Any]) -> str:
    """The funnel's line about the perplexity cut-off(s) of the run."""
    if info.get("mode") == "max":
        return f"perplexity: documents above {info['perplexity_max']:g} per word dropped (data.quality.perplexity_max)"
    if not info.get("cutoffs"):
        return f"perplexity buckets: no scored documents in the sample ({info.get('scored_docs', 0)} scored)"
    a, b = info["cutoffs"]
    lo, hi = info["percentiles"]
    return (
        f"perplexity buckets (CCNet, p{lo}/p{hi} of a sample of {info['sample_docs']:,} of this run's "
        f"{info['scored_docs']:,} scored docs): head ≤ {a:,.1f} < middle ≤ {b:,.1f} < tail; kept: {', '.join(info['keep'])}"
    )


# ---------------------------------------------------------------------------------------------
# CLI entry points


def iter_docs(paths: Iterable[str | Path]) -> Iterator[Document]:
    from oreline.data.read.inputs import discover_inputs, iter_input_documents

    found, unknown = discover_inputs([str(p) for p in paths])
    if unknown:
        raise InputError(
            f"{len(unknown)} input files of unknown kind, e.g. {unknown[0]}",
            "pass .txt/.txt.gz/.zip/.jsonl/.parquet files",
        )
    for path, kind in found:
        if kind == "warc":
            raise InputError(f"{path} is a WARC file", "run oreline data first and score its Parquet shards")
        yield from iter_input_documents(path, DataConfig())


def score_cli(
    docs: list[str], model: str | Path, out: str | Path | None, console: Any = None, batch_docs: int = 32
) -> dict[str, Any]:
    """Score documents, print the perplexity distribution, write per-document scores.

    out (Parquet): id, source_file, words, perplexity. The summary names the percentiles a user
    picks `data.quality.perplexity_max` from, and the p30/p60 the pipeline's buckets would use on
    these documents (the pipeline computes its own from each run's documents).
    """
    scorer = load_scorer(model)
    ids, sources, words, ppls = [], [], [], []
    batch: list[Document] = []
    t0 = time.perf_counter()

    def flush() -> None:
        for doc, s in zip(batch, scorer.score_texts([d.text for d in batch]), strict=True):
            ids.append(doc.id)
            sources.append(str(doc.metadata.get("source_file", "")))
            words.append(int(round(s["words"])))
            ppls.append(s["perplexity"] if s["words"] else math.inf)
        batch.clear()

    for doc in iter_docs(docs):
        batch.append(doc)
        if len(batch) >= batch_docs:
            flush()
    flush()
    seconds = time.perf_counter() - t0
    finite = np.array([p for p in ppls if math.isfinite(p)])
    if finite.size == 0:
        raise InputError("no document had any word to score", "pass text documents")
    pct = {q: float(np.percentile(finite, q)) for q in (10, 30, 50, 60, 90)}
    summary = {
        "documents": len(ppls),
        "scored": int(finite.size),
        "percentiles": pct,
        "kind": scorer.kind,
        "bucket_cutoffs": [pct[BUCKET_PERCENTILES[0]], pct[BUCKET_PERCENTILES[1]]],
        "seconds": round(seconds, 3),
        "docs_per_s": len(ppls) / seconds if seconds else None,
    }
    if out is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(
            pa.table({"id": ids, "source_file": sources, "words": words, "perplexity": ppls}), str(out)
        )
    if console is not None:
        console.print(
            f"{len(ppls)} documents scored with the {scorer.kind} reference in {seconds:.1f} s; perplexity per word "
            f"p10 {pct[10]:.1f}, p30 {pct[30]:.1f}, median {pct[50]:.1f}, p60 {pct[60]:.1f}, p90 {pct[90]:.1f}"
            + (f"; scores → {out}" if out else "")
        )
        console.print(
            "set data.quality.perplexity_max to one of these to cut absolutely, or leave it unset for CCNet "
            "buckets (head/middle/tail at p30/p60 of each run's own documents)"
        )
    return summary
