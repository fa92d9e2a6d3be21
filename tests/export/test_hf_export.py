"""HF export and import: transformers loads the export with no custom code and agrees with oreline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from oreline.cli import app
from oreline.errors import ConfigError, DataIntegrityError, InputError
from oreline.export.hf import export_hf, export_state_dict_hf, import_hf
from oreline.model.llama import Llama, ModelArgs, generate
from oreline.tokens.train_bpe import load_tokenizer
from oreline.train.checkpoint.load import load_model_state
from oreline.train.checkpoint.save import save_checkpoint
from oreline.train.checkpoint.verify import verify_checkpoint

transformers = pytest.importorskip("transformers")

SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def make_model(vocab: int, **kw) -> Llama:
    args = ModelArgs(
        **(
            dict(
                dim=64,
                n_layers=2,
                n_heads=4,
                n_kv_heads=2,
                vocab_size=vocab,
                ffn_dim=192,
                max_seq_len=256,
                tie_embeddings=True,
            )
            | kw
        )
    )
    torch.manual_seed(0)
    model = Llama(args).eval()
    with torch.no_grad():  # non-trivial norm weights, so a dropped or swapped norm would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def snapshot(model: Llama, root: Path, tokenizer_dir: Path | None) -> Path:
    """A model-only checkpoint written by the real checkpoint code, as training writes it."""
    meta = {
        "model_args": model.args.to_dict(),
        "tokenizer_dir": str(tokenizer_dir) if tokenizer_dir else None,
        "tokens_seen": 0,
    }
    return save_checkpoint(root, 7, model, None, meta, kind="model_only")


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(tie_embeddings=False, rope_theta=500_000.0, rope_scaling=SCALING)],
    ids=["tied", "untied-llama3-rope"],
)
def test_transformers_loads_export_and_agrees(kw, tokenizer_dir, tmp_path):
    tok = load_tokenizer(tokenizer_dir)
    model = make_model(tok.vocab_size, **kw)
    ckpt = snapshot(model, tmp_path / "checkpoints", tokenizer_dir)
    out = tmp_path / "hf"
    summary = export_hf(ckpt, out)
    assert summary["shards"] == 1 and (out / "model.safetensors").is_file()
    assert set(summary["tokenizer_files"]) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    assert ("lm_head.weight" in load_file(str(out / "model.safetensors"))) is (not model.args.tie_embeddings)

    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.dtype == torch.float32
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    ids = tok.encode(text)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ids
    assert (hf_tok.pad_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id) == (0, 1, 2)

    batch = torch.tensor([[1] + ids])
    with torch.no_grad():
        diff = (hf(batch).logits - model(batch)).abs().max().item()
    assert diff < 1e-4
    ours = generate(model, [1] + ids[:5], max_new_tokens=24)
    theirs = hf.generate(
        torch.tensor([[1] + ids[:5]]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, 6:].tolist()
    assert ours == theirs and len(ours) == 24

    record = json.loads((out / "oreline_export.json").read_text())
    assert record["step"] == 7 and record["model_args"] == model.args.to_dict()
    assert record["files"]["config.json"]["bytes"] == (out / "config.json").stat().st_size


def test_sharded_export_loads(tokenizer_dir, tmp_path):
    model = make_model(512, tie_embeddings=False)
    out = tmp_path / "hf"
    summary = export_state_dict_hf(model.state_dict(), model.args, tokenizer_dir, out, max_shard_bytes=60_000)
    assert summary["shards"] > 3
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(v.numel() * 4 for v in model.state_dict().values())
    assert not (out / "model.safetensors").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, 512, (1, 40))
    with torch.no_grad():
        assert (hf(x).logits - model(x)).abs().max().item() < 1e-4
    # importing the shards gives back the same tensors, bit for bit
    sd = import_hf(out, tmp_path / "imported")
    assert sd.keys() == model.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


def test_export_import_round_trip_is_exact(tokenizer_dir, tmp_path):
    model = make_model(512, rope_scaling=SCALING, depth_scaled_init=True)
    export_state_dict_hf(model.state_dict(), model.args, tokenizer_dir, tmp_path / "hf")
    back = tmp_path / "imported"
    import_hf(tmp_path / "hf", back)
    assert verify_checkpoint(back)[0]
    sd, args, meta = load_model_state(back)
    assert meta["kind"] == "model_only" and (Path(meta["tokenizer_dir"]) / "tokenizer.json").is_file()
    # init_std / depth_scaled_init do not travel through HF's config; the shapes and numerics do
    assert args.to_dict() | {"depth_scaled_init": True} == model.args.to_dict()
    assert sd.keys() == model.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
    # and the import exports again to the same weights file
    export_hf(back, tmp_path / "hf2")
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == (
        tmp_path / "hf2" / "model.safetensors"
    ).read_bytes()


def test_import_records_the_training_step_of_the_weights(tmp_path):
    """import-hf recorded step 0 for every folder: an export of step 37 became a "step 0" model."""
    import json
    import shutil

    model = make_model(512)
    export_state_dict_hf(model.state_dict(), model.args, None, tmp_path / "hf", provenance={"step": 37})
    import_hf(tmp_path / "hf", tmp_path / "a")
    _, _, meta = load_model_state(tmp_path / "a")
    assert (meta["step"], meta["step_from"]) == (37, "oreline_export.json")
    assert verify_checkpoint(tmp_path / "a")[0]

    trainer = tmp_path / "trainer"  # a transformers Trainer checkpoint says it in trainer_state.json
    shutil.copytree(tmp_path / "hf", trainer)
    (trainer / "oreline_export.json").unlink()
    (trainer / "trainer_state.json").write_text(json.dumps({"global_step": 500, "epoch": 1.0}))
    import_hf(trainer, tmp_path / "b")
    assert load_model_state(tmp_path / "b")[2]["step"] == 500

    (trainer / "trainer_state.json").unlink()  # a folder that does not say: unknown, not 0
    import_hf(trainer, tmp_path / "c")
    assert load_model_state(tmp_path / "c")[2]["step"] is None


def test_import_of_a_transformers_save(tmp_path):
    """A folder written by transformers itself (5.x `rope_parameters` config) imports and agrees."""
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=300,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500_000.0, **SCALING},
    )
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    sd = import_hf(tmp_path / "hf", tmp_path / "ours")
    _, args, _ = load_model_state(tmp_path / "ours")
    assert args.rope_scaling == SCALING and args.n_kv_heads == 1 and args.norm_eps == 1e-6
    model = Llama(args).eval()
    model.load_state_dict(sd, strict=True)
    x = torch.randint(0, 300, (2, 90))
    with torch.no_grad():
        assert (model(x) - hf(x).logits).abs().max().item() < 1e-5


def test_import_refuses_what_it_cannot_represent(tmp_path):
    model = make_model(512)
    good = tmp_path / "hf"
    export_state_dict_hf(model.state_dict(), model.args, None, good)
    config = json.loads((good / "config.json").read_text())

    bias = tmp_path / "bias"
    export_state_dict_hf(model.state_dict(), model.args, None, bias)
    (bias / "config.json").write_text(json.dumps(config | {"mlp_bias": True}))
    with pytest.raises(ConfigError, match="mlp_bias=True"):
        import_hf(bias, tmp_path / "x")

    wrong = tmp_path / "wrong"
    export_state_dict_hf(model.state_dict(), model.args, None, wrong)
    (wrong / "config.json").write_text(json.dumps(config | {"intermediate_size": 200}))
    with pytest.raises(
        ConfigError, match=r"model.layers.0.mlp.(gate|up|down)_proj.weight has shape .*expects .*200"
    ):
        import_hf(wrong, tmp_path / "x")

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps(config))
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(InputError, match="never unpickles"):
        import_hf(pickled, tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_export_refuses_mismatch_and_foreign_out_dir(tmp_path):
    model = make_model(512)
    with pytest.raises(ConfigError, match="model.norm.weight has shape"):
        export_state_dict_hf(
            model.state_dict() | {"model.norm.weight": torch.ones(65)}, model.args, None, tmp_path / "a"
        )
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    with pytest.raises(InputError, match="not an earlier output"):
        export_state_dict_hf(model.state_dict(), model.args, None, foreign)
    assert (foreign / "todo.txt").read_text() == "mine"
    export_state_dict_hf(model.state_dict(), model.args, None, tmp_path / "b")
    export_state_dict_hf(model.state_dict(), model.args, None, tmp_path / "b")  # an export is replaced


def test_cli_export_and_import(tokenizer_dir, tmp_path):
    model = make_model(512)
    ckpt = snapshot(model, tmp_path / "run" / "checkpoints", tokenizer_dir)
    runner = CliRunner()
    result = runner.invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    flat = result.output.replace("\n", "")  # rich wraps long paths
    assert "(step 7)" in flat and ckpt.name in flat
    result = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")])
    assert result.exit_code == 0, result.output
    assert f"{model.num_params():,} parameters" in result.output.replace("\n", " ")
    sd, _, _ = load_model_state(tmp_path / "back")
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


def test_export_refuses_non_finite_weights(tmp_path):
    model = make_model(512)
    sd = model.state_dict()
    sd["model.layers.1.self_attn.v_proj.weight"] = sd["model.layers.1.self_attn.v_proj.weight"].clone()
    sd["model.layers.1.self_attn.v_proj.weight"][3, 5] = float("nan")
    with pytest.raises(DataIntegrityError, match="model.layers.1.self_attn.v_proj.weight holds NaN"):
        export_state_dict_hf(sd, model.args, None, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_cli_bf16_sharded_export(tokenizer_dir, tmp_path):
    model = make_model(512)
    snapshot(model, tmp_path / "run" / "checkpoints", tokenizer_dir)
    result = CliRunner().invoke(
        app,
        [
            "export",
            str(tmp_path / "run"),
            "--out",
            str(tmp_path / "hf"),
            "--dtype",
            "bfloat16",
            "--max-shard-bytes",
            "40000",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    shards = sorted((tmp_path / "hf").glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and all(
        t.dtype == torch.bfloat16 for f in shards for t in load_file(str(f)).values()
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    sd = import_hf(tmp_path / "hf", tmp_path / "back")  # back to fp32: the bf16-rounded weights exactly
    assert all(torch.equal(sd[k], v.to(torch.bfloat16).float()) for k, v in model.state_dict().items())
    rounded = Llama(model.args).eval()
    rounded.load_state_dict(sd)
    x = torch.randint(0, 512, (1, 32))
    with torch.no_grad():
        assert (hf(x).logits - rounded(x)).abs().max().item() < 1e-4


def test_cli_export_with_a_binary_tokenizer_json_names_the_file(tokenizer_dir, tmp_path, oreline_cli):
    import shutil

    broken = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_dir, broken)
    (broken / "tokenizer.json").write_bytes(bytes(range(128, 256)) * 16)
    snapshot(make_model(512), tmp_path / "run" / "checkpoints", broken)
    code, out = oreline_cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), timeout=300)
    assert code == 2 and "Traceback" not in out, out
    assert f"{broken / 'tokenizer.json'} is not UTF-8 text" in out and "oreline tokenizer train" in out
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------------------------
# clients feed the model as it was trained: [BOS] text, no EOS, the trained context

PROMPTS = ["First Citizen:", "Before we proceed", "ROMEO:\nO, she doth teach", "a literal <s> in a prompt"]


def trained_snapshot(model: Llama, root: Path, tokenizer_dir: Path, seq_len: int) -> Path:
    """A model-only checkpoint whose meta records the run's config, as oreline train writes it."""
    meta = {
        "model_args": model.args.to_dict(),
        "tokenizer_dir": str(tokenizer_dir),
        "tokens_seen": 0,
        "config": {"train": {"seq_len": seq_len}},
    }
    return save_checkpoint(root, 3, model, None, meta, kind="model_only")


