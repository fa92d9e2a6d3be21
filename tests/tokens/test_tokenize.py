"""Documents → token shards: BOS/EOS injection, round trip, split stability, re-runs, rejects."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from oreline.config import TokenizeConfig, TokenizerConfig
from oreline.io import file_sha256
from oreline.tokens import shards as fmt
from oreline.tokens.inputs import Rejects, iter_texts
from oreline.tokens.tokenize import is_val, read_manifest, tokenize_corpus
from oreline.tokens.train_bpe import load_tokenizer, train_tokenizer

from .conftest import write_jsonl, write_parquet


def split_documents(tokens_dir, split):
    """Every document of a split, in manifest order, as a list of ids."""
    manifest = read_manifest(tokens_dir)
    out = []
    for s in manifest["shards"]:
        if s["split"] == split:
            shard = fmt.open_shard(tokens_dir / s["name"], manifest["tokenizer_fingerprint"], s["sha256"])
            out.extend(shard.document(i).tolist() for i in range(shard.header.documents))
    return out


def input_docs(files):
    return list(iter_texts(files, Rejects()))


def test_round_trip_every_document(tokens_dir, corpus_files, byte_tokenizer_dir):
    tok = load_tokenizer(byte_tokenizer_dir)
    docs = input_docs(corpus_files)
    for split in ("train", "val"):
        expected = [text for doc_id, text in docs if is_val(doc_id, 0.1) == (split == "val")]
        got = split_documents(tokens_dir, split)
        assert len(got) == len(expected) > 0
        assert [tok.decode(ids) for ids in got] == expected


def test_each_document_is_bos_tokens_eos_without_double_bos(tokens_dir, corpus_files, byte_tokenizer_dir):
    tok = load_tokenizer(byte_tokenizer_dir)
    docs = split_documents(tokens_dir, "train") + split_documents(tokens_dir, "val")
    for ids in docs:
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        assert tok.bos_id not in ids[1:] and tok.eos_id not in ids[:-1]
    literal = "<s>starts with a literal BOS</s>"
    matches = [ids for ids in docs if tok.decode(ids) == literal]
    assert len(matches) == 1 and matches[0][1:-1] == tok.encode(literal)


def test_manifest_records_fingerprints_and_checksums(tokens_dir, corpus_files, byte_tokenizer_dir):
    manifest = read_manifest(tokens_dir)
    tok = load_tokenizer(byte_tokenizer_dir)
    assert manifest["tokenizer_fingerprint"] == tok.fingerprint
    assert manifest["vocab_size"] == tok.vocab_size and manifest["dtype"] == "uint16"
    assert [i["path"] for i in manifest["inputs"]] == [str(p) for p in corpus_files]
    assert manifest["splits"]["train"]["shards"] > len(corpus_files)  # max_shard_tokens forced several parts
    for s in manifest["shards"]:
        path = tokens_dir / s["name"]
        assert file_sha256(path) == s["sha256"] and path.stat().st_size == s["bytes"]
        assert fmt.read_header(path).fingerprint == tok.fingerprint
        shard = fmt.open_shard(path)
        last_doc = int(shard.offsets[-1] - shard.offsets[-2])
        assert s["tokens"] - last_doc < 20_000  # a shard closes with the document that fills it
    total = manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"]
    assert total == sum(s["tokens"] for s in manifest["shards"])


def test_workers_do_not_change_the_token_stream(corpus_files, byte_tokenizer_dir, tmp_path):
    cfg = TokenizeConfig(val_fraction=0.1)
    one = tokenize_corpus(corpus_files[:1], byte_tokenizer_dir, tmp_path / "w1", cfg, workers=1)
    two = tokenize_corpus(corpus_files[:1], byte_tokenizer_dir, tmp_path / "w2", cfg, workers=2)
    assert len(two["shards"]) > len(one["shards"])  # one file split into row-group tasks
    for split in ("train", "val"):
        assert split_documents(tmp_path / "w1", split) == split_documents(tmp_path / "w2", split)


def test_rerun_is_a_noop_and_changes_rebuild(corpus_files, byte_tokenizer_dir, tmp_path):
    out = tmp_path / "tokens"
    cfg = TokenizeConfig(val_fraction=0.1)
    first = tokenize_corpus(corpus_files[:2], byte_tokenizer_dir, out, cfg, workers=1)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = tokenize_corpus(corpus_files[:2], byte_tokenizer_dir, out, cfg, workers=1)
    assert again["up_to_date"] is True and first["up_to_date"] is False
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes

    # a different tokenizer: new shards with its fingerprint, the old generation is gone
    other = tmp_path / "tok2"
    train_tokenizer(corpus_files[:1], other, TokenizerConfig(vocab_size=512, heldout_docs=10))
    rebuilt = tokenize_corpus(corpus_files[:2], other, out, cfg, workers=1)
    assert (
        rebuilt["up_to_date"] is False
        and rebuilt["tokenizer_fingerprint"] == load_tokenizer(other).fingerprint
    )
    names = {s["name"] for s in rebuilt["shards"]}
    assert names.isdisjoint({s["name"] for s in first["shards"]})
    assert {p.name for p in out.glob("*.tok")} == names

    # changed documents (one more file) rebuild too
    more = tokenize_corpus(corpus_files, other, out, cfg, workers=1)
    assert more["up_to_date"] is False and more["docs_fingerprint"] != rebuilt["docs_fingerprint"]

    # a damaged shard is noticed on re-run and rebuilt
    victim = out / more["shards"][0]["name"]
    victim.write_bytes(victim.read_bytes()[:-8])
    repaired = tokenize_corpus(corpus_files, other, out, cfg, workers=1)
    assert repaired["up_to_date"] is False
    fmt.open_shard(victim, sha256=repaired["shards"][0]["sha256"])


def test_split_is_stable_when_the_corpus_grows(corpus, byte_tokenizer_dir, tmp_path):
    tok = load_tokenizer(byte_tokenizer_dir)
    base = write_parquet(tmp_path / "a.parquet", corpus["shakespeare"])
    grown = write_parquet(tmp_path / "b.parquet", corpus["austen"] + corpus["ru"])
    cfg = TokenizeConfig(val_fraction=0.2)
    tokenize_corpus([base], byte_tokenizer_dir, tmp_path / "small", cfg, workers=1)
    tokenize_corpus([grown, base], byte_tokenizer_dir, tmp_path / "big", cfg, workers=1)
    for split in ("train", "val"):
        small = {tok.decode(d) for d in split_documents(tmp_path / "small", split)}
        big = {tok.decode(d) for d in split_documents(tmp_path / "big", split)}
        assert small and small <= big  # no old document changed sides
    share = len(split_documents(tmp_path / "big", "val")) / len(
        corpus["shakespeare"] + corpus["austen"] + corpus["ru"]
    )
    assert 0.12 < share < 0.28


def test_bad_rows_are_counted_and_kept(corpus, byte_tokenizer_dir, tmp_path):
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        corpus["edge"][:2],
        gz=False,
        extra_lines=['{"id": "e1", "text": ""}', "not json at all", '{"id": "e2"}', "[1, 2]"],
    )
    manifest = tokenize_corpus(
        [bad], byte_tokenizer_dir, tmp_path / "out", TokenizeConfig(val_fraction=0.0), workers=1
    )
    # an empty text and a missing one are one reason; the row's detail says which
    assert manifest["rejected"] == {"bad_json": 2, "no_text": 2}
    rows = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rows) == ["bad_json", "bad_json", "no_text", "no_text"]
    details = {r["raw"]["id"]: r["raw"]["detail"] for r in rows if r["reason"] == "no_text"}
    assert details == {"e1": "empty", "e2": "missing or null"}
    assert manifest["splits"]["train"]["documents"] == 2 and manifest["splits"]["val"]["documents"] == 0


def test_uint32_shards_for_large_vocabularies(byte_tokenizer_dir, tmp_path):
    # a vocabulary above 65,536 is simulated by the writer's vocab size; the reader follows the header
    w = fmt.ShardWriter(tmp_path / "big.tok", load_tokenizer(byte_tokenizer_dir).fingerprint, 128_256, 1, 2)
    w.add_documents([[70_000, 128_255, 5]])
    header = w.close()
    shard = fmt.open_shard(tmp_path / "big.tok")
    assert header.dtype == np.uint32 and shard.document(0).tolist() == [1, 70_000, 128_255, 5, 2]


def test_cli_tokenize(corpus_files, byte_tokenizer_dir, tmp_path):
    from typer.testing import CliRunner

    from oreline.cli import app

    docs = tmp_path / "docs"
    shutil.copytree(corpus_files[0].parent, docs)
    args = [
        "tokenize",
        str(docs),
        "--tokenizer",
        str(byte_tokenizer_dir),
        "--out",
        str(tmp_path / "t"),
        "--workers",
        "1",
        "--val-fraction",
        "0.05",
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    manifest = read_manifest(tmp_path / "t")
    assert manifest["settings"]["val_fraction"] == 0.05 and len(manifest["inputs"]) == 3
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0 and "up to date" in second.output


def test_missing_input_says_what_to_do(byte_tokenizer_dir, tmp_path):
    from oreline.errors import InputError

    with pytest.raises(InputError, match="pass .parquet"):
        tokenize_corpus([tmp_path / "nothing-here"], byte_tokenizer_dir, tmp_path / "out", TokenizeConfig())


def test_unreadable_files_are_counted_not_fatal(corpus, byte_tokenizer_dir, tmp_path):
    good = write_parquet(tmp_path / "good.parquet", corpus["ru"])
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1" + b"\0" * 100)
    whole = write_jsonl(tmp_path / "cut.jsonl.gz", corpus["shakespeare"])
    cut = tmp_path / "cut-short.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    manifest = tokenize_corpus(
        [good, broken, cut], byte_tokenizer_dir, tmp_path / "out", TokenizeConfig(val_fraction=0.0), workers=1
    )
    assert manifest["rejected"]["unreadable_file"] == 2
    assert manifest["rejected"].get("bad_json", 0) <= 1  # the line cut in half, if it was delivered
    docs = manifest["splits"]["train"]["documents"]
    assert (
        len(corpus["ru"]) < docs < len(corpus["ru"]) + len(corpus["shakespeare"])
    )  # the readable half is kept
    rows = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert {r["source"] for r in rows if r["reason"] == "unreadable_file"} == {str(broken), str(cut)}


def test_data_output_folder_means_its_kept_documents(corpus, tmp_path):
    from oreline.tokens.inputs import expand_inputs

    out = tmp_path / "data"
    kept = write_parquet(out / "docs" / "part-00000-000.parquet", corpus["ru"])
    write_parquet(out / "rejects" / "part-00000-000.parquet", corpus["zh"])
    (out / "work").mkdir()
    (out / "work" / "sig.parquet").write_bytes(b"not documents")
    (out / "_SUCCESS").write_text("")
    assert expand_inputs([out]) == [kept]
    (out / "_SUCCESS").unlink()
    assert kept in expand_inputs([out]) and not any("rejects" in p.parts for p in expand_inputs([out]))


def test_lone_surrogates_are_rejected_not_fatal(corpus, byte_tokenizer_dir, tmp_path):
    bad = write_jsonl(
        tmp_path / "s.jsonl",
        corpus["ru"][:3],
        gz=False,
        extra_lines=['{"id": "sur", "text": "broken \\ud800 text"}'],
    )
    manifest = tokenize_corpus(
        [bad], byte_tokenizer_dir, tmp_path / "out", TokenizeConfig(val_fraction=0.0), workers=1
    )
    assert manifest["rejected"] == {"encode_error": 1}
    assert manifest["splits"]["train"]["documents"] == 3
    assert '"sur"' in (tmp_path / "out" / "rejects.jsonl").read_text(encoding="utf-8")
    stats = train_tokenizer([bad], tmp_path / "tok", TokenizerConfig(vocab_size=300, heldout_docs=0))
    assert stats["rejected"] == {"invalid_unicode": 1} and stats["train_docs"] == 3


def test_metaspace_shards_round_trip(corpus, metaspace_tokenizer_dir, tmp_path):
    tok = load_tokenizer(metaspace_tokenizer_dir)
    docs = corpus["edge"] + corpus["zh"][:40] + corpus["ru"][:40]
    src = write_parquet(tmp_path / "m.parquet", docs)
    tokenize_corpus(
        [src], metaspace_tokenizer_dir, tmp_path / "out", TokenizeConfig(val_fraction=0.0), workers=1
    )
    got = split_documents(tmp_path / "out", "train")
    assert [tok.decode(ids) for ids in got] == [t for _, t in docs]
    assert all(ids[0] == 1 and ids[-1] == 2 and 1 not in ids[1:] and 3 not in ids for ids in got)


def test_short_validation_split_takes_the_next_documents_by_id_hash(corpus, byte_tokenizer_dir, tmp_path):
    """A val_fraction that leaves validation (nearly) empty is raised, in id-hash order, until the
    split holds val_min_tokens: deterministic, the same whichever task holds which document."""
    from rich.console import Console

    from oreline.tokens.tokenize import id_hash, print_manifest_summary

    docs = corpus["shakespeare"][:400]
    tok = load_tokenizer(byte_tokenizer_dir)
    cfg = TokenizeConfig(val_fraction=0.01)
    plain = tokenize_corpus(
        [write_parquet(tmp_path / "all.parquet", docs)], byte_tokenizer_dir, tmp_path / "p", cfg
    )
    want = 4000
    assert plain["splits"]["val"]["tokens"] < want / 4  # the fraction alone: one short document
    one = tokenize_corpus(
        [tmp_path / "all.parquet"], byte_tokenizer_dir, tmp_path / "one", cfg, workers=1, val_min_tokens=want
    )
    halves = [
        write_parquet(tmp_path / "a.parquet", docs[::2]),
        write_parquet(tmp_path / "b.parquet", docs[1::2]),
    ]
    two = tokenize_corpus(halves, byte_tokenizer_dir, tmp_path / "two", cfg, workers=2, val_min_tokens=want)
    # the lowest-hash documents whose tokens (BOS and EOS included) first reach the minimum
    by_hash = sorted(docs, key=lambda d: id_hash(d[0]))
    lengths = np.cumsum([len(tok.encode(text)) + 2 for _, text in by_hash])
    needed = int(np.searchsorted(lengths, want)) + 1
    expected = {text for _, text in by_hash[:needed]}
    for out, manifest in ((tmp_path / "one", one), (tmp_path / "two", two)):
        assert manifest["val_split"]["raised"] is True
        assert want <= manifest["splits"]["val"]["tokens"] == int(lengths[needed - 1])
        assert {tok.decode(d) for d in split_documents(out, "val")} == expected
        train = {tok.decode(d) for d in split_documents(out, "train")}
        assert train.isdisjoint(expected) and len(train) + needed == len(docs)
        assert {p.name for p in out.glob("*.tok")} == {s["name"] for s in manifest["shards"]}
    assert one["val_split"]["below"] == two["val_split"]["below"]
    again = tokenize_corpus(halves, byte_tokenizer_dir, tmp_path / "two", cfg, workers=2, val_min_tokens=want)
    assert again["up_to_date"] is True
    console = Console(record=True, width=200)
    print_manifest_summary(two, console)
    assert "so the split was raised to the ids of lowest hash" in console.export_text()

    # a corpus too small for the minimum: validation takes at most half of its tokens
    tiny = tokenize_corpus(
        [write_parquet(tmp_path / "tiny.parquet", docs[:6])],
        byte_tokenizer_dir,
        tmp_path / "tiny",
        cfg,
        val_min_tokens=10**6,
    )
    assert 0 < tiny["splits"]["val"]["tokens"] <= tiny["splits"]["train"]["tokens"]


def test_tokenize_on_a_full_disk_is_one_error_and_removes_its_shards(
    corpus_files, byte_tokenizer_dir, small_disk, tmp_path
):
    """A full disk ended `oreline tokenize` in 54 lines of traceback (OSError: [Errno 28]) and
    left the shards of the tasks that had finished; an earlier set in the folder stays usable."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import oreline

    disk = small_disk("3m")
    out = disk / "tokens"
    before = tokenize_corpus(corpus_files[2:], byte_tokenizer_dir, out, TokenizeConfig(val_fraction=0.1))
    filler = small_disk.fill(disk, leave=150_000)
    command = [sys.executable, "-m", "oreline", "tokenize", *map(str, corpus_files)]
    command += ["--tokenizer", str(byte_tokenizer_dir), "--out", str(out), "--workers", "2"]
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(Path(oreline.__file__).parents[1])}
    full = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    err = full.stderr + full.stdout
    assert full.returncode == 2 and "Traceback" not in err and err.count("error:") == 1, err[-3000:]
    said = " ".join(err[err.index("error: ") :].split())
    assert said.startswith(f"error: no space left on the device of {out}"), said
    assert "run the same `oreline tokenize` command again" in said
    assert sorted(p.name for p in out.glob("*.tok*")) == sorted(s["name"] for s in before["shards"])
    assert not [p for p in out.iterdir() if p.name.startswith(".") and ".tmp-" in p.name]
    assert read_manifest(out)["key"] == before["key"]
    filler.unlink()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_manifest(out)["docs_fingerprint"] != before["docs_fingerprint"]


