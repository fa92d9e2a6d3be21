"""Hostile checkpoints: no file of a checkpoint can make oreline run code, and the error names the file.

A real run (debug preset, the prose tokens of tests/train/conftest.py, checkpoints at steps 4 and
8 and a model-only snapshot at 6) is trained once per module and copied per test. Each test plants
one file the way an attacker would — a pickle whose `__reduce__` runs `touch MARKER` — recomputes
checksums.json with oreline's own writer (xxh3 is no secret), and drives the real entry points:
`checkpoint verify` and `inspect` through the CLI app, `eval` and `export` through the functions
the CLI calls, `train --resume PATH` and `--resume auto` through `train()`. The marker must not
exist afterwards, and the error must name the planted file.

Without ORELINE_CHECKPOINT_KEY (the default here), the HMAC tests at the end set it per test.
"""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from rich.console import Console
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex
from typer.testing import CliRunner

import oreline
from oreline import compat
from oreline.cli import app
from oreline.config import load_config
from oreline.errors import CheckpointError, OrelineError
from oreline.train.checkpoint.dcp_calls import load_errors, quiet_single_process
from oreline.train.checkpoint.format import write_checksums
from oreline.train.checkpoint.metadata import read_dcp_metadata
from oreline.train.checkpoint.raw_tensors import RawTensorReader
from oreline.train.checkpoint.signature import KEY_ENV
from oreline.train.checkpoint.verify import forget_verified, verify_checkpoint
from oreline.train.loop import train

# the planters of issue 32 items 3 and 4 are benchmarks/hostile_inputs.py's (its table measures them)
_HOSTILE = "oreline_hostile_cases"
if _HOSTILE not in sys.modules:  # tests/test_hostile_bounds.py may have loaded it already
    _spec = importlib.util.spec_from_file_location(
        _HOSTILE, Path(__file__).resolve().parents[2] / "benchmarks" / "hostile_inputs.py"
    )
    sys.modules[_HOSTILE] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up by name
    _spec.loader.exec_module(sys.modules[_HOSTILE])
hostile = sys.modules[_HOSTILE]

STEP8, STEP4, SNAPSHOT = "step-00000008", "step-00000004", "model-step-00000006"
EMBED = "model.model.embed_tokens.weight"
# the copy of the run lives under another runs_dir (and continuations change the step count)
ALLOW = ["run.runs_dir", "train.steps"]


class RunsCommand:
    """Unpickling this runs a shell command that creates `marker` (what an attacker's pickle does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def quiet() -> Console:
    return Console(record=True, width=250, file=io.StringIO())


def _overrides(runs_dir: Path, prose: dict, steps: int) -> list[str]:
    return [
        f"run.runs_dir={runs_dir}",
        "run.name=t",
        "model.preset=debug",
        f"train.tokens={prose['tokens']}",
        f"train.tokenizer={prose['tokenizer']}",
        "train.seq_len=64",
        "train.micro_batch=4",
        "train.grad_accum=2",
        f"train.steps={steps}",
        "train.log_every=1",
        "train.eval_every=0",
        "train.optim.warmup_steps=4",
        "checkpoint.every=4",
        "checkpoint.keep_last=3",
        "checkpoint.model_only_every=6",
        "eval.batches=2",
        "eval.prompts=[]",
        "eval.max_new_tokens=4",
    ]


@pytest.fixture(scope="module")
def trained(prose_tokens, tmp_path_factory) -> Path:
    """runs dir of a finished 8-step run (checkpoints/step-4, step-8, model-step-6)."""
    root = tmp_path_factory.mktemp("hostile-origin")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(None, _overrides(root, prose_tokens, 8)), resume="none", console=quiet())
    finally:
        torch.set_num_threads(before)
    ckpts = root / "t" / "checkpoints"
    assert {STEP4, STEP8, SNAPSHOT} <= {p.name for p in ckpts.iterdir()}
    return root


@pytest.fixture
def run(trained, tmp_path, prose_tokens, monkeypatch):
    """A private copy of the trained run: (runs dir, checkpoints dir, config factory, marker path)."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    forget_verified()
    runs = tmp_path / "runs"
    shutil.copytree(trained, runs)
    marker = tmp_path / "MARKER-code-ran"
    torch.set_num_threads(1)
    return (
        runs,
        runs / "t" / "checkpoints",
        lambda steps=8: load_config(None, _overrides(runs, prose_tokens, steps)),
        marker,
    )


