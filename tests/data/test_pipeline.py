"""The data pipeline end to end on the real sample web archives, plus its inputs and options."""

from __future__ import annotations

import gzip
import json
import math
import operator
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard
from typer.testing import CliRunner

import oreline
from oreline.cli import app
from oreline.config import load_config
from oreline.data.pipeline.run import funnel_lines, run_data
from oreline.data.pipeline.runner import Step, StepStats, run_steps
from oreline.data.read.inputs import discover_inputs, input_kind, iter_input_documents
from oreline.data.read.shards import read_documents, write_documents
from oreline.document import Document
from oreline.errors import FingerprintMismatch, InputError
from oreline.executors.interface import TaskCrashed
from oreline.executors.local import run_tasks

# a subset of the sample crawl that covers every kind of archive and keeps the test quick
SUBSET = [
    "commoncrawl-samples",
    "dolma-wget-2024",
    "ia-blackbook-2008",
    "warcio-edge-cases",
]


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


@pytest.fixture(scope="module")
def sample_run(samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("sample-run") / "out"
    inputs = [str(samples / "web-archives" / s) for s in SUBSET]
    stats = run_data(inputs, out, _cfg(), workers=2)
    return out, stats, inputs


def test_funnel_is_consistent(sample_run):
    out, stats, _ = sample_run
    on_disk = json.loads((out / "stats.json").read_text())
    assert on_disk["steps"] == stats["steps"]
    names = [s["name"] for s in stats["steps"]]
    assert names[:5] == ["read", "protocol", "extract", "normalize", "langid"]
    assert names[-1] == "dedup" and any(n.startswith("quality:") for n in names)
    for prev, nxt in zip(stats["steps"], stats["steps"][1:], strict=False):
        assert prev["docs_out"] == nxt["docs_in"], (prev["name"], nxt["name"])
        assert prev["bytes_out"] == nxt["bytes_in"], (prev["name"], nxt["name"])
    for st in stats["steps"]:
        assert st["docs_in"] - st["docs_out"] == sum(st["dropped"].values()), st["name"]
    assert stats["steps"][-1]["docs_out"] == stats["output"]["docs"] > 0
    assert stats["inputs"]["revisits"] > 0  # warcio's example.warc(.gz) hold revisit records
    assert stats["inputs"]["records"] > stats["steps"][0]["docs_in"]  # requests/metadata are not documents


def test_kept_documents_are_clean_and_readable(sample_run):
    out, stats, _ = sample_run
    docs = list(read_documents(out / "docs"))
    assert len(docs) == stats["output"]["docs"]
    assert len({d.id for d in docs}) == len(docs)
    for d in docs:
        assert d.text.strip() and d.text == d.text.strip()
        assert "\x00" not in d.text and "<html" not in d.text.lower()
        assert d.metadata["language"] in load_config().data.langid.languages
        assert d.metadata["language_score"] >= 0.65
        assert d.metadata["entropy"] >= load_config().data.quality.min_entropy  # a flat quality-score column
        assert d.metadata["source_file"]
        if d.metadata["source_file"].endswith(".txt"):  # warcio's LICENSE file is prose input too
            assert "record_id" not in d.metadata
        else:
            assert d.metadata["record_id"] and d.metadata["crawl_date"]


def test_rejects_are_readable_and_match_the_funnel(sample_run):
    out, stats, _ = sample_run
    table = pq.read_table(sorted((out / "rejects").glob("*.parquet")))
    dropped = sum(sum(st["dropped"].values()) for st in stats["steps"])
    assert table.num_rows == dropped
    by_reason = {}
    for reason in table.column("reason").to_pylist():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    merged = {}
    for st in stats["steps"]:
        for r, n in st["dropped"].items():
            merged[r] = merged.get(r, 0) + n
    assert by_reason == merged


def test_damaged_and_unknown_inputs_are_reported(sample_run):
    _, stats, _ = sample_run
    unknown = {u["file"].rsplit("/", 1)[-1] for u in stats["inputs"]["unknown"]}
    assert "example-bad.warc.gz.bad" in unknown
    damaged = {e["file"].rsplit("/", 1)[-1] for e in stats["errors"]}
    assert "example-trunc.warc" in damaged


def test_output_loads_with_datasets(sample_run, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out, stats, _ = sample_run
    files = [str(p) for p in sorted((out / "docs").glob("*.parquet"))]
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path))
    assert len(ds) == stats["output"]["docs"]
    assert {"id", "text", "url", "language", "crawl_date", "http_status", "entropy", "words"} <= set(
        ds.column_names
    )


