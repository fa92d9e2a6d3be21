"""Peak host RSS per rank of FSDP2 training on CPU, before and after meta-device init (issue 33).

Each run is the real launch path of tests/train/test_distributed.py: `torchrun --standalone
--nproc_per_node=W -m oreline train -c CONFIG` on gloo, train.parallel = "fsdp", a few steps at a
tiny batch (seq_len 32, micro_batch 1, one micro-batch per step: activations are noise next to
the model), no checkpoint, no generation, one validation batch. While it runs, every rank's
/proc/PID/status VmHWM (the kernel's own peak-RSS high-water mark of that process) is read every
20 ms; the last value read before the rank exits is its peak. Per rank, never summed.

- after: this tree. The model is built on the meta device, wrapped, and each rank materialises
  and initialises only its shards (`oreline.train.session.build_model`).
- before: the tree at --before (default 2c2c919, the commit before meta-device init), checked out
  into a throwaway git worktree and put first on the ranks' PYTHONPATH: every rank built the full
  fp32 model on CPU (`Llama(args)`) and only then sharded it. Token data is prepared by each
  tree's own tokenizer and tokenize code, so a format change between the trees cannot matter.
  Only config keys both trees accept are set.

State: the full model's fp32 training state = params × 16 bytes (fp32 weights, fp32 gradients,
AdamW's exp_avg and exp_avg_sq). Under FSDP2 a rank's share of it is state / W.

The constant is what a rank holds whatever the model: the interpreter, torch and its libraries,
gloo's buffers, the token loader, allocator slack. It is measured, not assumed: the same launch
with the `debug` preset (~0.1M parameters, a state of ~2 MB), per tree and world size, whose
peak RSS minus its state / W is the constant of that tree and W.

How to read the table: "rss max/min" are the largest and smallest peak RSS over the ranks of one
run. "share" = state / W. "excess" = rss max - share: what a rank holds beyond its share of the
model's state; for the debug rows that is the constant itself ("const", per tree, allocator and
W). "over" = excess - const: the model-dependent memory a rank held beyond its share at its
peak. "gath" is the part of it that FSDP2 needs by design, as the project's memory floor states
it (`training_memory(...)["gathered"]`: two blocks' and the output head's weights gathered, the
largest unit's unsharded fp32 gradient and FSDP2's copy of it in the reduce-scatter input, so
"red" is part of "gath"; it counted that gradient once until the measurements below showed the
copy, and the "gath" values quoted below are the old ones). Issue 33's target, "after:
per-rank RSS ≤ 1/W of the full state + a constant", is column "ok" (share + const) and, with
FSDP2's gathered units stated on top, "ok+g"; what remains beyond those is optimizer-step and
autograd temporaries and allocator slack. "start" separates start-up from training: the peak
by the time every rank has built its model, before step 1 (the old tree's full fp32 copy of the
weights, params × 4 B on every rank, shows there; so do start-up costs that scale with the
largest matrix in both trees: the peak-FLOPs matmul measurement of the model's shapes and
init_weights' full draw of each matrix before a rank keeps its rows).

What it measured (2 shared cores, torch 2.13, gloo, 3 steps, MB = 1e6 B, max over ranks,
before → after meta-device init):
- 125m (128.4M params, state 2,054 MB), allocator "default" (glibc's own): peak W=2 2,060 →
  2,090, 2,075 → 2,007 and 2,053 → 2,131; W=4 1,720 → 1,659, 1,678 → 1,606 and 1,698 → 1,678
  (three runs): "over" 632-810 MB, not falling with W. "start" W=4 886 → 890, 887 → 863,
  876 → 846: at vocab 32,000 the start-up costs of the 98 MB embedding-sized matrices (peak-FLOPs
  measurement, full-matrix init draws) hide the 384 MB meta init saves.
- 125m, allocator "lean" (train.cpu_allocator = "lean"; in the old tree, which has no such key,
  glibc's MALLOC_MMAP_THRESHOLD_ sets the same threshold), the same run: peak W=2 1,749 → 1,750,
  W=4 1,260 → 1,263; "over" 329 → 329 (W=2) and 352 → 355 (W=4): the same at both world sizes,
  i.e. a rank's peak is share + const + ~330-355 MB, a term of the model that does not shrink
  with W. CPU time per step (rank 0, median of steps 2-3, loaded machine, noisy): default 2,983
  / 3,041 ms, lean 3,645 / 4,070 ms (W=2 / W=4, after tree); the old tree 2,975 / 2,247 vs
  2,731 / 3,816.
- 125m/v512 (104.2M params, the same blocks), default allocator, an earlier run: start W=2
  781 → 642, W=4 772 → 547 (meta init's saving, at start-up); peak W=2 1,803 → 1,618, W=4
  1,380 → 1,373.
- The constant (debug preset) was 393-395 MB per rank in every tree, W and allocator.

Where the default allocator's peak comes from (a probe, not in this file: torchrun on 2 ranks,
125m, the real `oreline train` with glibc's mallinfo2 (bytes in live malloc blocks, heap and
mmapped) and VmRSS sampled every 1-2 ms and at every FSDP2 unit's pre/post forward and
backward): no full-model-sized tensor exists at any point of a step. The optimizer step, clip and
zero_grad allocate nothing beyond the AdamW moments (step 1 only); the live peak is in backward.
With glibc's own setting, RSS ran 380-500 MB above the live blocks from step 2 on (the mmap
threshold rises to the largest block freed, up to 32 MB: a block's unsharded weights and
gradients (≤ 9.4 MB each), the shards and the activations then come from the heap, whose freed
pages stay resident wherever a live block sits above them; heap free 200-300 MB); with
"lean" RSS = live + ~260 MB (interpreter, libraries, Python's own arenas) at every point.
Per rank, W=2, lean, at the peak (the embedding's backward, the last op of backward), in MB:
VmHWM 1,748 = 267 (non-malloc) + 1,481 live = weight shards 257 + AdamW moments 514 + 172
other live blocks (148 in the debug preset: torch, gloo, loaders; +22 left by the peak-FLOPs
measurement) + 538 of backward: the gradient shards of the 12 blocks (208, part of the state;
the root's 49 is not there yet) and 330 that FSDP2 and autograd hold unsharded: the tied
embedding / output head of the root unit, gathered from forward to the end of backward (98),
the head's full gradient of it, waiting in autograd's buffer for the embedding's (98), the
embedding backward's own full dense gradient before it is added (98), block 0's reduce-scatter
input, which FSDP2 keeps in flight (34.6), ~2 of temporaries. That is "over": 3 × 98 + 34.6
- the root's missing gradient share = 329 at W=2, 353 at W=4, as measured. "gath" (then 266: two
blocks, the head, one unit's gradient) counts the head's weight and one gradient but not the
embedding's second one nor the reduce-scatter buffer, hence "over" > "gath". So with "lean",
peak = state / W + const + ~330-355 MB (W-independent), and "≤ state / W + const" cannot hold
while FSDP2 gathers whole units. The tuned allocator keeps freed blocks on purpose and peaks
higher still.

Since (oreline.model.tied, lean, --before 51b471c, one run each): the table's gradient exists
once in backward (the embedding's rows added in place into the output projection's dW): peak
W=2 1,754 → 1,723, W=4 1,263 → 1,246; the peak moved to the middle of backward, where the
root's gathered table still sat; the root now reshards right after the output layers' backward:
W=2 1,663, W=4 1,160 ("over" 238 / 248, "ok+g" yes; targets share + const 1,424 / 912). The
peak is now the root's reduce-scatter at the end of backward (a mallinfo2 probe after every op):
FSDP2's reduce-scatter input (the table's gradient, 98) and gloo's full-size temporary of
reduce_scatter (98). gloo's copy is gone since (oreline.train.gloo_reduce_scatter, an in-place
all-reduce; lean, --before bea85f6, one run): W=2 1,678 → 1,625 ("over" 257 → 205), W=4 1,156 →
1,157 (249 → 250: the W=4 peak sits elsewhere); targets share + const 1,420 / 907. The W=4 peak
was the blocks' backward, where FSDP2's backward prefetch held the next block's weights; CPU ranks
run without it since (oreline.train.dist.no_backward_prefetch; lean, --before b2ebbda, one run):
W=2 1,634 → 1,625 ("over" 213 → 204), W=4 1,153 → 1,133 (246 → 226); the peak at both W is now
the root's reduce-scatter (the tied table's gradient and FSDP2's copy of it, 98 MB each) plus
~40 MB of freed small blocks the heap kept resident, gone with lean's threshold at 64 KiB
(--before 8cdea67, one run): W=2 1,636 → 1,583 ("over" 216 → 163), W=4 1,136 → 1,093 (228 → 187);
targets share + const 1,419 / 906 (docs/measurements.md). That copy cannot go inside FSDP2
(its copy-in, torch's `_chunk_cat`, refuses an output overlapping its inputs), hence "red" (2 ×
the largest unit's unsharded gradient) in the stated bound share + const + red ("ok+r"): 1,616 /
1,103 at 125m. The in-place reduce-scatter releasing its input (--before ad90030, one run):
125m unchanged (1,582 / 1,093, peak at the root), 125m/v512 W=2 1,326 → 1,291, W=4 918 → 882
(its bound 1,295 / 878: 4 MB short at W=4); the ~15 MB left over FSDP2's floor at 125m are MKL's
and oneDNN's cached buffers for the model's matmul shapes.

Allocator: `--cpu-allocator default lean` (the default) measures glibc's own setting and "lean"
(a fixed mmap threshold, 64 KiB, 1 MiB until the measurements above: every freed block at or
over it goes back to the kernel at once, at the cost of zero-filling it again). "tuned" (the training default: mallopt M_MMAP_THRESHOLD 1 GiB,
M_TRIM_THRESHOLD 2 GiB, ~13% faster steps) keeps freed blocks resident, up to ~2 GiB per rank,
which the debug preset never reaches (tuned, 125m: peak 3.3-4.0 GB per rank in both trees at
W=2 and 4; start W=2 1,343 → 1,117, W=4 1,298 → 1,034).

    .venv/bin/python benchmarks/rank_memory.py [--preset 125m] [--worlds 2 4] [--steps 3]
        [--before 2c2c919 | --before ''] [--vocab-size N] [--cpu-allocator default lean [tuned]] [--work DIR]

Needs 4 × ~1.7 GB of RAM for 125m at W=4 (4 × ~3.5 GB with tuned); ~5-8 minutes on 2 cores per
allocator (8 launches). The ranks run with
OMP_NUM_THREADS=1 (W ranks share the cores).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6
STATE_BYTES_PER_PARAM = 16  # fp32 weight + fp32 gradient + AdamW exp_avg + exp_avg_sq
TINY = "debug"  # the preset that measures the constant
LEAN_MMAP_THRESHOLD = 1 << 20  # lean's threshold when trees older than "lean" were measured (64 KiB since)


# ---------------------------------------------------------------------------------------------
# data (run as a child with the tree's src on PYTHONPATH: `rank_memory.py --prepare DIR`)


def prepare(out: Path) -> None:
    """Emma in ~1,500-character documents → a 512-token BPE → token shards, with whatever
    `oreline` is first on the path (as tests/train/conftest.py's prose_tokens does)."""
    from oreline.config import TokenizeConfig, TokenizerConfig, samples_dir
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.tokens.train_bpe import train_tokenizer

    with zipfile.ZipFile(samples_dir() / "english-prose" / "nltk-gutenberg.zip") as zf:
        text = zf.read("gutenberg/austen-emma.txt").decode("utf-8", "replace")
    docs, cur = [], []
    for para in text.replace("\r\n", "\n").split("\n\n"):
        if para.strip():
            cur.append(" ".join(para.split()))
        if sum(map(len, cur)) >= 1500:
            docs.append("\n\n".join(cur))
            cur = []
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "emma.jsonl"
    jsonl.write_text("".join(json.dumps({"id": f"emma-{i}", "text": d}) + "\n" for i, d in enumerate(docs)))
    train_tokenizer([jsonl], out / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=20))
    tokenize_corpus([jsonl], out / "tokenizer", out / "tokens", TokenizeConfig(val_fraction=0.1, workers=1))


