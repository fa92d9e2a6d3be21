"""Presets against published shapes, config resolution, FLOPs, memory and `oreline model info`."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from typer.testing import CliRunner

from oreline.cli import app
from oreline.config import ModelConfig
from oreline.errors import ConfigError
from oreline.model.llama import Llama
from oreline.model.presets import (
    PRESETS,
    check_training_memory,
    count_params,
    flops_per_token,
    llama_ffn_dim,
    memory_estimate,
    print_model_info,
    resolve_model_args,
    training_memory,
)
from oreline.tokens.train_bpe import load_tokenizer


def test_mlp_width_rule_matches_meta():
    assert llama_ffn_dim(4096, multiple_of=256) == 11008  # Llama-2-7B
    assert llama_ffn_dim(4096, multiple_of=1024, ffn_multiplier=1.3) == 14336  # Llama-3-8B
    assert llama_ffn_dim(2048, multiple_of=256, ffn_multiplier=1.5) == 8192  # Llama-3.2-1B
    assert llama_ffn_dim(8192, multiple_of=4096, ffn_multiplier=1.3) == 28672  # Llama-3-70B


@pytest.mark.parametrize(
    "name,total",
    [
        ("llama2-7b", 6_738_415_616),  # HF meta-llama/Llama-2-7b-hf
        ("llama3-8b", 8_030_261_248),  # HF meta-llama/Meta-Llama-3-8B
        ("1b", 1_235_814_400),  # HF meta-llama/Llama-3.2-1B (tied)
        ("3b", 3_212_749_824),  # HF meta-llama/Llama-3.2-3B (tied)
    ],
)
def test_big_presets_have_the_published_parameter_counts(name, total):
    args = resolve_model_args(ModelConfig(preset=name))
    assert count_params(args)["total"] == total
    with torch.device("meta"):
        assert Llama(args).num_params() == total


def test_llama2_7b_is_untied_and_llama3_8b_is_gqa():
    l2 = resolve_model_args(ModelConfig(preset="llama2-7b"))
    assert (l2.tie_embeddings, l2.n_kv_heads, l2.vocab_size, l2.rope_theta, l2.max_seq_len) == (
        False,
        32,
        32000,
        1e4,
        4096,
    )
    l3 = resolve_model_args(ModelConfig(preset="llama3-8b"))
    assert (l3.tie_embeddings, l3.n_kv_heads, l3.vocab_size, l3.rope_theta, l3.max_seq_len) == (
        False,
        8,
        128256,
        5e5,
        8192,
    )


def test_every_preset_builds_and_counts_agree():
    for name in PRESETS:
        args = resolve_model_args(ModelConfig(preset=name))
        with torch.device("meta"):
            model = Llama(args)
        counts = count_params(args)
        assert counts["total"] == model.num_params()
        assert counts["non_embedding"] == model.num_params(exclude_embedding=True)


def test_resolution_order():
    cfg = ModelConfig(preset="demo", n_layers=2, dim=128)
    args = resolve_model_args(cfg, vocab_size=1024)
    assert (args.dim, args.n_layers, args.n_heads, args.vocab_size) == (128, 2, 8, 1024)
    assert args.ffn_dim == llama_ffn_dim(128, multiple_of=256)  # width follows the new dim
    assert resolve_model_args(ModelConfig(preset="demo", vocab_size=777), vocab_size=1024).vocab_size == 777
    assert resolve_model_args(ModelConfig(preset="demo")).vocab_size == PRESETS["demo"]["vocab_size"]
    assert resolve_model_args(ModelConfig(preset="demo", ffn_dim=100)).ffn_dim == 100
    assert resolve_model_args(ModelConfig(preset="demo", multiple_of=64)).ffn_dim == 704
    scratch = ModelConfig(preset=None, dim=64, n_layers=1, n_heads=2, vocab_size=100)
    assert resolve_model_args(scratch).n_kv_heads == 2
    with pytest.raises(ConfigError, match="unknown model.preset 'tiny'"):
        resolve_model_args(ModelConfig(preset="tiny"))
    with pytest.raises(ConfigError, match="model.vocab_size"):
        resolve_model_args(ModelConfig(preset=None, dim=64, n_layers=1, n_heads=2))
    with pytest.raises(ConfigError, match="not divisible"):
        resolve_model_args(ModelConfig(preset="demo", n_heads=7))


def test_flops_formula():
    args = resolve_model_args(ModelConfig(preset="debug"))
    n = count_params(args)["non_embedding"]  # untied: includes the lm head
    assert flops_per_token(args, 128) == 6 * n + 12 * args.n_layers * args.dim * 128
    tied = resolve_model_args(ModelConfig(preset="debug", tie_embeddings=True))
    # tying removes a parameter, not the output matmul
    assert flops_per_token(tied, 128) == flops_per_token(args, 128)
    # Llama-2-7B at 4096: ~6.74e9 params → ~4.2e10 FLOPs/token (6N ≈ 3.96e10 + attention 6.4e9)
    l2 = resolve_model_args(ModelConfig(preset="llama2-7b"))
    assert flops_per_token(l2, 4096) == 6 * (6_738_415_616 - 32000 * 4096) + 12 * 32 * 4096 * 4096


def test_memory_estimate():
    args = resolve_model_args(ModelConfig(preset="125m"))
    n = count_params(args)["total"]
    mem = memory_estimate(args)
    assert mem["fp32"] == {"weights": 4 * n, "grads": 4 * n, "adamw_state": 8 * n, "total": 16 * n}
    assert mem["bf16"]["weights"] == 2 * n and mem["bf16"]["total"] == 16 * n


def test_model_info_for_a_preset_and_a_config(tmp_path):
    buf = io.StringIO()
    info = print_model_info("llama3-8b", seq_len=8192, console=Console(file=buf, width=200))
    text = buf.getvalue()
    assert "8,030,261,248" in text and "lm_head.weight" in text and "14336 × 4096" in text
    assert info["flops_per_token"] == flops_per_token(
        resolve_model_args(ModelConfig(preset="llama3-8b")), 8192
    )
    cfg = tmp_path / "small.toml"
    cfg.write_text('[model]\npreset = "debug"\nn_layers = 3\nvocab_size = 1000\n')
    buf = io.StringIO()
    info = print_model_info(str(cfg), seq_len=64, console=Console(file=buf, width=200))
    assert info["args"]["n_layers"] == 3 and info["args"]["vocab_size"] == 1000
    assert "model.layers.2.mlp.down_proj.weight" in info["shapes"]
    # a run whose tokenizer exists gives the vocabulary (its padded size)
    tok = tmp_path / "tok"
    tok.mkdir()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(
        ["the cat sat on the mat"] * 20,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<pad>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    bpe.save(str(tok / "tokenizer.json"))
    cfg.write_text(f'[model]\npreset = "debug"\n[train]\ntokenizer = "{tok}"\n')
    info = print_model_info(str(cfg), seq_len=64, console=Console(file=io.StringIO(), width=200))
    assert info["args"]["vocab_size"] == load_tokenizer(tok).vocab_size != PRESETS["debug"]["vocab_size"]
    with pytest.raises(ConfigError, match="neither a preset nor a config"):
        print_model_info("gpt5", console=Console(file=io.StringIO()))


def test_model_info_of_a_config_counts_flops_at_its_own_seq_len(tmp_path):
    """A config with train.seq_len = 64 was reported "at seq_len 2048" unless --seq-len was given."""
    cfg = tmp_path / "short.toml"
    cfg.write_text('[model]\npreset = "debug"\n[train]\nseq_len = 64\n')
    result = CliRunner().invoke(app, ["model", "info", str(cfg)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    flops = flops_per_token(resolve_model_args(ModelConfig(preset="debug")), 64)
    assert f"FLOPs per token at seq_len 64 (the config's train.seq_len): {flops:,}" in result.output
    preset = print_model_info("debug", console=Console(file=io.StringIO(), width=200))
    assert preset["seq_len"] == 2048


def test_cli_model_info():
    result = CliRunner().invoke(app, ["model", "info", "debug", "--seq-len", "256"])
    assert result.exit_code == 0, result.output
    assert "FLOPs per token at seq_len 256" in result.output
    assert f"{count_params(resolve_model_args(ModelConfig(preset='debug')))['total']:,}" in result.output


# ---------------------------------------------------------------------------------------------
# the training-memory floor that refuses impossible runs before anything is allocated


@pytest.mark.parametrize("preset", ["debug", "demo"])
def test_training_memory_activations_are_a_floor_of_what_autograd_saves(preset):
    """Count the bytes autograd really keeps for backward in one forward (saved-tensor hooks, weights
    excluded): the estimate must not exceed them (it is a floor) and must not be far below (it is useful)."""
    args = resolve_model_args(ModelConfig(preset=preset))
    torch.manual_seed(0)
    model = Llama(args)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    B, T = 4, 128
    ids = torch.randint(0, args.vocab_size, (B, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids)
    est = training_memory(args, B, T)
    floor = est["activations"] + est["logits"]
    assert 0.8 * sum(saved.values()) <= floor <= sum(saved.values()), (floor, sum(saved.values()))
    assert est["state"] == 16 * count_params(args)["total"]


def test_training_memory_refuses_a_huge_model_with_the_arithmetic():
    args = resolve_model_args(ModelConfig(preset="debug", dim=10**6))
    with pytest.raises(ConfigError) as err:
        check_training_memory(args, 4, 64, "fp32", False, 1, torch.device("cpu"))
    msg = str(err.value)
    n = count_params(args)["total"]
    assert f"{n:,} parameters × 16 bytes" in msg and "model.dim=1000000" in msg
    assert "available RAM (psutil)" in msg and "lower train.micro_batch" in msg


def test_training_memory_refuses_a_huge_micro_batch_and_accepts_the_demo():
    args = resolve_model_args(ModelConfig(preset="demo"))
    with pytest.raises(
        ConfigError, match=r"64,000,000,000 tokens \(train.micro_batch=1000000000 × train.seq_len=64\)"
    ):
        check_training_memory(args, 10**9, 64, "fp32", False, 1, torch.device("cpu"))
    need = check_training_memory(args, 8, 256, "fp32", False, 1, torch.device("cpu"))
    assert need["total"] < 2**30
    sharded = training_memory(args, 8, 256, shards=4)
    assert sharded["state"] == need["state"] // 4 and sharded["activations"] == need["activations"]


def test_the_memory_floor_counts_the_rope_tables_of_max_seq_len():
    """model.max_seq_len=10^12 makes 2 × 10^12 × head_dim fp32 RoPE entries (terabytes) whatever
    train.seq_len is: refused before anything is allocated, by training and by eval/scoring."""
    from oreline.model.presets import check_model_memory, rope_bytes

    args = resolve_model_args(ModelConfig(preset="debug", max_seq_len=10**12))
    assert rope_bytes(args) == 2 * 10**12 * args.head_dim * 4
    assert training_memory(args, 4, 64)["rope"] == rope_bytes(args)
    with pytest.raises(ConfigError, match=r"RoPE tables 2 × model.max_seq_len=1,000,000,000,000"):
        check_training_memory(args, 4, 64, "fp32", False, 1, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"meta.json: the model it describes needs"):
        check_model_memory(args, torch.device("cpu"), "ckpt/meta.json")
    small = resolve_model_args(ModelConfig(preset="debug"))
    assert check_model_memory(small, torch.device("cpu"), "ckpt/meta.json")["rope"] == rope_bytes(small)
