"""Tokens/s of `oreline train` on 1 and 2 gloo ranks (DDP and FSDP2) and the communication share.

Corpus: Jane Austen's *Emma* from the samples (nltk-gutenberg), ~1,500-character documents, a
512-token byte-level BPE, tokenized by oreline's own functions (as in tests/train/conftest.py).
Model: the `debug` preset (default) or `demo` (--preset demo; its 8192-row embedding is larger
than the 512-token vocabulary, which only costs memory). Every run has the same global batch:

    1 rank  × 1 thread : micro M × accum 2A            (the reference)
    1 rank  × 2 threads: micro M × accum 2A            (the peer that uses both cores in one process)
    2 ranks × 1 thread : micro M × accum A, ddp / fsdp (OMP_NUM_THREADS=1: 2 ranks on 2 cores)

Each run is a real `oreline train` subprocess (2 ranks through torchrun --standalone), one after
the other. From its metrics.jsonl: the median over logged steps (the first 3 left out: warm-up) of
tokens_per_s (global tokens / step wall time, averaged over ranks), step_ms, and, for 2 ranks,
comm_ms / comm_frac (the span of gradient all-reduce / reduce-scatter plus the loop's small
all-reduces; see oreline.train.comm_timing). Ratios are against the 1-rank runs of the same invocation.

On a machine whose cores are shared with other work the figures move from run to run: the
printed load average says how busy it was, and `cores` (CPU seconds of all the run's processes,
start-up included, / its wall time) how much CPU the run actually got — under contention two
processes get about twice the CPU of one, which alone can make 2 ranks look better than 2×. Run: .venv/bin/python benchmarks/ddp_scaling.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from oreline.config import TokenizeConfig, TokenizerConfig, samples_dir
from oreline.tokens.tokenize import tokenize_corpus
from oreline.tokens.train_bpe import train_tokenizer
from oreline.train.torchrun import torchrun_command


def blocks(text: str, target: int = 1500) -> list[str]:
    out, cur, size = [], [], 0
    for para in text.replace("\r\n", "\n").split("\n\n"):
        para = " ".join(para.split())
        if para:
            cur.append(para)
            size += len(para)
        if size >= target:
            out.append("\n\n".join(cur))
            cur, size = [], 0
    return out + (["\n\n".join(cur)] if cur else [])


def build_tokens(root: Path) -> tuple[Path, Path]:
    with zipfile.ZipFile(samples_dir() / "english-prose" / "nltk-gutenberg.zip") as zf:
        text = zf.read("gutenberg/austen-emma.txt").decode("utf-8", "replace")
    docs = root / "emma.jsonl"
    with docs.open("w", encoding="utf-8") as fh:
        for i, b in enumerate(blocks(text)):
            fh.write(json.dumps({"id": f"emma-{i}", "text": b}) + "\n")
    train_tokenizer([docs], root / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=20))
    tokenize_corpus([docs], root / "tokenizer", root / "tokens", TokenizeConfig(val_fraction=0.1, workers=1))
    return root / "tokens", root / "tokenizer"


def config(path: Path, runs: Path, tokens: Path, tokenizer: Path, a: argparse.Namespace) -> Path:
    path.write_text(f"""
[run]
runs_dir = "{runs}"
[model]
preset = "{a.preset}"
[train]
tokens = "{tokens}"
tokenizer = "{tokenizer}"
seq_len = {a.seq_len}
micro_batch = {a.micro}
steps = {a.steps}
log_every = 1
eval_every = 0
eval_sequences = {a.micro}
[checkpoint]
every = 0
[eval]
prompts = []
""")
    return path


def run(name: str, cfg: Path, runs: Path, nproc: int, threads: int, accum: int, parallel: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "oreline",
        "train",
        "-c",
        str(cfg),
        f"run.name={name}",
        f"train.grad_accum={accum}",
        f"train.parallel={parallel}",
        "--resume",
        "none",
    ]
    if nproc > 1:
        cmd = torchrun_command(nproc, cmd[3:])  # cmd[3:]: the arguments after `python -m oreline`
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, ru1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (
        ru1.ru_stime - ru0.ru_stime
    )  # all its processes, start-up included
    if proc.returncode != 0:
        raise SystemExit(
            f"{name} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    recs = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in recs if r["type"] == "train"][3:]

    def med(key: str) -> float | None:
        vals = [r[key] for r in train if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    return {
        "name": name,
        "ranks": nproc,
        "threads": threads,
        "tps": med("tokens_per_s"),
        "step_ms": med("step_ms"),
        "comm_ms": med("comm_ms"),
        "comm_frac": med("comm_frac"),
        "wall_s": wall,
        "cores": cpu / wall,
        "batch": recs[0]["global_batch"]["tokens"],
        "params": recs[0]["model"]["params"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="debug", choices=["debug", "demo"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--accum", type=int, default=2, help="A: accumulation per rank on 2 ranks (1 rank: 2A)")
    p.add_argument(
        "--repeats", type=int, default=1, help="rounds of all four runs; the fastest of each is shown"
    )
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokens, tokenizer = build_tokens(root)
        cfg = config(root / "bench.toml", root / "runs", tokens, tokenizer, a)
        load_before = os.getloadavg()
        plan = [
            ("r1t1", 1, 1, 2 * a.accum, "none"),
            ("r1t2", 1, 2, 2 * a.accum, "none"),
            ("ddp2", 2, 1, a.accum, "ddp"),
            ("fsdp2", 2, 1, a.accum, "fsdp"),
        ]
        rounds = [[run(name, cfg, root / "runs", *rest) for name, *rest in plan] for _ in range(a.repeats)]
        # rounds interleave the four runs, so a burst of other work on the shared cores hits one round
        results = [max(same, key=lambda r: r["tps"]) for same in zip(*rounds, strict=True)]
        load_after = os.getloadavg()
    base, peer = results[0]["tps"], results[1]["tps"]
    print(
        f"preset {a.preset} ({results[0]['params']:,} params), seq_len {a.seq_len}, global batch "
        f"{results[0]['batch']:,} tokens, {a.steps} steps (median of steps 4-{a.steps}), fastest of "
        f"{a.repeats} round(s); "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before / {load_after[0]:.1f} after"
    )
    print(
        f"{'run':<22}{'tokens/s':>10}{'step ms':>10}{'vs 1r×1t':>10}{'vs 1r×2t':>10}{'comm ms':>10}{'comm %':>8}{'wall s':>8}{'cores':>7}"
    )
    for r in results:
        label = f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''} × {r['threads']} thr" + (
            f" {r['name'][:-1]}" if r["ranks"] > 1 else ""
        )
        comm = "" if r["comm_ms"] is None else f"{r['comm_ms']:.1f}"
        frac = "" if r["comm_frac"] is None else f"{100 * r['comm_frac']:.0f}%"
        print(
            f"{label:<22}{r['tps']:>10,.0f}{r['step_ms']:>10.1f}{r['tps'] / base:>10.2f}{r['tps'] / peer:>10.2f}"
            f"{comm:>10}{frac:>8}{r['wall_s']:>8.1f}{r['cores']:>7.2f}"
        )


if __name__ == "__main__":
    main()
