"""The validation set is a fixed number of sequences (train.eval_sequences), not of micro-batches.

Issue 36: with train.eval_batches, micro 2 × accum 4 and micro 8 × accum 1 trained identically
but validated on 4× fewer sequences (5.6695 against 5.6583 on the demo data). Now:

- `TokenLoader.iter_eval_set(n)` gives every rank its block of the first n val sequences in
  batches of micro_batch, padded with zero-weight rows so every rank runs the same forwards;
  the ranks' real rows together are exactly those n sequences, whatever micro_batch and world size.
- two in-process runs that differ only in micro_batch × grad_accum report the same validation loss;
- 2-rank DDP and FSDP2 runs (gloo, torchrun) report the 1-rank run's validation loss on a set
  that 2 does not divide (the padding row);
- train.eval_batches is read as eval_batches × micro_batch sequences with a FutureWarning (it wins
  over eval_sequences: a dumped config with the old key set on top by an override).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from oreline.config import TrainConfig, config_from_dict, load_config
from oreline.errors import ConfigError
from oreline.tokens.loader import IGNORE_INDEX, TokenLoader
from oreline.train.loop import train

from .conftest import read_metrics, write_config


def _rows(loader: TokenLoader, n: int) -> tuple[list[np.ndarray], int, list[tuple[int, int]]]:
    """This rank's real rows (input ids), its padding row count, and its batch shapes."""
    real, pad, shapes = [], 0, []
    for b in loader.iter_eval_set(n):
        shapes.append(tuple(b.input_ids.shape))
        for ids, labels in zip(b.input_ids, b.labels, strict=True):
            if bool((labels == IGNORE_INDEX).all()):
                pad += 1
            else:
                real.append(ids.numpy())
    return real, pad, shapes