def test_rerun_of_a_finished_run_is_a_no_op(sample_run):
    out, stats, inputs = sample_run
    before = {p: p.stat().st_mtime_ns for p in (out / "docs").glob("*.parquet")}
    again = run_data(inputs, out, _cfg(), workers=1)
    assert again == stats
    assert {p: p.stat().st_mtime_ns for p in (out / "docs").glob("*.parquet")} == before


def test_other_settings_in_the_same_folder_are_refused(sample_run):
    out, _, inputs = sample_run
    with pytest.raises(FingerprintMismatch, match="new --out"):
        run_data(inputs, out, _cfg("data.dedup.threshold=0.7"), workers=1)
    with pytest.raises(FingerprintMismatch):
        run_data(inputs[:2], out, _cfg(), workers=1)


def test_funnel_lines_show_percentages(sample_run):
    _, stats, _ = sample_run
    lines = funnel_lines(stats)
    lang = next(line for line in lines if line.startswith("langid:"))
    assert "%" in lang and "lang:" in lang


# ---------------------------------------------------------------------------------------------
# options, on one small file


def test_steps_switch_off_and_chunking_splits(samples, tmp_path):
    src = str(samples / "web-archives" / "dolma-wget-2024" / "sample-0000.warc.gz")
    stats = run_data(
        [src],
        tmp_path / "a",
        _cfg(
            "data.quality.enabled=false",
            "data.dedup.exact=false",
            "data.dedup.minhash=false",
            "data.chunk.enabled=true",
            "data.chunk.size=400",
            "data.chunk.overlap=100",
        ),
        workers=1,
    )
    names = [s["name"] for s in stats["steps"]]
    assert not any(n.startswith("quality") for n in names) and "dedup" not in names
    assert names[-1] == "chunk"
    chunk = stats["steps"][-1]
    assert chunk["docs_out"] > chunk["docs_in"] > 0
    docs = list(read_documents(tmp_path / "a" / "docs"))
    assert len(docs) == chunk["docs_out"]
    assert all(len(d.text) <= 400 for d in docs)
    assert all(d.metadata["parent_id"] and d.id.startswith(d.metadata["parent_id"]) for d in docs)


def test_cli_prints_the_funnel(samples, tmp_path):
    src = str(
        samples / "web-archives" / "commoncrawl-samples" / "resiliparse-CC-MAIN-2020-34-excerpt.warc.gz"
    )
    result = CliRunner().invoke(
        app, ["data", src, "--out", str(tmp_path / "o"), "--workers", "1", "data.langid.languages=['en']"]
    )
    assert result.exit_code == 0, result.output
    assert "funnel" in result.output and "langid" in result.output and "%" in result.output
    assert (tmp_path / "o" / "stats.json").is_file()
    # what the C4 line rules cut from the documents they kept, by rule (issue 36)
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    c4 = stats["line_filters"]["quality:c4"]
    printed = " ".join(result.output.split())
    n_lines = sum(r["lines"] for r in c4["rules"].values())
    assert n_lines > 0 and f"quality:c4 removed {n_lines:,} lines" in printed
    assert f"from {c4['docs_changed']:,} of {c4['docs']:,} kept documents" in printed
    assert "no_end_mark" in printed


