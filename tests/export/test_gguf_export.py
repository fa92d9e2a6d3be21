"""GGUF export: read back with gguf's own reader, the same tensors and the tokenizer llama.cpp needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from oreline.cli import app
from oreline.config import TokenizerConfig
from oreline.errors import ConfigError, InputError
from oreline.export.gguf import (
    export_state_dict_gguf,
    gguf_name,
    permute_rotary,
    read_gguf,
    unpermute_rotary,
)
from oreline.model.llama import Llama, ModelArgs
from oreline.tokens.train_bpe import train_tokenizer
from oreline.train.checkpoint.save import save_checkpoint

gguf = pytest.importorskip("gguf")

SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def oreline_weights(sd: dict[str, torch.Tensor], args: ModelArgs, tensors: dict[str, np.ndarray]) -> dict:
    """GGUF tensors back under oreline's names, q/k rows back in rotate-half order."""
    back = {}
    for name in sd:
        w = torch.from_numpy(np.array(tensors[gguf_name(name)], dtype=np.float32))
        if name.endswith("q_proj.weight"):
            w = unpermute_rotary(w, args.n_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_rotary(w, args.n_kv_heads)
        back[name] = w
    return back


def test_gguf_round_trip_f32_is_bit_identical(demo_model, tokenizer_dir, tmp_path):
    model, tok = demo_model
    meta = {
        "model_args": model.args.to_dict(),
        "tokenizer_dir": str(tokenizer_dir),
        "tokens_seen": 0,
        "config": {"train": {"seq_len": 128}},
    }
    save_checkpoint(tmp_path / "run" / "checkpoints", 5, model, None, meta, kind="model_only")
    out = tmp_path / "model-f32.gguf"
    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--format", "gguf", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "pre-tokenizer gpt-2" in result.output.replace("\n", " ")

    info, tensors = read_gguf(out)
    sd = model.state_dict()
    sd.pop("lm_head.weight", None)  # tied: llama.cpp reads token_embd for the output, as HF does
    assert set(tensors) == {gguf_name(k) for k in sd} and "output.weight" not in tensors
    back = oreline_weights(sd, model.args, tensors)
    assert all(torch.equal(back[k], v) for k, v in sd.items())  # bit for bit
    assert all(tensors[gguf_name(k)].dtype == np.float32 for k in sd)

    # the tokenizer llama.cpp builds: oreline's vocabulary and merges, gpt-2 pre-tokenizer, [BOS] text
    tj = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = sorted(tj["model"]["vocab"], key=tj["model"]["vocab"].get)
    assert info["tokenizer.ggml.model"] == "gpt2" and info["tokenizer.ggml.pre"] == "gpt-2"
    assert info["tokenizer.ggml.tokens"][: len(vocab)] == vocab
    assert len(info["tokenizer.ggml.tokens"]) == model.args.vocab_size == info["llama.vocab_size"]
    assert info["tokenizer.ggml.merges"] == [
        " ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]
    ]
    types = info["tokenizer.ggml.token_type"]
    assert types[:3] == [int(gguf.TokenType.CONTROL)] * 3 and types[3] == int(gguf.TokenType.NORMAL)
    assert set(types[len(vocab) :]) <= {int(gguf.TokenType.UNUSED)}
    assert (
        info["tokenizer.ggml.bos_token_id"],
        info["tokenizer.ggml.eos_token_id"],
        info["tokenizer.ggml.padding_token_id"],
    ) == (tok.bos_id, tok.eos_id, tok.pad_id)
    assert info["tokenizer.ggml.add_bos_token"] is True and info["tokenizer.ggml.add_eos_token"] is False
    assert info["llama.context_length"] == 128 and info["general.file_type"] == int(
        gguf.LlamaFileType.ALL_F32
    )
    assert (
        info["llama.attention.head_count"],
        info["llama.attention.head_count_kv"],
        info["llama.rope.dimension_count"],
    ) == (4, 2, 16)
    assert json.loads(info["oreline.training_format"])["prompt"] == "<s> prompt"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "q8_0"])
def test_gguf_reduced_types(dtype, demo_model, tokenizer_dir, tmp_path):
    model, _ = demo_model
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    summary = export_state_dict_gguf(sd, model.args, tokenizer_dir, tmp_path / "m.gguf", dtype)
    info, tensors = read_gguf(tmp_path / "m.gguf")
    back = oreline_weights(sd, model.args, tensors)
    for name, w in sd.items():
        if w.dim() == 1:  # norms stay float32, as llama.cpp's converter keeps them
            assert torch.equal(back[name], w) and summary["tensors"][gguf_name(name)] == "F32"
        elif dtype == "float16":
            assert torch.equal(back[name], w.half().float())
        elif dtype == "bfloat16":  # gguf rounds to nearest even, as torch does
            assert torch.equal(back[name], w.to(torch.bfloat16).float())
        else:  # q8_0: 32-value blocks, int8 with one f16 scale d = max |w| / 127 each: half a step of
            # rounding plus the scale's own f16 rounding (2^-11 relative, times up to 127 steps)
            blocks = w.reshape(-1, 32)
            step = blocks.abs().amax(dim=1, keepdim=True) / 127
            assert ((back[name].reshape(-1, 32) - blocks).abs() <= step * (0.5 + 127 * 2**-11) + 1e-12).all()
    assert info["general.file_type"] == {"float16": 1, "bfloat16": 32, "q8_0": 7}[dtype]


