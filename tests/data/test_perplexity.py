"""Reference n-gram LM: a normalized KN model, ARPA parity with kenlm, ranking prose < web < garbage."""

from __future__ import annotations

import gzip
import json
import random
import re
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from oreline.config import QualityConfig
from oreline.data.document import Document
from oreline.data.perplexity import (
    BOS,
    UNK,
    ArpaModel,
    doc_perplexity,
    estimate_kneser_ney,
    load_reference,
    perplexity_filter_factory,
    score_cli,
    sentences,
    train_reference,
    write_arpa,
)
from oreline.errors import ConfigError

TRAIN_BOOKS = ["austen-emma.txt", "chesterton-brown.txt"]
HELDOUT_BOOKS = ["austen-persuasion.txt", "chesterton-ball.txt"]


def book(samples: Path, name: str) -> str:
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        return zf.read(f"gutenberg/{name}").decode("latin-1")


def articles(samples: Path) -> list[str]:
    truth = json.loads((samples / "article-extraction-dev" / "ground-truth.json").read_text())
    return [truth[k]["articleBody"] for k in sorted(truth)]


@pytest.fixture(scope="module")
def reference(samples, tmp_path_factory) -> Path:
    """A trigram model on two books plus every other clean news article of the samples."""
    src = tmp_path_factory.mktemp("ref-src")
    paths = []
    for name in TRAIN_BOOKS:
        (src / name).write_text(book(samples, name), encoding="utf-8")
        paths.append(str(src / name))
    with open(src / "articles.jsonl", "w", encoding="utf-8") as fh:
        for i, text in enumerate(articles(samples)[::2]):
            fh.write(json.dumps({"id": f"a{i}", "text": text}) + "\n")
    paths.append(str(src / "articles.jsonl"))
    out = tmp_path_factory.mktemp("ref")
    meta = train_reference(paths, out, kind="ngram", console=None)
    assert meta["documents"] == 2 + len(articles(samples)[::2])
    assert 100 < meta["heldout_perplexity"] < 1000
    return out


def nav_menus(samples: Path) -> list[str]:
    """Link texts of real pages, one per line: what a menu looks like after extraction."""
    out = []
    truth = json.loads((samples / "article-extraction-dev" / "ground-truth.json").read_text())
    for key in sorted(truth)[:30]:
        html = gzip.decompress((samples / "article-extraction-dev" / "html" / f"{key}.html.gz").read_bytes())
        links = [" ".join(t.split()) for t in re.findall(r"<a[^>]*>([^<]{2,40})</a>", html.decode("utf-8", "replace"))]
        links = [t for t in links if t]
        if len(links) >= 20:
            out.append("\n".join(links[:60]))
    return out


def garbage(samples: Path, prose: list[str]) -> dict[str, list[str]]:
    rng = random.Random(0)

    def shuffled(text: str) -> str:
        words = text.split()
        rng.shuffle(words)
        return " ".join(words)

    return {
        "shuffled": [shuffled(t) for t in prose[:20]],
        # keyword stuffing and loaders; repeated function words ("the the the") are the Gopher
        # repetition filter's job: an n-gram model scores them like prose
        "repeated": [" ".join([p] * 150) for p in ("click here", "buy cheap watches", "loading", "free download", "home")],
        "random_chars": ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz    ") for _ in range(2000)) for _ in range(5)],
        "nav_menus": nav_menus(samples),
    }


def auc(low: list[float], high: list[float]) -> float:
    """P(a random `high` score > a random `low` score), ties counted half."""
    lo, hi = np.asarray(low)[:, None], np.asarray(high)[None, :]
    return float((hi > lo).mean() + 0.5 * (hi == lo).mean())


def test_ranks_prose_below_web_below_garbage(samples, reference):
    model = load_reference(reference, backend="python")
    prose = [t[i : i + 3000] for t in (book(samples, b) for b in HELDOUT_BOOKS) for i in range(5000, 65000, 3000)]
    web = [t for t in articles(samples)[1::2] if len(t) > 500]
    bad = garbage(samples, prose)
    assert all(len(v) >= 5 for v in bad.values())
    ppl = lambda texts: [doc_perplexity(model, t)[0] for t in texts]  # noqa: E731
    p_prose, p_web = ppl(prose), ppl(web)
    p_bad = {k: ppl(v) for k, v in bad.items()}
    pooled = [p for v in p_bad.values() for p in v]
    assert np.median(p_prose) < np.median(p_web) < np.median(pooled)
    assert auc(p_prose, pooled) >= 0.98, {k: np.median(v) for k, v in p_bad.items()}
    assert auc(p_prose, p_web) >= 0.8
    for kind, scores in p_bad.items():
        assert np.median(scores) > 2 * np.median(p_prose), kind


