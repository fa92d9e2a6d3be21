"""train.activation_checkpointing = none | full | selective (oreline.train.performance): the same loss
and gradients whatever the mode, every N-th block or all, with either kernel set; selective recomputes
the elementwise ops but no product (its backward runs exactly the matmul FLOPs of no checkpointing,
full's runs the forward's once more); the old booleans still mean none/full, in configs and in a
checkpoint's saved config."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from oreline.config import ModelConfig, TrainConfig, to_dict, upgrade_saved
from oreline.errors import CheckpointError
from oreline.model.kernels.select import kernels_for
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args, training_memory
from oreline.train.checkpoint.resume import check_resume_compatible
from oreline.train.performance import enable_activation_checkpointing

ARGS = resolve_model_args(ModelConfig(preset="debug"), 512)


def _model(kernels: str) -> Llama:
    torch.manual_seed(0)
    return Llama(ARGS, kernels_for(kernels, "cpu"))


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 512, (2, 48), generator=g)
    labels = torch.roll(ids, -1, dims=1)
    labels[0, :10] = -100
    return ids, labels


def _step(model: Llama) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
    ids, labels = _batch()
    loss = model(ids, labels=labels).sum() / (labels != -100).sum()
    with FlopCounterMode(display=False) as flops:
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, flops.get_total_flops()


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
@pytest.mark.parametrize(("mode", "every"), [("full", 1), ("selective", 1), ("selective", 2), ("full", 2)])
def test_every_mode_gives_the_losses_and_gradients_of_none(kernels, mode, every, one_thread):
    ref_loss, ref_grads, ref_flops = _step(_model(kernels))
    model = _model(kernels)
    chosen = enable_activation_checkpointing(model, mode, every)
    assert chosen == list(range(0, ARGS.n_layers, every))
    loss, grads, flops = _step(model)
    # recomputation repeats the same ops on the same inputs, on one thread: bit for bit
    assert torch.equal(loss, ref_loss)
    for name, g in ref_grads.items():
        assert torch.equal(grads[name], g), name
    if mode == "selective":
        assert flops == ref_flops  # the products' outputs are kept: none is recomputed
    else:
        assert flops > ref_flops  # full recomputes the checkpointed blocks' products


def test_selective_keeps_the_products_and_recomputes_the_rest(one_thread):
    """What the backward of each mode recomputes, op by op: selective reruns RMSNorm's and the
    MLP's elementwise ops but no aten.mm; full reruns both."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            self.ops[name] = self.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    counts = {}
    for mode in ("none", "full", "selective"):
        model = _model("reference")
        enable_activation_checkpointing(model, mode)
        ids, labels = _batch()
        loss = model(ids, labels=labels).sum()
        with Count() as c:
            loss.backward()
        counts[mode] = c.ops
    assert counts["selective"]["mm"] == counts["none"]["mm"] < counts["full"]["mm"]
    assert counts["selective"]["silu"] == counts["full"]["silu"] > counts["none"].get("silu", 0)
    assert counts["selective"]["rsqrt"] == counts["full"]["rsqrt"] > counts["none"].get("rsqrt", 0)


def test_memory_estimate_orders_the_modes():
    args = resolve_model_args(ModelConfig(preset="1b"))
    act = {
        mode: training_memory(args, 1, 8192, "bf16", mode)["activations"]
        for mode in ("none", "selective", "full")
    }
    assert act["full"] < act["selective"] < act["none"]
    assert training_memory(args, 1, 8192, "bf16", True)["activations"] == act["full"]
    every2 = training_memory(args, 1, 8192, "bf16", "full", checkpoint_every=2)["activations"]
    assert act["full"] < every2 < act["none"]
    chunked = training_memory(args, 1, 8192, "bf16", "none", loss_chunk_tokens=1024)["logits"]
    assert chunked == 1024 * args.vocab_size * 4 < training_memory(args, 1, 8192, "bf16")["logits"]


def test_the_old_booleans_still_mean_none_and_full():
    assert TrainConfig(activation_checkpointing=True).activation_checkpointing == "full"
    assert TrainConfig(activation_checkpointing=False).activation_checkpointing == "none"
    assert TrainConfig().activation_checkpointing == "none"
    with pytest.raises(ValueError):
        TrainConfig(activation_checkpointing="sometimes")
    with pytest.raises(ValueError):
        enable_activation_checkpointing(_model("reference"), "sometimes")


