"""Dedup: MinHash estimates, LSH recall, verification, clusters, stage files, the cs336 fixtures."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from oreline.config import Config, DedupConfig
from oreline.data.dedup import (
    UnionFind,
    dedup_plan,
    dedup_stage_signatures,
    estimated_jaccard,
    exact_key,
    jaccard,
    lsh_candidates,
    minhash_signature,
    minhash_signatures,
    near_duplicate_clusters,
    optimal_bands_rows,
    shingles,
    verify_pairs,
)
from oreline.data.document import Document
from oreline.errors import DataIntegrityError

CFG = DedupConfig()


def random_doc(rng: random.Random, n_words: int = 300) -> list[str]:
    return [f"w{rng.randrange(10**9)}" for _ in range(n_words)]


def mutate(words: list[str], rng: random.Random, frac: float) -> list[str]:
    """Replace a share of words with fresh ones (each replacement breaks up to 5 shingles)."""
    out = list(words)
    for i in rng.sample(range(len(out)), int(frac * len(out))):
        out[i] = f"x{rng.randrange(10**9)}"
    return out


def test_minhash_estimates_exact_jaccard():
    rng = random.Random(0)
    errors = []
    for k in range(60):
        a = random_doc(rng)
        b = mutate(a, rng, frac=0.005 + 0.06 * (k % 12) / 11)  # exact Jaccard spread over ~0.3..1
        sa, sb = shingles(" ".join(a)), shingles(" ".join(b))
        exact = jaccard(sa, sb)
        est = estimated_jaccard(minhash_signature(" ".join(a), num_perm=256), minhash_signature(" ".join(b), num_perm=256))
        sd = np.sqrt(max(exact * (1 - exact), 0.01) / 256)
        assert abs(est - exact) < 5 * sd, (exact, est)
        errors.append(est - exact)
    assert abs(np.mean(errors)) < 0.015  # unbiased
    assert np.std(errors) < 0.04


def test_shingles_and_exact_key():
    assert len(shingles("a b c d e f g", 5)) == 3
    assert len(shingles("too short", 5)) == 1  # fewer words than n: the whole text is one shingle
    assert len(shingles("   ", 5)) == 0
    assert np.array_equal(shingles("A b C d E f"), shingles("a  b c\nd e F"))
    assert exact_key("Hello   World\n") == exact_key("hello world")
    assert exact_key("hello world") != exact_key("hello worlds")


def test_batched_signatures_match_single():
    rng = random.Random(1)
    texts = [" ".join(random_doc(rng, rng.randrange(1, 400))) for _ in range(30)] + ["", "one"]
    sig, counts = minhash_signatures(texts, num_perm=64, max_rows=300)  # blocks cross documents
    for t, row, c in zip(texts, sig, counts, strict=True):
        assert np.array_equal(row, minhash_signature(t, num_perm=64))
        assert c == len(shingles(t))
    assert (sig[-2] == 0xFFFFFFFF).all()


def test_optimal_bands_rows():
    b, r = optimal_bands_rows(0.8, 128)
    assert b * r <= 128
    p = lambda s: 1 - (1 - s**r) ** b  # noqa: E731
    assert p(0.9) > 0.99 and p(0.85) > 0.95 and p(0.5) < 0.05
    assert optimal_bands_rows(0.8, 128, 0.5, 0.5) == (9, 13)  # datasketch's choice for equal weights


def test_lsh_finds_planted_near_duplicates():
    rng = random.Random(2)
    base = [random_doc(rng) for _ in range(200)]
    texts = [" ".join(d) for d in base] + [" ".join(mutate(d, rng, 0.01)) for d in base[:20]]
    sig, _ = minhash_signatures(texts)
    b, r = optimal_bands_rows(0.8, 128)
    pairs = {tuple(p) for p in lsh_candidates(sig, b, r).tolist()}
    planted = {(i, 200 + i) for i in range(20)}
    assert planted <= pairs
    assert len(pairs - planted) <= 2  # unrelated random documents almost never collide


def test_verification_rejects_band_collision():
    rng = np.random.default_rng(3)
    sig = rng.integers(0, 2**32, size=(2, 128), dtype=np.uint64).astype(np.uint32)
    sig[1, 9:] = rng.integers(0, 2**32, size=119, dtype=np.uint64).astype(np.uint32)
    sig[1, :9] = sig[0, :9]  # equal in band 0 only (rows=9): an LSH candidate, Jaccard ~0.07
    pairs = lsh_candidates(sig, 14, 9)
    assert pairs.tolist() == [[0, 1]]
    sims = verify_pairs(pairs, sig, 0.8)
    assert sims[0] == pytest.approx(9 / 128)
    assert near_duplicate_clusters(2, pairs[sims >= 0.8], np.arange(2)) == {}


def test_union_find_and_order_independent_survivor():
    edges = np.array([[0, 1], [1, 2], [5, 6], [3, 4], [4, 5]])
    rank = np.array([3, 1, 2, 9, 8, 0, 7])  # row 1 is earliest in {0,1,2}; row 5 in {3,4,5,6}
    expected = {0: 1, 2: 1, 3: 5, 4: 5, 6: 5}
    rng = np.random.default_rng(0)
    for _ in range(5):
        e = edges[rng.permutation(len(edges))]
        e = np.where(rng.random((len(e), 1)) < 0.5, e[:, ::-1], e)
        assert near_duplicate_clusters(7, e, rank) == expected
    uf = UnionFind(4)
    uf.union(0, 1)
    uf.union(2, 3)
    assert uf.find(0) == uf.find(1) != uf.find(2) == uf.find(3)
    uf.union(1, 3)
    assert len(set(uf.roots().tolist())) == 1


def _docs(folder, prefix=""):
    return [
        Document(f"{prefix}{p.name}", p.read_text(), metadata={"source": str(p), "offset": 0})
        for p in sorted(folder.iterdir())
    ]


def test_cs336_fixtures_near_and_exact(samples, tmp_path):
    fuzzy = _docs(samples / "near-dup-fixtures-cs336/documents_with_fuzzy_duplicates")
    lines = _docs(samples / "near-dup-fixtures-cs336/documents_with_line_duplicates", prefix="line-")
    cfg = Config()  # the whole config is accepted too: dedup reads cfg.data.dedup
    # three tasks: dedup is global across them
    paths = [tmp_path / "sig" / f"task-{i}.parquet" for i in range(3)]
    assert dedup_stage_signatures(fuzzy[:1], paths[0], cfg)["docs"] == 1
    dedup_stage_signatures(fuzzy[1:], paths[1], cfg)
    dedup_stage_signatures(iter(lines), paths[2], cfg)
    plan = dedup_plan(paths[::-1], tmp_path / "plan", cfg)
    rails, react = (d.id for d in fuzzy if "mit" in d.id)
    assert sorted(d.id for d in fuzzy) == ["pytorch_license.txt", rails, react]
    assert plan[react] == ("dedup:near_dup", rails)  # rails sorts first by source path
    assert plan["line-doc2.txt"] == ("dedup:exact", "line-doc1.txt")
    assert set(plan) == {react, "line-doc2.txt"}
    removals = pq.read_table(tmp_path / "plan" / "removals.parquet").to_pylist()
    near = next(r for r in removals if r["reason"] == "dedup:near_dup")
    assert 0.8 <= near["similarity"] <= 1.0
    stats = json.loads((tmp_path / "plan" / "dedup_stats.json").read_text())
    assert stats["docs"] == 8 and stats["exact_duplicates"] == 1 and stats["near_duplicates"] == 1
    assert stats["verified_pairs"] >= 1


def test_survivor_is_earliest_by_source_and_offset(tmp_path):
    text = "the same words of this page appear again in a copy of the same page " * 5
    docs = [
        Document("z-first", text, metadata={"source": "a.warc", "offset": 10}),
        Document("a-second", text + " extra", metadata={"source": "a.warc", "offset": 900}),
        Document("b-third", text.upper(), metadata={"source": "b.warc", "offset": 0}),
    ]
    for order in ([0, 1, 2], [2, 1, 0]):
        path = tmp_path / f"sig-{order[0]}.parquet"
        dedup_stage_signatures([docs[i] for i in order], path, CFG)
        plan = dedup_plan([path], tmp_path / f"plan-{order[0]}", CFG)
        assert plan == {"b-third": ("dedup:exact", "z-first"), "a-second": ("dedup:near_dup", "z-first")}


def test_mismatched_signature_files_refuse(tmp_path):
    doc = Document("d", "some words that make up a small document for the test")
    dedup_stage_signatures([doc], tmp_path / "a.parquet", CFG)
    dedup_stage_signatures([doc], tmp_path / "b.parquet", CFG.model_copy(update={"num_perm": 64}))
    with pytest.raises(DataIntegrityError, match="re-run the dedup signature stage"):
        dedup_plan([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "plan", CFG)