def test_kneser_ney_is_normalized(samples, tmp_path):
    sents = sentences(book(samples, "blake-poems.txt"))
    model = estimate_kneser_ney(sents, order=3)
    write_arpa(model, tmp_path / "m.arpa")
    arpa = ArpaModel(tmp_path / "m.arpa")
    assert arpa.order == 3 and arpa.prob[BOS] == -99.0
    vocab = [w for w in model["words"] if w != BOS] + [UNK]
    for context in (["of", "the"], ["the"], [BOS], ["unseen-word"], ["and", "the"]):
        total = sum(10 ** (arpa.word_log10(context, w)) for w in vocab)
        assert total == pytest.approx(1.0, abs=1e-3), context


def test_arpa_query_matches_kenlm(samples, reference):
    kenlm = pytest.importorskip("kenlm", reason="kenlm is optional: pip install 'oreline[ngram]'")
    fast = kenlm.Model(str(reference / "model.arpa"))
    ours = load_reference(reference, backend="python")
    for toks in sentences(book(samples, "austen-persuasion.txt")[:30000])[:300]:
        assert ours.sentence_log10(toks) == pytest.approx(fast.score(" ".join(toks), bos=True, eos=True), abs=1e-3)


def test_filter_by_threshold_and_by_buckets(samples, reference, tmp_path):
    prose = Document("p", book(samples, "austen-persuasion.txt")[10000:14000])
    menu = Document("m", nav_menus(samples)[0])
    cfg = QualityConfig(perplexity_model=str(reference), perplexity_max=1000.0)
    fn = perplexity_filter_factory(cfg)
    assert fn(prose) is None and 50 < prose.metadata["perplexity"] < 1000
    assert fn(menu) == "perplexity:>1000" and menu.metadata["perplexity"] > 1000
    assert fn(Document("e", "   ")) == "perplexity:no_tokens"

    with pytest.raises(ConfigError, match="perplexity_max"):
        perplexity_filter_factory(QualityConfig(perplexity_model=str(reference)))
    # calibrate CCNet buckets on a sample "crawl": prose, web articles and menus
    sample = tmp_path / "crawl.jsonl"
    texts = [prose.text] + [t for t in articles(samples)[1::2] if len(t) > 500][:20] + nav_menus(samples)[:10]
    sample.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    summary = score_cli([str(sample)], reference, tmp_path / "scores.parquet", console=None)
    assert summary["scored"] == len(texts)
    scores = pq.read_table(tmp_path / "scores.parquet").to_pydict()
    assert scores["id"] == [f"d{i}" for i in range(len(texts))]
    cuts = json.loads((reference / "buckets.json").read_text())["cutoffs"]
    assert cuts[0] < cuts[1]
    fn = perplexity_filter_factory(QualityConfig(perplexity_model=str(reference)))
    assert fn(prose) is None and prose.metadata["perplexity_bucket"] == "head"
    assert fn(menu) == "perplexity:bucket_tail"
    (reference / "buckets.json").unlink()


def test_odd_characters_train_and_score(tmp_path):
    text = "Plain words here.\nA \ud800 lone surrogate, a \x00 NUL and tabs\tin it.\n\nDigits 1984 map to 0000."
    assert sentences(text)[1] == ["a", "lone", "surrogate", ",", "a", "nul", "and", "tabs", "in", "it", "."]
    assert ["digits", "0000", "map", "to", "0000", "."] in sentences(text)
    model = estimate_kneser_ney(sentences(text * 3), order=3)
    write_arpa(model, tmp_path / "m.arpa")
    ppl, n = doc_perplexity(ArpaModel(tmp_path / "m.arpa"), text)
    assert n == sum(len(s) + 1 for s in sentences(text)) and 1 < ppl < 50
