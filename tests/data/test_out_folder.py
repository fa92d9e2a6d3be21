"""`oreline data --out`: a folder of the user's files is never emptied, one writer at a time,
reject rows bounded in every field, and an input folder that cannot be listed is reported.

Inputs are real: a 214 KB WARC of the dolma-wget sample (20 documents kept) and, for the reject caps, a
JSONL document whose id, url and metadata are 5 MB each.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from oreline.config import load_config
from oreline.data.pipeline.run import run_data
from oreline.outdir import LOCK, OWNER, FolderInUse, NotOurFolder

WARC = "web-archives/dolma-wget-2024/sample-0000.warc.gz"


def user_folder(root: Path, with_docs: bool = True) -> dict[str, bytes]:
    """A folder of the user's own files (hidden ones included); returns {relative path: bytes}."""
    files = {
        ".git/HEAD": b"ref: refs/heads/main\n",
        ".git/objects/ab/cdef": b"\x00blob",
        ".env": b"TOKEN=secret\n",
        "sub/.hidden": b"hidden",
        "notes.txt": b"my notes",
    }
    if with_docs:
        files["docs/part-00000-mine.parquet"] = b"PAR1 my own table"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def assert_intact(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        assert (root / rel).read_bytes() == data, rel


def test_data_refuses_a_folder_of_user_files_and_deletes_nothing(samples, tmp_path, oreline_cli):
    out = tmp_path / "mine"
    files = user_folder(out)
    code, err = oreline_cli("data", str(samples / WARC), "--out", str(out))
    err = " ".join(err.split())  # rich's line wrapping undone
    assert code == 2, err[-2000:]
    assert f"{out} is not empty" in err and "--force" in err and "not created by oreline data" in err
    # --force still never takes a folder that has names oreline writes (docs/): nothing is touched
    code, err = oreline_cli("data", str(samples / WARC), "--out", str(out), "--force")
    err = " ".join(err.split())  # rich's line wrapping undone
    assert (
        code == 2
        and f"{out} holds docs, names oreline data writes" in err
        and "never overwrites or deletes" in err
    )
    assert_intact(out, files)
    assert sorted(p.name for p in out.iterdir()) == [".env", ".git", "docs", "notes.txt", "sub"]


def test_force_writes_next_to_user_files_and_keeps_them(samples, tmp_path):
    out = tmp_path / "mine"
    files = user_folder(out, with_docs=False)
    stats = run_data([samples / WARC], out, load_config(), workers=1, force=True)
    assert (out / "_SUCCESS").is_file() and stats["output"]["docs"] > 0
    assert_intact(out, files)  # the end-of-run clean-up deleted every hidden path here before
    assert json.loads((out / OWNER).read_text())["adopted"] == "force"
    again = run_data([samples / WARC], out, load_config(), workers=1)  # a re-run: its own folder now
    assert again["output"] == stats["output"]
    assert_intact(out, files)
    assert not (out / LOCK).exists()


def test_a_second_data_run_on_a_held_folder_is_refused(samples, tmp_path, lock_holder, dead_lock, capfd):
    out = tmp_path / "out"
    holder = lock_holder(out, "oreline data")  # a live `oreline data` process stand-in on this host
    with pytest.raises(FolderInUse, match=f"oreline data \\(pid {holder.pid} on host"):
        run_data([samples / WARC], out, load_config(), workers=1)
    assert not (out / "docs").exists()
    holder.kill()
    holder.wait()
    out2 = tmp_path / "stale"
    pid = dead_lock(out2)  # a run that was killed: its lock names a pid that is gone
    capfd.readouterr()
    stats = run_data([samples / WARC], out2, load_config(), workers=1)
    assert re.search(f"^warning: .*taking over the lock .*pid {pid}", capfd.readouterr().err, re.M)
    assert (out2 / "_SUCCESS").is_file() and stats["output"]["docs"] > 0 and not (out2 / LOCK).exists()


def test_a_folder_of_another_oreline_kind_is_refused(samples, tmp_path):
    out = tmp_path / "tok"
    out.mkdir()
    (out / OWNER).write_text(json.dumps({"kind": "tokens"}))
    (out / "manifest.json").write_text("{}")
    with pytest.raises(NotOurFolder, match="holds oreline 'tokens' output"):
        run_data([samples / WARC], out, load_config(), workers=1)
    assert sorted(p.name for p in out.iterdir()) == [OWNER, "manifest.json"]


def test_reject_rows_cap_id_url_and_metadata(tmp_path):
    big = "x" * (5 << 20)
    doc = {
        "id": "id-" + big,
        "url": "https://example.com/" + big,
        "text": "too short",
        "metadata": {"note": big, "lang_hint": "en"},
    }
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    stats = run_data([src], tmp_path / "out", load_config(), workers=1)
    assert stats["output"]["docs"] == 0
    rows = pq.read_table(sorted((tmp_path / "out" / "rejects").glob("*.parquet"))).to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert len(row["id"].encode()) <= 1024 and row["id"].startswith("id-xxx")
    assert len(row["url"].encode()) <= 8192 and row["url"].startswith("https://example.com/")
    assert len(row["metadata"].encode()) <= 65536 + 200
    meta = json.loads(row["metadata"])
    assert meta["_cut"]["id"] == len(doc["id"]) and meta["_cut"]["url"] == len(doc["url"])
    assert meta["_cut"]["metadata"] > 5 << 20 and meta["_head"].startswith("{")
    assert sum(p.stat().st_size for p in (tmp_path / "out" / "rejects").glob("*.parquet")) < 200_000


def _unlistable_folder(root: Path) -> Path:
    """A real folder that cannot be listed by path, even by root (tests run as root, where chmod
    000 stops nothing): nested so deep that its path passes PATH_MAX (4096 bytes), so opening it by
    name fails with ENAMETOOLONG. Built with directory file descriptors, which have no such limit."""
    name = "d" * 250
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(18):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        inner = os.open("hidden-corpus.jsonl", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(inner, b'{"id": "deep", "text": "never read"}\n')
        os.close(inner)
    finally:
        os.close(fd)
    return root / name


def test_an_input_folder_that_cannot_be_listed_is_recorded(samples, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "web.warc.gz").write_bytes((samples / WARC).read_bytes())
    _unlistable_folder(inputs)
    stats = run_data([inputs], tmp_path / "out", load_config(), workers=1)
    assert stats["output"]["docs"] > 0
    unread = [e for e in stats["errors"] if e["error"].startswith("folder not read")]
    assert len(unread) == 1 and "File name too long" in unread[0]["error"]
    assert unread[0]["file"].startswith(str(inputs / ("d" * 250)))
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert any(e["error"].startswith("folder not read") for e in on_disk["errors"])


@pytest.mark.hostile
def test_links_planted_in_a_data_folder_are_refused(samples, tmp_path):
    """out/docs -> the user's corpus and out/work/dedup -> the user's project, in a folder oreline
    created: the run overwrote their shard through the first and rmtree'd their stages/ through the
    second. Now the folder is refused, the links named, and nothing behind them changes."""
    from oreline.outdir import claim_folder

    corpus, project = tmp_path / "corpus", tmp_path / "project"
    files = {
        corpus / "part-00000-000.parquet": b"PAR1 the user's own shard",
        project / "stages" / "notes.txt": b"the user's notes",
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    out = claim_folder(tmp_path / "out", "data", "oreline data")  # oreline's folder, as a first run made it
    (out / "work").mkdir()
    os.symlink(corpus, out / "docs")
    os.symlink(project, out / "work" / "dedup")
    with pytest.raises(NotOurFolder, match=r"symbolic links .*docs -> .*corpus, work/dedup -> .*project"):
        run_data([samples / WARC], out, load_config(), workers=1)
    for path, data in files.items():
        assert path.read_bytes() == data, path
    assert sorted(p.name for p in corpus.iterdir()) == ["part-00000-000.parquet"]
    assert sorted(p.name for p in out.iterdir()) == [OWNER, "docs", "work"]  # nothing written