def test_a_checkpoint_saved_with_a_boolean_resumes_under_the_mode_it_meant():
    from oreline.config import Config

    now = to_dict(Config(train=TrainConfig(activation_checkpointing="full")))
    saved = to_dict(Config())
    saved["train"]["activation_checkpointing"] = True  # as an oreline before "selective" wrote it
    assert check_resume_compatible({"config": saved, "step": 5}, now) == []
    assert upgrade_saved(saved)["train"]["activation_checkpointing"] == "full"
    saved["train"]["activation_checkpointing"] = False  # a real change: refused unless allowed
    with pytest.raises(CheckpointError, match="train.activation_checkpointing"):
        check_resume_compatible({"config": saved, "step": 5}, now)


FSDP_SCRIPT = """
import json, os, sys
import torch, torch.distributed as tdist
from oreline.config import ModelConfig, TrainConfig
from oreline.model.kernels.select import kernels_for
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train import dist
from oreline.train.performance import compile_blocks, enable_activation_checkpointing

torch.set_num_threads(1)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
tdist.init_process_group("gloo", rank=rank, world_size=world)
mode, compiled = sys.argv[1], sys.argv[2] == "compile"
args = resolve_model_args(ModelConfig(preset="debug"), 512)
torch.manual_seed(0)
model = Llama(args, kernels_for("reference", "cpu"))
enable_activation_checkpointing(model, mode)  # before fully_shard, as session.build_model orders it
if compiled:
    compile_blocks(model)
info = dist.DistInfo(rank, world, rank, torch.device("cpu"), "gloo", rank == 0, "fsdp")
wrapped = dist.wrap_model(model, TrainConfig(parallel="fsdp", activation_checkpointing=mode), info)
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 512, (2 * world, 48), generator=g)
labels = torch.roll(ids, -1, dims=1)
mine = slice(2 * rank, 2 * rank + 2)
loss = wrapped(ids[mine], labels=labels[mine]).sum() / labels.numel() * world
loss.backward()
total = loss.detach().clone()
tdist.all_reduce(total)
grads = {n: p.grad.full_tensor().tolist() for n, p in model.named_parameters()}
if rank == 0:
    with open(sys.argv[3], "w") as fh:
        json.dump({"loss": float(total) / world, "grads": grads}, fh)
# as `oreline train` ends a rank: a barrier, the group torn down, then no interpreter finalization
# (gloo aborted it now and then: "terminate called without an active exception")
dist.cleanup()
dist.leave(0)
"""


def _fsdp_run(tmp_path, mode: str, compiled: str, nproc: int) -> dict:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script, out = tmp_path / "fsdp_ac.py", tmp_path / f"{mode}-{compiled}-{nproc}.json"
    script.write_text(FSDP_SCRIPT)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {
        **os.environ,
        "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(
        [*cmd, str(script), mode, compiled, str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_selective_and_full_under_two_rank_fsdp2_equal_none(tmp_path):
    """FSDP2 over 2 gloo ranks (fully_shard around the checkpointed blocks): full and selective give
    the loss and the gathered gradients of no checkpointing, to fp32 reduction-order tolerance."""
    ref = _fsdp_run(tmp_path, "none", "eager", 2)
    for mode in ("full", "selective"):
        got = _fsdp_run(tmp_path, mode, "eager", 2)
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6)
        for name, g in ref["grads"].items():
            torch.testing.assert_close(
                torch.tensor(got["grads"][name]), torch.tensor(g), rtol=1e-5, atol=1e-7
            )


@pytest.mark.slow
def test_selective_under_torch_compile_and_fsdp2_equals_none(tmp_path):
    """Regional compilation of the checkpointed blocks (compile_blocks after the checkpoint, as
    session.build_model orders them), under one-rank FSDP2: the gradients of eager, no checkpointing."""
    ref = _fsdp_run(tmp_path, "none", "eager", 1)
    got = _fsdp_run(tmp_path, "selective", "compile", 1)
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    for name, g in ref["grads"].items():
        torch.testing.assert_close(torch.tensor(got["grads"][name]), torch.tensor(g), rtol=1e-4, atol=1e-6)