def _real_metadata(folder: Path):
    with open(folder / ".metadata", "rb") as fh:  # the test's own, trusted file
        return pickle.load(fh)


def _resign(folder: Path) -> None:
    """What an attacker does after editing files: recompute checksums.json (oreline's own writer)."""
    (folder / "checksums.json").unlink()
    write_checksums(folder)
    forget_verified()


# ---------------------------------------------------------------------------------------------
# planters: each edits one checkpoint folder and returns the file name the error must mention


def plant_metadata_pickle(folder: Path, marker: Path) -> str:
    """The issue's case: .metadata replaced by a pickle whose __reduce__ runs a command."""
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCommand(marker)))
    return ".metadata"


def plant_metadata_inner_object(folder: Path, marker: Path) -> str:
    """A real, complete index with one command-running object tucked inside it."""
    md = _real_metadata(folder)
    md.storage_meta.modules = [RunsCommand(marker)]
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return ".metadata"


def plant_byte_item(folder: Path, marker: Path) -> str:
    """A structurally clean index that declares a model tensor a DCP byte item, whose bytes are a
    torch.save of a command-running object: DCP's planner loads byte items with weights_only=False."""
    md = _real_metadata(folder)
    blob = io.BytesIO()
    torch.save(RunsCommand(marker), blob)
    data = folder / "__0_0.distcp"
    offset = data.stat().st_size
    with open(data, "ab") as fh:
        fh.write(blob.getvalue())
    md.state_dict_metadata[EMBED] = BytesStorageMetadata()
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != EMBED}
    md.storage_data[MetadataIndex(EMBED)] = _StorageInfo("__0_0.distcp", offset, len(blob.getvalue()))
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return "__0_0.distcp"


def plant_stock_tensor_item(folder: Path, marker: Path) -> str:
    """A tensor item in DCP's stock format (a torch.save archive, read with torch.load(weights_only=True))
    whose archive holds a command-running object."""
    md = _real_metadata(folder)
    blob = io.BytesIO()
    torch.save(RunsCommand(marker), blob)
    data = folder / "__0_0.distcp"
    offset = data.stat().st_size
    with open(data, "ab") as fh:
        fh.write(blob.getvalue())
    for index in list(md.storage_data):
        if index.fqn == EMBED:
            md.storage_data[index] = _StorageInfo("__0_0.distcp", offset, len(blob.getvalue()))
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return "__0_0.distcp"


def plant_meta_json(folder: Path, marker: Path) -> str:
    (folder / "meta.json").write_bytes(pickle.dumps(RunsCommand(marker)))
    return "meta.json"


def plant_safetensors(folder: Path, marker: Path) -> str:
    (folder / "model.safetensors").write_bytes(pickle.dumps(RunsCommand(marker)))
    return "model.safetensors"


FULL_PLANTERS = [
    plant_metadata_pickle,
    plant_metadata_inner_object,
    plant_byte_item,
    plant_stock_tensor_item,
    plant_meta_json,
]


def _outcome(marker: Path, fn) -> str:
    """Run an entry point; return the error text (OrelineError) or its output. The marker must not exist."""
    try:
        result = fn()
    except OrelineError as exc:
        text = str(exc)
    else:
        text = result if isinstance(result, str) else ""
    assert not marker.exists(), "the planted pickle ran its command"
    return text


def _cli(*args: str) -> str:
    res = CliRunner().invoke(app, list(args), terminal_width=250)
    if isinstance(res.exception, OrelineError):
        raise res.exception
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return f"exit={res.exit_code}\n{res.output}"


