"""Export and import folders: an --out folder is replaced only when it holds an earlier output of
the same command and nothing else; index entries never leave the model folder."""

from __future__ import annotations

import json

import pytest
import torch

from oreline.errors import DataIntegrityError
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
