"""The per-task work of a data run: phase 1 (read → filters → signatures) and phase 3 (dedup → chunk → shards).

A task is one input file. Both phases are idempotent and atomic, so a run killed at any moment
(SIGKILL included) resumes by running them again, and two attempts of one task running at once
(a zombie worker and its retry, on two nodes of a cluster) leave one valid output. The commits
hold on a filesystem shared by the nodes (`oreline.storage`):

- Phase 1 writes everything of a task (kept documents, rejects, dedup signatures, stats) into its
  own attempt folder `work/phase1/attempts/task-NNNNN-<attempt id>` (an id no other attempt on
  any node uses), writes `DONE` there, and then publishes the task's marker
  `work/phase1/task-NNNNN.json`, which names the attempt and lists its exact files with their
  sizes. The first marker wins (`storage.publish_first`); an attempt that lost deletes its own
  folder. Readers find a task's files through its marker only (`phase1_dir`); folders of attempts
  no marker names (killed or losing attempts) are deleted at the end of the run
  (`remove_stale_attempts`), by the names the attempts were given.
- Phase 3 writes the final shards (each under an attempt-unique temporary name, renamed into place
  when complete) and then its marker `work/phase3/task-NNNNN.json` (the task's stats and shard
  names). Shard names and contents depend only on the task, so a killed attempt's shards are
  overwritten by identical ones and concurrent attempts rename identical files into place: nothing
  is deleted by pattern before the task runs.

Everything a task decides depends only on its input file, the config and the dedup plan, never
on timing or worker count, so a resumed run produces exactly the same documents.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import oreline.storage as storage
from oreline.data.filters.quality import LineRemovals
from oreline.data.pipeline.runner import Read, Step, StepStats, run_source, run_steps, text_bytes
from oreline.data.pipeline.steps import filter_steps
from oreline.data.read.shards import REJECT_SCHEMA, ShardWriter, read_documents, reject_row
from oreline.document import Document
from oreline.errors import DataIntegrityError
from oreline.executors.progress import Progress
from oreline.io import json_bytes, write_json_atomic

NO_LIMIT = 1 << 62  # intermediate files of a task are never split


def task_name(index: int) -> str:
    return f"task-{index:05d}"


ATTEMPT = re.compile(r"task-(\d{5})-([0-9a-f]{16})")  # work/phase1/attempts/<name>


def phase1_marker(work: Path, index: int) -> Path:
    """The commit of a task's phase 1: which attempt folder holds its files, and which files."""
    return work / "phase1" / f"{task_name(index)}.json"


def phase1_dir(work: Path, index: int) -> Path:
    """The folder of the task's committed phase-1 attempt (a path that does not exist before the
    commit, so `phase1_dir(…) / "DONE"` is false until the marker is there)."""
    marker = storage.read_json(phase1_marker(work, index))
    attempt = marker.get("attempt") if isinstance(marker, dict) else None
    if not isinstance(attempt, str) or not ATTEMPT.fullmatch(attempt):
        return work / "phase1" / "attempts" / f"{task_name(index)}-uncommitted"
    return work / "phase1" / "attempts" / attempt


def phase1_files(work: Path, index: int, prefix: str) -> list[Path]:
    """The committed files of a task whose names start with `prefix`, as its marker lists them."""
    marker = storage.read_json(phase1_marker(work, index)) or {}
    folder = phase1_dir(work, index)
    return [folder / name for name in sorted(marker.get("files", {})) if name.startswith(prefix)]


def remove_stale_attempts(work: Path, indices) -> list[str]:
    """Delete the phase-1 attempt folders of these tasks that no marker names (attempts killed or
    beaten by another attempt of the same task); only names of the form oreline gives them."""
    folder = work / "phase1" / "attempts"
    wanted = {int(i) for i in indices}
    committed = {phase1_dir(work, i).name for i in wanted}
    removed = []
    for name in storage.listdir(folder):
        m = ATTEMPT.fullmatch(name)
        if m and int(m.group(1)) in wanted and name not in committed:
            storage.remove(folder / name)
            removed.append(name)
    return removed


def phase3_marker(work: Path, index: int) -> Path:
    return work / "phase3" / f"{task_name(index)}.json"


# ---------------------------------------------------------------------------------------------
# reading


