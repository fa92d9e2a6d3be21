"""The token layer's folders: `oreline tokenize --out` never deletes a file it did not write, one
writer at a time, manifest shard names stay in their folder, and a data run that has not finished
is not consumed by `tokenize` or `tokenizer train` unless the user says so.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from oreline.config import TokenizeConfig, TokenizerConfig
from oreline.errors import DataIntegrityError, InputError
from oreline.outdir import LOCK, FolderInUse, NotOurFolder
from oreline.tokens.loader import TokenLoader
from oreline.tokens.tokenize import tokenize_corpus
from oreline.tokens.train_bpe import train_tokenizer

from .conftest import write_parquet


def test_tokenize_keeps_a_users_tok_file(corpus, byte_tokenizer_dir, tmp_path, oreline_cli):
    docs = write_parquet(tmp_path / "docs.parquet", corpus["shakespeare"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "my-notes.tok").write_bytes(b"my own notes, not a shard")
    code, err = oreline_cli("tokenize", str(docs), "--tokenizer", str(byte_tokenizer_dir), "--out", str(out))
    err = " ".join(err.split())  # rich's line wrapping undone
    assert code == 2 and f"{out} is not empty (my-notes.tok)" in err and "--force" in err
    assert sorted(p.name for p in out.iterdir()) == ["my-notes.tok"]
    # --force: written next to it; a re-run with other settings replaces oreline's shards, only those
    first = tokenize_corpus(
        [docs], byte_tokenizer_dir, out, TokenizeConfig(val_fraction=0.0), workers=1, force=True
    )
    second = tokenize_corpus([docs], byte_tokenizer_dir, out, TokenizeConfig(val_fraction=0.2), workers=1)
    names = {p.name for p in out.glob("*.tok")}
    assert names == {s["name"] for s in second["shards"]} | {"my-notes.tok"}
    assert not names & {s["name"] for s in first["shards"]}  # the old generation is gone
    assert (out / "my-notes.tok").read_bytes() == b"my own notes, not a shard"
    # --force never adopts a folder holding names tokenize writes
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text("{}")
    with pytest.raises(NotOurFolder, match="manifest.json, names oreline tokenize writes"):
        tokenize_corpus([docs], byte_tokenizer_dir, other, TokenizeConfig(), workers=1, force=True)


def test_a_second_tokenize_on_a_held_folder_is_refused(corpus, byte_tokenizer_dir, tmp_path, lock_holder):
    docs = write_parquet(tmp_path / "docs.parquet", corpus["ru"])
    holder = lock_holder(tmp_path / "out", "oreline tokenize")
    with pytest.raises(FolderInUse, match=f"oreline tokenize \\(pid {holder.pid} on host"):
        tokenize_corpus([docs], byte_tokenizer_dir, tmp_path / "out", TokenizeConfig(), workers=1)
    assert not list((tmp_path / "out").glob("*.tok"))


def test_a_second_tokenizer_train_on_a_held_folder_is_refused(corpus, tmp_path, lock_holder):
    docs = write_parquet(tmp_path / "docs.parquet", corpus["ru"])
    holder = lock_holder(tmp_path / "tok", "oreline tokenizer train")
    with pytest.raises(FolderInUse, match=f"oreline tokenizer train \\(pid {holder.pid} on host"):
        train_tokenizer([docs], tmp_path / "tok", TokenizerConfig(vocab_size=300))
    assert not (tmp_path / "tok" / "tokenizer.json").exists()


def test_manifest_shard_names_that_leave_the_folder_are_refused(tokens_dir, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(
        "TOP-SECRET-CONTENT of a file outside the token folder\n" * 8
    )  # longer than a shard header
    for name in ("../secret.txt", str(secret)):
        copy = tmp_path / "tokens"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(tokens_dir, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["shards"][0]["name"] = name
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DataIntegrityError) as err:
            TokenLoader(copy, split=manifest["shards"][0]["split"], seq_len=32, micro_batch=2)
        msg = str(err.value)
        assert "shards[0].name" in msg and "TOP-SECRET" not in msg and "TOP-" not in repr(err.value.args)


@pytest.mark.slow
def test_an_unfinished_data_run_is_not_consumed(samples, byte_tokenizer_dir, tmp_path, oreline_cli, kill_at):
    """`oreline data` killed as soon as its first shard is in docs/: tokenize and tokenizer train refuse
    the folder (and its docs/), naming it and the command that finishes it; --allow-incomplete reads it."""
    inputs = [
        str(samples / "web-archives" / p)
        for p in (
            "dolma-wget-2024/sample-0000.warc.gz",
            "dolma-wget-2024/sample-0001.warc.gz",
            "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
            "ia-blackbook-2008/IAH-20080430204825-00000-blackbook.warc.gz",
        )
    ]
    data = tmp_path / "data"
    command = [sys.executable, "-m", "oreline", "data", *inputs, "--out", str(data), "--workers", "1"]
    killed = kill_at(command, lambda: bool(list((data / "docs").glob("part-*.parquet"))))
    assert killed, "the data run finished before it could be killed"
    assert not (data / "_SUCCESS").exists()

    for target in (data, data / "docs"):
        code, err = oreline_cli(
            "tokenize", str(target), "--tokenizer", str(byte_tokenizer_dir), "--out", str(tmp_path / "t")
        )
        err = " ".join(err.split())  # rich's line wrapping undone
        assert code == 2 and f"{data} is an oreline data run that has not finished (no _SUCCESS)" in err, err
        assert f"--out {data}` again" in err and "--allow-incomplete" in err
        code, err = oreline_cli("tokenizer", "train", str(target), "--out", str(tmp_path / "tok"))
        err = " ".join(err.split())  # rich's line wrapping undone
        assert code == 2 and "has not finished (no _SUCCESS)" in err, err
    assert not (tmp_path / "t").exists() and not (tmp_path / "tok").exists()
    assert (data / LOCK).exists()  # the killed run's lock: stale, taken over by the run that finishes it
    with pytest.raises(InputError, match="has not finished"):
        tokenize_corpus([data], byte_tokenizer_dir, tmp_path / "t", TokenizeConfig(), workers=1)

    manifest = tokenize_corpus(
        [data],
        byte_tokenizer_dir,
        tmp_path / "t",
        TokenizeConfig(val_fraction=0.0),
        workers=1,
        allow_incomplete=True,
    )
    assert manifest["splits"]["train"]["documents"] > 0
    assert all("/docs/" in i["path"] for i in manifest["inputs"])  # docs only: not work/ nor rejects/
    stats = train_tokenizer(
        [data / "docs"],
        tmp_path / "tok",
        TokenizerConfig(vocab_size=300, heldout_docs=0),
        allow_incomplete=True,
    )
    assert stats["train_docs"] > 0
    plain = sorted((data / "docs").glob("part-*.parquet"))  # files named one by one are taken as they are
    assert tokenize_corpus(
        plain, byte_tokenizer_dir, tmp_path / "t2", TokenizeConfig(val_fraction=0.0), workers=1
    )
