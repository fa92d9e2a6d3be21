"""Validation loss and bits per byte against direct computations, generations, and `oreline eval` JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from typer.testing import CliRunner

from oreline.cli import app
from oreline.config import ModelConfig, TokenizerConfig
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.model.scoring import generate_samples, token_byte_lengths, validation_loss
from oreline.tokens.loader import TokenLoader
from oreline.tokens.train_bpe import load_tokenizer, train_tokenizer
from oreline.train.loop import train

TEXTS = [
    "Emma Woodhouse, handsome, clever, and rich.",
    "naïve café — “quoted” ½ 😀 中文",
    "  two  spaces\n\nand lines ",
]


def test_byte_lengths_add_up_to_the_utf8_bytes_byte_level(prose_tokens):
    tok = load_tokenizer(prose_tokens["tokenizer"])
    bpt = token_byte_lengths(tok)
    assert bpt.shape == (tok.vocab_size,)
    assert bpt[tok.bos_id] == bpt[tok.eos_id] == bpt[tok.pad_id] == 0
    for text in TEXTS:
        assert int(bpt[tok.encode(text)].sum()) == len(text.encode("utf-8")), text


def test_byte_lengths_metaspace(prose_tokens, tmp_path):
    train_tokenizer(
        [prose_tokens["docs"]],
        tmp_path / "tok",
        TokenizerConfig(vocab_size=512, pre_tokenizer="metaspace", heldout_docs=5),
    )
    tok = load_tokenizer(tmp_path / "tok")
    bpt = token_byte_lengths(tok)
    for text in TEXTS:
        # + 1: the ▁ the normalizer puts in front of every text is counted as the space it stands for
        assert int(bpt[tok.encode(text)].sum()) == len(text.encode("utf-8")) + 1, text


def _model():
    torch.manual_seed(0)
    return Llama(resolve_model_args(ModelConfig(preset="debug"), 512))


def test_validation_loss_matches_a_direct_computation(prose_tokens, one_thread):
    tok = load_tokenizer(prose_tokens["tokenizer"])
    bpt = token_byte_lengths(tok)
    val = TokenLoader(prose_tokens["tokens"], split="val", seq_len=64, micro_batch=4, seed=0)
    model = _model()
    got = validation_loss(model, val, tok.bos_id, tok.eos_id, 3, bpt)
    nats, n, n_bytes = 0.0, 0, 0
    with torch.no_grad():
        for b in val.iter_eval_batches(3):
            logits = model(b.input_ids)
            nats += float(
                F.cross_entropy(
                    logits.view(-1, logits.shape[-1]), b.labels.view(-1), ignore_index=-100, reduction="sum"
                )
            )
            valid = b.labels[b.labels != -100]
            n += valid.numel()
            n_bytes += int(bpt[valid.numpy()].sum())
    assert got["batches"] == 3 and got["targets"] == n and got["bytes"] == n_bytes
    assert got["loss"] == pytest.approx(nats / n, rel=1e-6)
    assert got["ppl"] == pytest.approx(math.exp(nats / n), rel=1e-6)
    assert got["bpb"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-6)
    assert got["loss_token"] is not None and got["loss_bos"] is not None
    assert model.training  # restored after evaluation


def test_generations_greedy_and_seeded_sampling_are_reproducible(prose_tokens, one_thread):
    tok = load_tokenizer(prose_tokens["tokenizer"])
    model = _model()
    prompts = ["The capital of France is", "Emma"]
    greedy = generate_samples(model, tok, prompts, 6, greedy=True)
    assert [g["prompt"] for g in greedy] == prompts and all(g["mode"] == "greedy" for g in greedy)
    assert greedy == generate_samples(model, tok, prompts, 6, greedy=True)
    a = generate_samples(model, tok, prompts, 6, greedy=False, temperature=1.0, top_k=50, seed=7)
    assert a == generate_samples(model, tok, prompts, 6, greedy=False, temperature=1.0, top_k=50, seed=7)
    assert all(g["mode"] == "sampled" and 0 < g["tokens"] <= 6 for g in a)


def test_oreline_eval_writes_json(tmp_path, train_config, one_thread):
    cfg = train_config(train__steps=6, train__eval_every=0, checkpoint__every=3, eval__max_new_tokens=5)
    summary = train(cfg, resume="none", console=Console(quiet=True))
    run = tmp_path / "t"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n\nMr. Knightley said\n")
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(
        app, ["eval", str(run), "--out", str(out), "--batches", "2", "--prompts", str(prompts)]
    )
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["step"] == 6 and r["checkpoint"].endswith("step-00000006")
    for key in ("val_loss", "val_ppl", "val_bpb", "val_loss_token", "val_loss_eos", "val_loss_bos"):
        assert key in r
    assert r["val_batches"] == 2 and r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
    assert r["val_sequences"] == 2 * 4  # batches of train.micro_batch sequences
    # 4 batches of 4: training's validation set (train.eval_sequences = 16), so its final loss
    whole = tmp_path / "eval16.json"
    res = CliRunner().invoke(app, ["eval", str(run), "--out", str(whole), "--batches", "4"])
    assert res.exit_code == 0, res.output
    assert json.loads(whole.read_text())["val_loss"] == pytest.approx(summary["final_val_loss"], rel=1e-9)
    assert [(g["prompt"], g["mode"]) for g in r["generations"]] == [
        ("Once upon a time", "greedy"),
        ("Mr. Knightley said", "greedy"),
        ("Once upon a time", "sampled"),
        ("Mr. Knightley said", "sampled"),
    ]
    # the training format is stated, in the JSON and on screen, and generations carry their ids
    assert (
        r["training_format"]["document"] == "<s> text </s>" and r["training_format"]["prompt"] == "<s> prompt"
    )
    assert "trained on <s> text </s>" in res.output and all(
        len(g["ids"]) == g["tokens"] for g in r["generations"]
    )
    # default prompts (cfg.eval.prompts) and the default path <run>/eval/eval-step-N.json
    res = CliRunner().invoke(app, ["eval", summary["checkpoint"], "--batches", "1"])
    assert res.exit_code == 0, res.output
    default = json.loads((run / "eval" / "eval-step-6.json").read_text())
    assert [g["prompt"] for g in default["generations"] if g["mode"] == "greedy"] == cfg.eval.prompts