# ---------------------------------------------------------------------------------------------
# one launch


def config_toml(run_root: Path, data: Path, preset: str, vocab: int, steps: int, allocator: str) -> str:
    """Only keys that the tree before meta-device init accepts too (its config forbids unknown ones)."""
    return f"""[run]
name = "r"
runs_dir = "{run_root}"

[model]
preset = "{preset}"
vocab_size = {vocab}

[train]
tokens = "{data / "tokens"}"
tokenizer = "{data / "tokenizer"}"
parallel = "fsdp"
cpu_matmul = "blas"
cpu_allocator = "{allocator}"
seq_len = 32
micro_batch = 1
grad_accum = 1
steps = {steps}
log_every = 1
eval_every = {steps}
eval_sequences = 1

[train.optim]
warmup_steps = 1

[checkpoint]
every = 0

[eval]
prompts = []
"""


def workers(agent: int) -> dict[int, int]:
    """{rank: pid} of the torchrun agent's worker processes (their parent is the agent)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) != agent:
                continue
            env = dict(kv.split(b"=", 1) for kv in (d / "environ").read_bytes().split(b"\0") if b"=" in kv)
            if b"RANK" in env:
                found[int(env[b"RANK"])] = int(d.name)
        except (OSError, IndexError, ValueError):
            continue
    return found


def vm_hwm(pid: int) -> int | None:
    """The process's peak RSS so far, in bytes (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def launch(
    src: Path,
    cfg: Path,
    metrics: Path,
    world: int,
    log: Path,
    timeout: float = 900,
    env_extra: dict | None = None,
) -> tuple[dict[int, int], dict[int, int]]:
    """Run the training; ({rank: peak RSS at start-up}, {rank: peak RSS}) in bytes, the start-up
    one read when rank 0 writes the run's "start" record to `metrics` (after a barrier that every
    rank reaches with its model built and sharded and its optimizer made, before step 1).
    Raises with the log's tail on failure."""
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        **(env_extra or {}),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    cmd += ["-m", "oreline", "train", "-c", str(cfg)]
    peaks: dict[int, int] = {}
    startup: dict[int, int] = {}
    pids: dict[int, int] = {}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    end = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > end:
            proc.kill()
            raise RuntimeError(f"{cfg}: no end after {timeout:.0f} s; see {log}")
        if len(pids) < world:
            pids.update(workers(proc.pid))
        for rank, pid in pids.items():
            hwm = vm_hwm(pid)
            if hwm is not None:
                peaks[rank] = max(peaks.get(rank, 0), hwm)
        if not startup and metrics.is_file() and '"type": "start"' in metrics.read_text(errors="replace"):
            startup = dict(peaks)
        time.sleep(0.02)
    if proc.returncode != 0 or len(peaks) != world or len(startup) != world:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{cfg}: rc {proc.returncode}, peaks of ranks {sorted(peaks)}:\n{tail}")
    return startup, peaks


