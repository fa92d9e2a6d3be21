"""Training on a corpus of more shards than the process may open files (issue 33's scale run, small).

The token folder holds 2,000 hard links of the prose fixture's train shard and the process runs
under RLIMIT_NOFILE 256: a loader that keeps one mapping per shard dies with EMFILE at start-up,
one that hashes every shard reads the corpus 2,000 times before the first step. The full-size run
(10,000 shards, 34 B tokens, `ulimit -n 1024`) and its numbers: benchmarks/loader_scale.py.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

from oreline.tokens.tokenize import read_manifest

from .conftest import read_metrics, write_config

COPIES, NOFILE = 2_000, 256


def _linked(prose_tokens, dest):
    dest.mkdir()
    m = read_manifest(prose_tokens)
    shards = [s for s in m["shards"] if s["split"] == "val"]
    for s in shards:
        (dest / s["name"]).hardlink_to(prose_tokens / s["name"])
    train = [s for s in m["shards"] if s["split"] == "train"]
    for c in range(COPIES):
        s = train[c % len(train)]
        name = f"train-{c:010x}-00000-000.tok"
        (dest / name).hardlink_to(prose_tokens / s["name"])
        shards.append({**s, "name": name})
    (dest / "manifest.json").write_text(json.dumps({**m, "shards": shards}))
    return dest


def test_train_on_more_shards_than_open_files_allowed(prose_tokens, tmp_path):
    tokens = _linked(prose_tokens["tokens"], tmp_path / "tokens")
    config = write_config(
        tmp_path / "train.toml",
        tmp_path / "runs",
        {**prose_tokens, "tokens": tokens},
        {
            "train.steps": 3,
            "train.optim.warmup_steps": 1,
            "train.eval_every": 3,
            "train.eval_sequences": 8,
            "train.log_every": 1,
        },
    )

    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.run(
        [sys.executable, "-m", "oreline", "train", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=low_nofile,
        env={**os.environ, "COLUMNS": "10000"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [
        r["step"] for r in read_metrics(tmp_path / "runs" / "t" / "metrics.jsonl") if r["type"] == "train"
    ]
    assert steps == [1, 2, 3]
