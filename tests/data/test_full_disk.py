"""`oreline data` on a full disk ends with one error naming the folder and the fix, not the
tracebacks of its workers; after space is freed the same command finishes with exactly the output
of a run that had room. The disk is a real small tmpfs (tests/conftest.py `small_disk`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from oreline.config import load_config
from oreline.data.pipeline.run import run_data

INPUTS = [
    "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
    "dolma-wget-2024/sample-0000.warc.gz",
    "dolma-wget-2024/sample-0001.warc.gz",
]


def _rows(folder, columns):
    files = sorted(folder.glob("*.parquet"))
    return sorted(map(tuple, (r.values() for r in pq.read_table(files, columns=columns).to_pylist())))


@pytest.mark.slow
def test_data_on_a_full_disk_is_one_error_and_resumes_exactly(samples, small_disk, tmp_path):
    inputs = [str(samples / "web-archives" / p) for p in INPUTS]
    run_data(inputs, tmp_path / "ref", load_config(), workers=1)
    disk = small_disk("4m")
    out = disk / "d"
    filler = small_disk.fill(disk, leave=200_000)
    command = [sys.executable, "-m", "oreline", "data", *inputs, "--out", str(out), "--workers", "2"]
    # wide enough that rich does not wrap the error inside the folder's path (it breaks at a "-"):
    # under pytest-xdist tmp_path is longer (popen-gw1/...) and the 80-column wrap cut it
    env = {**os.environ, "COLUMNS": "250"}
    full = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    err = full.stderr
    assert full.returncode == 2, err[-3000:]
    assert "Traceback" not in err and err.count("error:") == 1, err[-3000:]
    said = " ".join(err[err.index("error: ") :].split())
    assert said.startswith(f"error: no space left on the device of {out}"), said
    assert "MB free" in said and "run the same `oreline data` command again" in said
    filler.unlink()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _rows(out / "docs", ["id", "text"]) == _rows(tmp_path / "ref" / "docs", ["id", "text"])
    assert _rows(out / "rejects", ["id", "step", "reason"]) == _rows(
        tmp_path / "ref" / "rejects", ["id", "step", "reason"]
    )
