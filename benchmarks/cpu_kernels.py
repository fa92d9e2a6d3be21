"""oreline's CPU kernels against the plain reference, one at a time and in a whole training step.

Each line times forward + backward of one kernel (or one optimizer step of the train_vs_hf model:
vocab 8192, dim 256, 4 layers, 8/4 heads, MLP 768, seq 256, batch 8, fp32, fused AdamW, clip 1.0)
with the CPU set and with the reference, interleaved round by round, and prints the ratio of the
medians of this process's CPU time (time.process_time), which other jobs on a shared machine
disturb much less than wall time. Read the ratios, not the milliseconds.

    .venv/bin/python benchmarks/cpu_kernels.py [--threads 1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from oreline.model.kernels import matmul, rmsnorm, rope
from oreline.model.kernels.select import cpu_kernels
from oreline.model.llama import REFERENCE, Llama, ModelArgs, apply_rope, rms_norm, rope_tables
from oreline.train.performance import tune_cpu_allocator

ARGS = ModelArgs(
    vocab_size=8192,
    dim=256,
    n_layers=4,
    n_heads=8,
    n_kv_heads=4,
    ffn_dim=768,
    max_seq_len=512,
    tie_embeddings=False,
)
B, T = 8, 256


def timed(fn, rounds: int, reps: int) -> list[float]:
    fn()
    out = []
    for _ in range(rounds):
        c0 = time.process_time()
        for _ in range(reps):
            fn()
        out.append((time.process_time() - c0) / reps)
    return out


def compare(name: str, ours, ref, rounds: int, reps: int) -> None:
    a, b = [], []
    for _ in range(rounds):  # interleaved: a load change hits both sides alike
        a += timed(ours, 1, reps)
        b += timed(ref, 1, reps)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:44s} cpu {1e3 * ma:8.2f} ms vs reference {1e3 * mb:8.2f} ms: {mb / ma:.2f}×")


def fwd_bwd(fn, *shapes):
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(*s, generator=gen).requires_grad_() for s in shapes]

    def run():
        out = fn(*xs)
        outs = out if isinstance(out, list | tuple) else [out]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tune_cpu_allocator()
    backend, how = matmul.machine_choice()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}; {backend}: {how}"
    )
    d = ARGS.dim
    w = torch.ones(d, requires_grad=True)
    compare(
        "RMSNorm (8, 256, 256)",
        fwd_bwd(lambda x: rmsnorm.rms_norm(x, w, 1e-5), (B, T, d)),
        fwd_bwd(lambda x: rms_norm(x, w, 1e-5), (B, T, d)),
        a.rounds,
        20,
    )
    cos, sin = rope_tables(ARGS)
    cos, sin = cos[:T], sin[:T]
    compare(
        "RoPE (8, 256, 8, 32)",
        fwd_bwd(lambda x: rope.apply_rope(x, cos, sin), (B, T, 8, 32)),
        fwd_bwd(lambda x: apply_rope(x, cos, sin), (B, T, 8, 32)),
        a.rounds,
        20,
    )
    torch.manual_seed(0)
    qkv = [matmul.Linear(d, n, backend) for n in (256, 128, 128)]
    compare(
        f"q/k/v: one stacked product vs three ({backend})",
        fwd_bwd(lambda x: matmul.projections(x, qkv), (B, T, d)),
        fwd_bwd(lambda x: [lin(x) for lin in qkv], (B, T, d)),
        a.rounds,
        5,
    )
    ids = torch.randint(0, ARGS.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(0))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step_fn(kernels):
        torch.manual_seed(0)
        model = Llama(ARGS, kernels)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

        def step():
            (model(x, labels=y).sum() / y.numel()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    compare(
        "training step (model, clip, fused AdamW)",
        step_fn(cpu_kernels(backend)),
        step_fn(REFERENCE),
        a.rounds,
        2,
    )
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