def test_line_filters_account_for_the_bytes_of_the_documents_c4_kept(sample_run):
    """stats.json "line_filters": exact counts of the run, matching the funnel's C4 step."""
    _, stats, _ = sample_run
    c4 = stats["line_filters"]["quality:c4"]
    (step,) = [st for st in stats["steps"] if st["name"] == "quality:c4"]
    assert c4["docs"] == step["docs_out"] and c4["bytes_after"] == step["bytes_out"]
    assert c4["bytes_before"] <= step["bytes_in"]  # the rest went with the documents C4 dropped
    removed = c4["bytes_before"] - c4["bytes_after"]
    assert 0 < sum(r["bytes"] for r in c4["rules"].values()) <= removed
    assert 0 < c4["docs_changed"] <= c4["docs"]


# ---------------------------------------------------------------------------------------------
# inputs


def test_discovery_is_sorted_recursive_and_reports_unknown(tmp_path):
    (tmp_path / "b").mkdir()
    for name in ("b/z.warc.gz", "a.jsonl.zst", "b/c.parquet", "notes.md", "b/x.txt.gz"):
        (tmp_path / name).write_bytes(b"")
    files, unknown = discover_inputs([str(tmp_path), str(tmp_path / "a.jsonl.zst")])
    assert [(p.name, k) for p, k in files] == [
        ("a.jsonl.zst", "jsonl"),
        ("c.parquet", "parquet"),
        ("x.txt.gz", "txt"),
        ("z.warc.gz", "warc"),
    ]
    assert [p.name for p in unknown] == ["notes.md"]
    files, _ = discover_inputs([str(tmp_path / "b" / "*.gz")])
    assert [p.name for p, _ in files] == ["x.txt.gz", "z.warc.gz"]
    with pytest.raises(InputError, match="does not exist"):
        discover_inputs([str(tmp_path / "missing.warc")])
    with pytest.raises(InputError, match="matches no file"):
        discover_inputs([str(tmp_path / "*.wet")])
    assert input_kind("x.WARC.GZ") == "warc" and input_kind("x.warc.gz.bad") is None


def test_prose_inputs_decode_with_latin1_fallback(samples):
    cfg = _cfg()
    books = list(iter_input_documents(samples / "english-prose" / "nltk-gutenberg.zip", cfg))
    assert len(books) == 14 and all(b.text for b in books)  # the README member is not a .txt
    assert {b.metadata["charset"] for b in books} <= {"utf-8", "latin-1"}
    assert "latin-1" in {b.metadata["charset"] for b in books}  # some Gutenberg files are not UTF-8
    (shakespeare,) = iter_input_documents(samples / "english-prose" / "tinyshakespeare.txt.gz", cfg)
    assert shakespeare.text.startswith("First Citizen")


def test_jsonl_and_parquet_inputs(tmp_path):
    rows = [{"id": "a", "text": "alpha", "url": "u1", "lang": "en"}, {"text": "beta"}]
    raw = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "x.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "x.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    cfg = _cfg()
    for name in ("x.jsonl.gz", "x.jsonl.zst"):
        docs = list(iter_input_documents(tmp_path / name, cfg))
        assert [d.text for d in docs] == ["alpha", "beta"]
        assert docs[0].id == "a" and docs[0].url == "u1" and docs[0].metadata["lang"] == "en"
        assert docs[1].id.startswith("sha256:")
    write_documents(docs, tmp_path / "pq", "part", 1 << 20)
    shutil.copy(next((tmp_path / "pq").glob("*.parquet")), tmp_path / "y.parquet")
    back = list(iter_input_documents(tmp_path / "y.parquet", cfg))
    assert [(d.id, d.text) for d in back] == [(d.id, d.text) for d in docs]


# the text field of JSONL/Parquet inputs (issue 36: a wrong key gave 0 documents and exit 0)


def _no_filters() -> list[str]:
    return ["data.quality.enabled=false", "data.langid.enabled=false", "--workers", "1"]


