"""Export and import folders: an --out folder is replaced only when it holds an earlier output of
the same command and nothing else; index entries never leave the model folder."""

from __future__ import annotations

import json
import os

import pytest
import torch

from oreline.errors import DataIntegrityError, InputError
from oreline.export.hf import export_state_dict_hf, import_hf, read_hf_weights
from oreline.model.llama import Llama, ModelArgs
from oreline.outdir import OWNER, NotOurFolder


def small_model() -> Llama:
    torch.manual_seed(0)
    return Llama(
        ModelArgs(
            dim=32,
            n_layers=1,
            n_heads=2,
            n_kv_heads=2,
            vocab_size=128,
            ffn_dim=64,
            max_seq_len=64,
            tie_embeddings=True,
        )
    ).eval()


def test_import_hf_refuses_a_folder_with_any_meta_json(tmp_path):
    model = small_model()
    export_state_dict_hf(model.state_dict(), model.args, None, tmp_path / "hf")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "meta.json").write_text('{"my": "project metadata"}')
    (out / "notes.txt").write_text("my notes")
    with pytest.raises(NotOurFolder, match="not an earlier output of oreline import-hf"):
        import_hf(tmp_path / "hf", out)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "notes.txt"]
    assert (out / "notes.txt").read_text() == "my notes"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # its temporary folder is gone

    import_hf(tmp_path / "hf", tmp_path / "back")
    import_hf(tmp_path / "hf", tmp_path / "back")  # an earlier import is replaced
    (tmp_path / "back" / "notes.txt").write_text("added by the user")
    with pytest.raises(NotOurFolder, match="also holds notes.txt"):
        import_hf(tmp_path / "hf", tmp_path / "back")
    assert (tmp_path / "back" / "notes.txt").read_text() == "added by the user"


def test_export_replaces_only_its_own_files(tmp_path):
    model = small_model()
    out = tmp_path / "hf"
    export_state_dict_hf(model.state_dict(), model.args, None, out)
    owner = json.loads((out / OWNER).read_text())
    assert owner["kind"] == "export-hf" and "model.safetensors" in owner["files"]
    (out / "README.md").write_text("my model card")
    with pytest.raises(NotOurFolder, match="also holds README.md"):
        export_state_dict_hf(model.state_dict(), model.args, None, out)
    assert (out / "README.md").read_text() == "my model card"
    # an export written before markers existed is recognised by its oreline_export.json file list
    (out / "README.md").unlink()
    (out / OWNER).unlink()
    export_state_dict_hf(model.state_dict(), model.args, None, out)
    assert (out / OWNER).is_file()


@pytest.mark.parametrize("entry", ["../outside.safetensors", "/etc/hostname", "sub/../../x.safetensors"])
def test_hf_index_entries_that_leave_the_folder_are_refused(tmp_path, entry):
    model = small_model()
    out = tmp_path / "hf"
    export_state_dict_hf(model.state_dict(), model.args, None, out, max_shard_bytes=4096)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    (tmp_path / "outside.safetensors").write_bytes(
        (out / next(iter(index["weight_map"].values()))).read_bytes()
    )
    index["weight_map"][next(iter(index["weight_map"]))] = entry
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(DataIntegrityError, match="weight_map: the file name"):
        read_hf_weights(out)


class _Payload:
    """What a pickle renamed .safetensors holds: unpickled, it would run a command."""

    def __reduce__(self):
        import os

        return os.system, ("true",)


