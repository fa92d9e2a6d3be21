"""`oreline tokenize --executor slurm` on a real cluster (scripts/local-slurm.sh; CI starts it) writes
the local run's shards and manifest, byte for byte: one array index per tokenize task, run by the
same task function, with the job files and logs in the output's `slurm/` folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def _files(folder: Path) -> dict[str, bytes]:
    # the owner record holds its creation time and pid; the manifest is compared without its timings
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name[0] != "."}


def test_tokenize_on_slurm_equals_the_local_run(
    slurm_cluster, corpus_files, byte_tokenizer_dir, tmp_path, untimed
):
    def command(out: Path, executor: str) -> list[str]:
        cmd = [sys.executable, "-m", "oreline", "tokenize", *map(str, corpus_files), "--tokenizer"]
        cmd += [str(byte_tokenizer_dir), "--out", str(out), "--workers", "2", "--executor", executor]
        return [*cmd, "tokenize.max_shard_tokens=20000", "data.slurm.poll_s=0.3"]

    local, out = tmp_path / "local", tmp_path / "slurm"
    subprocess.run(command(local, "local"), capture_output=True, text=True, timeout=300, check=True)
    cmd = command(out, "slurm")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"tokenize: {len(corpus_files)} array task(s) submitted" in proc.stderr
    # one array index per task, each with its log
    assert len(list((out / "slurm" / "tokenize-0" / "logs").glob("*_*.out"))) == len(corpus_files)
    got, want = _files(out), _files(local)
    manifests = [untimed(json.loads(f.pop("manifest.json"))) for f in (got, want)]
    assert manifests[0] == manifests[1]
    assert len(got) > len(corpus_files) and got == want
    # a second run finds the manifest up to date and submits nothing
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "submitted" not in again.stderr, again.stderr[-2000:]