def test_a_wrong_jsonl_text_key_fails_naming_the_fields_there(tmp_path):
    rows = [{"id": str(i), "content": f"Document number {i} is here."} for i in range(5)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    args = ["data", str(tmp_path / "c.jsonl"), "--out", str(out), *_no_filters()]
    proc = subprocess.run(  # the command line itself: exit 2 and the message, no traceback
        [sys.executable, "-m", "oreline", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "10000", "PYTHONPATH": str(Path(oreline.__file__).parents[1])},
    )
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "Traceback" not in said, said
    assert "no document kept: 5 of 5 JSONL/Parquet records (in 1 of 1 files)" in said
    assert "no text under 'text' (data.read.jsonl_text_key)" in said
    assert "'content' (5), 'id' (5)" in said and "data.read.jsonl_text_key=content" in said
    # the bad input stays where the user can look at it; running the same command again says it again
    rejects = pq.read_table(sorted((out / "rejects").glob("*.parquet"))).to_pylist()
    assert [r["reason"] for r in rejects] == ["read:no_text"] * 5
    stats = json.loads((out / "stats.json").read_text())
    assert stats["inputs"]["text_field"] == {
        "key": "text",
        "files": 1,
        "files_missing": 1,
        "records": 5,
        "with_text": 0,
        "missing": 5,
        "empty": 0,
        "fields": {"content": 5, "id": 5},
    }
    with pytest.raises(InputError, match="no document kept"):
        CliRunner().invoke(app, args, catch_exceptions=False)
    fixed = CliRunner().invoke(
        app, [*args[:2], "--out", str(tmp_path / "o2"), *_no_filters(), "data.read.jsonl_text_key=content"]
    )
    assert fixed.exit_code == 0, fixed.output
    assert json.loads((tmp_path / "o2" / "stats.json").read_text())["output"]["docs"] == 5


def test_a_parquet_input_without_the_text_column_fails_naming_its_columns(tmp_path):
    import pyarrow as pa

    pq.write_table(
        pa.table({"id": ["a", "b", "c"], "body": ["One.", "Two.", "Three."]}), tmp_path / "b.parquet"
    )
    with pytest.raises(InputError) as info:
        run_data([str(tmp_path / "b.parquet")], tmp_path / "o", _cfg("data.quality.enabled=false"), workers=1)
    message = str(info.value)
    assert "3 of 3 JSONL/Parquet records" in message and "'body' (3)" in message
    assert "data.read.jsonl_text_key=body" in message


def test_most_records_without_the_text_key_warn_with_the_counts(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "1", "text": "The one document with text."}) + "\n")
    rows = [{"id": f"b{i}", "body": f"Body {i}."} for i in range(3)]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["data", str(tmp_path), "--out", str(out), *_no_filters()])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "warning: 3 of 4 JSONL/Parquet records (in 1 of 2 files) have no text under 'text'" in said
    assert "'body' (3)" in said
    stats = json.loads((out / "stats.json").read_text())
    assert stats["output"]["docs"] == 1 and len(stats["warnings"]) == 1
    assert stats["inputs"]["text_field"]["missing"] == 3 and stats["inputs"]["text_field"]["records"] == 4


