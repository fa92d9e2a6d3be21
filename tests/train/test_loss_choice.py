"""train.loss = auto | full | chunked (oreline.train.session.loss_choice / with_loss): what auto means
per device, and a model built with the chunked loss trains to the gradients of the full one, through
forward_backward (the step's own Σ CE / n_targets), with either kernel set; a resume's switch of the
CPU product backend keeps the chunked loss."""

import contextlib

import pytest
import torch

from oreline.config import ModelConfig, TrainConfig
from oreline.model.kernels.chunked_cross_entropy import chunked_linear_cross_entropy
from oreline.model.kernels.select import kernels_for, use_matmul_backend
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train.batch import _Batch as MicroBatch
from oreline.train.dist import DistInfo
from oreline.train.session import loss_choice, with_loss
from oreline.train.step import forward_backward

CPU1 = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None, is_main=True)
ARGS = resolve_model_args(ModelConfig(preset="debug"), 512)


def test_auto_is_the_full_loss_until_a_gpu_measures_the_chunked_one():
    assert loss_choice(TrainConfig(), torch.device("cpu")) == "full"
    assert loss_choice(TrainConfig(), torch.device("cuda", 0)) == "full"
    assert loss_choice(TrainConfig(loss="chunked"), torch.device("cuda", 0)) == "chunked"
    assert loss_choice(TrainConfig(loss="chunked"), torch.device("cpu")) == "chunked"
    assert loss_choice(TrainConfig(loss="full"), torch.device("cuda", 0)) == "full"
    with pytest.raises(ValueError):
        TrainConfig(loss_chunk_tokens=0)


def _trained(kernels, micro_batches, n_targets):
    torch.manual_seed(0)
    model = Llama(ARGS, kernels)
    forward_backward(model, micro_batches, n_targets, CPU1, contextlib.nullcontext, 1, 2)
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_chunked_loss_gives_the_full_losses_gradients(kernels, one_thread):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 512, (4, 40), generator=g)
    labels = torch.roll(ids, -1, dims=1)
    labels[1, 20:] = -100
    micro = [MicroBatch(ids[i : i + 2], labels[i : i + 2], None) for i in (0, 2)]
    n = float((labels != -100).sum())
    full_kernels = kernels_for(kernels, "cpu")
    chunked_kernels = with_loss(full_kernels, TrainConfig(loss="chunked", loss_chunk_tokens=7), "cpu", "blas")
    assert chunked_kernels.token_loss.func is chunked_linear_cross_entropy
    assert with_loss(full_kernels, TrainConfig(loss="full"), "cpu", "blas") is full_kernels
    full, chunked = _trained(full_kernels, micro, n), _trained(chunked_kernels, micro, n)
    for name, grad in full.items():
        torch.testing.assert_close(chunked[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_resumes_backend_switch_keeps_the_chunked_loss():
    model = Llama(
        ARGS,
        with_loss(kernels_for("cpu", "cpu"), TrainConfig(loss="chunked", loss_chunk_tokens=9), "cpu", "blas"),
    )
    use_matmul_backend(model, "onednn")
    loss = model.kernels.token_loss
    assert loss.func is chunked_linear_cross_entropy
    assert loss.keywords == {"chunk_tokens": 9, "backend": "onednn"}


def _losses(tmp_path, train_config, name, **dotted):
    import io
    import json

    from rich.console import Console

    from oreline.train.loop import train

    cfg = train_config(
        run__name=name, train__steps=6, train__log_every=1, train__eval_every=0, eval__prompts=[], **dotted
    )
    out = io.StringIO()
    train(cfg, resume="none", console=Console(file=out, width=200))
    recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in recs if r["type"] == "train"], out.getvalue()


def test_a_run_with_selective_checkpointing_and_the_chunked_loss_trains_as_the_default(
    tmp_path, train_config, one_thread
):
    """oreline's own training loop end to end (setup_run applies both levers): the same losses, step by step."""
    ref, _ = _losses(tmp_path, train_config, "ref")
    got, said = _losses(
        tmp_path,
        train_config,
        "levers",
        train__activation_checkpointing="selective",
        train__loss="chunked",
        train__loss_chunk_tokens=100,
    )
    assert "loss: chunked (100 tokens per chunk of logits)" in said
    assert 'activation_checkpointing = "selective"' in (tmp_path / "levers" / "config.toml").read_text()
    assert len(got) == len(ref) == 6
    assert got == pytest.approx(ref, rel=1e-5)
