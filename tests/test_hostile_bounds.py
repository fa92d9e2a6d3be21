"""Sizes that are the attacker's word, files that are not regular files, unbounded readers, planted
checkpoints and a panicking tokenizer (issue 32 items 3, 4, 9-11; `-m hostile`).

The `call` cases of benchmarks/hostile_inputs.py, each run in a child process capped at 1.5 GiB of
address space as tests/data/test_hostile_inputs.py runs the pipeline's (which also runs the two
Parquet cases of item 9: a footer that understates a row group, rows that repeat one dictionary
entry). Before this change each of these failed the cap, the time bound or both:

- `oreline tokenizer train` on prose plus one random 1 MiB "word" ran for more than 120 s (10 MB:
  more than 300 s); the trainer now sees runs of at most 256 characters (long_runs_cut);
- `oreline train` with model.max_seq_len=10^12 tried to allocate the 4 TB RoPE tables; it is now
  refused by the memory floor, before anything is allocated;
- `oreline eval` of a checkpoint whose meta.json (checksums rewritten to match) says vocab_size
  2^30 or max_seq_len 10^12 built the model it described; the shapes and the memory are now
  checked first;
- `oreline doctor run` / `report` blocked forever on a FIFO named export/model.gguf, took minutes
  on a GGUF holding a 60M-item metadata array, and read a 1 GB metrics.jsonl line whole (2.5 GB);
- `oreline checkpoint verify` passed a real .metadata that also renamed torch's _get_layout
  posix.system (the process's later saves then pickled torch.strided as a call of it); it is now
  refused and torch is left as it was;
- a checkpoint item behind DCP's `stream.zstd/1` transform (1 GiB of zeros here, 2 GiB in the
  table) passed `checkpoint verify`, and `eval` / `export` decoded it whole (MemoryError under
  the cap); all three now refuse the index before reading any data file;
- `oreline tokenize` ended with a Rust panic on the one document that makes the tokenizer's regex
  exhaust Oniguruma's retry limit; that document is now an `encode_error` reject.

Issue 45's cases (items 3, 6, 8), the same way:

- `oreline data` with a quality classifier whose 92-byte model.bin states a dictionary it does not
  hold (fastText read on at end of file until MemoryError) or whose 151-byte model.bin states a
  16 GiB input matrix (bad_alloc): refused before fastText reads it, naming the file;
- `oreline train --resume` of a checkpoint whose loader state weighs its source "1e999999999"
  (Fraction() computed 10^999999999: killed at the time bound); refused;
- `oreline eval --tasks FOLDER` with one 1 GiB line among 20 items (read whole: MemoryError under
  the cap); that line is now skipped and counted, the 20 items scored;
- `oreline eval --tasks copa` of a checkpoint whose meta.json says max_seq_len 10^12 (the 4 TB
  RoPE tables' allocation traceback); refused by plain eval's memory check.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "hostile_inputs.py"
_NAME = "oreline_hostile_cases"
if _NAME not in sys.modules:  # tests/data/test_hostile_inputs.py may have loaded it already
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up by name
    _spec.loader.exec_module(sys.modules[_NAME])
hostile = sys.modules[_NAME]
WORD_CHARS = 1 << 20  # the tokenizer case's word: more than 120 s before, ~5 s now (the table's: 10 MB)

CAP = int(1.5 * (1 << 30))
CASES = [name for name, case in hostile.CASES.items() if case.kind == "call"]
CKPT_BOMB_BYTES = 1 << 30  # decoded size of the zstd checkpoint item: past the cap for the old code
TASK_LINE_BYTES = 1 << 30  # the task folder's one line: read whole, past the cap for the old code
SECONDS = {"tokenizer-long-word": 30.0}  # the bound for the 1 MiB word (the table's 10 MB: 120 s)


@pytest.mark.hostile
@pytest.mark.slow  # ~1 min for the section, most of it one small training run shared by the cases
@pytest.mark.parametrize("name", CASES)
def test_hostile_size_or_file_is_refused_in_bounded_memory_and_time(name, tmp_path, child_env, monkeypatch):
    monkeypatch.setattr(hostile, "WORD_CHARS", WORD_CHARS)
    monkeypatch.setattr(hostile, "CKPT_BOMB_BYTES", CKPT_BOMB_BYTES)
    monkeypatch.setattr(hostile, "TASK_LINE_BYTES", TASK_LINE_BYTES)
    case = hostile.CASES[name]
    bound = SECONDS.get(name, case.max_seconds)
    result = hostile.run_case(case, tmp_path, CAP, timeout_s=3 * bound, env=child_env)
    log = (tmp_path / "child.log").read_text(errors="replace")[-3000:]
    assert result.ok, f"{name}: {result.outcome}\n{log}"
    assert result.seconds < bound, f"{name} took {result.seconds:.1f} s (bound {bound} s)"
    assert result.peak_rss_mb < case.max_rss_mb, (
        f"{name} peaked at {result.peak_rss_mb:.0f} MB (bound {case.max_rss_mb} MB)"
    )
