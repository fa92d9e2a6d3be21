"""Dedup: MinHash estimates, LSH recall, verification (signature and exact), clusters, stage files,
the text source over Parquet shards, the pipeline's exact verification, the cs336 fixtures."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from oreline.config import Config, DedupConfig, load_config
from oreline.data.dedup.buckets import lsh_candidates
from oreline.data.dedup.components import UnionFind, near_duplicate_clusters
from oreline.data.dedup.minhash import (
    bands_rows,
    dedup_stage_signatures,
    estimated_jaccard,
    minhash_signature,
    minhash_signatures,
    optimal_bands_rows,
)
from oreline.data.dedup.reference_plan import dedup_plan
from oreline.data.dedup.shingles import exact_key, jaccard, shingles
from oreline.data.dedup.verify import parquet_text_source, verify_pairs
from oreline.data.pipeline.run import run_data
from oreline.data.read.shards import read_documents, write_documents
from oreline.document import Document
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
        est = estimated_jaccard(
            minhash_signature(" ".join(a), num_perm=256), minhash_signature(" ".join(b), num_perm=256)
        )
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


@pytest.mark.extended("near-dup-fixtures-cs336")
def test_cs336_fixtures_near_and_exact(full_samples, tmp_path):
    fuzzy = _docs(full_samples / "near-dup-fixtures-cs336/documents_with_fuzzy_duplicates")
    lines = _docs(full_samples / "near-dup-fixtures-cs336/documents_with_line_duplicates", prefix="line-")
    cfg = Config()  # the whole config is accepted too: dedup reads cfg.data.dedup
    # three tasks: dedup is global across them
    paths = [tmp_path / "sig" / f"task-{i}.parquet" for i in range(3)]
    assert dedup_stage_signatures(fuzzy[:1], paths[0], cfg)["docs"] == 1
    dedup_stage_signatures(fuzzy[1:], paths[1], cfg)
    dedup_stage_signatures(iter(lines), paths[2], cfg)
    source = DictSource(fuzzy + lines)
    plan = dedup_plan(paths[::-1], tmp_path / "plan", cfg, text_source=source)
    rails, react = (d.id for d in fuzzy if "mit" in d.id)
    assert sorted(d.id for d in fuzzy) == ["pytorch_license.txt", rails, react]
    assert plan[react] == ("dedup:near_dup", rails)  # rails sorts first by source path
    assert plan["line-doc2.txt"] == ("dedup:exact", "line-doc1.txt")
    assert set(plan) == {react, "line-doc2.txt"}
    removals = pq.read_table(tmp_path / "plan" / "removals.parquet").to_pylist()
    near = next(r for r in removals if r["reason"] == "dedup:near_dup")
    assert near["similarity_method"] == "jaccard"
    assert near["similarity"] == pytest.approx(
        jaccard(*(shingles(d.text) for d in fuzzy if "mit" in d.id)), abs=1e-6
    )
    assert 0.8 <= near["similarity"] <= 1.0
    assert source.asked == {rails, react}  # the exact duplicate is not bucketed, the license not a candidate
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


# ---------------------------------------------------------------------------------------------
# exact verification


def borderline_pair(exact_range: tuple[float, float], estimate_above: bool) -> tuple[str, str, float]:
    """Two 300-word texts, an LSH candidate pair, whose exact Jaccard is in exact_range and whose
    signature estimate is on the given side of the threshold (found by a deterministic search)."""
    b, r = bands_rows(CFG)
    for seed in range(2000):
        rng = random.Random(seed)
        a = random_doc(rng)
        for k in range(4, 12):  # words replaced: exact Jaccard ~0.87 .. ~0.67
            m = list(a)
            for i in rng.sample(range(len(a)), k):
                m[i] = f"x{rng.randrange(10**9)}"
            ta, tb = " ".join(a), " ".join(m)
            exact = jaccard(shingles(ta), shingles(tb))
            if not exact_range[0] <= exact < exact_range[1]:
                continue
            sig, _ = minhash_signatures([ta, tb], CFG.num_perm, CFG.shingle_words, CFG.seed)
            if (estimated_jaccard(sig[0], sig[1]) >= CFG.threshold) == estimate_above and len(
                lsh_candidates(sig, b, r)
            ):
                return ta, tb, exact
    raise AssertionError("no borderline pair found")


@pytest.fixture(scope="module")
def borderline_docs():
    """fp-*: estimate above the threshold, exact below; fn-*: the other way round; u*: unrelated."""
    fp_a, fp_b, fp_j = borderline_pair((0.7, CFG.threshold), estimate_above=True)
    fn_a, fn_b, fn_j = borderline_pair((CFG.threshold, 0.9), estimate_above=False)
    rng = random.Random(7)
    docs = [
        Document(i, t, metadata={"source": "s.jsonl", "offset": n})
        for n, (i, t) in enumerate([("fp-a", fp_a), ("fn-a", fn_a), ("fp-b", fp_b), ("fn-b", fn_b)])
    ]
    docs += [
        Document(f"u{n}", " ".join(random_doc(rng)), metadata={"source": "s.jsonl", "offset": 10 + n})
        for n in range(20)
    ]
    return docs, fp_j, fn_j


class DictSource:
    """A text source over an in-memory dict that records which ids it was asked for."""

    def __init__(self, docs, skip=(), replace=None, extra=()):
        self.texts = {d.id: d.text for d in docs if d.id not in skip}
        self.texts.update(replace or {})
        self.extra = list(extra)
        self.asked: set[str] = set()

    def __call__(self, ids):
        self.asked |= ids
        yield from ((i, self.texts[i]) for i in sorted(ids) if i in self.texts)
        yield from self.extra


def _signature_files(docs, tmp_path):
    paths = [tmp_path / "sig" / "task-0.parquet", tmp_path / "sig" / "task-1.parquet"]
    dedup_stage_signatures(docs[:3] + docs[10:], paths[0], CFG)  # pairs span both files: dedup is global
    dedup_stage_signatures(docs[3:10], paths[1], CFG)
    return paths


def test_exact_verification_decides_where_the_estimate_errs(borderline_docs, tmp_path):
    docs, fp_j, fn_j = borderline_docs
    paths = _signature_files(docs, tmp_path)
    source = DictSource(docs)
    plan = dedup_plan(paths, tmp_path / "exact", CFG, text_source=source)
    assert plan == {"fn-b": ("dedup:near_dup", "fn-a")}  # fp-b (estimate above, exact below) is kept
    assert source.asked == {"fp-a", "fp-b", "fn-a", "fn-b"}  # only candidates' texts are read
    stats = json.loads((tmp_path / "exact" / "dedup_stats.json").read_text())
    assert stats["verify"] == "exact" and (stats["bands"], stats["rows"]) == bands_rows(CFG)
    assert (
        stats["candidate_pairs"] == stats["exact_verified_pairs"] == 2
        and stats["signature_verified_pairs"] == 0
    )
    assert stats["verified_pairs"] == 1 and stats["rejected_pairs"] == 1
    assert stats["estimate_above_exact_below"] == 1 and stats["estimate_below_exact_above"] == 1
    assert stats["texts_read"] == stats["candidate_docs"] == 4 and stats["texts_missing"] == 0
    removal = pq.read_table(tmp_path / "exact" / "removals.parquet").to_pylist()
    assert [(r["doc_id"], r["similarity_method"]) for r in removal] == [("fn-b", "jaccard")]
    assert removal[0]["similarity"] == pytest.approx(fn_j, abs=1e-6)

    # the same candidates (same bands×rows) verified with the estimate decide the other way
    b, r = bands_rows(CFG)
    sig_cfg = CFG.model_copy(update={"verify": "signature", "bands": b, "rows": r})
    source = DictSource(docs)
    assert dedup_plan(paths, tmp_path / "sig-plan", sig_cfg, text_source=source) == {
        "fp-b": ("dedup:near_dup", "fp-a")
    }
    assert source.asked == set()  # signature verification never reads texts
    removal = pq.read_table(tmp_path / "sig-plan" / "removals.parquet").to_pylist()
    assert removal[0]["similarity_method"] == "minhash" and removal[0]["similarity"] >= CFG.threshold > fp_j
    # exact asked for but no text source: the estimate, and the stats say so
    exact_cfg = CFG.model_copy(update={"bands": b, "rows": r})
    assert dedup_plan(paths, tmp_path / "none", exact_cfg) == {"fp-b": ("dedup:near_dup", "fp-a")}
    stats = json.loads((tmp_path / "none" / "dedup_stats.json").read_text())
    assert stats["verify"] == "signature" and "no text source" in stats["verify_note"]
    # verify = false: every candidate pair is a duplicate
    off = dedup_plan(paths, tmp_path / "off", CFG.model_copy(update={"verify": False}), text_source=source)
    assert set(off) == {"fp-b", "fn-b"} and source.asked == set()


def test_missing_and_mismatched_texts_fall_back_and_are_counted(borderline_docs, tmp_path):
    docs, _, _ = borderline_docs
    paths = _signature_files(docs, tmp_path)
    # fn-b's text is missing, fp-a's is another version (an edited file), u1 was never asked for
    source = DictSource(docs, skip={"fn-b"}, replace={"fp-a": "an edited text"}, extra=[("u1", "unasked")])
    plan = dedup_plan(paths, tmp_path / "plan", CFG, text_source=source)
    assert plan == {"fp-b": ("dedup:near_dup", "fp-a")}  # both pairs fell back to the estimate
    stats = json.loads((tmp_path / "plan" / "dedup_stats.json").read_text())
    assert stats["exact_verified_pairs"] == 0 and stats["signature_verified_pairs"] == 2
    assert stats["texts_read"] == 2 and stats["texts_missing"] == 2
    assert stats["texts_missing_examples"] == ["fn-b", "fp-a"]
    assert stats["texts_other_version_examples"] == ["fp-a"] and stats["texts_unrequested"] == 1


def test_parquet_text_source_reads_only_asked_ids(tmp_path):
    rng = random.Random(5)
    docs = [Document(f"d{i:03d}", " ".join(random_doc(rng, 50))) for i in range(300)]
    files = write_documents(docs[:150], tmp_path / "t0", "kept", 1 << 62)
    files += write_documents(docs[150:], tmp_path / "t1", "kept", 1 << 62)
    source = parquet_text_source(files + [tmp_path / "gone.parquet"])  # a deleted file is skipped
    want = {"d000", "d149", "d150", "d299", "absent"}
    got = list(source(want))
    assert sorted(got) == sorted((d.id, d.text) for d in docs if d.id in want)
    assert list(source(set())) == []


def test_pipeline_verifies_candidates_exactly(borderline_docs, tmp_path):
    docs, _, _ = borderline_docs
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in docs))
    cfg = load_config(None, ["data.quality.enabled=false", "data.langid.enabled=false"])
    stats = run_data([str(src)], tmp_path / "out", cfg, workers=1)
    assert stats["dedup"]["verify"] == "exact" and stats["dedup"]["exact_verified_pairs"] == 2
    assert stats["dedup"]["texts_read"] == 4 and stats["dedup"]["texts_missing"] == 0
    kept = {d.id for d in read_documents(tmp_path / "out" / "docs")}
    assert kept == {d.id for d in docs} - {"fn-b"}
