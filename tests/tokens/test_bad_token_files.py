"""Broken token-layer files end in an error naming the file and the fix, never in a traceback.

Each test breaks one real artifact of the session fixtures (a trained tokenizer, real token
shards) the way a disk, a copy or a hostile file breaks it, and runs the real command line
(`python -m oreline ...` in a subprocess) or the loader the commands use.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from oreline.config import load_config, to_toml
from oreline.errors import DataIntegrityError, InputError
from oreline.io import file_sha256
from oreline.tokens import shards as fmt
from oreline.tokens.loader import TokenLoader
from oreline.tokens.train_bpe import load_tokenizer

# issue 32 item 11's tokenizer is benchmarks/hostile_inputs.py's (its table measures it)
_HOSTILE = "oreline_hostile_cases"
if _HOSTILE not in sys.modules:  # another test module may have loaded it already
    _spec = importlib.util.spec_from_file_location(
        _HOSTILE, Path(__file__).resolve().parents[2] / "benchmarks" / "hostile_inputs.py"
    )
    sys.modules[_HOSTILE] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up by name
    _spec.loader.exec_module(sys.modules[_HOSTILE])
hostile = sys.modules[_HOSTILE]


def assert_clean_error(code: int, out: str, *needles: str) -> None:
    assert code == 2, out  # oreline's exit code for an OrelineError
    assert "Traceback" not in out, out
    for needle in needles:
        assert needle in out, (needle, out)


def train_config(tmp_path: Path, tokens: Path, tokenizer: Path) -> Path:
    """A tiny training config (debug preset) over the given token folder; returns the TOML path."""
    cfg = load_config(
        None,
        [
            f"run.runs_dir={json.dumps(str(tmp_path / 'runs'))}",
            "run.name=t",
            "model.preset=debug",
            f"train.tokens={json.dumps(str(tokens))}",
            f"train.tokenizer={json.dumps(str(tokenizer))}",
            "train.seq_len=64",
            "train.micro_batch=2",
            "train.steps=2",
            "train.optim.warmup_steps=1",
            "train.cpu_matmul=blas",
            "checkpoint.every=0",
        ],
    )
    path = tmp_path / "train.toml"
    path.write_text(to_toml(cfg))
    return path


# ---------------------------------------------------------------------------------------------
# tokenizer.json


def _break_tokenizer(src: Path, dest: Path, how: str) -> Path:
    shutil.copytree(src, dest)
    file = dest / "tokenizer.json"
    data = file.read_bytes()
    file.write_bytes(
        {
            "empty": b"",
            "truncated": data[: len(data) // 2],
            "binary": bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
        }[how]
    )
    return file


@pytest.mark.parametrize("how", ["empty", "truncated", "binary"])
def test_tokenize_with_a_broken_tokenizer_json_names_the_file_and_the_rebuild(
    how, byte_tokenizer_dir, corpus_files, tmp_path, oreline_cli
):
    file = _break_tokenizer(byte_tokenizer_dir, tmp_path / "tok", how)
    code, out = oreline_cli(
        "tokenize", str(corpus_files[2]), "-t", str(file.parent), "-o", str(tmp_path / "out")
    )
    assert_clean_error(code, out, str(file), f"oreline tokenizer train DOCS --out {file.parent}")
    assert {"empty": "is empty", "truncated": "is not valid JSON", "binary": "is not UTF-8"}[how] in out


def test_tokenizer_json_that_is_json_but_not_a_tokenizer(byte_tokenizer_dir, tmp_path):
    file = _break_tokenizer(byte_tokenizer_dir, tmp_path / "tok", "empty")
    file.write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(InputError, match="is JSON but not a Hugging Face tokenizer") as err:
        load_tokenizer(file.parent)
    assert str(file) in str(err.value)
    file.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested too deeply"):
        load_tokenizer(file.parent)


# ---------------------------------------------------------------------------------------------
# manifest.json


def _copy_tokens(tokens_dir: Path, dest: Path) -> Path:
    shutil.copytree(tokens_dir, dest)
    return dest


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: list(m["shards"]), "holds a JSON list, not a token manifest"),
        (lambda m: {k: v for k, v in m.items() if k != "shards"}, "key 'shards' is missing"),
        (
            lambda m: {**m, "shards": [{**m["shards"][0], "tokens": "many"}]},
            "shards[0].tokens is a str, expected a int",
        ),
        (
            lambda m: {**m, "shards": [{**m["shards"][0], "name": "../../etc/passwd"}]},
            "is not a file name in",
        ),
        (lambda m: {**m, "bos_id": None}, "key 'bos_id' is a NoneType"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_named(edit, message, tokens_dir, tmp_path):
    tokens = _copy_tokens(tokens_dir, tmp_path / "tokens")
    manifest = tokens / "manifest.json"
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    with pytest.raises(DataIntegrityError, match="re-run oreline tokenize") as err:
        TokenLoader(tokens, seq_len=32, micro_batch=2)
    assert str(manifest) in str(err.value) and message in str(err.value)


def test_train_on_a_manifest_that_is_a_list_names_the_file(
    tokens_dir, byte_tokenizer_dir, tmp_path, oreline_cli
):
    tokens = _copy_tokens(tokens_dir, tmp_path / "tokens")
    manifest = tokens / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text())["shards"]))
    code, out = oreline_cli("train", "-c", str(train_config(tmp_path, tokens, byte_tokenizer_dir)))
    assert_clean_error(code, out, str(manifest), "not a token manifest", "re-run oreline tokenize")


# ---------------------------------------------------------------------------------------------
# token ids outside the vocabulary


def _plant_out_of_vocabulary_id(
    tokens: Path, split: str = "train", at: int | None = None
) -> tuple[Path, int]:
    """Overwrite one token with an id past its vocabulary (token `at` of the split's stream, by
    default the middle of its first shard), and refresh the shard's sha256 in the manifest (as a
    tool that wrote the shard itself would): only the id is wrong."""
    manifest_path = tokens / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    entries = [s for s in manifest["shards"] if s["split"] == split]
    entry, local = entries[0], entries[0]["tokens"] // 2
    if at is not None:
        for entry in entries:
            if at < entry["tokens"]:
                local = at
                break
            at -= entry["tokens"]
    path = tokens / entry["name"]
    header = fmt.read_header(path)
    bad = header.vocab_size + 100
    ids = np.memmap(path, dtype=header.dtype, mode="r+", offset=fmt.HEADER_SIZE, shape=(header.tokens,))
    ids[local] = bad
    ids.flush()
    del ids
    entry["sha256"] = file_sha256(path)
    manifest_path.write_text(json.dumps(manifest))
    return path, bad


def test_an_out_of_vocabulary_id_is_found_by_the_full_check(tokens_dir, tmp_path, oreline_cli):
    tokens = _copy_tokens(tokens_dir, tmp_path / "tokens")
    path, bad = _plant_out_of_vocabulary_id(tokens)
    with pytest.raises(DataIntegrityError) as err:
        TokenLoader(tokens, seq_len=32, micro_batch=2, verify="full")
    assert f"token shard {path} holds token id {bad}, outside its vocabulary" in str(err.value)
    code, out = oreline_cli("tokens", "verify", str(tokens))
    assert code == 1, out
    assert f"token shard {path} holds token id {bad}" in out and "1 of" in out


def test_an_out_of_vocabulary_id_is_found_per_batch_with_header_only_verification(tokens_dir, tmp_path):
    tokens = _copy_tokens(tokens_dir, tmp_path / "tokens")
    path, bad = _plant_out_of_vocabulary_id(tokens)
    loader = TokenLoader(tokens, seq_len=32, micro_batch=4)  # opens: no full read
    with pytest.raises(DataIntegrityError, match=f"holds token id {bad}") as err:
        for _ in range(loader.num_sequences // 4 + 2):  # one epoch reaches every sequence
            loader.next_batch()
    assert str(path) in str(err.value)


def test_train_on_a_shard_with_an_out_of_vocabulary_id_names_the_shard(
    tokens_dir, byte_tokenizer_dir, tmp_path, oreline_cli
):
    tokens = _copy_tokens(tokens_dir, tmp_path / "tokens")
    config = train_config(tmp_path, tokens, byte_tokenizer_dir)
    tc = load_config(config, []).train
    # ids are checked per batch: put the bad one in the first sequence the run reads
    first = TokenLoader(tokens, seq_len=tc.seq_len, seed=tc.seed).global_indices(0, 1)[0]
    path, bad = _plant_out_of_vocabulary_id(tokens, at=first * tc.seq_len + 10)
    code, out = oreline_cli("train", "-c", str(config))
    assert_clean_error(code, out, f"token shard {path} holds token id {bad}", "re-run oreline tokenize")


# ---------------------------------------------------------------------------------------------
# issue 32 item 11: a tokenizer whose regex makes Oniguruma give up


@pytest.mark.hostile
def test_a_text_that_panics_the_tokenizer_is_one_rejected_document(byte_tokenizer_dir, tmp_path, oreline_cli):
    # the trained tokenizer with `(a+)+b` before its pre-tokenizer: 40 a's then c exhaust Oniguruma
    tok_dir = hostile.backtracking_tokenizer(byte_tokenizer_dir, tmp_path / "tok")
    good = [f"Document {i}: a perfectly ordinary paragraph of plain English text." for i in range(6)]
    docs = tmp_path / "docs.jsonl"
    with docs.open("w", encoding="utf-8") as fh:
        for i, text in enumerate(good[:3] + ["a" * 40 + "c"] + good[3:]):
            fh.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    code, out = oreline_cli("tokenize", str(docs), "-t", str(tok_dir), "-o", str(tmp_path / "out"))
    assert code == 0 and "Traceback" not in out, out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["rejected"] == {"encode_error": 1}, manifest["rejected"]
    assert sum(s["documents"] for s in manifest["shards"]) == len(good)
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [r["raw"]["id"] for r in rejects] == ["d3"], rejects
    assert "retry-limit-in-match" in rejects[0]["raw"]["error"], rejects
    # and one text through the Python API: an InputError naming the tokenizer, not a PanicException
    tok = load_tokenizer(tok_dir)
    with pytest.raises(InputError, match=f"the tokenizer at {tok_dir} failed on a text"):
        tok.encode("a" * 40 + "c")
    assert tok.encode("plain text") == load_tokenizer(byte_tokenizer_dir).encode("plain text")
