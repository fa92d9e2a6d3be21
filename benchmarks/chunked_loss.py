"""The output loss three ways: peak memory and time of forward + backward, and the ratios.

- reference: oreline.model.llama.token_cross_entropy (logits h·Wᵀ, `.float()`, F.cross_entropy):
  what `train.kernels = "reference"` computes, on CUDA by default until train.loss=chunked;
- fused: oreline.model.kernels.cross_entropy.linear_cross_entropy, the CPU kernels' loss (one
  fp32 tokens × vocab buffer, worked on in place);
- chunked: oreline.model.kernels.chunked_cross_entropy (`train.loss = "chunked"`): at most
  --chunk rows of logits at a time, recomputed in backward.

Each variant runs in a fresh process (one thread, fp32 unless --bf16): its peak memory is the
growth of the process's peak RSS (ru_maxrss) over its RSS once the inputs exist, or on CUDA
torch.cuda.max_memory_allocated over what the inputs hold; times are the median CPU time
(process_time; wall time on CUDA) of --repeats forward + backward passes, after one warm-up
pass at the smaller rows. Every variant's loss and gradient norms are printed with their
relative difference to the reference's.

    .venv/bin/python benchmarks/chunked_loss.py [--rows demo,8192x32000,8192x128256]
        [--dim 2048] [--chunk 1024] [--device cpu|cuda] [--bf16]

A row TOKENSxVOCAB runs at --dim (default 2048); "demo" is the demo model's head (2,048 tokens ×
8,192 vocab × dim 256). The 8,192 × 128,256 row needs about 13 GB for the reference (its fp32
logits are 4.2 GB, held three times over at its peak) and minutes of one CPU core per variant at dim 2048:
it is skipped with a message when the machine's available memory is short, and --dim 256 keeps its
logits (the memory in question) while making the products 8× cheaper.
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

VARIANTS = ("reference", "fused", "chunked")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(
    variant: str, tokens: int, vocab: int, dim: int, chunk: int, device: str, bf16: bool, repeats: int
) -> dict:
    """One variant in this process: the inputs, a warm-up (small rows), then the timed passes."""
    import torch

    from oreline.model.kernels.chunked_cross_entropy import chunked_linear_cross_entropy
    from oreline.model.kernels.cross_entropy import linear_cross_entropy
    from oreline.model.llama import token_cross_entropy

    torch.set_num_threads(1)
    fn = {
        "reference": token_cross_entropy,
        "fused": linear_cross_entropy,
        "chunked": lambda h, w, y: chunked_linear_cross_entropy(h, w, y, chunk_tokens=chunk),
    }[variant]
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, dim, generator=g) * 0.5).to(dev).requires_grad_()
    w = (torch.randn(vocab, dim, generator=g) * dim**-0.5).to(dev).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g).to(dev)
    labels[::16] = -100

    def once() -> float:
        h.grad = w.grad = None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter() if dev.type == "cuda" else time.process_time()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fn(h, w, labels)
        (loss.sum() / (labels != -100).sum()).backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return (time.perf_counter() if dev.type == "cuda" else time.process_time()) - t0

    big = tokens * vocab >= 8192 * 32000
    if not big:
        once()
    h.grad = w.grad = None
    base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else rss_bytes()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = [once() for _ in range(repeats)]
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    with torch.no_grad():
        loss = fn(h.detach(), w.detach(), labels).double().sum()
    return {
        "seconds": statistics.median(times),
        "peak_bytes": peak,
        "loss": float(loss),
        "dh_norm": float(h.grad.double().norm()),
        "dw_norm": float(w.grad.double().norm()),
    }


def available_bytes() -> int:
    import psutil

    return psutil.virtual_memory().available


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="demo,8192x32000,8192x128256")
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes (default 3, 1 at the large rows)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        variant, tokens, vocab, dim = a.child.split(":")
        print(
            json.dumps(
                child(variant, int(tokens), int(vocab), int(dim), a.chunk, a.device, a.bf16, a.repeats or 1)
            )
        )
        return 0
    print(
        f"output projection + cross entropy, forward + backward, {'bf16 autocast' if a.bf16 else 'fp32'} on "
        f"{a.device}, 1 thread, chunk {a.chunk} tokens; peak = growth over the inputs' memory"
    )
    for row in a.rows.split(","):
        tokens, vocab, dim = (2048, 8192, 256) if row == "demo" else (*map(int, row.split("x")), a.dim)
        big = tokens * vocab >= 8192 * 32000
        repeats = a.repeats or (1 if big else 3)
        results: dict[str, dict] = {}
        for variant in a.variants.split(","):
            # measured here at 8,192 × 32,000: the reference's peak is 3.0× its fp32 logits, the fused 1.07×
            need = {"reference": 3.2, "fused": 1.2}.get(variant, 0.0) * tokens * vocab * 4
            if a.device == "cpu" and need > 0.8 * available_bytes():
                print(
                    f"  {row} {variant}: skipped, needs ~{need / 2**30:.1f} GiB, {available_bytes() / 2**30:.1f} available"
                )
                continue
            cmd = [sys.executable, __file__, "--child", f"{variant}:{tokens}:{vocab}:{dim}", "--chunk", str(a.chunk),
                   "--device", a.device, "--repeats", str(repeats)] + (["--bf16"] if a.bf16 else [])  # fmt: skip
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
            )
            if proc.returncode != 0:
                print(f"  {row} {variant}: failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}")
                continue
            results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        ref = results.get("reference")
        print(
            f"{row}: {tokens:,} tokens × {vocab:,} vocab × dim {dim} (fp32 logits {tokens * vocab * 4 / 2**30:.2f} GiB)"
        )
        for variant, r in results.items():
            line = f"  {variant:<9} peak {r['peak_bytes'] / 2**30:6.2f} GiB  {r['seconds']:8.2f} s"
            if ref and variant != "reference":
                rel = max(
                    abs(r[k] - ref[k]) / max(abs(ref[k]), 1e-30) for k in ("loss", "dh_norm", "dw_norm")
                )
                line += (
                    f"  memory ×{r['peak_bytes'] / max(ref['peak_bytes'], 1):.3f}, time ×{r['seconds'] / ref['seconds']:.2f}"
                    f" of the reference; loss/grad norms rel. diff {rel:.1e}"
                )
            print(line)
        if "fused" in results and "chunked" in results:
            f, c = results["fused"], results["chunked"]
            print(
                f"  chunked vs fused: memory ×{c['peak_bytes'] / max(f['peak_bytes'], 1):.3f}, time ×{c['seconds'] / f['seconds']:.2f}"
            )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
