"""The staged dedup plan (jobs over partitioned files) removes exactly what the single-process
reference removes, with the same stats, whatever the partition counts and the order jobs run in.

The corpus is benchmarks/dedup_quality.py's planted near-duplicate set (prose paragraphs and
mutants at set exact Jaccard levels around the threshold) plus what stresses the stages: exact
copies differing in case and spacing, a family of 40 close variants (a bucket above the 32-member
all-pairs limit), chains of mutants (transitive clusters), empty and one-word texts, records
under one id in two files (same and different text), and sort fields that disagree with the row
order. Hypothesis draws the documents, how they are split into files, the partition counts, the
components algorithm (one union-find job, or large-star/small-star rounds over node partitions),
the verification mode and a permutation of every stage's jobs.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oreline.config import DedupConfig
from oreline.data.dedup.components import components, star_components
from oreline.data.dedup.minhash import dedup_stage_signatures
from oreline.data.dedup.reference_plan import dedup_plan, split_by_file
from oreline.data.dedup.staged.layout import Partitions
from oreline.data.dedup.staged.plan import staged_plan
from oreline.data.dedup.verify import parquet_text_source
from oreline.data.read.shards import write_documents
from oreline.document import Document
from oreline.executors.local import LocalExecutor

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "dedup_quality.py"
_spec = importlib.util.spec_from_file_location("oreline_dedup_quality", _PATH)
quality = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = quality
_spec.loader.exec_module(quality)


class ShuffledExecutor:
    """Runs every job in this process, in an order drawn by the test (results in job order)."""

    name = "shuffled"

    def __init__(self, rng: random.Random):
        self.rng = rng

    def map(self, fn, jobs, *, label, resources=None):
        order = list(range(len(jobs)))
        self.rng.shuffle(order)
        results = [None] * len(jobs)
        for i in order:
            results[i] = fn(*jobs[i])
        return results


def _pool() -> list[tuple[str, str]]:
    """(id, text) of the planted corpus: distinct ids, except the deliberate repeats below."""
    rng = random.Random(7)
    bases = quality.base_docs(36, size=600)
    out = []
    for i, text in enumerate(bases[:24]):
        out.append((f"b{i}", text))
        level = quality.LEVELS[i % len(quality.LEVELS)]
        m, _ = quality.mutant(text, level, rng)
        out.append((f"m{i}", m))
        if i % 4 == 0:  # a chain: a mutant of the mutant
            out.append((f"c{i}", quality.mutant(m, 0.85, rng)[0]))
        if i % 5 == 0:  # an exact copy up to case and spacing
            out.append((f"x{i}", "  " + text.upper().replace(" ", "\n ")))
    family = bases[24]
    for k in range(40):  # one large bucket: close variants of one text
        out.append((f"f{k}", quality.mutant(family, 0.93, rng)[0]))
    out += [("e0", ""), ("e1", "   "), ("w0", "word"), ("w1", "word")]
    out += [("b1", bases[1]), ("b2", bases[30]), ("m3", bases[31])]  # ids repeated in other files
    return out


POOL = _pool()


@st.composite
def cases(draw):
    n = len(POOL)
    chosen = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=n, unique=True))
    files = draw(st.integers(1, 4))
    where = [draw(st.integers(0, files - 1)) for _ in chosen]
    sources = [draw(st.sampled_from(["a.warc", "b.warc", "c.warc"])) for _ in chosen]
    offsets = [draw(st.integers(0, 5)) for _ in chosen]  # ties: the id, then the row, decide
    star = draw(st.sampled_from([0, 1, 3]))  # 0: one components job; else large/small-star rounds
    group_docs = draw(st.sampled_from([1, 20, 10**6]))  # signature files per scatter/lists job: 1, some, all
    parts = Partitions(
        draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4)), star, group_docs
    )
    verify = draw(st.sampled_from(["exact", "signature", False, "no-texts"]))
    exact = draw(st.booleans())
    order = [draw(st.integers(0, 10)) for _ in range(files)]
    seed = draw(st.integers(0, 2**32 - 1))
    return chosen, files, where, sources, offsets, parts, verify, exact, order, seed


def _removal_rows(path: Path) -> list[tuple]:
    return sorted(tuple(r.values()) for r in pq.read_table(path).to_pylist())


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_staged_plan_equals_reference(case, tmp_path_factory):
    chosen, files, where, sources, offsets, parts, verify, exact, order, seed = case
    tmp = tmp_path_factory.mktemp("staged")
    cfg = DedupConfig(verify="exact" if verify == "no-texts" else verify, exact=exact)
    per_file: list[list[Document]] = [[] for _ in range(files)]
    for idx, f, src, off in zip(chosen, where, sources, offsets, strict=True):
        doc_id, text = POOL[idx]
        per_file[f].append(Document(doc_id, text, metadata={"source": src, "offset": off}))
    sig_paths, kept = [], []
    for f, docs in enumerate(per_file):
        sig_paths.append(tmp / f"task-{f}" / "signatures.parquet")
        dedup_stage_signatures(docs, sig_paths[-1], cfg)
        kept += write_documents(docs, tmp / f"task-{f}", "kept", 1 << 62)
    texts = None if verify == "no-texts" else kept

    ref = dedup_plan(sig_paths, tmp / "ref", cfg, text_source=parquet_text_source(texts) if texts else None)
    lists = [tmp / "staged" / f"task-{f}.json" for f in range(files)]
    stats = staged_plan(
        sig_paths[::-1],  # the order given does not matter: rows follow the sorted paths
        tmp / "staged",
        cfg,
        ShuffledExecutor(random.Random(seed)),
        text_files=texts,
        list_paths=lists[::-1],
        keeper_order=order[::-1],
        partitions=parts,
    )
    assert stats == json.loads((tmp / "ref" / "dedup_stats.json").read_text())
    assert _removal_rows(tmp / "staged" / "removals.parquet") == _removal_rows(
        tmp / "ref" / "removals.parquet"
    )
    expected = split_by_file(ref, [[d.id for d in docs] for docs in per_file], order)
    assert [json.loads(p.read_text()) for p in lists] == expected


@pytest.mark.slow
def test_staged_plan_on_the_local_pool(tmp_path):
    """The same through the real process pool (two workers, jobs finishing in any order)."""
    cfg = DedupConfig()
    docs = [Document(i, t, metadata={"source": "s", "offset": k}) for k, (i, t) in enumerate(POOL[:60])]
    paths = [tmp_path / f"sig-{f}.parquet" for f in range(3)]
    for f in range(3):
        dedup_stage_signatures(docs[f::3], paths[f], cfg)
    kept = write_documents(docs, tmp_path / "kept", "kept", 1 << 62)
    ref = dedup_plan(paths, tmp_path / "ref", cfg, text_source=parquet_text_source(kept))
    stats = staged_plan(
        paths,
        tmp_path / "staged",
        cfg,
        LocalExecutor(workers=2),
        text_files=kept,
        partitions=Partitions(2, 2, 3),
    )
    assert stats == json.loads((tmp_path / "ref" / "dedup_stats.json").read_text())
    assert stats["near_duplicates"] > 5 and stats["exact_duplicates"] > 0  # the corpus has both
    rows = _removal_rows(tmp_path / "staged" / "removals.parquet")
    assert rows == _removal_rows(tmp_path / "ref" / "removals.parquet")
    assert {r[0] for r in rows} == set(ref)


class IsolatingExecutor:
    """Runs jobs in this process; while a verify or similarity job of id partition p runs, every
    other partition's candidates file is moved out of reach, so a job that read one would fail."""

    name = "isolating"
    STAGES = {"dedup:verify", "dedup:similarity"}

    def __init__(self, stages: Path):
        self.cands = stages / "cands"
        self.away = stages.parent / "away"

    def map(self, fn, jobs, *, label, resources=None):
        if label not in self.STAGES:
            return [fn(*job) for job in jobs]
        results = []
        for job in jobs:
            others = [f for f in self.cands.glob("p*.parquet") if f.name != f"p{job[0]:05d}.parquet"]
            self.away.mkdir(exist_ok=True)
            for f in others:
                f.rename(self.away / f.name)
            try:
                results.append(fn(*job))
            finally:
                for f in others:
                    (self.away / f.name).rename(f)
        return results


