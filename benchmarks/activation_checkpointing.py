"""train.activation_checkpointing none / full / selective: peak memory and time of a training step.

Each mode runs in a fresh process (one thread, fp32, the reference kernels unless --kernels cpu):
a Llama of --dim/--layers (ffn 3·dim, vocab 8192, 8 heads / 4 kv heads), forward + backward of
--batch × --seq tokens. Peak memory is the growth of the process's peak RSS (ru_maxrss) over its
RSS once the model and its gradients exist (one untimed step first); time is the median CPU time
(process_time) of --steps steps. On CUDA (--device cuda) torch.cuda.max_memory_allocated and wall
time instead; there the target is selective ≥ 1.08× full's tokens/s (benchmarks/gpu_check.py
measures it under FSDP2 and bf16 too).

    .venv/bin/python benchmarks/activation_checkpointing.py [--dim 512] [--layers 4] [--seq 1024] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

MODES = ("none", "full", "selective")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(mode: str, a: argparse.Namespace) -> dict:
    import torch

    from oreline.model.kernels.select import kernels_for
    from oreline.model.llama import Llama, ModelArgs
    from oreline.train.performance import enable_activation_checkpointing

    torch.set_num_threads(1)
    dev = torch.device(a.device)
    args = ModelArgs(
        dim=a.dim, n_layers=a.layers, n_heads=8, n_kv_heads=4, vocab_size=8192, ffn_dim=3 * a.dim,
        max_seq_len=a.seq, tie_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Llama(args, kernels_for(a.kernels, dev)).to(dev)
    enable_activation_checkpointing(model, mode)
    ids = torch.randint(0, 8192, (a.batch, a.seq), device=dev)
    labels = torch.roll(ids, -1, dims=1)

    def step() -> float:
        model.zero_grad(set_to_none=False)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter() if dev.type == "cuda" else time.process_time()
        (model(ids, labels=labels).sum() / labels.numel()).backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return (time.perf_counter() if dev.type == "cuda" else time.process_time()) - t0

    step()  # the gradients exist from here on: the baseline holds them
    if dev.type == "cuda":
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        base = rss_bytes()
    times = [step() for _ in range(a.steps)]
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    grads = float(sum(p.grad.double().pow(2).sum() for p in model.parameters()) ** 0.5)
    return {"seconds": statistics.median(times), "peak_bytes": peak, "grad_norm": grads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--kernels", default="reference", choices=("reference", "cpu"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a)))
        return 0
    print(
        f"activation checkpointing: dim {a.dim}, {a.layers} layers, {a.batch} × {a.seq} tokens, fp32, "
        f"{a.kernels} kernels on {a.device}, 1 thread; peak = growth over the model + gradients"
    )
    results = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--child", mode] + [
            f"--{k}={v}" for k, v in vars(a).items() if k != "child"
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            print(f"  {mode}: failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}")
            continue
        results[mode] = r = json.loads(proc.stdout.strip().splitlines()[-1])
        line = f"  {mode:<9} peak {r['peak_bytes'] / 2**20:8.0f} MiB  {1000 * r['seconds']:8.0f} ms/step"
        if "none" in results and mode != "none":
            ref = results["none"]
            line += (
                f"  memory ×{r['peak_bytes'] / max(ref['peak_bytes'], 1):.2f}, time ×{r['seconds'] / ref['seconds']:.2f}"
                f" of none; grad norm rel. diff {abs(r['grad_norm'] - ref['grad_norm']) / ref['grad_norm']:.1e}"
            )
        print(line, flush=True)
    if "full" in results and "selective" in results:
        f, s = results["full"], results["selective"]
        print(
            f"  selective vs full: {f['seconds'] / s['seconds']:.2f}× the speed, "
            f"memory ×{s['peak_bytes'] / max(f['peak_bytes'], 1):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