@pytest.fixture(scope="module")
def exported(demo_model, tokenizer_dir, tmp_path_factory):
    """The demo-like model, its run trained at 128 of its 256 positions, exported."""
    root = tmp_path_factory.mktemp("clients")
    model, tok = demo_model
    export_hf(trained_snapshot(model, root / "checkpoints", tokenizer_dir, seq_len=128), root / "hf")
    return model, tok, root / "hf"


def test_exported_tokenizer_adds_one_bos_and_no_eos(exported, tokenizer_dir):
    from tokenizers import Tokenizer

    from oreline.tokens.format import PROBE_TEXTS, check_inference_tokenizer

    _, tok, out = exported
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    bare = Tokenizer.from_file(str(out / "tokenizer.json"))
    bare.encode_special_tokens = True  # what oreline (and transformers' split_special_tokens) set on load
    texts = [*PROBE_TEXTS, *PROMPTS, "</s> and <pad> inside", "<s><s>"]
    for text in texts:
        want = [tok.bos_id] + tok.encode(text)  # what training put in front of the same text
        enc = hf_tok(text)
        assert enc["input_ids"] == want, text
        assert set(enc) == {"input_ids", "attention_mask"}  # no token_type_ids for generate(**enc)
        assert bare.encode(text).ids == want, text
        assert hf_tok.decode(enc["input_ids"], skip_special_tokens=True) == text
    literal = hf_tok("<s>")["input_ids"]
    assert literal.count(tok.bos_id) == 1 and literal[0] == tok.bos_id and len(literal) > 2
    # the trained context, declared where clients look for it; truncation keeps BOS in front
    assert hf_tok.model_max_length == 128 and hf_tok.padding_side == "left"
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 128
    long = hf_tok("to be or not " * 200, truncation=True)["input_ids"]
    assert len(long) == 128 and long[0] == tok.bos_id and long.count(tok.bos_id) == 1
    record = json.loads((out / "oreline_export.json").read_text())
    assert record["context_len"] == 128 and record["training_format"]["document"] == "<s> text </s>"
    # the doctor's agreement check passes the export and names what is wrong with the training form
    assert check_inference_tokenizer(out, tok.bos_id, tok.eos_id, 128) == []
    problems = check_inference_tokenizer(tokenizer_dir, tok.bos_id, tok.eos_id, 128)
    assert any("adds no BOS" in p for p in problems) and any(
        "model_max_length=1000000000" in p for p in problems
    )