@pytest.mark.parametrize("planter", FULL_PLANTERS, ids=lambda f: f.__name__.removeprefix("plant_"))
def test_planted_full_checkpoint_runs_nothing_in_verify_inspect_eval_export(run, planter):
    from oreline.eval.evaluate import evaluate_cli
    from oreline.export.hf import export_hf

    runs, ckpts, _, marker = run
    target = ckpts / STEP8
    name = planter(target, marker)
    _resign(target)

    verify = _outcome(marker, lambda: _cli("checkpoint", "verify", str(target)))
    inspect = _outcome(marker, lambda: _cli("checkpoint", "inspect", str(target)))
    evaluated = _outcome(
        marker, lambda: evaluate_cli(target, out=runs / "e.json", batches=1, console=quiet())
    )
    exported = _outcome(marker, lambda: export_hf(target, runs / "hf", console=quiet()))
    if planter is plant_stock_tensor_item:
        # the index is sound and the data file covered: verify cannot tell, loading refuses the archive
        assert "exit=0" in verify
        for text in (evaluated, exported):
            assert f"{name}: not readable as torch.save tensors" in text and "Unpickling" in text, text
    else:
        assert "exit=1" in verify and "0 of 1 checkpoints valid" in verify and name in verify, verify
        assert "exit=1" in inspect and "INVALID" in inspect and name in inspect, inspect
        for text in (evaluated, exported):
            assert f"checkpoint {target} is invalid" in text and name in text, text
    assert not (runs / "hf").exists() and not (runs / "e.json").exists()


@pytest.mark.parametrize("planter", FULL_PLANTERS, ids=lambda f: f.__name__.removeprefix("plant_"))
def test_planted_checkpoint_runs_nothing_on_resume_path(run, planter):
    _, ckpts, config, marker = run
    target = ckpts / STEP8
    name = planter(target, marker)
    _resign(target)
    text = _outcome(
        marker, lambda: train(config(12), resume=str(target), allow_config_change=ALLOW, console=quiet())
    )
    assert name in text and str(target) in text, text


@pytest.mark.parametrize(
    "planter",
    [plant_metadata_pickle, plant_byte_item, plant_meta_json],
    ids=lambda f: f.__name__.removeprefix("plant_"),
)
def test_resume_auto_passes_over_a_planted_checkpoint_and_says_which_file(run, planter):
    runs, ckpts, config, marker = run
    name = planter(ckpts / STEP8, marker)
    _resign(ckpts / STEP8)
    console = quiet()
    summary = train(config(8), resume="auto", allow_config_change=ALLOW, console=console)
    assert not marker.exists()
    assert summary["resumed_from"].endswith(STEP4) and summary["step"] == 8
    said = console.export_text()
    assert f"skipping checkpoint {STEP8}:" in said and name in said, said


def test_resume_auto_stops_at_a_planted_stock_archive_with_the_file_named(run):
    _, ckpts, config, marker = run
    plant_stock_tensor_item(ckpts / STEP8, marker)
    _resign(ckpts / STEP8)
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp: not readable as torch.save tensors"):
        train(config(8), resume="auto", allow_config_change=ALLOW, console=quiet())
    assert not marker.exists()


@pytest.mark.parametrize("where", ["rng-rank00000.json", "meta.json"])
def test_planted_rng_state_runs_nothing_on_resume(run, where):
    """RNG states are JSON (rank 0's inside meta.json, other ranks' in rng-rankNNNNN.json): a pickle
    there is refused as unreadable, naming the file."""
    import base64
    import json

    _, ckpts, config, marker = run
    target = ckpts / STEP8
    meta = json.loads((target / "meta.json").read_text())
    evil = pickle.dumps(RunsCommand(marker))
    if where == "meta.json":
        meta["rng"] = base64.b64encode(evil).decode()
    else:
        del meta["rng"]  # rank 0 then reads rng-rank00000.json, as ranks > 0 read theirs
        (target / where).write_bytes(evil)
    (target / "meta.json").write_text(json.dumps(meta))
    _resign(target)
    text = _outcome(
        marker, lambda: train(config(12), resume=str(target), allow_config_change=ALLOW, console=quiet())
    )
    assert f"{target / where}: the RNG state is unreadable" in text, text