def test_permuted_qk_give_llama_cpp_the_same_attention_scores():
    """llama.cpp's `llama` RoPE rotates adjacent pairs; with the permuted rows it scores q·k as oreline does."""
    from oreline.model.llama import apply_rope, rope_tables

    args = ModelArgs(
        dim=64,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=64,
        ffn_dim=64,
        max_seq_len=32,
        rope_theta=500_000.0,
        rope_scaling=SCALING,
    )
    torch.manual_seed(0)
    wq, wk = torch.randn(64, 64), torch.randn(32, 64)
    x = torch.randn(32, 64)
    hd = args.head_dim
    cos, sin = rope_tables(args)
    q = apply_rope((x @ wq.T).view(1, 32, 4, hd), cos[:32], sin[:32]).transpose(1, 2)
    k = apply_rope((x @ wk.T).view(1, 32, 2, hd), cos[:32], sin[:32]).transpose(1, 2)
    ours = q[:, ::2] @ k.transpose(-1, -2)  # heads 0 and 2 with kv heads 0 and 1 (GQA groups of 2)

    # llama.cpp's rope_norm: pair (2i, 2i+1) turns by pos * theta_i / rope_freqs[i]
    from oreline.export.gguf import rope_freq_factors

    theta = args.rope_theta ** (-torch.arange(0, hd, 2).double() / hd) / rope_freq_factors(args).double()
    ang = torch.arange(32).double()[:, None] * theta[None]

    def rope_pairs(t: torch.Tensor) -> torch.Tensor:
        t = t.double()
        a, b = t[..., 0::2], t[..., 1::2]
        out = torch.stack([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], dim=-1)
        return out.flatten(-2)

    qg = rope_pairs((x @ permute_rotary(wq, 4).T).view(1, 32, 4, hd).transpose(1, 2))
    kg = rope_pairs((x @ permute_rotary(wk, 2).T).view(1, 32, 2, hd).transpose(1, 2))
    theirs = qg[:, ::2] @ kg.transpose(-1, -2)
    assert (ours.double() - theirs).abs().max() < 1e-3 * ours.abs().max()
    assert torch.equal(unpermute_rotary(permute_rotary(wq, 4), 4), wq)


def test_gguf_refuses_what_llama_cpp_would_tokenize_differently(samples, tmp_path, tokenizer_dir, demo_model):
    import gzip

    with gzip.open(samples / "english-prose" / "tinyshakespeare.txt.gz", "rt", encoding="utf-8") as fh:
        paras = [p for p in fh.read(50_000).split("\n\n") if p.strip()]
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "text": p}) + "\n" for i, p in enumerate(paras))
    )
    train_tokenizer(
        [tmp_path / "docs.jsonl"],
        tmp_path / "sp",
        TokenizerConfig(vocab_size=400, heldout_docs=0, pre_tokenizer="metaspace"),
    )
    model = Llama(
        ModelArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=448, ffn_dim=64, max_seq_len=64)
    )
    with pytest.raises(ConfigError, match="not a plain byte-level BPE"):
        export_state_dict_gguf(model.state_dict(), model.args, tmp_path / "sp", tmp_path / "m.gguf")
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".tmp-*"))
    demo, _ = demo_model
    with pytest.raises(InputError, match="does not end in .gguf"):
        export_state_dict_gguf(demo.state_dict(), demo.args, tokenizer_dir, tmp_path / "folder")
    with pytest.raises(ConfigError, match="context length 512"):
        export_state_dict_gguf(
            demo.state_dict(), demo.args, tokenizer_dir, tmp_path / "m.gguf", context_len=512
        )


def test_gguf_llama3_rope_factors(tokenizer_dir, tmp_path):
    args = ModelArgs(
        dim=64,
        n_layers=1,
        n_heads=4,
        n_kv_heads=4,
        vocab_size=512,
        ffn_dim=64,
        max_seq_len=256,
        rope_theta=500_000.0,
        rope_scaling=SCALING,
        tie_embeddings=False,
    )
    model = Llama(args)
    export_state_dict_gguf(model.state_dict(), args, tokenizer_dir, tmp_path / "m.gguf")
    _, tensors = read_gguf(tmp_path / "m.gguf")
    factors = tensors["rope_freqs.weight"]
    assert factors.shape == (8,) and factors[0] == 1.0 and factors[-1] == pytest.approx(8.0)
    assert "output.weight" in tensors  # untied: its own output matrix
    assert Path(tmp_path / "m.gguf").stat().st_size > 0