@pytest.mark.slow  # ~13 HF generate calls: 15-70 s on a shared 2-core machine
def test_default_generate_equals_oreline_eval(exported):
    """generate(**tokenizer(prompt)) and pipeline() with default settings continue exactly as oreline eval."""
    from oreline.model.scoring import generate_samples

    model, tok, out = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ours = [g["ids"] for g in generate_samples(model, tok, PROMPTS, max_new_tokens=20, greedy=True)]
    theirs, unfed = [], []
    for prompt in PROMPTS:
        enc = hf_tok(prompt, return_tensors="pt")
        n = enc["input_ids"].shape[1]
        theirs.append(hf.generate(**enc, max_new_tokens=20)[0, n:].tolist())
        bare = torch.tensor([tok.encode(prompt)])  # the pre-fix default: no BOS
        unfed.append(
            hf.generate(bare, attention_mask=torch.ones_like(bare), max_new_tokens=20)[
                0, bare.shape[1] :
            ].tolist()
        )
    assert theirs == ours
    assert unfed != ours  # the test can tell: without BOS the model continues differently
    # batched, with the exported default (left) padding: the same tokens as one prompt at a time
    batch = hf_tok(PROMPTS, padding=True, return_tensors="pt")
    rows = hf.generate(**batch, max_new_tokens=20)[:, batch["input_ids"].shape[1] :].tolist()
    trimmed = [row[: row.index(tok.eos_id) + 1] if tok.eos_id in row else row for row in rows]
    assert trimmed == ours
    # pipeline("text-generation") (which samples unless told otherwise) feeds the same [BOS] prompt
    pipe = transformers.pipeline("text-generation", model=hf, tokenizer=hf_tok)
    texts = [
        pipe(p, max_new_tokens=20, do_sample=False, return_full_text=False)[0]["generated_text"]
        for p in PROMPTS
    ]
    assert texts == [tok.decode(ids) for ids in ours]


def test_import_restores_the_training_tokenizer(exported, tokenizer_dir, tmp_path):
    _, tok, out = exported
    import_hf(out, tmp_path / "back")
    _, _, meta = load_model_state(tmp_path / "back")
    back = load_tokenizer(meta["tokenizer_dir"])
    assert back.fingerprint == tok.fingerprint  # the shards' and checkpoints' tokenizer, exactly
