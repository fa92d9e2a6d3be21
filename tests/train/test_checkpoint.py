"""Checkpoint save/load/verify/retention with a real debug-preset Llama and AdamW (CPU, seconds)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from typer.testing import CliRunner

import oreline.train.checkpoint.async_save as async_save
import oreline.train.checkpoint.load as ck_load
import oreline.train.checkpoint.save as ck_save
from oreline import compat
from oreline.cli import app
from oreline.config import CheckpointConfig, ModelConfig
from oreline.errors import CheckpointError
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train.checkpoint.async_save import wait_for_pending_save
from oreline.train.checkpoint.commands import print_checkpoints
from oreline.train.checkpoint.dcp_calls import quiet_single_process
from oreline.train.checkpoint.format import (
    FORMAT_VERSION,
    file_digest,
    list_checkpoints,
    read_latest,
    read_meta,
)
from oreline.train.checkpoint.load import load_checkpoint, load_model_state
from oreline.train.checkpoint.resume import check_resume_compatible, find_resumable
from oreline.train.checkpoint.rng import capture_rng_state, restore_rng_state
from oreline.train.checkpoint.save import last_save_stats, save_checkpoint
from oreline.train.checkpoint.verify import verify_checkpoint

# raw tensor files need DCP records with transform_descriptors (torch >= 2.7; oreline.compat)
needs_raw_files = pytest.mark.skipif(
    compat.dcp_raw_writer_internals() is None,
    reason="this torch writes checkpoints with DCP's stock writer (oreline.compat)",
)

ARGS = resolve_model_args(ModelConfig(preset="debug"))


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = Llama(ARGS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    return model, opt


def train_step(model, opt, gen: torch.Generator) -> float:
    x = torch.randint(0, ARGS.vocab_size, (2, 33), generator=gen)
    logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def meta_for(step: int, **extra) -> dict:
    return {
        "tokens_seen": step * 64,
        "model_args": ARGS.to_dict(),
        "config": {"train": {"steps": 10}},
        **extra,
    }


@pytest.mark.parametrize("route", ["single_process", "generic"])
def test_resume_continues_bit_exactly(tmp_path, monkeypatch, route):
    if route == "generic":  # the get_state_dict/set_state_dict route torch.distributed runs take
        monkeypatch.setattr(ck_load, "_load_single_process", lambda *args: False)
    model, opt = build()
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        train_step(model, opt, gen)
    path = save_checkpoint(tmp_path, 3, model, opt, meta_for(3, loader={"gen": gen.get_state().tolist()}))
    assert path.name == "step-00000003" and read_latest(tmp_path) == "step-00000003"
    torch.manual_seed(77)
    expected_rand = torch.rand(4)
    expected_losses = [train_step(model, opt, gen) for _ in range(3)]

    model2, opt2 = build(seed=5)  # different init: everything must come from the checkpoint
    found = find_resumable(tmp_path)
    assert found == path
    torch.manual_seed(77)  # restore_rng puts torch's generator back to the saved state, not this one
    meta = load_checkpoint(found, model2, opt2)
    assert meta["step"] == 3 and meta["tokens_seen"] == 192 and meta["world_size"] == 1
    gen2 = torch.Generator()
    gen2.set_state(torch.tensor(meta["loader"]["gen"], dtype=torch.uint8))
    torch.manual_seed(77)
    assert torch.equal(torch.rand(4), expected_rand)
    losses = [train_step(model2, opt2, gen2) for _ in range(3)]
    assert losses == expected_losses
    for (n, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    assert opt2.param_groups[0]["betas"] == (0.9, 0.95)
    assert opt2.state_dict()["state"][0]["step"].item() == 6


def test_rng_state_round_trips_through_json():
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    state = json.loads(json.dumps(capture_rng_state()))
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_load_restores_rng_of_the_save(tmp_path):
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    torch.manual_seed(123)
    save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    after_save = torch.rand(3)
    torch.manual_seed(999)
    load_checkpoint(tmp_path / "step-00000001", model, opt)
    assert torch.equal(torch.rand(3), after_save)


def test_files_meta_and_checksums(tmp_path):
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    path = save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    names = {p.name for p in path.iterdir()}
    assert {".metadata", "meta.json", "checksums.json"} <= names and any(n.endswith(".distcp") for n in names)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["kind"] == "full" and meta["format_version"] == FORMAT_VERSION
    assert set(meta["rng"]) == {"python", "numpy", "torch_cpu", "cuda"}
    assert len(meta["config_fingerprint"]) == 64
    assert meta["optim_param_groups"][0]["lr"] == 1e-3
    sums = json.loads((path / "checksums.json").read_text())
    assert set(sums["files"]) == names - {"checksums.json"}
    assert verify_checkpoint(path) == (True, [])
    assert not list(tmp_path.glob(".tmp-*"))


def test_meta_that_is_not_json_is_refused_before_writing(tmp_path):
    model, opt = build()
    with pytest.raises(CheckpointError, match="bad"):
        save_checkpoint(tmp_path, 1, model, opt, {"bad": object()})
    assert find_resumable(tmp_path) is None


def test_retention_keeps_last_and_every(tmp_path):
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    cfg = CheckpointConfig(keep_last=2, keep_every=3)
    for step in range(1, 8):
        save_checkpoint(tmp_path, step, model, opt, meta_for(step), cfg=cfg)
    kept = sorted(e.step for e in list_checkpoints(tmp_path) if e.kind == "full")
    assert kept == [3, 6, 7]
    assert read_latest(tmp_path) == "step-00000007"
    assert not list(tmp_path.glob(".t*-*"))


def test_interrupted_save_folder_is_never_resumed_and_is_cleaned(tmp_path):
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    # what a kill during dcp.save of step 2 leaves: a complete-looking copy under the temporary name
    import shutil

    shutil.copytree(tmp_path / "step-00000001", tmp_path / ".tmp-step-00000002")
    skipped = []
    assert find_resumable(tmp_path, skipped=skipped) == tmp_path / "step-00000001"
    assert skipped and "interrupted" in skipped[0][1][0]
    save_checkpoint(tmp_path, 3, model, opt, meta_for(3))
    assert not (tmp_path / ".tmp-step-00000002").exists()


def test_saving_the_same_step_again_replaces_it(tmp_path):
    model, opt = build()
    gen = torch.Generator().manual_seed(0)
    train_step(model, opt, gen)
    save_checkpoint(tmp_path, 1, model, opt, meta_for(1, tag="first"))
    save_checkpoint(tmp_path, 1, model, opt, meta_for(1, tag="second"))
    assert read_meta(tmp_path / "step-00000001")["tag"] == "second"
    assert verify_checkpoint(tmp_path / "step-00000001")[0]


def test_model_only_snapshot_and_load_model_state(tmp_path):
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    run = tmp_path / "run"
    root = run / "checkpoints"
    snap = save_checkpoint(root, 1, model, opt, meta_for(1), kind="model_only")
    assert snap.name == "model-step-00000001" and (snap / "model.safetensors").is_file()
    assert find_resumable(root) is None  # never offered for resume
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load_checkpoint(snap, *build())
    want = model.state_dict()
    sd, args, meta = load_model_state(snap)
    assert args == ARGS and meta["kind"] == "model_only"
    assert sd.keys() == want.keys() and all(torch.equal(sd[k], want[k]) for k in want)

    train_step(model, opt, torch.Generator().manual_seed(1))
    save_checkpoint(root, 2, model, opt, meta_for(2))
    want = model.state_dict()
    for where in (run, root, root / "step-00000002"):  # a run dir resolves to its latest
        sd, args, meta = load_model_state(where)
        assert meta["step"] == 2 and sd.keys() == want.keys()
        assert all(torch.equal(sd[k], want[k]) for k in want)
    fresh = Llama(args)
    fresh.load_state_dict(sd)


def test_load_model_state_refuses_an_invalid_checkpoint(tmp_path):
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    path = save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    (path / ".metadata").unlink()
    with pytest.raises(CheckpointError, match="metadata is missing"):
        load_model_state(path)


def test_resume_compatibility_rules():
    saved = {"train": {"steps": 100, "optim": {"lr": 1e-3}}, "model": {"dim": 64}, "checkpoint": {"every": 5}}
    meta = {"step": 40, "config": saved, "tokenizer_fingerprint": "a" * 64, "model_args": {"dim": 64}}
    same = json.loads(json.dumps(saved))
    assert check_resume_compatible(meta, same, []) == []

    changed = json.loads(json.dumps(saved))
    changed["train"]["optim"]["lr"] = 5e-4
    changed["train"]["steps"] = 200
    with pytest.raises(CheckpointError, match="train.optim.lr") as err:
        check_resume_compatible(meta, changed, [])
    assert "--allow-config-change" in str(err.value)
    assert check_resume_compatible(meta, changed, ["train.optim.lr", "train.steps"]) == [
        "train.optim.lr",
        "train.steps",
    ]
    assert check_resume_compatible(meta, changed, ["train"]) == ["train.optim.lr", "train.steps"]

    shape = json.loads(json.dumps(saved))
    shape["model"]["dim"] = 128
    with pytest.raises(CheckpointError, match="model shape"):
        check_resume_compatible(meta, shape, ["model.dim"])
    with pytest.raises(CheckpointError, match="tokenizer fingerprint"):
        check_resume_compatible(meta, same, ["tokenizer"], fingerprints={"tokenizer": "b" * 64})
    with pytest.raises(CheckpointError, match="model_args"):
        check_resume_compatible(meta, same, [], model_args={"dim": 32})


def test_a_key_added_after_the_checkpoint_resumes_at_its_default():
    """A checkpoint written before a config key existed (train.kernels, train.profile, data.executor
    came later) resumes without --allow-config-change while the key keeps its default; a
    non-default value is a change like any other."""
    saved = {"train": {"steps": 100}, "checkpoint": {"every": 5}}
    meta = {"step": 40, "config": saved}
    later = {"train": {"steps": 100, "kernels": "auto", "profile": False}, "checkpoint": {"every": 5}}
    assert check_resume_compatible(meta, later, []) == []
    later["train"]["kernels"] = "reference"
    with pytest.raises(CheckpointError, match="train.kernels"):
        check_resume_compatible(meta, later, [])
    assert check_resume_compatible(meta, later, ["train.kernels"]) == ["train.kernels"]


def test_debug_settings_and_removed_keys_do_not_count_on_resume():
    """Issue 36: a train.debug.* setting blocked a resume as a config change. It is recorded with
    the allowed changes and never refused; a key this oreline removed (train.eval_batches) is no
    change either; a real setting still is, and a removed key of a free-form value (not a section)
    still counts."""
    saved = {
        "train": {
            "steps": 100,
            "eval_batches": 20,
            "debug": {"sleep_per_step_s": 0.5, "param_digest": False},
        },
        "model": {"dim": 64, "rope_scaling": {"factor": 8.0, "low": 1.0}},
    }
    meta = {"step": 40, "config": saved}
    now = json.loads(json.dumps(saved))
    del now["train"]["eval_batches"]
    now["train"]["eval_sequences"] = 160  # this oreline's default: a key added later
    now["train"]["debug"] = {"sleep_per_step_s": 0.0, "param_digest": True}
    assert check_resume_compatible(meta, now, []) == [
        "train.debug.param_digest",
        "train.debug.sleep_per_step_s",
    ]
    now["train"]["steps"] = 200
    with pytest.raises(CheckpointError, match="in: train.steps:"):
        check_resume_compatible(meta, now, [])
    now["train"]["steps"] = 100
    del now["model"]["rope_scaling"]["low"]
    with pytest.raises(CheckpointError, match="model.rope_scaling.low"):
        check_resume_compatible(meta, now, [])


def test_cli_ls_verify_inspect(tmp_path):
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", 1, model, opt, meta_for(1))
    save_checkpoint(run / "checkpoints", 2, model, opt, meta_for(2))
    runner = CliRunner()
    res = runner.invoke(app, ["checkpoint", "ls", str(run)], terminal_width=200)
    assert res.exit_code == 0 and "step-00000002" in res.output and "ok" in res.output and "←" in res.output
    res = runner.invoke(app, ["checkpoint", "verify", str(run)])
    assert res.exit_code == 0 and "2 of 2 checkpoints valid" in res.output
    res = runner.invoke(app, ["checkpoint", "inspect", str(run)], terminal_width=200)
    assert res.exit_code == 0 and "model.embed_tokens.weight" in res.output and "(512, 64)" in res.output
    assert "optimizer state" in res.output

    f = run / "checkpoints" / "step-00000002" / "meta.json"
    f.write_text(f.read_text().replace('"step": 2', '"step": 3'))
    res = runner.invoke(app, ["checkpoint", "verify", str(run)])
    assert res.exit_code == 1 and "meta.json checksum mismatch" in res.output.replace("\n", " ")
    con = Console(record=True, width=200)
    print_checkpoints(run, con)
    assert "checksum mismatch" in con.export_text()


def test_async_save_completes_in_the_background(tmp_path, monkeypatch):
    monkeypatch.setattr(async_save, "ASYNC_ON_CPU", True)  # the CUDA code path, with CPU tensors
    model, opt = build()
    gen = torch.Generator().manual_seed(0)
    train_step(model, opt, gen)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = CheckpointConfig(async_save=True)
    path = save_checkpoint(tmp_path, 1, model, opt, meta_for(1), cfg=cfg)
    assert "blocking_s" in last_save_stats()
    train_step(model, opt, gen)  # training goes on while the save is written: it holds a staged copy
    assert wait_for_pending_save() == path and wait_for_pending_save() is None
    assert verify_checkpoint(path) == (True, []) and read_latest(tmp_path) == "step-00000001"
    sd, _, _ = load_model_state(path)
    assert all(torch.equal(sd[k], want[k]) for k in want)
    second = save_checkpoint(tmp_path, 2, model, opt, meta_for(2), cfg=cfg)
    third = save_checkpoint(tmp_path, 3, model, opt, meta_for(3), cfg=cfg)  # finishes the second first
    assert verify_checkpoint(second)[0] and not third.exists()
    wait_for_pending_save()
    assert find_resumable(tmp_path) == third


def test_async_save_under_a_process_group_without_a_cpu_backend(tmp_path, monkeypatch):
    """On CUDA a run's default group is NCCL alone, and DCP's async save refuses a group without a
    CPU backend: `checkpoint.async` failed at the first save on an H200. "cuda:gloo" is such a group
    on a CPU-only machine (gloo, registered for CUDA tensors only): the same refusal, here."""
    import torch.distributed as tdist

    monkeypatch.setattr(async_save, "ASYNC_ON_CPU", True)
    model, opt = build()
    cfg = CheckpointConfig(async_save=True)
    for step in (1, 2):  # a second process group in the same process gets a gloo group of its own
        tdist.init_process_group("cuda:gloo", store=tdist.HashStore(), rank=0, world_size=1)
        try:
            assert torch.device("cpu") not in tdist.group.WORLD._device_types  # what NCCL alone gives
            path = save_checkpoint(tmp_path, step, model, opt, meta_for(step), cfg=cfg)
            assert wait_for_pending_save() == path
            assert verify_checkpoint(path) == (True, [])
            sd, _, _ = load_model_state(path)
            assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
        finally:
            tdist.destroy_process_group()


# A process that starts an async save and then ends without finishing it (a kill between the
# tensor write and the publish). Before that it says what find_resumable finds as a fresh process.
_FRESH_PROCESS = """
import os, sys
from pathlib import Path
import torch
from oreline.config import CheckpointConfig
import oreline.train.checkpoint.async_save as async_save
from oreline.train.checkpoint.resume import find_resumable
from oreline.train.checkpoint.save import save_checkpoint

