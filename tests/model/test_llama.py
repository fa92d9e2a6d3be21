"""The Llama against Hugging Face's LlamaForCausalLM, document masking, init, shapes, generation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from oreline.errors import ConfigError
from oreline.model.llama import LayerKV, Llama, ModelArgs, apply_rope_scaling, check_shapes, generate

transformers = pytest.importorskip("transformers")

LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def tiny(**kw) -> ModelArgs:
    base = dict(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=301,
        ffn_dim=160,
        max_seq_len=128,
        tie_embeddings=False,
        rope_theta=10_000.0,
    )
    return ModelArgs(**(base | kw))


def hf_twin(model: Llama):
    """A transformers LlamaForCausalLM with the same config and the same weights (identity rename)."""
    a = model.args
    rope = {"rope_type": "default", "rope_theta": a.rope_theta}
    if a.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": a.rope_theta, **a.rope_scaling}
    cfg = transformers.LlamaConfig(
        hidden_size=a.dim,
        intermediate_size=a.ffn_dim,
        num_hidden_layers=a.n_layers,
        num_attention_heads=a.n_heads,
        num_key_value_heads=a.n_kv_heads,
        vocab_size=a.vocab_size,
        max_position_embeddings=a.max_seq_len,
        rms_norm_eps=a.norm_eps,
        tie_word_embeddings=a.tie_embeddings,
        rope_parameters=rope,
        attn_implementation="eager",
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    hf = transformers.LlamaForCausalLM(cfg).eval()
    sd = model.state_dict()
    if a.tie_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    hf.load_state_dict(sd, strict=True)
    return hf


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # GQA (4 query heads, 2 kv heads), untied
        dict(n_kv_heads=4, tie_embeddings=True),  # plain multi-head, tied
        dict(n_kv_heads=1, rope_theta=500_000.0, rope_scaling=LLAMA3_SCALING),  # MQA + Llama-3 RoPE scaling
    ],
    ids=["gqa-untied", "mha-tied", "mqa-llama3-rope"],
)
def test_logits_match_hf_llama(kw):
    torch.manual_seed(0)
    model = Llama(tiny(**kw)).eval()
    hf = hf_twin(model)
    ids = torch.randint(0, model.args.vocab_size, (2, 100))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.dtype == torch.float32 and ours.shape == (2, 100, model.args.vocab_size)
    assert (ours - theirs).abs().max().item() < 1e-5


def test_llama3_scaling_changes_low_frequencies_only():
    inv = 1.0 / (500_000.0 ** (torch.arange(0, 64, 2).float() / 64))
    scaled = apply_rope_scaling(inv, LLAMA3_SCALING | {"original_max_position_embeddings": 8192})
    assert torch.equal(scaled[:4], inv[:4])  # short wavelengths untouched
    assert torch.allclose(scaled[-1], inv[-1] / 8.0)  # the longest divided by factor


def test_greedy_generation_matches_hf():
    torch.manual_seed(1)
    model = Llama(tiny(tie_embeddings=True)).eval()
    hf = hf_twin(model)
    prompt = [5, 17, 42, 99, 3]
    ours = generate(model, prompt, max_new_tokens=20)
    theirs = hf.generate(
        torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(prompt) :].tolist()
    assert ours == theirs and len(ours) == 20


def test_doc_mask_isolates_documents():
    torch.manual_seed(2)
    model = Llama(tiny()).eval()
    a, b = torch.randint(0, 301, (1, 30)), torch.randint(0, 301, (1, 50))
    packed = torch.cat([a, b], dim=1)
    doc_ids = torch.tensor([[0] * 30 + [1] * 50])
    with torch.no_grad():
        masked = model(packed, doc_ids=doc_ids)
        alone_a, alone_b, unmasked = model(a), model(b), model(packed)
    # The first document sees exactly what it sees alone; the second one too, although its
    # positions start at 30: RoPE scores depend on relative offsets only.
    assert torch.allclose(masked[:, :30], alone_a, atol=1e-5)
    assert torch.allclose(masked[:, 30:], alone_b, atol=1e-4)
    assert not torch.allclose(unmasked[:, 30:], alone_b, atol=1e-3)  # without the mask it leaks
    with torch.no_grad():
        one_doc = model(packed, doc_ids=torch.zeros_like(doc_ids))
    assert torch.allclose(one_doc, unmasked, atol=1e-5)


def test_init_std_and_depth_scaling():
    args = ModelArgs(
        dim=256,
        n_layers=8,
        n_heads=4,
        n_kv_heads=4,
        vocab_size=1000,
        ffn_dim=512,
        depth_scaled_init=True,
        init_std=0.02,
    )
    torch.manual_seed(0)
    model = Llama(args)
    layer = model.model.layers[3]
    assert layer.self_attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert layer.mlp.up_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    scaled = 0.02 / math.sqrt(2 * 8)
    assert layer.self_attn.o_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert layer.mlp.down_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert torch.equal(layer.input_layernorm.weight, torch.ones(256))
    assert torch.equal(model.model.norm.weight, torch.ones(256))


def test_meta_construction_then_materialise():
    args = tiny(tie_embeddings=True)
    with torch.device("meta"):
        model = Llama(args)
    assert model.model.embed_tokens.weight.is_meta
    model.to_empty(device="cpu")
    model.init_weights()  # what FSDP users do after fully_shard on a meta model
    torch.manual_seed(3)
    reference = Llama(args)
    assert torch.equal(model.rope_cos, reference.rope_cos) and torch.equal(model.rope_sin, reference.rope_sin)
    out = model(torch.randint(0, 301, (1, 16)))
    assert torch.isfinite(out).all()


def test_tied_model_has_no_lm_head_and_counts():
    tied, untied = Llama(tiny(tie_embeddings=True)), Llama(tiny())
    assert "lm_head.weight" not in tied.state_dict() and tied.output_weight is tied.model.embed_tokens.weight
    assert untied.num_params() - tied.num_params() == 301 * 64
    assert tied.num_params(exclude_embedding=True) == tied.num_params() - 301 * 64
    assert untied.num_params(exclude_embedding=True) == untied.num_params() - 301 * 64


def test_check_shapes_names_the_offending_tensor():
    args = tiny()
    sd = Llama(args).state_dict()
    check_shapes(sd, args)
    bad = dict(sd)
    bad["model.layers.1.mlp.up_proj.weight"] = torch.zeros(161, 64)
    with pytest.raises(ConfigError, match=r"model.layers.1.mlp.up_proj.weight has shape \(161, 64\)"):
        check_shapes(bad, args)
    missing = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    with pytest.raises(ConfigError, match="model.norm.weight is missing"):
        check_shapes(missing, args)
    with pytest.raises(ConfigError, match="unexpected tensor model.layers.2"):
        check_shapes(Llama(tiny(n_layers=3)).state_dict(), args)
    with pytest.raises(
        ConfigError, match=r"model.embed_tokens.weight has shape \(301, 64\), the config expects \(302, 64\)"
    ):
        check_shapes(sd, tiny(vocab_size=302))
    with pytest.raises(ConfigError, match="lm_head.weight differs from model.embed_tokens.weight"):
        check_shapes(sd, tiny(tie_embeddings=True))  # an untied head would be silently dropped
    tied_copy = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    tied_copy["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    check_shapes(tied_copy, tiny(tie_embeddings=True))
    with pytest.raises(ConfigError, match="lm_head.weight is missing"):
        check_shapes({k: v for k, v in sd.items() if k != "lm_head.weight"}, args)


def test_model_args_round_trip_and_validation():
    args = tiny(rope_scaling=LLAMA3_SCALING, depth_scaled_init=True)
    back = ModelArgs.from_dict(json.loads(json.dumps(args.to_dict())))
    assert back == args and back.head_dim == 16
    with pytest.raises(ConfigError, match="not divisible"):
        tiny(dim=66)
    with pytest.raises(ConfigError, match="multiple of model.n_kv_heads"):
        tiny(n_kv_heads=3)
    with pytest.raises(ConfigError, match="unknown keys"):
        ModelArgs.from_dict(args.to_dict() | {"n_experts": 8})
    with pytest.raises(ConfigError, match="rope_scaling lacks"):
        tiny(rope_scaling={"factor": 8.0})


def test_too_long_sequence_is_refused():
    model = Llama(tiny(max_seq_len=16))
    with pytest.raises(ConfigError, match="max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    torch.manual_seed(4)
    model = Llama(tiny()).eval()
    prompt = [1, 2, 3]
    draw = [
        generate(model, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert draw[0] == draw[1]
    greedy = generate(model, prompt, 8)
    assert generate(model, prompt, 8, temperature=1.0, top_k=1) == greedy
    stop = greedy[4]
    cut = generate(model, prompt, 8, eos_id=stop)
    assert cut == greedy[: greedy.index(stop) + 1]


def test_a_few_steps_learn_a_batch():
    torch.manual_seed(5)
    model = Llama(tiny())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 301, (2, 17))
    losses = []
    for _ in range(12):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 301), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(301), rel=0.05)  # init predicts ~uniformly
    assert losses[-1] < 0.5 * losses[0]


def test_kv_cache_matches_full_recompute():
    torch.manual_seed(6)
    model = Llama(tiny(max_seq_len=24)).eval()
    ids = torch.randint(0, 301, (1, 20))
    cache = [LayerKV() for _ in model.model.layers]
    with torch.no_grad():
        full = model(ids)
        prefill = model(ids[:, :12], cache=cache)
        steps = [model(ids[:, t : t + 1], cache=cache) for t in range(12, 20)]
    assert len(cache[0]) == 20
    assert torch.allclose(prefill, full[:, :12], atol=1e-5)
    assert torch.allclose(torch.cat(steps, dim=1), full[:, 12:], atol=1e-5)
    # a generation that slides past max_seq_len gives the same tokens with and without the cache
    prompt = ids[0, :10].tolist()
    assert generate(model, prompt, 20) == generate(model, prompt, 20, use_cache=False)
