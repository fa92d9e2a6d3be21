"""Token shards damaged under a running `oreline train` (real processes, a copy of the prose tokens):
a shard cut mid-run is one error naming it and the last good checkpoint (not SIGBUS), and bytes
flipped with the file's mtime put back are an error listing the checkpoints written since the
shard was last verified, which a later `--resume auto` refuses once the shard is restored.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from oreline.tokens import shards as fmt
from oreline.tokens.tokenize import read_manifest


def _kill_resume():
    spec = importlib.util.spec_from_file_location(
        "oreline_test_kill_resume_train_damaged", Path(__file__).with_name("test_kill_resume_train.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kr = _kill_resume()


def start(tmp_path: Path, prose_tokens: dict) -> tuple[subprocess.Popen, Path, Path, list[Path], Path]:
    """`oreline train` on a copy of the prose tokens (40 slow steps, a checkpoint every 4)."""
    tokens = tmp_path / "tokens"
    shutil.copytree(prose_tokens["tokens"], tokens)
    config = kr.write_config(
        tmp_path / "run.toml", tmp_path / "runs", {**prose_tokens, "tokens": tokens}, train__steps=40
    )
    train_shards = [tokens / s["name"] for s in read_manifest(tokens)["shards"] if s["split"] == "train"]
    log = tmp_path / "train.log"
    with open(log, "ab") as out:  # (rich would wrap the paths at 80 columns)
        proc = subprocess.Popen(
            [sys.executable, "-m", "oreline", "train", "-c", str(config)],
            env={**kr.env(), "COLUMNS": "10000"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, tmp_path / "runs" / "r", log, train_shards, config


def wait(proc: subprocess.Popen, log: Path, cond) -> None:
    deadline = time.monotonic() + 300
    while not cond():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.slow
def test_a_shard_cut_while_train_runs_is_one_error_naming_it_and_the_last_good_checkpoint(
    tmp_path, prose_tokens
):
    proc, run, log, shards, _config = start(tmp_path, prose_tokens)
    wait(proc, log, lambda: kr.has(run, "checkpoint", 8))
    for shard in shards:  # a failed copy: each train shard cut to its header and a few tokens
        os.truncate(shard, fmt.HEADER_SIZE + 64)
    code = proc.wait(timeout=300)
    out = one_line(log.read_text())
    assert code == 2, (code, out[-3000:])  # oreline's error exit, not -7 (SIGBUS)
    assert "changed after it was opened" in out and any(str(s) in out for s in shards), out[-3000:]
    newest = max((run / "checkpoints").glob("step-*"))
    assert f"the newest, {newest}, is the last good one" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


@pytest.mark.slow
def test_damaged_content_lists_the_checkpoints_since_it_was_verified_and_resume_refuses_them(
    tmp_path, prose_tokens
):
    proc, run, log, shards, config = start(tmp_path, prose_tokens)
    wait(proc, log, lambda: kr.has(run, "checkpoint", 8))
    # every id flipped outside the vocabulary, and the file's times put back: its identity (inode,
    # size, mtime) is the one the run opened, so only the ids can show the damage
    originals = {}
    for shard in shards:
        st = shard.stat()
        data = bytearray(shard.read_bytes())
        originals[shard] = (bytes(data), st)
        header = fmt.read_header(shard)
        n = header.tokens * header.dtype.itemsize
        body = np.frombuffer(bytes(data[fmt.HEADER_SIZE : fmt.HEADER_SIZE + n]), dtype=header.dtype)
        data[fmt.HEADER_SIZE : fmt.HEADER_SIZE + n] = (body ^ np.array(0xFF00, dtype=header.dtype)).tobytes()
        with open(shard, "r+b") as fh:  # in place: the same inode
            fh.write(bytes(data))
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    code = proc.wait(timeout=300)
    out = one_line(log.read_text())
    assert code == 2, (code, out[-3000:])
    assert "outside its vocabulary" in out and "was last verified at" in out, out[-3000:]
    written = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    assert written and f"may hold training on its damaged tokens: {', '.join(written)}" in out, out[-3000:]
    assert "--resume none" in out, out[-3000:]  # no checkpoint predates the shard's last verification

    for shard, (data, st) in originals.items():  # the shard restored
        with open(shard, "r+b") as fh:
            fh.write(data)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    relaunch = subprocess.run(
        [sys.executable, "-m", "oreline", "train", "-c", str(config)],
        env={**kr.env(), "COLUMNS": "10000"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    again = one_line(relaunch.stdout + relaunch.stderr)
    assert relaunch.returncode == 2, again[-3000:]
    assert "may hold training on the damaged tokens" in again and written[-1] in again, again[-3000:]
    assert "--resume none" in again, again[-3000:]
