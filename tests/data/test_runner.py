"""The step runner is the one place that counts documents: reading, the filters, dedup and chunking.

Where is a document dropped? In `oreline.data.pipeline.runner` only: a reader yields `Read`s
(a document, or a stub with its reason), a step returns a reason, a one-to-many step returns the
documents that replace one; the runner counts, times and rejects all of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import oreline.data
from oreline.data.pipeline.runner import Read, Step, StepStats, run_source, run_steps
from oreline.data.read.record import ReadReport, Record, record_to_document
from oreline.document import Document

FUNNEL_COUNTERS = {"docs_in", "docs_out", "bytes_in", "bytes_out"}


def test_only_the_runner_counts_documents():
    """No module of the data pipeline but the runner adds to a step's document or byte counts
    (the reader, dedup and chunking counted by hand before)."""
    root = Path(oreline.data.__file__).parent
    runner = root / "pipeline" / "runner.py"
    counting = []
    for path in sorted(root.rglob("*.py")):
        if path == runner:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.AugAssign)
                and isinstance(node.target, ast.Attribute)
                and node.target.attr in FUNNEL_COUNTERS
            ):
                counting.append(f"{path.relative_to(root)}:{node.lineno}")
    assert counting == []


def test_a_record_without_payload_gives_its_reason():
    rec = Record("urn:x", "response", "http://a.example/", "", 200, "text/html", None, 0, b"")
    report = ReadReport()
    assert record_to_document(rec, report) == "read:empty_payload"
    assert not report.dropped  # counted by the runner, not behind the caller's back
    doc = record_to_document(Record("urn:y", "response", "u", "", 200, "text/plain", None, 9, b"hi"), report)
    assert isinstance(doc, Document) and doc.text == "hi"


def test_reads_are_counted_by_the_runner():
    reads = [
        Read(Document("a", "héllo", "", {}), 100),
        Read(Document("b", "", "", {}), 40, "read:empty_payload"),
        Read(Document("c", "ok", "", {}), 7),
    ]
    st = StepStats("read")
    rejected = []
    kept = list(run_source(reads, st, lambda d, step, why: rejected.append((d.id, step, why))))
    assert [d.id for d in kept] == ["a", "c"]
    assert rejected == [("b", "read", "read:empty_payload")]
    assert (st.docs_in, st.docs_out, st.bytes_in, st.bytes_out) == (3, 2, 147, 6 + 2)
    assert dict(st.dropped) == {"read:empty_payload": 1}


def test_a_one_to_many_step_counts_pieces_drops_and_empty_results():
    docs = [Document(f"d{i}", f"aa bb {i}", "", {}) for i in range(4)]

    def split(doc):
        if doc.id == "d1":
            raise ValueError("cannot split this one")
        if doc.id == "d2":
            return []  # nothing left: counted as a drop, never lost silently
        if doc.id == "d3":
            return "split:refused"
        return [Document(f"{doc.id}#{k}", w, "", {}) for k, w in enumerate(doc.text.split())]

    def mark(doc):
        doc.metadata["seen"] = True
        return None

    steps = [Step("split", split, many=True), Step("mark", mark)]
    stats = [StepStats(s.name) for s in steps]
    rejected = []
    out = list(run_steps(docs, steps, stats, lambda d, step, why: rejected.append((d.id, step, why))))
    assert [d.id for d in out] == ["d0#0", "d0#1", "d0#2"] and all(d.metadata["seen"] for d in out)
    assert rejected == [
        ("d1", "split", "split:error:ValueError"),
        ("d2", "split", "split:empty"),
        ("d3", "split", "split:refused"),
    ]
    assert docs[1].metadata["error"].startswith("ValueError: cannot split")
    split_st, mark_st = stats
    assert (split_st.docs_in, split_st.docs_out, split_st.bytes_in, split_st.bytes_out) == (4, 3, 28, 5)
    assert (mark_st.docs_in, mark_st.docs_out) == (3, 3)  # the funnel: docs_out of k == docs_in of k+1
