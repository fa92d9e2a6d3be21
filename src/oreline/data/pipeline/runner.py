"""The step runner: steps as plain `(name, fn)` pairs, and the one loop that counts, times and rejects.

The steps of the data pipeline themselves are built in `oreline.data.pipeline.steps`.

A step function takes a Document and returns None to keep it (it may rewrite `doc.text` or add
metadata) or a drop reason string. `run_steps` is the only place that counts documents and
bytes in and out per step, measures time, catches exceptions and hands dropped documents to
the reject writer, so the filters themselves stay pure functions (DESIGN.md "Contracts").

A step may apply to some documents only (`applies`): extraction runs on HTML documents, the
protocol step on WARC records. Documents a step does not apply to pass through it and are
counted as in and out, so the funnel stays consistent: docs_out of step k == docs_in of k+1.

A batched step (`batch_fn`, e.g. model-based perplexity) receives up to `batch_size` documents
at once; `run_steps` runs the per-document steps around it and `run_batch_step` counts it the
same way.

A one-to-many step (`many`, chunking) returns the documents that replace one, or a drop reason
(`run_many_step`). Reading is a source rather than a step: the reader yields one `Read` per input
unit (the document, or a stub with the reason there is none) and `run_source` counts them as the
"read" step. So every document that enters, leaves or is dropped is counted here, from reading
to the last step of phase 3.

An exception inside a step never stops the task: the document is dropped with the reason
"<step>:error:<ExceptionType>" and written to the rejects with the message in its metadata.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from oreline.document import Document
from oreline.errors import ConfigError

StepFn = Callable[[Document], "str | None"]
RejectFn = Callable[[Document, str, str], None]


@dataclass
class Step:
    name: str
    fn: StepFn
    applies: Callable[[Document], bool] | None = None
    # A batched step (model scoring) takes up to batch_size documents at once and returns one
    # reason per document; `fn` stays the one-document form (used to isolate a failing batch).
    batch_fn: Callable[[list[Document]], list[str | None]] | None = None
    batch_size: int = 1
    # A one-to-many step (chunking): `fn` returns the documents that replace this one, or a reason.
    many: bool = False


@dataclass
class StepStats:
    name: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    dropped: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 6),
            "dropped": dict(self.dropped),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepStats:
        return cls(
            d["name"],
            d["docs_in"],
            d["docs_out"],
            d["bytes_in"],
            d["bytes_out"],
            d["seconds"],
            Counter(d["dropped"]),
        )

    def add(self, other: StepStats) -> None:
        self.docs_in += other.docs_in
        self.docs_out += other.docs_out
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.seconds += other.seconds
        self.dropped.update(other.dropped)


def text_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass")) if not text.isascii() else len(text)


def run_steps(
    docs: Iterable[Document], steps: list[Step], stats: list[StepStats], reject: RejectFn
) -> Iterator[Document]:
    """Push each document through the steps in order; yield the survivors."""
    for k, step in enumerate(steps):  # a batched or one-to-many step splits the chain around it
        if step.batch_fn is not None or step.many:
            head = run_steps(docs, steps[:k], stats[:k], reject)
            run_one = run_batch_step if step.batch_fn is not None else run_many_step
            yield from run_steps(
                run_one(head, step, stats[k], reject), steps[k + 1 :], stats[k + 1 :], reject
            )
            return
    clock = time.perf_counter
    for doc in docs:
        size = text_bytes(doc.text)
        kept = True
        for step, st in zip(steps, stats, strict=True):
            st.docs_in += 1
            st.bytes_in += size
            if step.applies is not None and not step.applies(doc):
                st.docs_out += 1
                st.bytes_out += size
                continue
            before = doc.text
            t0 = clock()
            try:
                reason = step.fn(doc)
            except ConfigError:  # a setting that cannot work fails the run, not every document
                raise
            except Exception as exc:  # a bad document must never stop the task
                reason = f"{step.name}:error:{type(exc).__name__}"
                doc.metadata["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            st.seconds += clock() - t0
            if reason is not None:
                st.dropped[reason] += 1
                reject(doc, step.name, reason)
                kept = False
                break
            if doc.text is not before:
                size = text_bytes(doc.text)
            st.docs_out += 1
            st.bytes_out += size
        if kept:
            yield doc


def run_batch_step(
    docs: Iterable[Document], step: Step, st: StepStats, reject: RejectFn
) -> Iterator[Document]:
    """The counting of run_steps for a batched step: batches of step.batch_size documents.

    A batch whose batch_fn raises is retried one document at a time with step.fn, so only the
    documents that fail are dropped ("<step>:error:<ExceptionType>"), as in run_steps.
    """
    batch: list[Document] = []
    it = iter(docs)
    while True:
        doc = next(it, None)
        if doc is not None:
            batch.append(doc)
            if len(batch) < max(1, step.batch_size):
                continue
        if not batch:
            return
        sizes = [text_bytes(d.text) for d in batch]
        st.docs_in += len(batch)
        st.bytes_in += sum(sizes)
        t0 = time.perf_counter()
        try:
            reasons = step.batch_fn(batch)
        except ConfigError:
            raise
        except Exception:
            reasons = []
            for d in batch:
                try:
                    reasons.append(step.fn(d))
                except ConfigError:
                    raise
                except Exception as exc:
                    reasons.append(f"{step.name}:error:{type(exc).__name__}")
                    d.metadata["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        st.seconds += time.perf_counter() - t0
        for d, size, reason in zip(batch, sizes, reasons, strict=True):
            if reason is not None:
                st.dropped[reason] += 1
                reject(d, step.name, reason)
                continue
            st.docs_out += 1
            st.bytes_out += size  # a batched step scores; it does not rewrite text
            yield d
        batch = []
        if doc is None:
            return


@dataclass(slots=True)
class Read:
    """One input unit a source read (a WARC record, a JSONL line): its document, or a stub
    naming it with the reason it gave none (`reason`); `nbytes` is the input's size."""

    doc: Document
    nbytes: int
    reason: str | None = None