def test_verify_and_similarity_jobs_read_only_their_own_candidates(tmp_path):
    """Each verify and similarity job reads its own partition's candidates and the rows shipped
    to it, never another partition's file (those reads made the two stages grow as partitions²),
    and the plan still removes exactly what the reference removes."""
    cfg = DedupConfig()
    docs = [Document(i, t, metadata={"source": "s", "offset": k}) for k, (i, t) in enumerate(POOL)]
    paths = [tmp_path / f"sig-{f}.parquet" for f in range(2)]
    for f in range(2):
        dedup_stage_signatures(docs[f::2], paths[f], cfg)
    kept = write_documents(docs, tmp_path / "kept", "kept", 1 << 62)
    ref = dedup_plan(paths, tmp_path / "ref", cfg, text_source=parquet_text_source(kept))
    out = tmp_path / "staged"
    parts = Partitions(2, 1, 4)
    stats = staged_plan(paths, out, cfg, IsolatingExecutor(out / "stages"), text_files=kept, partitions=parts)
    assert stats == json.loads((tmp_path / "ref" / "dedup_stats.json").read_text())
    assert stats["exact_verified_pairs"] > 5  # shingle sets, not only signatures, were shipped
    rows = _removal_rows(out / "removals.parquet")
    assert rows == _removal_rows(tmp_path / "ref" / "removals.parquet") and {r[0] for r in rows} == set(ref)
    for kind in ("verify", "similarity"):  # pairs crossed partitions: rows were shipped for both
        shipped = sum(
            pq.read_metadata(f).num_rows for f in (out / "stages" / "ship" / kind).glob("*.parquet")
        )
        assert shipped > 0, kind