def test_ctrl_c_in_tokenize_says_it_stopped_and_leaves_no_partial_shards(
    corpus, byte_tokenizer_dir, tmp_path
):
    """Ctrl-C printed nothing (Typer's silent exit 130): the command says it stopped and what to
    do, and the folder holds no half-written shard."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import oreline

    docs = write_parquet(tmp_path / "big.parquet", corpus["shakespeare"] * 60)
    out = tmp_path / "tokens"
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(Path(oreline.__file__).parents[1])}
    command = [sys.executable, "-m", "oreline", "tokenize", str(docs), "--tokenizer", str(byte_tokenizer_dir)]
    proc = subprocess.Popen(
        [*command, "--out", str(out), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal gives it
    )
    deadline = time.time() + 120
    while not any(p.name.endswith(".tok.tmp-" + str(proc.pid)) for p in out.glob(".*")):  # mid-shard
        assert time.time() < deadline and proc.poll() is None, "tokenize finished before the interrupt"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    said = " ".join(proc.communicate(timeout=120)[0].split())
    assert proc.returncode == 130, said
    assert "interrupted: oreline tokenize stopped at Ctrl-C before it finished" in said, said
    assert "Traceback" not in said
    assert sorted(p.name for p in out.iterdir()) == [".oreline-owner"]  # no shard, no manifest, no lock


def test_a_named_validation_set_is_the_split_and_every_input_trains(corpus, byte_tokenizer_dir, tmp_path):
    """The split was chosen only by a hash of document ids: comparing with a published result
    needs a given held-out text. `--val FILE` makes its documents the validation split."""
    from typer.testing import CliRunner

    from oreline.cli import app

    tok = load_tokenizer(byte_tokenizer_dir)
    inputs = write_parquet(tmp_path / "austen.parquet", corpus["austen"])
    heldout = write_parquet(tmp_path / "heldout" / "shakespeare.parquet", corpus["shakespeare"][:50])
    out = tmp_path / "tokens"
    args = ["tokenize", str(inputs), "--tokenizer", str(byte_tokenizer_dir), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--val", str(heldout)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert [tok.decode(d) for d in split_documents(out, "val")] == [t for _, t in corpus["shakespeare"][:50]]
    assert [tok.decode(d) for d in split_documents(out, "train")] == [t for _, t in corpus["austen"]]
    manifest = read_manifest(out)
    assert manifest["val_split"]["given"] == [str(heldout)]
    assert "the documents of shakespeare.parquet (tokenize.val_inputs)" in " ".join(result.output.split())
    # another held-out set is another key: re-tokenized, not "up to date"
    other = write_parquet(tmp_path / "heldout2.parquet", corpus["shakespeare"][50:80])
    again = tokenize_corpus([inputs], byte_tokenizer_dir, out, TokenizeConfig(), val_inputs=[other])
    assert again["up_to_date"] is False and again["splits"]["val"]["documents"] == 30