def test_planted_model_only_snapshot_runs_nothing(run):
    from oreline.eval.evaluate import evaluate_cli
    from oreline.export.hf import export_hf

    runs, ckpts, _, marker = run
    target = ckpts / SNAPSHOT
    plant_safetensors(target, marker)
    _resign(target)
    assert "exit=0" in _cli("checkpoint", "verify", str(target))  # covered and intact: loading decides
    for fn in (
        lambda: evaluate_cli(target, out=runs / "e.json", batches=1, console=quiet()),
        lambda: export_hf(target, runs / "hf", console=quiet()),
        lambda: _cli("checkpoint", "inspect", str(target)),
    ):
        text = _outcome(marker, fn)
        assert "model.safetensors" in text, text


@pytest.mark.slow  # a fresh interpreter importing torch: ~15 s on the shared 2-core machine
def test_cli_subprocess_refuses_a_metadata_pickle(run):
    """The installed entry point, end to end: exit status, the message, no traceback, no command."""
    _, ckpts, _, marker = run
    target = ckpts / STEP8
    plant_metadata_pickle(target, marker)
    _resign(target)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(oreline.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    out = subprocess.run(
        [sys.executable, "-m", "oreline", "export", str(target), "--out", str(target.parent / "hf")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert not marker.exists()
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2 and "Traceback" not in text, text
    assert "refused to unpickle posix.system" in text and ".metadata" in text, text


@pytest.mark.parametrize(
    "payload, what",
    [
        # BUILD applied to an allowed class itself: setattr(Metadata, "__init__", torch.Size)
        (
            b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\nN}X\x08\x00\x00\x00__init__ctorch\nSize\ns\x86b.",
            "setting the state of Metadata",
        ),
        # BUILD on an allowed function: its lookup table swapped for the pickle's own
        (
            b"\x80\x02ctorch.serialization\n_get_layout\n}X\x05\x00\x00\x00cache}sb.",
            "setting the state of _get_layout",
        ),
    ],
    ids=["class-attribute", "function-attribute"],
)
def test_metadata_pickle_cannot_alter_the_allowed_classes(payload, what):
    from torch.distributed.checkpoint.metadata import Metadata

    from oreline.train.checkpoint.metadata import parse_dcp_metadata

    init, cache = Metadata.__init__, torch.serialization._get_layout.cache
    with pytest.raises(CheckpointError, match=rf"x/\.metadata: refused {what} \(a \w+ it did not create\)"):
        parse_dcp_metadata(payload, Path("x/.metadata"))
    assert Metadata.__init__ is init and torch.serialization._get_layout.cache is cache


# ---------------------------------------------------------------------------------------------
# issue 32 item 3: a `.metadata` that is a real index but also alters torch's own objects


_ENCODING = hostile.MEM_FORMAT_ENCODING
# each leaves the stack as it found it (BUILD, then POP): enum-value sets TORCH_CONTIGUOUS_FORMAT's
# _value_ to 7, layout-qualname renames _get_layout posix.system (hostile.METADATA_SIDE_EFFECTS)
SIDE_EFFECTS = hostile.METADATA_SIDE_EFFECTS


def _torch_state() -> tuple:
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    layout = torch.serialization._get_layout
    return tuple((m.name, m._value_) for m in _MEM_FORMAT_ENCODING), layout.__module__, layout.__qualname__


@pytest.fixture
def torch_state_restored():
    """The state SIDE_EFFECTS alter, put back after the test (on code that lets the pickle alter
    it, the test fails, and the rest of the session must not inherit the damage)."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    layout = torch.serialization._get_layout
    before = _torch_state()
    yield before
    for member in _MEM_FORMAT_ENCODING:
        member._value_ = dict(before[0])[member.name]
    layout.__module__, layout.__qualname__ = before[1], before[2]


@pytest.mark.hostile
@pytest.mark.parametrize("effect", list(SIDE_EFFECTS))
def test_metadata_that_alters_torch_objects_is_invalid_and_alters_nothing(run, effect, torch_state_restored):
    """A real index whose pickle also BUILDs on an enum member or on _get_layout: verify refuses
    it (naming .metadata), torch's objects are untouched, and resume auto passes over it to step 4,
    whose continuation saves checkpoints that verify and load."""
    runs, ckpts, config, _ = run
    target = ckpts / STEP8
    hostile.plant_metadata_side_effect(target, effect)
    _resign(target)
    verify = " ".join(_cli("checkpoint", "verify", str(target)).split())
    assert _torch_state() == torch_state_restored
    assert "exit=1" in verify and "0 of 1 checkpoints valid" in verify, verify
    assert ".metadata: refused setting the state of" in verify and "it did not create" in verify, verify
    console = quiet()
    summary = train(config(12), resume="auto", allow_config_change=ALLOW, console=console)
    assert _torch_state() == torch_state_restored
    assert summary["resumed_from"].endswith(STEP4) and summary["step"] == 12
    assert verify_checkpoint(ckpts / "step-00000012") == (True, [])
    md = read_dcp_metadata(ckpts / "step-00000012")
    assert all(v.properties.layout is torch.strided for v in md.state_dict_metadata.values())


def test_second_line_puts_back_attributes_vars_does_not_show():
    """Behind the opcode rules: a change to an allowed function's __qualname__ (not in its __dict__),
    to an enum member's _value_ or to _get_layout's cache during a read is found, named and undone."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from oreline.train.checkpoint import metadata

    layout = torch.serialization._get_layout
    member = _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST
    name, value, entries = layout.__qualname__, member._value_, dict(layout.cache)
    before = metadata._snapshot()
    layout.__qualname__, member._value_ = "system", 9
    layout.cache["torch.strided"] = "not a layout"
    try:
        altered = metadata._restore(before)
    finally:
        layout.__qualname__, member._value_ = name, value
        layout.cache.clear()
        layout.cache.update(entries)
    assert sorted(altered) == [
        "_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST._value_",
        "_get_layout.__qualname__",
        "_get_layout.cache",
    ]


@pytest.mark.parametrize(
    "payload, what",
    [
        (b"\x80\x02cbuiltins\ndict\n)R.", "to unpickle builtins.dict"),
        (b"\x80\x02ctorch\nSize\nctorch\nSize\n\x85R.", "a call of Size"),  # torch.Size(torch.Size)
        (_ENCODING + b"X\x01\x00\x00\x00a\x85R.", "a call of _MEM_FORMAT_ENCODING"),
        (b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\nK\x01\x85\x81.", "creating a Metadata"),
        (b"\x80\x02(ctorch\nSize\no.", "the pickle opcode OBJ"),
        (b"\x80\x02\x82\x01.", "the pickle opcode EXT1"),
        (b"\x80\x02ctorch.serialization\n_get_layout\n\x94}h\x00\x8c\x01xsb.", "setting the state of"),
    ],
    ids=["global", "size-of-object", "enum-of-str", "newobj-args", "obj", "ext", "build-via-memo"],
)
def test_metadata_unpickler_allows_only_what_dcp_writes(payload, what):
    from oreline.train.checkpoint.metadata import parse_dcp_metadata

    with pytest.raises(CheckpointError, match=rf"x/\.metadata: refused {what}"):
        parse_dcp_metadata(payload, Path("x/.metadata"))


# ---------------------------------------------------------------------------------------------
# issue 32 item 4: an item stored through DCP's zstd stream transform (a decompression bomb)


@pytest.mark.hostile
def test_zstd_transform_item_is_refused_before_it_is_decoded(run):
    from oreline.eval.evaluate import evaluate_cli
    from oreline.export.hf import export_hf

    runs, ckpts, _, _ = run
    target = ckpts / STEP8
    hostile.plant_zstd_item(target, 256 << 20)  # ~8 KB on disk
    _resign(target)
    verify = " ".join(_cli("checkpoint", "verify", str(target)).split())
    assert "exit=1" in verify and "transforms ['stream.zstd/1']" in verify and ".metadata" in verify, verify
    for fn in (
        lambda: evaluate_cli(target, out=runs / "e.json", batches=1, console=quiet()),
        lambda: export_hf(target, runs / "hf", console=quiet()),
    ):
        with pytest.raises(
            CheckpointError, match=r"\.metadata is not DCP checkpoint metadata: .*stream\.zstd/1"
        ):
            fn()
    # a load that skips verification: the reader itself refuses the index, before any data file
    with (
        pytest.raises(CheckpointError, match=r"stream\.zstd/1"),
        quiet_single_process(),
        load_errors(target),
    ):
        dcp.load({"model": {}}, storage_reader=RawTensorReader(str(target)), **compat.dcp_no_dist(True))


# ---------------------------------------------------------------------------------------------
# clear errors: a data file of another format, a binary or dangling `latest`


def test_data_file_replaced_by_another_format_is_a_clear_error(run):
    _, ckpts, config, marker = run
    target = ckpts / STEP8
    blob = io.BytesIO()
    torch.save({"weights": torch.zeros(8)}, blob)  # a zip archive: another format, and shorter
    (target / "__0_0.distcp").write_bytes(blob.getvalue())
    _resign(target)
    ok, problems = verify_checkpoint(target)
    assert not ok and any(
        p.startswith("__0_0.distcp has ") and "replaced by a file of another format" in p for p in problems
    ), problems
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp has \d+ bytes, but \.metadata places tensors"):
        train(config(12), resume=str(target), allow_config_change=ALLOW, console=quiet())


@pytest.mark.skipif(
    compat.dcp_raw_writer_internals() is None, reason="raw tensor files need torch >= 2.7 (oreline.compat)"
)
def test_reader_names_the_file_when_a_data_file_is_short(run):
    """Below verification (a load that skips it): the reader itself names the file, no raw traceback."""
    _, ckpts, _, _ = run
    target = ckpts / STEP8
    data = target / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:1000])
    model_state = {
        "model": {
            k.removeprefix("model."): torch.empty(v.size, dtype=v.properties.dtype)
            for k, v in read_dcp_metadata(target).state_dict_metadata.items()
            if k.startswith("model.")
        }
    }
    with (
        pytest.raises(CheckpointError, match=r"__0_0\.distcp is 1000 bytes, but model\.\S+ lies at bytes"),
        quiet_single_process(),
        load_errors(target),
    ):
        dcp.load(model_state, storage_reader=RawTensorReader(str(target)), **compat.dcp_no_dist(True))


def test_ls_with_a_binary_latest_file_says_so(run):
    runs, ckpts, _, _ = run
    (ckpts / "latest").write_bytes(bytes(range(256)))
    text = _cli("checkpoint", "ls", str(runs / "t"))
    assert "exit=0" in text and "latest is not text (256 bytes of binary data)" in " ".join(text.split()), (
        text
    )
    assert STEP8 in text


def test_resume_says_latest_names_a_missing_folder_before_falling_back(run):
    _, ckpts, config, _ = run
    (ckpts / "latest").write_text("step-00000012\n")
    console = quiet()
    summary = train(config(12), resume="auto", allow_config_change=ALLOW, console=console)
    said = " ".join(console.export_text().split())
    assert (
        "latest names step-00000012, which no longer exists: falling back to the newest valid checkpoint"
        in said
    )
    assert said.index("no longer exists") < said.index("resumed from")
    assert summary["resumed_from"].endswith(STEP8)


# ---------------------------------------------------------------------------------------------
# keyed signatures (ORELINE_CHECKPOINT_KEY)


def test_signed_checkpoints_verify_and_load(run, monkeypatch):
    import json

    _, ckpts, config, _ = run
    monkeypatch.setenv(KEY_ENV, "a shared secret")
    train(
        config(5), resume="none", console=quiet()
    )  # a fresh run: its checkpoints (4 and final 5) are signed
    signed = ckpts / "step-00000005"
    assert json.loads((signed / "checksums.json").read_text())["algo"] == "sha256"
    assert json.loads((signed / "signature.json").read_text())["algo"] == "hmac-sha256"
    assert verify_checkpoint(signed) == (True, [])
    text = _cli("checkpoint", "verify", str(signed))
    assert "exit=0" in text and f"signatures checked with the key in {KEY_ENV}" in " ".join(text.split())
    summary = train(config(8), resume="auto", allow_config_change=ALLOW, console=quiet())
    assert summary["resumed_from"] == str(signed) and summary["step"] == 8
    assert verify_checkpoint(ckpts / STEP8) == (True, [])


def test_unsigned_checkpoint_is_refused_when_a_key_is_set(run, monkeypatch):
    _, ckpts, config, _ = run
    monkeypatch.setenv(KEY_ENV, "a shared secret")
    ok, problems = verify_checkpoint(ckpts / STEP8)
    assert not ok and problems == [
        f"not signed (signature.json is missing) while {KEY_ENV} is set: unsigned checkpoints are refused"
    ]
    with pytest.raises(CheckpointError, match="not signed"):
        train(config(12), resume=str(ckpts / STEP8), allow_config_change=ALLOW, console=quiet())


def test_tampered_or_foreign_signed_checkpoint_is_refused(run, monkeypatch):
    _, ckpts, _, marker = run
    monkeypatch.setenv(KEY_ENV, "a shared secret")
    target = ckpts / STEP8
    _resign(target)  # the owner signs the intact checkpoint
    assert verify_checkpoint(target) == (True, [])
    sig = (target / "signature.json").read_bytes()
    # the attacker plants a pickle and rewrites checksums.json, keeping the owner's signature
    plant_metadata_pickle(target, marker)
    monkeypatch.setenv(KEY_ENV, "the attacker's guess")
    _resign(target)
    (target / "signature.json").write_bytes(sig)
    monkeypatch.setenv(KEY_ENV, "a shared secret")
    forget_verified()
    ok, problems = verify_checkpoint(target)
    assert not ok and problems == [
        "signature.json does not match checksums.json under the key in "
        f"{KEY_ENV} (forged or modified, or signed with another key)"
    ]
    text = _outcome(marker, lambda: _cli("checkpoint", "inspect", str(target)))
    assert "exit=1" in text and "does not match" in text
    # a checkpoint signed with another key is refused the same way
    monkeypatch.setenv(KEY_ENV, "another key")
    assert not verify_checkpoint(ckpts / STEP4)[0]


def test_sign_command_signs_intact_checkpoints_only(run, monkeypatch):
    runs, ckpts, config, marker = run
    assert "ORELINE_CHECKPOINT_KEY is not set" in " ".join(
        _cli("checkpoint", "sign", str(runs / "t")).split()
    )
    plant_metadata_pickle(ckpts / STEP4, marker)
    _resign(ckpts / STEP4)  # a planted checkpoint with a recomputed (unkeyed) manifest
    monkeypatch.setenv(KEY_ENV, "a shared secret")
    flat = "".join(_cli("checkpoint", "sign", str(runs / "t")).split())  # (rich wraps long paths)
    assert not marker.exists()
    assert "exit=1" in flat and f"signed{ckpts / STEP8}" in flat and f"signed{ckpts / SNAPSHOT}" in flat, flat
    assert f"NOTSIGNED{ckpts / STEP4}isinvalid,notsigningit:{ckpts / STEP4}/.metadata:refused" in flat, flat
    assert not (ckpts / STEP4 / "signature.json").exists()
    assert verify_checkpoint(ckpts / STEP8) == (True, [])
    summary = train(config(12), resume="auto", allow_config_change=ALLOW, console=quiet())
    assert summary["resumed_from"].endswith(STEP8) and summary["step"] == 12


def test_verify_without_a_key_says_checksums_are_not_a_signature(run):
    _, ckpts, _, _ = run
    text = " ".join(_cli("checkpoint", "verify", str(ckpts / STEP4)).split())
    assert "1 of 1 checkpoints valid" in text
    assert f"checksums detect corruption, not forgery; set {KEY_ENV}" in text


# ---------------------------------------------------------------------------------------------
# the source: nothing in oreline calls an unpickling loader


def _dotted(node) -> str:
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def test_no_unpickling_loader_in_the_source():
    """Every call in src/oreline that could unpickle a file: none, except through the safe readers
    and the Slurm executor's sealed files."""
    import ast

    src = Path(oreline.__file__).parent
    unpicklers = (
        "pickle.load",
        "pickle.loads",
        "torch.load",
        "FileSystemReader",
        "joblib.load",
        "dill.load",
        "cloudpickle.load",
        "marshal.load",
        "marshal.loads",
        "shelve.open",
        "pd.read_pickle",
    )
    hits = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            allow_pickle = keywords.get("allow_pickle")
            if (
                name.endswith(unpicklers)
                or (
                    name.endswith(("np.load", "numpy.load"))
                    and not (isinstance(allow_pickle, ast.Constant) and allow_pickle.value is False)
                )
                or (name in ("dcp.load", "dcp.async_load") and "storage_reader" not in keywords)
            ):
                hits.append(f"{path.relative_to(src)}:{node.lineno} {name}")
    # the Slurm executor's job and result files are sealed JSON too (oreline.executors.wire)
    assert hits == []


# ---------------------------------------------------------------------------------------------
# issue 32 item 11: token folders eval reads, tampered with (each shard's sha256 refreshed in the
# manifest and its header checksum recomputed, as a tool that wrote them would)


def _val_shard(tokens: Path) -> tuple[Path, dict, dict]:
    import json

    manifest = json.loads((tokens / "manifest.json").read_text())
    entry = next(s for s in manifest["shards"] if s["split"] == "val")
    return tokens / entry["name"], entry, manifest


def _save_manifest(tokens: Path, manifest: dict) -> None:
    import json

    from oreline.io import file_sha256

    for entry in manifest["shards"]:
        entry["sha256"] = file_sha256(tokens / entry["name"])
    (tokens / "manifest.json").write_text(json.dumps(manifest))


def tamper_document_index(tokens: Path) -> str:
    """Two document starts swapped: the index falls back, the token count still matches."""
    import numpy as np

    from oreline.tokens import shards as fmt

    path, _, manifest = _val_shard(tokens)
    header = fmt.read_header(path)
    index = np.memmap(path, dtype="<u8", mode="r+", offset=header.index_offset, shape=(header.documents + 1,))
    index[1], index[2] = int(index[2]), int(index[1])
    index.flush()
    del index
    _save_manifest(tokens, manifest)
    return "has a broken document index"


def tamper_bos_id(tokens: Path) -> str:
    path, _, manifest = _val_shard(tokens)
    manifest["bos_id"] = 10**12
    _save_manifest(tokens, manifest)
    return "bos_id 1000000000000 is outside the vocabulary"


def tamper_header_vocabulary(tokens: Path) -> str:
    """The header's vocabulary field raised to 65,536 (checksum recomputed), and a token past the
    model's embedding planted: the id check, which trusts the header, lets it through."""
    import dataclasses

    import numpy as np

    from oreline.tokens import shards as fmt

    path, _, manifest = _val_shard(tokens)
    header = fmt.read_header(path)
    with open(path, "r+b") as fh:
        fh.write(dataclasses.replace(header, vocab_size=65_536).pack())
    ids = np.memmap(path, dtype=header.dtype, mode="r+", offset=fmt.HEADER_SIZE, shape=(header.tokens,))
    ids[5] = 60_000
    ids.flush()
    del ids
    _save_manifest(tokens, manifest)
    return "declares a vocabulary of 65536, its manifest"


@pytest.mark.hostile
@pytest.mark.parametrize(
    "tamper",
    [tamper_document_index, tamper_bos_id, tamper_header_vocabulary],
    ids=lambda f: f.__name__.removeprefix("tamper_"),
)
def test_eval_refuses_a_tampered_token_folder(run, prose_tokens, tamper):
    from oreline.errors import DataIntegrityError
    from oreline.eval.evaluate import evaluate_cli

    runs, ckpts, _, _ = run
    tokens = runs / "tokens"
    shutil.copytree(prose_tokens["tokens"], tokens)
    assert evaluate_cli(ckpts / STEP8, data=tokens, out=runs / "ok.json", batches=1, console=quiet())[
        "val_loss"
    ]
    message = tamper(tokens)
    with pytest.raises(DataIntegrityError) as err:
        evaluate_cli(ckpts / STEP8, data=tokens, out=runs / "e.json", batches=1, console=quiet())
    assert message in str(err.value) and str(tokens) in str(err.value), str(err.value)
    assert not (runs / "e.json").exists()