def n_params(preset: str, vocab: int) -> int:
    """Parameters of the preset at this vocabulary (this tree's model, built on the meta device)."""
    import torch

    from oreline.config import ModelConfig
    from oreline.model.llama import Llama
    from oreline.model.presets import resolve_model_args

    with torch.device("meta"):
        return Llama(resolve_model_args(ModelConfig(preset=preset, vocab_size=vocab))).num_params()


def fsdp_gathered(preset: str, vocab: int, world: int) -> int:
    """What FSDP2 holds unsharded on top of a rank's shards, as the project's own memory floor
    states it (two blocks' and the output head's weights, the largest unit's fp32 gradient and
    FSDP2's reduce-scatter copy of it)."""
    from oreline.config import ModelConfig
    from oreline.model.presets import resolve_model_args, training_memory

    args = resolve_model_args(ModelConfig(preset=preset, vocab_size=vocab))
    return training_memory(args, 1, 32, "fp32", False, shards=world)["gathered"]


def largest_unit_grad(preset: str, vocab: int) -> int:
    """Bytes of the largest FSDP2 unit's unsharded fp32 gradient (`dist.fsdp_units`, the root
    holding the rest: with tied embeddings, the table and the final norm; 98 MB at 125m), as the
    project's memory floor counts it (oreline.model.presets.largest_fsdp_unit; tests/train/
    test_meta_init.py checks it against the real units)."""
    from oreline.config import ModelConfig
    from oreline.model.presets import largest_fsdp_unit, resolve_model_args

    return 4 * largest_fsdp_unit(resolve_model_args(ModelConfig(preset=preset, vocab_size=vocab)))


