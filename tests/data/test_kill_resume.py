"""A data run killed with SIGKILL (twice, in different phases) and re-run gives exactly the output of
an uninterrupted run: the same document ids and texts, the same rejects, no duplicate, nothing lost."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from oreline.config import load_config
from oreline.data.pipeline.run import run_data

INPUTS = [
    "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
    "commoncrawl-samples/whirlwind.warc.gz",
    "dolma-wget-2024/sample-0000.warc.gz",
    "dolma-wget-2024/sample-0001.warc.gz",
    "ia-blackbook-2008/IAH-20080430204825-00000-blackbook.warc.gz",
    "warcio-edge-cases/example.warc.gz",
]


def _rows(folder, columns):
    files = sorted(folder.glob("*.parquet"))
    return pq.read_table(files, columns=columns).to_pylist() if files else []


def _command(inputs, out):
    return [sys.executable, "-m", "oreline", "data", *inputs, "--out", str(out), "--workers", "2"]


@pytest.mark.slow
def test_sigkill_and_resume_match_an_uninterrupted_run(samples, tmp_path, kill_at):
    inputs = [str(samples / "web-archives" / p) for p in INPUTS]
    ref_stats = run_data(inputs, tmp_path / "ref", load_config(), workers=1)
    out = tmp_path / "killed"

    # kill 1: in phase 1, after the first task finished and while others are being written
    phase1 = out / "work" / "phase1"
    killed = kill_at(
        _command(inputs, out),
        lambda: phase1.is_dir() and any(p.name.startswith("task-") for p in phase1.iterdir()),
    )
    assert killed, "the run finished before it could be killed in phase 1"
    assert not (out / "_SUCCESS").exists()
    done_after_kill = [p for p in phase1.iterdir() if p.name.startswith("task-")]
    assert 0 < len(done_after_kill) < len(inputs)

    # kill 2: the resumed run, in phase 3, as soon as a final shard is in place
    docs_dir = out / "docs"
    killed = kill_at(
        _command(inputs, out), lambda: docs_dir.is_dir() and any(docs_dir.glob("part-*.parquet"))
    )
    assert not (out / "_SUCCESS").exists() or not killed

    # finish
    result = subprocess.run(_command(inputs, out), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (out / "_SUCCESS").is_file()

    ref_docs = _rows(tmp_path / "ref" / "docs", ["id", "text"])
    docs = _rows(docs_dir, ["id", "text"])
    assert len(ref_docs) == ref_stats["output"]["docs"] > 0
    assert len({d["id"] for d in docs}) == len(docs)  # no duplicate
    assert sorted((d["id"], d["text"]) for d in docs) == sorted((d["id"], d["text"]) for d in ref_docs)
    ref_rej = _rows(tmp_path / "ref" / "rejects", ["id", "step", "reason"])
    rej = _rows(out / "rejects", ["id", "step", "reason"])
    assert sorted(map(tuple, (r.values() for r in rej))) == sorted(map(tuple, (r.values() for r in ref_rej)))
    assert not list(out.rglob(".*.tmp-*"))  # no wreck of a killed write is left behind

    import json

    stats = json.loads((out / "stats.json").read_text())
    strip = lambda steps: [{k: v for k, v in s.items() if k != "seconds"} for s in steps]  # noqa: E731
    assert strip(stats["steps"]) == strip(ref_stats["steps"])