def test_the_eval_set_is_the_first_n_sequences_whatever_micro_batch_and_world_size(prose_tokens):
    one = TokenLoader(prose_tokens["tokens"], split="val", seq_len=64, micro_batch=64, seed=3)
    total = one.eval_set_size(10**9)
    assert 20 < total < 10**9  # more than asked for below; all of it when asked for more
    want, pad, _ = _rows(one, 23)
    assert len(want) == 23 and pad == 0
    for world in (1, 2, 3, 4):
        for micro in (1, 2, 5, 8):
            got, pads, shapes = [], 0, []
            for rank in range(world):
                loader = TokenLoader(
                    prose_tokens["tokens"],
                    split="val",
                    seq_len=64,
                    micro_batch=micro,
                    seed=11,  # the training order's seed: the eval set does not depend on it
                    rank=rank,
                    world_size=world,
                )
                real, pad, shape = _rows(loader, 23)
                got += real
                pads += pad
                shapes.append(shape)
            assert len(got) == 23 and all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
            assert pads == -(-23 // world) * world - 23
            assert all(s == shapes[0] for s in shapes), (
                world,
                micro,
                shapes,
            )  # the same forwards on every rank
            assert max(n for n, _ in shapes[0]) <= micro


def test_validation_loss_is_the_same_for_any_micro_batch_and_accumulation(tmp_path, prose_tokens, one_thread):
    """The issue's pair: micro 2 × accum 4 against micro 8 × accum 1, 20 val sequences (the last
    batch of 8 is partial). Same training (its gradients summed over 4 micro-batches or 1, so the
    weights differ in the last bits), same validation set: the validation losses agree to 1e-6
    relative (1.7e-8 seen), where the old eval_batches scored 4× fewer sequences at micro 2; the
    eval record and line state the set."""
    from io import StringIO

    from rich.console import Console

    from .conftest import make_config

    out = {}
    for micro, accum in ((2, 4), (8, 1)):
        cfg = make_config(
            tmp_path / f"m{micro}",
            prose_tokens,
            train__micro_batch=micro,
            train__grad_accum=accum,
            train__steps=3,
            train__optim__warmup_steps=1,
            train__eval_every=0,
            train__eval_sequences=20,
            train__log_every=1,
            eval__prompts=[],
        )
        text = StringIO()
        summary = train(cfg, resume="none", console=Console(file=text, width=250))
        recs = read_metrics(tmp_path / f"m{micro}" / "t" / "metrics.jsonl")
        out[micro] = (summary, recs, text.getvalue())
    (s2, recs2, text2), (s8, recs8, _) = out[2], out[8]
    train2 = {r["step"]: r["loss"] for r in recs2 if r["type"] == "train"}
    train8 = {r["step"]: r["loss"] for r in recs8 if r["type"] == "train"}
    assert train2.keys() == train8.keys() == {1, 2, 3}
    assert all(train2[s] == pytest.approx(train8[s], rel=1e-6) for s in train2)
    (e2,) = [r for r in recs2 if r["type"] == "eval"]
    (e8,) = [r for r in recs8 if r["type"] == "eval"]
    assert e2["val_sequences"] == e8["val_sequences"] == 20 and e2["val_tokens"] == 20 * 64
    assert e2["val_targets"] == e8["val_targets"]
    assert e2["val_batches"] == 10 and e8["val_batches"] == 3
    assert e2["val_loss"] == pytest.approx(e8["val_loss"], rel=1e-6, abs=0)
    assert s2["final_val_loss"] == e2["val_loss"] and s8["final_val_loss"] == e8["val_loss"]
    assert "(20 seqs, 1,280 tokens)" in text2


def test_eval_batches_is_read_as_sequences_with_a_warning():
    with pytest.warns(FutureWarning, match=r"eval_sequences = 20 × 4 = 80"):
        cfg = TrainConfig(micro_batch=4, eval_batches=20)
    assert cfg.eval_sequences == 80 and "eval_batches" not in cfg.model_dump()
    with pytest.warns(
        FutureWarning, match=r"= 2 × 8 = 16"
    ):  # micro_batch's default; an old checkpoint's config
        assert config_from_dict({"train": {"eval_batches": 2}}).train.eval_sequences == 16
    # the demo sets eval_sequences = 400: the old key, written on top, wins and says so
    with pytest.warns(FutureWarning, match=r"= 2 × 8 = 16 \(in place of train.eval_sequences = 400\)"):
        assert load_config(None, ["train.eval_batches=2"]).train.eval_sequences == 16
    with pytest.raises(ConfigError, match="train.eval_batches"):
        load_config(None, ["train.eval_batches=0"])
    assert TrainConfig().eval_sequences == 160  # the old default: 20 batches × 8 sequences


@pytest.mark.slow
def test_two_ranks_validate_on_the_same_set_as_one(tmp_path, prose_tokens):
    """`oreline train` on 1 rank (micro 2 × accum 4), 2 DDP ranks (`--nproc 2`, micro 2 × accum 2)
    and 2 FSDP2 ranks (torchrun): 9 validation sequences (rank 1 scores 4 and a padding row).
    The same training within float reduction order, so the validation losses agree to 1e-5."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "250"}
    common = {
        "run.name": "r",
        "train.micro_batch": 2,
        "train.steps": 3,
        "train.log_every": 1,
        "train.eval_every": 0,
        "train.eval_sequences": 9,
        "train.optim.warmup_steps": 1,
        "eval.prompts": [],
    }
    ore = [sys.executable, "-m", "oreline", "train", "-c"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    plans = {
        "ref": ({"train.grad_accum": 4}, lambda c: [*ore, c]),
        "ddp": ({"train.grad_accum": 2}, lambda c: [*ore, c, "--nproc", "2"]),
        "fsdp": (
            {"train.grad_accum": 2, "train.parallel": "fsdp"},
            lambda c: [*torchrun, "-m", "oreline", "train", "-c", c],
        ),
    }
    procs = {}
    for name, (changes, cmd) in plans.items():
        config = write_config(tmp_path / f"{name}.toml", tmp_path / name, prose_tokens, common | changes)
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        procs[name] = (subprocess.Popen(cmd(str(config)), env=env, stdout=log, stderr=subprocess.STDOUT), log)
    evals = {}
    for name, (proc, log) in procs.items():
        rc = proc.wait(timeout=600)
        log.close()
        text = (tmp_path / f"{name}.log").read_text(errors="replace")
        assert rc == 0, text[-4000:]
        (evals[name],) = [
            r for r in read_metrics(tmp_path / name / "r" / "metrics.jsonl") if r["type"] == "eval"
        ]
    ref = evals["ref"]
    assert ref["val_sequences"] == 9 and ref["val_tokens"] == 9 * 64 and ref["val_batches"] == 5
    for name in ("ddp", "fsdp"):
        got = evals[name]
        assert got["val_sequences"] == 9 and got["val_targets"] == ref["val_targets"], got
        assert got["val_batches"] == 3  # this rank's forwards: 5 rows of micro 2
        assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-5), (
            name,
            got["val_loss"],
            ref["val_loss"],
        )
        assert got["val_bpb"] == pytest.approx(ref["val_bpb"], rel=1e-5)