@settings(max_examples=200, deadline=None)
@given(edges=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=80))
def test_star_rounds_equal_union_find(edges):
    e = np.array([(a, b) for a, b in edges if a != b], dtype=np.int64).reshape(-1, 2)
    nodes, labels = components(e)
    star_nodes, star_labels = star_components(e)
    assert np.array_equal(nodes, star_nodes) and np.array_equal(labels, star_labels)
    for a, b in e.tolist():  # connected nodes share a label, and a label is a member of its component
        assert labels[np.searchsorted(nodes, a)] == labels[np.searchsorted(nodes, b)]
    assert set(labels.tolist()) <= set(nodes.tolist())


class Killed(Exception):
    pass


class DyingExecutor(ShuffledExecutor):
    """Runs jobs like ShuffledExecutor until its budget of jobs is spent, then dies mid-stage."""

    def __init__(self, rng: random.Random, budget: int):
        super().__init__(rng)
        self.budget = budget

    def map(self, fn, jobs, *, label, resources=None):
        order = list(range(len(jobs)))
        self.rng.shuffle(order)
        for i in order:
            if self.budget == 0:
                raise Killed(label)
            self.budget -= 1
            fn(*jobs[i])
        return [fn(*job) for job in jobs]  # all done: the rerun of each job reads its marker


@pytest.mark.parametrize("budget", [3, 17, 24, 30])  # of 32 jobs
def test_staged_plan_resumes_after_a_kill(tmp_path, budget):
    cfg = DedupConfig()
    docs = [Document(i, t, metadata={"source": "s", "offset": k}) for k, (i, t) in enumerate(POOL[::2])]
    paths = [tmp_path / f"sig-{f}.parquet" for f in range(2)]
    for f in range(2):
        dedup_stage_signatures(docs[f::2], paths[f], cfg)
    kept = write_documents(docs, tmp_path / "kept", "kept", 1 << 62)
    parts = Partitions(2, 1, 2)
    lists = [tmp_path / "out" / f"l{f}.json" for f in range(2)]
    args = dict(text_files=kept, list_paths=lists, keeper_order=[0, 1], partitions=parts)
    with pytest.raises(Killed):
        staged_plan(paths, tmp_path / "out", cfg, DyingExecutor(random.Random(budget), budget), **args)
    (tmp_path / "out" / "stages" / "exact").mkdir(parents=True, exist_ok=True)
    (tmp_path / "out" / "stages" / "exact" / ".h00000.parquet.wreck.tmp").write_bytes(
        b"torn"
    )  # a killed write
    stats = staged_plan(paths, tmp_path / "out", cfg, ShuffledExecutor(random.Random(0)), **args)
    whole = staged_plan(
        paths, tmp_path / "whole", cfg, ShuffledExecutor(random.Random(1)), **args | {"list_paths": None}
    )
    assert stats == whole
    assert _removal_rows(tmp_path / "out" / "removals.parquet") == _removal_rows(
        tmp_path / "whole" / "removals.parquet"
    )
    ref = dedup_plan(paths, tmp_path / "ref", cfg, text_source=parquet_text_source(kept))
    assert [json.loads(p.read_text()) for p in lists] == split_by_file(
        ref, [[d.id for d in docs[f::2]] for f in range(2)], [0, 1]
    )
