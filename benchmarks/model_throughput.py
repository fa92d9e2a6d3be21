"""Training and generation speed of oreline's Llama against transformers' LlamaForCausalLM.

Both models have the same shape (the `demo` preset unless --preset says otherwise) and the same
weights (copied through the export rename table), run fp32 on the same CPU threads, and are timed
in alternating rounds so that load from other processes hits both alike. Reported:

- train: tokens/s of one optimizer step (forward, cross-entropy, backward, AdamW) at batch × seq;
  oreline with and without the document mask (block-diagonal causal attention, 4 docs per row).
- generate: new tokens/s of greedy decoding from a 16-token prompt: oreline with its KV cache and
  without (re-running the context each step), HF `generate` with its cache.

Before timing, the logits of the two models are compared (max |Δ| printed) and generation is
checked token-identical, so the speed figures are of two implementations of the same function.
Generation runs first: the training rounds then change each model's weights differently.
Run: .venv/bin/python benchmarks/model_throughput.py [--preset demo] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from oreline.config import ModelConfig
from oreline.export.hf import DEFAULT_SPECIAL_IDS, hf_config
from oreline.model.llama import Llama, generate
from oreline.model.presets import flops_per_token, resolve_model_args


def hf_twin(model: Llama):
    """transformers' LlamaForCausalLM from the config.json `oreline export` writes, with these weights."""
    import transformers

    a = model.args
    cfg = transformers.LlamaConfig(**hf_config(a, DEFAULT_SPECIAL_IDS), attn_implementation="sdpa")
    hf = transformers.LlamaForCausalLM(cfg)
    sd = model.state_dict()
    if a.tie_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    hf.load_state_dict(sd, strict=True)
    return hf


def train_step_seconds(model, logits_fn, ids, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = logits_fn(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (median over rounds)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's). On a shared, oversubscribed CPU use 1: "
        "OpenMP barriers across contended cores made a tiny forward ~30x slower here",
    )
    opts = ap.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)

    torch.manual_seed(0)
    args = resolve_model_args(ModelConfig(preset=opts.preset))
    ours = Llama(args)
    hf = hf_twin(ours)
    B, T = opts.batch, opts.seq
    ids = torch.randint(0, args.vocab_size, (B, T + 1))
    doc_ids = torch.arange(T).div(T // 4, rounding_mode="floor").expand(B, T)  # 4 documents per row
    with torch.no_grad():
        diff = (ours.eval()(ids[:, :T]) - hf.eval()(ids[:, :T]).logits).abs().max().item()
    print(
        f"{opts.preset}: {ours.num_params():,} params, batch {B} × seq {T}, {torch.get_num_threads()} threads, "
        f"max |Δlogits| vs HF = {diff:.2e}"
    )

    prompt = ids[0, :16].tolist()
    gen = {"oreline (KV cache)": [], "oreline (no cache)": [], "hf generate (KV cache)": []}
    for _ in range(opts.rounds):
        t0 = time.perf_counter()
        a = generate(ours, prompt, opts.new_tokens)
        gen["oreline (KV cache)"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        a_nc = generate(ours, prompt, opts.new_tokens, use_cache=False)
        gen["oreline (no cache)"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad():
            b = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=opts.new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, 16:].tolist()
        gen["hf generate (KV cache)"].append(time.perf_counter() - t0)
    hf_gen = opts.new_tokens / statistics.median(gen["hf generate (KV cache)"])
    print(f"greedy generation of {opts.new_tokens} tokens: token-identical = {a == b == a_nc}")
    for name, secs in gen.items():
        tps = opts.new_tokens / statistics.median(secs)
        print(f"{name:24s} {tps:8.1f} tokens/s {tps / hf_gen:6.2f}x")

    ours.train(), hf.train()
    runs: dict[str, list[float]] = {"oreline": [], "oreline+doc_mask": [], "hf": []}
    for model, fn in ((ours, ours), (hf, lambda x: hf(x).logits)):
        train_step_seconds(model, fn, ids, 1)  # warm-up (allocator, first-call dispatch), not timed
    for _ in range(opts.rounds):
        runs["oreline"].append(train_step_seconds(ours, ours, ids, opts.steps))
        runs["hf"].append(train_step_seconds(hf, lambda x: hf(x).logits, ids, opts.steps))
        runs["oreline+doc_mask"].append(train_step_seconds(ours, lambda x: ours(x, doc_ids), ids, opts.steps))
    tokens = B * T
    hf_tps = tokens / statistics.median(runs["hf"])
    fpt = flops_per_token(args, T)
    print(f"{'train step':20s} {'tokens/s':>10s} {'GFLOP/s':>8s} {'vs HF':>6s}")
    for name, secs in runs.items():
        tps = tokens / statistics.median(secs)
        print(f"{name:20s} {tps:10,.0f} {tps * fpt / 1e9:8.1f} {tps / hf_tps:6.2f}x")


if __name__ == "__main__":
    main()