root = Path(sys.argv[1])
print("found", find_resumable(root).name, flush=True)
async_save.ASYNC_ON_CPU = True
model = torch.nn.Linear(4096, 4096)  # 64 MB: the process ends while they are being written
save_checkpoint(root, 3, model, torch.optim.AdamW(model.parameters()), {}, cfg=CheckpointConfig(async_save=True))
os._exit(0)
"""


def test_find_resumable_finishes_a_save_in_flight_and_skips_one_a_kill_left(tmp_path, monkeypatch):
    """The one find_resumable: in the process with an async save in flight it finishes that save and
    returns it; a fresh process finds the same; a save another process never finished is skipped."""
    import os
    import subprocess
    import sys

    import oreline

    monkeypatch.setattr(async_save, "ASYNC_ON_CPU", True)  # the CUDA code path, with CPU tensors
    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    second = save_checkpoint(tmp_path, 2, model, opt, meta_for(2), cfg=CheckpointConfig(async_save=True))
    # (in flight, or published already: it is published as soon as it is written)
    skipped: list = []
    assert find_resumable(tmp_path, skipped=skipped) == second and skipped == []
    assert verify_checkpoint(second) == (True, []) and wait_for_pending_save() is None

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(oreline.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "found step-00000002" in out.stdout  # a fresh process finds what this one did
    assert (tmp_path / ".tmp-step-00000003").is_dir() and not (tmp_path / "step-00000003").exists()
    skipped = []
    assert find_resumable(tmp_path, skipped=skipped) == second  # nothing in flight here: the disk decides
    assert [(p.name, problems) for p, problems in skipped] == [
        (".tmp-step-00000003", ["incomplete save (temporary folder: the save was interrupted)"])
    ]


def test_an_async_save_is_published_as_soon_as_it_is_written(tmp_path, monkeypatch):
    """Not at the next save: after a crash the newest resumable checkpoint is at most one interval old."""
    monkeypatch.setattr(async_save, "ASYNC_ON_CPU", True)
    model, opt = build()
    gen = torch.Generator().manual_seed(0)
    train_step(model, opt, gen)
    save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    path = save_checkpoint(tmp_path, 2, model, opt, meta_for(2), cfg=CheckpointConfig(async_save=True))
    deadline = time.monotonic() + 120
    # the background thread writes `latest` as its last act and then ends: wait for both (between
    # the two it is still alive for a moment, which made a check of both at once flaky)
    while not (read_latest(tmp_path) == path.name and async_save.published()) and time.monotonic() < deadline:
        train_step(model, opt, gen)  # training goes on; nothing here waits for the save
        time.sleep(0.05)
    assert read_latest(tmp_path) == path.name and async_save.published()
    assert verify_checkpoint(path) == (True, []) and not (tmp_path / ".tmp-step-00000002").exists()
    assert wait_for_pending_save() == path


def test_rollback_right_after_an_async_save_loads_that_save(tmp_path, monkeypatch):
    """load_checkpoint of the checkpoint still being written (the loop's rollback target right after
    a save) finishes the save first instead of failing on a folder that does not exist yet."""
    monkeypatch.setattr(async_save, "ASYNC_ON_CPU", True)
    model, opt = build()
    gen = torch.Generator().manual_seed(0)
    train_step(model, opt, gen)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    path = save_checkpoint(tmp_path, 1, model, opt, meta_for(1), cfg=CheckpointConfig(async_save=True))
    train_step(model, opt, gen)  # the step that "failed"
    meta = load_checkpoint(path, model, opt)
    assert meta["step"] == 1 and all(torch.equal(model.state_dict()[k], want[k]) for k in want)


# ---------------------------------------------------------------------------------------------
# the raw-tensor storage layer under DCP (oreline.train.checkpoint.raw_tensors)


def _odd_tensors() -> dict:
    """Dtypes numpy lacks, 0-dim, empty and non-contiguous tensors: every case _as_bytes handles."""
    g = torch.Generator().manual_seed(3)
    return {
        "bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(12.5),
        "empty": torch.empty(0, 4),
        "int": torch.randint(-9, 9, (6,), generator=g),
        "transposed": torch.randn(4, 3, generator=g).t(),
        "f64": torch.randn(3, 2, 2, generator=g).double(),
    }


def _holder_like(state: dict, contiguous: bool = True) -> dict:
    out = {}
    for k, v in state.items():
        out[k] = (
            torch.full_like(v, 0)
            if contiguous or v.dim() != 2
            else torch.zeros(v.shape[::-1], dtype=v.dtype).t()
        )
    return out


@pytest.mark.parametrize("threads", [1, 3])
@needs_raw_files
def test_raw_tensor_files_round_trip_bit_exactly(tmp_path, threads):
    import torch.distributed.checkpoint as dcp

    from oreline.train.checkpoint.metadata import RAW_DESCRIPTOR
    from oreline.train.checkpoint.raw_tensors import RawTensorReader, RawTensorWriter

    state = {"t": _odd_tensors()}
    writer = RawTensorWriter(str(tmp_path), thread_count=threads)
    with quiet_single_process():
        dcp.save(state, storage_writer=writer, **compat.dcp_no_dist(True))
        md = dcp.FileSystemReader(str(tmp_path)).read_metadata()
        # every tensor went in as raw bytes, described by DCP's own metadata
        assert all(RAW_DESCRIPTOR in info.transform_descriptors for info in md.storage_data.values())
        # into contiguous destinations (read straight in) and non-contiguous ones (scratch + copy)
        for contiguous in (True, False):
            holder = {"t": _holder_like(state["t"], contiguous)}
            dcp.load(holder, storage_reader=RawTensorReader(str(tmp_path)), **compat.dcp_no_dist(True))
            for k, v in state["t"].items():
                assert holder["t"][k].dtype == v.dtype and torch.equal(holder["t"][k], v), k
    assert len(list(tmp_path.glob("*.distcp"))) == min(threads, len(state["t"]))
    # on disk: exactly the tensors' bytes, nothing per record
    payload = sum(v.numel() * v.element_size() for v in state["t"].values())
    assert sum(p.stat().st_size for p in tmp_path.glob("*.distcp")) == payload
    # the digests computed while writing are those of the files as they lie on disk
    assert writer.file_digests == {
        p.name: {"bytes": p.stat().st_size, "hash": file_digest(p)} for p in tmp_path.glob("*.distcp")
    }


def test_raw_reader_loads_checkpoints_of_dcps_stock_writer(tmp_path, monkeypatch):
    """Checkpoints written before the raw format (torch.save per tensor) still resume."""
    monkeypatch.setattr(ck_save, "RAW_TENSOR_FILES", False)
    model, opt = build()
    gen = torch.Generator().manual_seed(1)
    train_step(model, opt, gen)
    path = save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    monkeypatch.setattr(ck_save, "RAW_TENSOR_FILES", True)
    model2, opt2 = build(seed=5)
    load_checkpoint(path, model2, opt2)
    for (n, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    # the optimizer state came back too: the next step is the same step
    assert train_step(model, opt, torch.Generator().manual_seed(9)) == train_step(
        model2, opt2, torch.Generator().manual_seed(9)
    )


@needs_raw_files
def test_raw_files_are_refused_by_dcps_stock_reader_and_truncation_is_an_error(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from oreline.train.checkpoint.raw_tensors import RawTensorReader, RawTensorWriter

    state = {"t": _odd_tensors()}
    with quiet_single_process():
        dcp.save(state, storage_writer=RawTensorWriter(str(tmp_path)), **compat.dcp_no_dist(True))
        # the stock reader would torch.load raw bytes: the descriptor makes it refuse instead
        # (DCP's CheckpointException is a BaseException, carrying each rank's error in its text)
        with pytest.raises(CheckpointException, match="Unknown extension name='oreline-raw'"):
            dcp.load({"t": _holder_like(state["t"])}, checkpoint_id=str(tmp_path), **compat.dcp_no_dist(True))
        (f,) = tmp_path.glob("*.distcp")
        f.write_bytes(f.read_bytes()[:-8])
        # a CheckpointError naming the file, before any byte of the short tensor is read
        with pytest.raises(
            CheckpointException, match=r"CheckpointError: \S+/__0_0.distcp is 258 bytes, but t.f64"
        ):
            dcp.load(
                {"t": _holder_like(state["t"])},
                storage_reader=RawTensorReader(str(tmp_path)),
                **compat.dcp_no_dist(True),
            )


# ---------------------------------------------------------------------------------------------
# a full disk (a real small tmpfs: the kernel says ENOSPC)


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_a_full_disk_is_one_error_and_the_save_leaves_nothing_behind(small_disk, monkeypatch, async_):
    monkeypatch.setattr(async_save, "ASYNC_ON_CPU", True)
    root = small_disk("8m") / "checkpoints"
    model, opt = build()
    gen = torch.Generator().manual_seed(0)
    train_step(model, opt, gen)
    cfg = CheckpointConfig(async_save=async_, keep_last=5)
    first = save_checkpoint(root, 1, model, opt, meta_for(1), cfg=cfg)
    wait_for_pending_save()
    size = sum(p.stat().st_size for p in first.iterdir())
    filler = small_disk.fill(root, leave=size // 3)
    train_step(model, opt, gen)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(root, 2, model, opt, meta_for(2), cfg=cfg)
        wait_for_pending_save()  # (an async save fails here, or at the next save)
    msg = str(err.value)
    assert f"no space left on the device of {root}" in msg and "step-00000002" in msg
    assert "a checkpoint needs about" in msg and "free space there" in msg and "step-00000001" in msg
    assert "Traceback" not in msg and len(msg) < 800
    assert not (root / ".tmp-step-00000002").exists() and not (root / "step-00000002").exists()
    assert read_latest(root) == "step-00000001" and verify_checkpoint(first) == (True, [])
    filler.unlink()  # space freed: the same save works
    second = save_checkpoint(root, 2, model, opt, meta_for(2), cfg=cfg)
    assert wait_for_pending_save() in (second, None) and verify_checkpoint(second) == (True, [])
    assert read_latest(root) == "step-00000002"


def test_resume_hashes_each_data_byte_once(tmp_path):
    """A resume reads the checkpoint once: the data files are hashed as they are read, not all of
    them hashed first and read again (bytes read by this process, /proc/self/io)."""
    from oreline.train.checkpoint.verify import forget_verified

    model, opt = build()
    train_step(model, opt, torch.Generator().manual_seed(0))
    save_checkpoint(tmp_path, 1, model, opt, meta_for(1))
    data = sum(p.stat().st_size for p in (tmp_path / "step-00000001").glob("*.distcp"))
    forget_verified()  # as a new process

    def read_bytes() -> int:
        io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return int(io["rchar"])

    before = read_bytes()
    path = find_resumable(tmp_path)
    load_checkpoint(path, *build(1))
    spent = read_bytes() - before
    assert data <= spent < 1.5 * data, (spent, data)
    # a corrupted byte is still found, by the load
    shard = next(path.glob("*.distcp"))
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 3] ^= 0x10
    shard.write_bytes(bytes(blob))
    forget_verified()
    assert find_resumable(tmp_path) == path  # (sizes and index intact)
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp checksum mismatch"):
        load_checkpoint(path, *build(1))


def test_the_manifest_lists_what_the_ranks_reported(tmp_path):
    from oreline.train.checkpoint.format import write_checksums

    (tmp_path / "a.bin").write_bytes(b"a" * 10)
    (tmp_path / "not-reported.bin").write_bytes(b"b")
    write_checksums(tmp_path, names=["a.bin"])
    listed = json.loads((tmp_path / "checksums.json").read_text())["files"]
    assert set(listed) == {"a.bin"}
    with pytest.raises(
        CheckpointError, match=r"missing\.distcp was reported written by a rank but is not there"
    ):
        write_checksums(tmp_path, names=["a.bin", "missing.distcp"])


def test_verify_reports_a_latest_that_names_a_missing_folder(tmp_path):
    model, opt = build()
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", 1, model, opt, meta_for(1))
    (run / "checkpoints" / "latest").write_text("step-00000009\n")
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(run)], terminal_width=200)
    out = " ".join(res.output.split())
    assert res.exit_code == 1 and "names step-00000009, which no longer exists" in out, out