def step_cpu_ms(metrics: Path) -> float:
    """Rank 0's median process CPU time per step, step 1 (optimizer state allocation) left out."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    ms = sorted(
        r["cpu_ms"] for r in recs if r.get("type") == "train" and r.get("step", 0) > 1 and "cpu_ms" in r
    )
    return ms[len(ms) // 2] if ms else float("nan")


def knows_lean(src: Path) -> bool:
    """Whether the tree's config accepts train.cpu_allocator = "lean"."""
    return '"lean"' in (src / "oreline" / "config.py").read_text()


def preset_vocab(preset: str) -> int:
    from oreline.model.presets import PRESETS

    return int(PRESETS[preset]["vocab_size"])


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="125m")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--before", default="2c2c919", help="git revision of the old tree ('' : none)")
    ap.add_argument(
        "--vocab-size", type=int, default=None, help="model.vocab_size of --preset (default: the preset's)"
    )
    ap.add_argument(
        "--cpu-allocator", nargs="+", choices=["default", "tuned", "lean"], default=["default", "lean"]
    )
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.prepare:
        prepare(Path(a.prepare))
        return 0

    work = Path(a.work or tempfile.mkdtemp(prefix="oreline-rank-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    old_tree = work / "before-tree"
    trees = {"after": ROOT / "src"}
    try:
        if a.before:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), a.before],
                check=True,
                capture_output=True,
            )
            trees = {"before": old_tree / "src", **trees}
        presets = [TINY, a.preset]
        vocab = {TINY: preset_vocab(TINY), a.preset: a.vocab_size or preset_vocab(a.preset)}
        params = {p: n_params(p, vocab[p]) for p in presets}
        state = {p: STATE_BYTES_PER_PARAM * params[p] for p in presets}
        gathered = {(p, w): fsdp_gathered(p, vocab[p], w) for p in presets for w in a.worlds}
        unit_grad = {p: largest_unit_grad(p, vocab[p]) for p in presets}
        rows = []
        for tree, src in trees.items():
            data = work / f"data-{tree}"
            subprocess.run(
                [sys.executable, __file__, "--prepare", str(data)],
                env={**os.environ, "PYTHONPATH": str(src)},
                check=True,
                capture_output=True,
            )
            for alloc, world, preset in itertools.product(a.cpu_allocator, a.worlds, presets):
                name = f"{tree}-{alloc}-w{world}-{preset}"
                cfg = work / f"{name}.toml"
                # a tree older than "lean" refuses the key: glibc's environment variable sets the same threshold
                emulate = alloc == "lean" and not knows_lean(src)
                cfg.write_text(
                    config_toml(
                        work / name, data, preset, vocab[preset], a.steps, "default" if emulate else alloc
                    )
                )
                t0 = time.monotonic()
                startup, peaks = launch(
                    src,
                    cfg,
                    work / name / "r" / "metrics.jsonl",
                    world,
                    work / f"{name}.log",
                    env_extra={"MALLOC_MMAP_THRESHOLD_": str(LEAN_MMAP_THRESHOLD)} if emulate else None,
                )
                rows.append(
                    {
                        "tree": tree,
                        "alloc": alloc,
                        "world": world,
                        "preset": preset,
                        "max": max(peaks.values()),
                        "min": min(peaks.values()),
                        "startup": max(startup.values()),
                        "wall_s": time.monotonic() - t0,
                        "cpu_ms": step_cpu_ms(work / name / "r" / "metrics.jsonl"),
                    }
                )
                print(
                    f"  ran {name}: {time.monotonic() - t0:.0f} s, peaks (MB) "
                    + ", ".join(
                        f"rank {r}: {v / MB:,.0f} (start-up {startup[r] / MB:,.0f})"
                        for r, v in sorted(peaks.items())
                    ),
                    flush=True,
                )
        default_vocab = vocab[a.preset] == preset_vocab(a.preset)
        labels = {TINY: TINY, a.preset: a.preset if default_vocab else f"{a.preset}/v{vocab[a.preset]}"}
        report(rows, params, state, gathered, unit_grad, labels)
    finally:
        if old_tree.exists():
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False
            )
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def report(
    rows: list[dict],
    params: dict[str, int],
    state: dict[str, int],
    gathered: dict[tuple[str, int], int],
    unit_grad: dict[str, int],
    labels: dict[str, str],
) -> None:
    """The table; `labels` names a preset whose vocab_size was overridden ("125m/v512")."""
    const = {
        (r["tree"], r["alloc"], r["world"]): r["max"] - state[r["preset"]] / r["world"]
        for r in rows
        if r["preset"] == TINY
    }
    print(
        f"\nstate = params × {STATE_BYTES_PER_PARAM} B (fp32 weights + grads + AdamW exp_avg + exp_avg_sq); "
        "share = state / W; start = largest rank's peak RSS once every rank has built its model "
        "(before step 1); rss max/min = peak RSS over the whole run, largest/smallest rank; excess = rss max - share; const = excess of the "
        f"{TINY} preset (same tree, allocator, W); over = excess - const; gath = FSDP2's unsharded "
        "units and the largest unit's gradient twice, red included (oreline.model.presets.training_memory 'gathered'); "
        "red = 2 × the largest unit's unsharded fp32 gradient (FSDP2's reduce-scatter: the gradient and "
        "its flat copy, alive together); "
        "ok: rss max ≤ share + const, ok+r: rss max ≤ share + const + red, "
        "ok+g: rss max ≤ share + gath + const; cpu ms: rank 0's median process "
        "CPU time per step after step 1.  MB = 1e6 bytes."
    )
    head = (
        f"{'tree':6s} {'alloc':7s} {'W':>1s} {'preset':9s} {'params':>11s} {'state':>6s} {'share':>6s} "
        f"{'start':>5s} {'rss max':>7s} {'rss min':>7s} {'excess':>6s} {'const':>5s} {'over':>5s} {'red':>4s} {'gath':>4s}  ok   ok+r ok+g  cpu ms"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        p, w = r["preset"], r["world"]
        share, c, g = state[p] / w, const[(r["tree"], r["alloc"], w)], gathered[(p, w)]
        red = 2 * unit_grad[p]
        excess = r["max"] - share
        print(
            f"{r['tree']:6s} {r['alloc']:7s} {w:1d} {labels[p]:9s} {params[p]:11,d} {state[p] / MB:6,.0f} "
            f"{share / MB:6,.0f} {r['startup'] / MB:5,.0f} {r['max'] / MB:7,.0f} {r['min'] / MB:7,.0f} {excess / MB:6,.0f} "
            f"{c / MB:5,.0f} {(excess - c) / MB:5,.0f} {red / MB:4,.0f} {g / MB:4,.0f}  "
            f"{'yes' if r['max'] <= share + c else 'NO':4s} {'yes' if r['max'] <= share + c + red else 'NO':4s} "
            f"{'yes' if r['max'] <= share + g + c else 'NO':4s} "
            f"{r['cpu_ms']:6,.0f}"
        )


if __name__ == "__main__":
    sys.exit(main())