class Reader:
    """The `Read`s of one input file (a document, or a stub with the reason it gave none) for the
    runner's `run_source`, which counts them into `stats`; with the input's facts and errors."""

    def __init__(self, path: Path | str, kind: str, cfg, progress: Progress):
        # `path`: a local path, or an fsspec URL (read through a local copy, named by its URL)
        self.path, self.kind, self.cfg, self.progress = path, kind, cfg, progress
        self.stats = StepStats("read")  # counted by run_source; read here for the input's facts
        self.errors: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {"kind": kind, "bytes": storage.size(path) if storage.exists(path) else 0}

    def __iter__(self) -> Iterator[Read]:
        inner = self._warc() if self.kind == "warc" else self._other()
        while True:
            try:
                read = next(inner)
            except StopIteration:
                break
            except Exception as exc:  # an unexpected reader failure ends this file, not the run
                self.errors.append(
                    {
                        "file": str(self.path),
                        "offset": None,
                        "skipped_bytes": 0,
                        "reason": "read:reader_error",
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
                break
            yield read
        self.progress.flush()

    def _warc(self) -> Iterator[Read]:
        with storage.local_copy(self.path) as local:
            yield from self._warc_file(local)

    def _named(self, errors: list[dict[str, Any]], local: Path) -> list[dict[str, Any]]:
        """Errors of a local copy, named by the input's own path or URL."""
        name = str(self.path)
        return [{**e, "file": name} if e.get("file") == str(local) else e for e in errors]

    def _warc_file(self, local: Path) -> Iterator[Read]:
        from oreline.data.read.record import ReadReport, record_to_document
        from oreline.data.read.warc import iter_records

        rcfg = self.cfg.data.read
        report = ReadReport()
        seen_rejected = 0
        name = str(self.path)

        def rejected() -> Iterator[Read]:
            """Records the reader dropped whole (too large, Content-Length not matching the block)."""
            nonlocal seen_rejected
            for o in report.rejected[seen_rejected:]:
                meta = {
                    "source_file": name,
                    "offset": o["offset"],
                    "record_id": o.get("record_id"),
                    "bytes": o["bytes"],
                }
                if o.get("content_encoding"):  # the block fit, its decoded body did not
                    meta["content_encoding"] = o["content_encoding"]
                doc = Document(o.get("record_id") or f"{name}:{o['offset']}", "", o.get("url") or "", meta)
                yield Read(doc, int(o["bytes"]), o["reason"])
            seen_rejected = len(report.rejected)

        try:
            records = iter_records(
                local,
                max_record_bytes=rcfg.max_record_bytes,
                report=report,
                record_types=tuple(rcfg.record_types),
            )
            for rec in records:
                yield from rejected()
                rec.source_file = name  # the input's path or URL, also when read from a local copy
                nbytes = len(rec.payload)
                self.progress.add(1, nbytes)
                error = None
                try:
                    doc = record_to_document(rec, report)
                except Exception as exc:  # one record's failure drops that record, never the rest of the file
                    error = f"{type(exc).__name__}: {str(exc)[:500]}"
                    doc = f"read:error:{type(exc).__name__}"
                if isinstance(doc, Document):
                    yield Read(doc, nbytes)
                    continue
                stub = Document(
                    rec.record_id or f"{name}:{rec.offset}",
                    rec.payload[:4000].decode("utf-8", "replace"),
                    rec.url,
                    {
                        "source_file": name,
                        "offset": rec.offset,
                        "record_id": rec.record_id,
                        "content_type": rec.content_type,
                        "http_status": rec.http_status,
                    },
                )
                if error:
                    stub.metadata["error"] = error
                yield Read(stub, nbytes, doc)
            yield from rejected()
        finally:
            self.errors.extend(self._named(report.errors, local))
            self.info.update(
                records=report.records,
                by_type=dict(report.by_type),
                revisits=report.revisits,
                documents=self.stats.docs_out,
                decoding=dict(report.decoding),
                replacement_chars=report.replacement_chars,
            )

    def _other(self) -> Iterator[Read]:
        with storage.local_copy(self.path) as local:
            yield from self._other_file(local)

    def _other_file(self, local: Path) -> Iterator[Read]:
        from oreline.data.read.inputs import TextFieldCounts, iter_input_documents

        name = str(self.path)
        text_field = TextFieldCounts(self.cfg.data.read.jsonl_text_key)
        dropped: list[Read] = []  # what the input reader reported between two documents

        def report(reason: str, offset: int | None, preview: str) -> None:
            doc = Document(f"{name}:{offset}", preview, "", {"source_file": name, "offset": offset})
            dropped.append(Read(doc, len(preview), reason))
            if reason in ("read:corrupt_file", "read:bad_zip", "read:bad_parquet"):
                self.errors.append({"file": name, "offset": offset, "error": preview})

        def drain() -> Iterator[Read]:
            yield from dropped
            dropped.clear()

        records = 0
        try:
            for doc in iter_input_documents(local, self.cfg, report=report, text_field=text_field):
                yield from drain()
                if doc.metadata.get("source_file") == str(local):
                    doc.metadata["source_file"] = name
                records += 1
                nbytes = text_bytes(doc.text)
                self.progress.add(1, nbytes)
                yield Read(doc, nbytes)
            yield from drain()
        except Exception:
            yield from drain()  # the drops reported before the failure are counted, then the file ends
            raise
        finally:
            self.info.update(
                records=records + sum(self.stats.dropped.values()), documents=self.stats.docs_out
            )
            if self.kind in ("jsonl", "parquet"):
                self.info["text_field"] = text_field.as_dict()


# ---------------------------------------------------------------------------------------------
# phase 1


def dedup_enabled(cfg) -> bool:
    return cfg.data.dedup.exact or cfg.data.dedup.minhash


def run_phase1(index: int, path: str, kind: str, work: str, cfg) -> dict[str, Any]:
    """Read and filter one input file into its own attempt folder, then commit it with the task's
    marker (skipped when a marker is already there; see the module docstring)."""
    work_dir = Path(work)
    done = phase1_dir(work_dir, index)
    if (done / "DONE").is_file():
        return json.loads((done / "stats.json").read_text())
    attempt = f"{task_name(index)}-{storage.attempt_id()}"
    tmp = work_dir / "phase1" / "attempts" / attempt
    tmp.mkdir(parents=True)
    t_start = time.perf_counter()

    normalize_removed: Counter = Counter()
    extract_paths: dict[str, dict] = {}
    c4_lines = LineRemovals()
    steps = filter_steps(cfg, normalize_removed, extract_paths, c4_lines)
    step_stats = [StepStats(s.name) for s in steps]
    progress = Progress(index)
    with (
        ShardWriter(tmp, "kept", NO_LIMIT) as kept,
        ShardWriter(tmp, "rejects", NO_LIMIT, REJECT_SCHEMA) as rejects,
    ):

        def reject(doc: Document, step: str, reason: str) -> None:
            rejects.write_row(reject_row(doc, step, reason))

        reader = Reader(path if storage.is_url(path) else Path(path), kind, cfg, progress)
        survivors = run_steps(run_source(reader, reader.stats, reject), steps, step_stats, reject)
        upstream = [0.0]

        def write_kept() -> Iterator[Document]:
            while True:
                t0 = time.perf_counter()
                doc = next(survivors, None)
                if doc is not None:
                    kept.write_doc(doc)
                upstream[0] += time.perf_counter() - t0  # reading, filtering and writing: not dedup
                if doc is None:
                    return
                yield doc

        if dedup_enabled(cfg):
            from oreline.data.dedup.minhash import dedup_stage_signatures
        t0 = time.perf_counter()
        if dedup_enabled(cfg):
            dedup_stage_signatures(write_kept(), tmp / "signatures.parquet", cfg)
        else:
            for _ in write_kept():
                pass
        signature_seconds = time.perf_counter() - t0 - upstream[0]
    kept_docs = kept.rows_written

    stats = {
        "task": index,
        "file": path,
        "kind": kind,
        "steps": [reader.stats.as_dict()] + [s.as_dict() for s in step_stats],
        "kept": kept_docs,
        "signature_seconds": round(signature_seconds, 6),
        "normalize_removed": dict(normalize_removed),
        "line_filters": {"quality:c4": c4_lines.as_dict()} if c4_lines.docs else {},
        "extract_paths": {
            k: {"docs": v["docs"], "seconds": round(v["seconds"], 6)} for k, v in extract_paths.items()
        },
        "input": reader.info,
        "errors": reader.errors,
        "seconds": round(time.perf_counter() - t_start, 6),
    }
    write_json_atomic(tmp / "stats.json", stats)
    write_json_atomic(tmp / "DONE", {"task": index, "attempt": attempt})
    files = {p.name: storage.size(p) for p in sorted(tmp.iterdir()) if p.name != "DONE"}
    marker = {"task": index, "attempt": attempt, "files": files}
    if not storage.publish_first(phase1_marker(work_dir, index), json_bytes(marker)):
        # another attempt of this task committed first: its output is the task's, ours goes
        if phase1_dir(work_dir, index).name != attempt:
            storage.remove(tmp)
        done = phase1_dir(work_dir, index)
        return json.loads((done / "stats.json").read_text())
    return stats


# ---------------------------------------------------------------------------------------------
# phase 3


def phase3_steps(work: Path, plan: dict[str, list[str]], cfg) -> list[Step]:
    """Phase-3 steps in order: the perplexity buckets (before dedup: they continue phase 1's
    quality:perplexity, with the cut-offs of the global phase), the dedup removals of the task's
    plan ({doc id: [reason, survivor id]}), chunking (one document to many)."""
    steps: list[Step] = []
    if cfg.data.quality.perplexity_model:
        from oreline.data.filters.perplexity import bucket_step
        from oreline.data.pipeline.perplexity_cutoffs import cutoffs_path

        buckets = bucket_step(cutoffs_path(work), cfg)
        if buckets is not None:
            steps.append(buckets)
    if cfg.data.quality.classifier:  # the run-wide top fraction, also before dedup
        from oreline.data.filters.classifier import top_fraction_step
        from oreline.data.pipeline.classifier_cutoff import cutoff_path

        top = top_fraction_step(cutoff_path(work), cfg)
        if top is not None:
            steps.append(top)
    if dedup_enabled(cfg):

        def removed(doc: Document) -> str | None:
            removal = plan.get(doc.id)
            if removal is None:
                return None
            doc.metadata["survivor_id"] = removal[1]
            return removal[0]

        steps.append(Step("dedup", removed))
    if cfg.data.chunk.enabled:
        from oreline.data.filters.chunk import chunk_document

        def chunk(doc: Document) -> list[Document]:
            pieces = chunk_document(doc, cfg)
            for piece in pieces:
                piece.metadata.setdefault("parent_id", doc.id)
            return pieces

        steps.append(Step("chunk", chunk, many=True))
    return steps


def run_phase3(index: int, work: str, out: str, cfg) -> dict[str, Any]:
    """Drop dedup removals, chunk, and write the final shards of one task (skipped when done)."""
    work_dir, out_dir = Path(work), Path(out)
    marker = phase3_marker(work_dir, index)
    if marker.is_file():
        return json.loads(marker.read_text())
    t_start = time.perf_counter()
    src = phase1_dir(work_dir, index)
    kept_files = [p for p in phase1_files(work_dir, index, "kept-") if p.is_file()]
    expected = json.loads((src / "stats.json").read_text())["kept"]
    if expected and not kept_files:  # intermediates are deleted once a run succeeds
        raise DataIntegrityError(
            f"{src} has no kept documents left ({expected} expected): the run finished before and its "
            "intermediate files were removed, but its phase-3 markers are gone",
            f"delete {out_dir} and run oreline data again",
        )
    plan_path = work_dir / "dedup" / f"{task_name(index)}.json"
    plan: dict[str, list[str]] = json.loads(plan_path.read_text()) if plan_path.is_file() else {}
    prefix = f"part-{index:05d}"
    steps = phase3_steps(work_dir, plan, cfg)
    step_stats = [StepStats(s.name) for s in steps]
    out_docs = out_bytes = 0
    with (
        ShardWriter(out_dir / "docs", prefix, cfg.data.max_shard_bytes) as docs_w,
        ShardWriter(out_dir / "rejects", prefix, cfg.data.max_shard_bytes, REJECT_SCHEMA) as rej_w,
    ):
        for path in phase1_files(work_dir, index, "rejects-"):  # phase-1 rejects, in their order
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    rej_w.write_row(row)

        def reject(doc: Document, step: str, reason: str) -> None:
            rej_w.write_row(reject_row(doc, step, reason))

        for doc in run_steps(read_documents(kept_files), steps, step_stats, reject):
            docs_w.write_doc(doc)
            out_docs += 1
            out_bytes += text_bytes(doc.text)
    stats = {
        "task": index,
        "steps": [st.as_dict() for st in step_stats],
        "output": {
            "docs": out_docs,
            "bytes": out_bytes,
            "shards": [p.name for p in docs_w.paths],
            "reject_shards": [p.name for p in rej_w.paths],
        },
        "seconds": round(time.perf_counter() - t_start, 6),
    }
    write_json_atomic(marker, stats)
    return stats