def test_an_empty_text_and_a_missing_text_are_one_reason(tmp_path):
    import pyarrow as pa

    lines = [
        {"id": "e", "text": ""},
        {"id": "w", "text": " \n "},
        {"id": "m", "body": "x"},
        {"id": "n", "text": None},
    ]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"text": "kept"}\n')
    pq.write_table(pa.table({"id": ["e", "n", "k"], "text": ["", None, "kept"]}), tmp_path / "x.parquet")
    for name, n in (("x.jsonl", 4), ("x.parquet", 2)):
        reported: list[tuple] = []

        def report(reason, offset, preview, into=reported):
            into.append((reason, offset, preview))

        docs = list(iter_input_documents(tmp_path / name, _cfg(), report))
        assert [d.text for d in docs] == ["kept"]
        assert [reason for reason, _, _ in reported] == ["read:no_text"] * n, reported
        assert "empty text under 'text'" in reported[0][2]
    stats = run_data([str(tmp_path)], tmp_path / "o", _cfg(*_no_filters()[:2]), workers=1)
    assert stats["steps"][0]["dropped"] == {"read:no_text": 6}
    counts = {Path(f).name: i["text_field"] for f, i in stats["inputs"]["files"].items()}
    assert counts["x.jsonl"] == {
        "key": "text",
        "records": 5,
        "missing": 2,
        "empty": 2,
        "fields": {"id": 2, "body": 1, "text": 1},
    }
    assert counts["x.parquet"] == {"key": "text", "records": 3, "missing": 1, "empty": 1, "fields": {"id": 1}}


def test_config_inputs_expand_samples(samples, tmp_path, monkeypatch):
    monkeypatch.delenv("ORELINE_SAMPLES", raising=False)  # {samples} is then the embedded set
    stats = run_data(
        ["{samples}/web-archives/commoncrawl-samples/whirlwind.warc.gz"], tmp_path / "o", _cfg(), workers=1
    )
    assert list(stats["inputs"]["files"]) == [
        str(samples / "web-archives" / "commoncrawl-samples" / "whirlwind.warc.gz")
    ]


# ---------------------------------------------------------------------------------------------
# the runner's guarantees: a failing step drops one document, a dying worker loses one task


def test_an_exception_in_a_step_drops_only_that_document():
    docs = [Document(f"d{i}", f"text {i}", "", {}) for i in range(4)]

    def fragile(doc):
        if doc.id == "d2":
            raise ValueError("cannot handle this one")
        return None

    def upper(doc):
        doc.text = doc.text.upper() + "!"
        return None

    steps = [Step("fragile", fragile), Step("upper", upper)]
    stats = [StepStats(s.name) for s in steps]
    rejected = []
    kept = list(run_steps(docs, steps, stats, lambda d, step, reason: rejected.append((d.id, step, reason))))
    assert [d.id for d in kept] == ["d0", "d1", "d3"] and kept[0].text == "TEXT 0!"
    assert rejected == [("d2", "fragile", "fragile:error:ValueError")]
    assert docs[2].metadata["error"].startswith("ValueError: cannot handle")
    assert (stats[0].docs_in, stats[0].docs_out, stats[1].docs_in, stats[1].docs_out) == (4, 3, 3, 3)
    assert stats[1].bytes_out == stats[1].bytes_in + 3  # "!" added to each of three documents


def test_a_worker_that_dies_loses_only_its_task():
    jobs = [(math.sqrt, 4.0), (os.abort,), (math.sqrt, 9.0), (math.sqrt, 16.0)]
    results = run_tasks(operator.call, jobs, workers=2, label="crash test")
    assert results[0] == 2.0 and results[2] == 3.0 and results[3] == 4.0
    assert isinstance(results[1], TaskCrashed) and "died" in results[1].error


def test_a_small_dedup_plan_runs_in_this_process_a_large_one_on_the_pool(tmp_path):
    """Below INLINE_PLAN_DOCS documents the local pool's dedup stages run in the driver (the
    demo's plan cost more to dispatch than to run); from there on they go to the pool."""
    import importlib.util

    from oreline.data.pipeline.phases import INLINE_PLAN_DOCS, plan_executor
    from oreline.executors.local import LocalExecutor

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "dedup_scale.py"
    spec = importlib.util.spec_from_file_location("oreline_dedup_scale", path)
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    paths = scale.write_files(tmp_path, INLINE_PLAN_DOCS)  # files of 10,000 documents
    pool = LocalExecutor(workers=2)
    small = plan_executor(pool, paths[:-1])
    assert small is not pool and small.name == "local" and small.workers == 1
    assert plan_executor(pool, paths) is pool