def run_source(reads: Iterable[Read], st: StepStats, reject: RejectFn) -> Iterator[Document]:
    """The counting of run_steps for the read step: each Read is one document in, kept or dropped
    with its reason (bytes in: the input's size; bytes out: the document's text). Seconds are the
    source's own, not those of the steps after it."""
    clock = time.perf_counter
    it = iter(reads)
    while True:
        t0 = clock()
        read = next(it, None)
        st.seconds += clock() - t0
        if read is None:
            return
        st.docs_in += 1
        st.bytes_in += read.nbytes
        if read.reason is not None:
            st.dropped[read.reason] += 1
            reject(read.doc, st.name, read.reason)
            continue
        st.docs_out += 1
        st.bytes_out += text_bytes(read.doc.text)
        yield read.doc


def run_many_step(
    docs: Iterable[Document], step: Step, st: StepStats, reject: RejectFn
) -> Iterator[Document]:
    """The counting of run_steps for a one-to-many step (`many`, e.g. chunking): its fn returns the
    documents that replace one (counted out one by one) or a drop reason. An empty list drops the
    document as "<step>:empty", so no document leaves a step uncounted."""
    clock = time.perf_counter
    for doc in docs:
        size = text_bytes(doc.text)
        st.docs_in += 1
        st.bytes_in += size
        t0 = clock()
        try:
            out = step.fn(doc)
        except ConfigError:
            raise
        except Exception as exc:  # a bad document must never stop the task
            out = f"{step.name}:error:{type(exc).__name__}"
            doc.metadata["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        st.seconds += clock() - t0
        if not out:
            out = f"{step.name}:empty"
        if isinstance(out, str):
            st.dropped[out] += 1
            reject(doc, step.name, out)
            continue
        for piece in out:
            st.docs_out += 1
            st.bytes_out += text_bytes(piece.text)
            yield piece


# ---------------------------------------------------------------------------------------------
# the counts of several tasks


def merge_step_stats(per_task: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Sum per-task step lists by step name, keeping the first-seen order of steps."""
    merged: dict[str, StepStats] = {}
    for steps in per_task:
        for d in steps:
            st = StepStats.from_dict(d)
            if st.name in merged:
                merged[st.name].add(st)
            else:
                merged[st.name] = st
    return [st.as_dict() for st in merged.values()]