@pytest.mark.hostile
@pytest.mark.parametrize("where", ["model.safetensors", "shard", "config.json", "index"])
def test_import_hf_of_a_pickle_or_garbage_is_an_error_naming_the_file(tmp_path, where):
    """Issue 32 item 11: a pickle renamed .safetensors (single file or one shard of an index), a
    config.json or index that is not JSON: `oreline import-hf` ends with the file named (exit 2),
    not a SafetensorError / JSONDecodeError traceback, and writes nothing."""
    import os
    import pickle
    import subprocess
    import sys

    from oreline.errors import InputError

    model = small_model()
    hf = tmp_path / "hf"
    sharded = where in ("shard", "index")
    export_state_dict_hf(
        model.state_dict(), model.args, None, hf, **({"max_shard_bytes": 20_000} if sharded else {})
    )
    target = {
        "model.safetensors": hf / "model.safetensors",
        "shard": next(iter(sorted(hf.glob("model-00001-of-*.safetensors"))), hf / "none"),
        "config.json": hf / "config.json",
        "index": hf / "model.safetensors.index.json",
    }[where]
    assert target.is_file()
    target.write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(InputError) as err:
        import_hf(hf, tmp_path / "out")
    assert str(target) in str(err.value)
    assert not (tmp_path / "out").exists()
    if where == "model.safetensors":  # the command line: exit 2, the message, no traceback
        proc = subprocess.run(
            [sys.executable, "-m", "oreline", "import-hf", str(hf), "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "COLUMNS": "10000"},
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "Traceback" not in out, out
        assert f"{target} is not a readable safetensors file" in out, out


def planted_user_folder(out, how: str) -> dict[str, bytes]:
    """A user's folder (a git repository, notes, their own config.json) with an ownership claim
    planted in it: a `.oreline-owner` of kind export-hf, or an oreline_export.json, listing every
    one of the user's files as oreline's."""
    files = {
        ".git/HEAD": b"ref: refs/heads/main\n",
        ".git/objects/ab/cdef": b"\x00blob",
        "notes.txt": b"my notes",
        "config.json": b'{"mine": true}',
    }
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    listed = sorted(files)
    if how == "marker":
        (out / OWNER).write_text(json.dumps({"kind": "export-hf", "files": listed}))
    else:
        (out / "oreline_export.json").write_text(json.dumps({"format": "hf-llama", "files": listed}))
    return files


@pytest.mark.hostile
@pytest.mark.parametrize("how", ["marker", "export-record"])
def test_a_planted_ownership_claim_deletes_nothing(tmp_path, how):
    model = small_model()
    out = tmp_path / "mine"
    files = planted_user_folder(out, how)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(NotOurFolder, match=r"also holds .*\.git.*notes\.txt"):
        export_state_dict_hf(model.state_dict(), model.args, None, out)
    for rel, data in files.items():
        assert (out / rel).read_bytes() == data, rel
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    # what the kind writes, and only that, is replaced: an export of oreline's own names
    export_state_dict_hf(model.state_dict(), model.args, None, tmp_path / "hf")
    (tmp_path / "hf" / OWNER).write_text(
        json.dumps({"kind": "export-hf", "files": []})
    )  # the list is not read
    export_state_dict_hf(model.state_dict(), model.args, None, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / OWNER).read_text())["files"]


def _secret(tmp_path):
    secret = tmp_path / "secret" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY----- not for export")
    return secret


@pytest.mark.hostile
def test_import_hf_refuses_links_and_other_non_regular_files(tmp_path, tokenizer_dir):
    model = small_model()
    hf = tmp_path / "hf"
    export_state_dict_hf(model.state_dict(), model.args, tokenizer_dir, hf)
    assert (hf / "special_tokens_map.json").is_file()
    secret = _secret(tmp_path)
    (hf / "special_tokens_map.json").unlink()
    os.symlink(secret, hf / "special_tokens_map.json")  # copied verbatim into the import, then every export
    with pytest.raises(InputError, match=r"special_tokens_map.json is a symbolic link"):
        import_hf(hf, tmp_path / "imported")
    assert not (tmp_path / "imported").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]

    (hf / "special_tokens_map.json").unlink()
    os.mkfifo(hf / "special_tokens_map.json")  # a read that never ends
    with pytest.raises(InputError, match=r"special_tokens_map.json is not a regular file"):
        import_hf(hf, tmp_path / "imported")
    (hf / "special_tokens_map.json").unlink()

    (hf / "model.safetensors").rename(tmp_path / "weights.safetensors")
    os.symlink(tmp_path / "weights.safetensors", hf / "model.safetensors")
    with pytest.raises(InputError, match=r"model.safetensors is a symbolic link"):
        import_hf(hf, tmp_path / "imported")
    assert not (tmp_path / "imported").exists()


def test_import_hf_reads_the_hub_cache_links(tmp_path, tokenizer_dir):
    """The Hugging Face hub cache's snapshot folders are links into its blobs/: those, and only
    those, are followed."""
    model = small_model()
    export_state_dict_hf(model.state_dict(), model.args, tokenizer_dir, tmp_path / "hf")
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(p for p in (tmp_path / "hf").iterdir() if not p.name.startswith("."))):
        f.rename(repo / "blobs" / f"{i:064x}")
        os.symlink(f"../../blobs/{i:064x}", snapshot / f.name)
    sd = import_hf(snapshot, tmp_path / "imported")
    assert sd.keys() <= model.state_dict().keys()
    assert all(torch.equal(t, model.state_dict()[name]) for name, t in sd.items())
    assert (tmp_path / "imported" / "tokenizer" / "special_tokens_map.json").is_file()
    # a link of that form whose blobs/ is itself a link (to a folder of secrets) is not the cache's
    secret = _secret(tmp_path)
    os.symlink(secret.parent, tmp_path / "hub2")
    fake = tmp_path / "fake" / "snapshots" / "rev"
    fake.mkdir(parents=True)
    for f in snapshot.iterdir():
        (fake / f.name).write_bytes(f.read_bytes())
    os.symlink(tmp_path / "hub2", tmp_path / "fake" / "blobs")
    (fake / "special_tokens_map.json").unlink()
    os.symlink("../../blobs/id_ed25519", fake / "special_tokens_map.json")
    with pytest.raises(InputError, match="is a symbolic link"):
        import_hf(fake, tmp_path / "imported2")


def test_export_on_a_full_disk_is_one_error_and_leaves_no_temporary_folder(small_disk):
    """A full disk ended `oreline export` in a traceback and left `.tmp-DIR-<pid>/` for good."""
    from oreline.errors import DiskFull

    torch.manual_seed(0)
    args = ModelArgs(
        dim=64, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=8192, ffn_dim=128, max_seq_len=64
    )
    model = Llama(args).eval()  # 2 x 2 MiB of embeddings and head: more than the disk holds
    disk = small_disk("2m")
    with pytest.raises(DiskFull) as err:
        export_state_dict_hf(model.state_dict(), args, None, disk / "hf")
    assert f"no space left on the device of {disk / 'hf'}" in str(err.value)
    assert "run the same `oreline export` command again" in str(err.value)
    assert sorted(p.name for p in disk.iterdir()) == []  # the partial output is gone