def test_a_crashed_write_task_is_reported_with_its_input_file(samples, tmp_path):
    """A phase-3 (write) task whose worker died twice comes back as TaskCrashed with its job,
    (i, work, out, cfg): stats.json names the task's input file, as for a crashed filter task, not
    the run's work folder."""
    from oreline.data.pipeline.phases import merge_stats
    from oreline.data.pipeline.tasks import run_phase1

    cfg = _cfg("data.dedup.exact=false", "data.dedup.minhash=false")
    out, work = tmp_path / "out", tmp_path / "out" / "work"
    paths = [samples / "web-archives" / "warcio-edge-cases" / "example.warc.gz"] * 2
    tasks = [(i, p, "warc") for i, p in enumerate(paths)]
    for i, p, kind in tasks:
        run_phase1(i, str(p), kind, str(work), cfg)
    crashes = [
        TaskCrashed((0, str(work), str(out), cfg), "worker process died while running this task (twice)"),
        TaskCrashed((1, str(paths[1]), "warc", str(work), cfg), "worker process died (twice)"),
    ]
    stats = merge_stats(work, tasks, tasks, [], crashes, {}, 2, "fp")
    assert [e["file"] for e in stats["errors"] if e["offset"] is None] == [str(paths[0]), str(paths[1])]


def test_a_change_to_the_data_code_is_another_data_run(tmp_path, monkeypatch):
    """The rules and the extractor decide the documents as much as the settings do: a run resumed
    after an upgrade that changed them must not mix the old code's shards with the new code's."""
    import oreline.data.pipeline.run as run_mod

    package = Path(run_mod.__file__).resolve().parents[1]
    copy = tmp_path / "data"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = run_mod.data_code_sha256(copy)
    assert run_mod.data_code_sha256(copy) == before
    quality = copy / "filters" / "quality.py"
    quality.write_text(quality.read_text(encoding="utf-8") + "\n# a changed rule\n", encoding="utf-8")
    assert run_mod.data_code_sha256(copy) != before

    cfg = load_config("demo")
    files = [
        (p, "warc") for p in sorted(Path(oreline.config.samples_dir(), "web-archives").rglob("*.warc.gz"))[:1]
    ]
    fp = run_mod.data_fingerprint(cfg, files)
    monkeypatch.setattr(run_mod, "data_code_sha256", lambda: "0" * 64)
    assert run_mod.data_fingerprint(cfg, files) != fp


# a run that keeps nothing (issue 52: a single WET file or a .txt.gz book gave "→ 0 documents",
# exit 0 and _SUCCESS, and the next stage failed far from the cause)


@pytest.mark.parametrize(
    ("relative", "reason", "text_hint"),
    [
        ("web-archives/commoncrawl-samples/whirlwind.warc.wet.gz", "lang:score<0.65 1", False),
        ("english-prose/tinyshakespeare.txt.gz", "gopher:long_doc 1", True),
    ],
)
def test_a_run_that_keeps_no_document_fails_with_the_top_drop_reasons(
    samples, tmp_path, relative, reason, text_hint
):
    out = tmp_path / "o"
    proc = subprocess.run(  # the command line itself: exit 2 and the message, no traceback
        [
            sys.executable,
            "-m",
            "oreline",
            "data",
            str(samples / relative),
            "--out",
            str(out),
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "10000", "PYTHONPATH": str(Path(oreline.__file__).parents[1])},
    )
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "Traceback" not in said, said
    assert (
        f"error: no document kept: the 1 document(s) read from 1 input file(s) were all dropped ({reason})"
        in said
    )
    assert str(out / "rejects") in said
    assert ("data.extra_inputs" in said) is text_hint
    # what was dropped stays where the user can look at it
    rejects = pq.read_table(sorted((out / "rejects").glob("*.parquet"))).to_pylist()
    assert [r["reason"] for r in rejects] == [reason.rsplit(" ", 1)[0]]
