"""Resume exactness under 20 random SIGKILLs of `oreline train`, against the same run uninterrupted.

The peer is the uninterrupted run of the same config, measured in the same invocation (run
alongside). The killed run is launched with the same command again and again (`--resume auto`),
and killed at a random point each time, chosen among:
- during a step (a random moment inside step t, slowed by `train.debug.sleep_per_step_s`),
- during a checkpoint save (the moment its `.tmp-step-…` folder appears),
- during evaluation (right after the checkpoint of an eval step is logged),
- a random moment after launch (start-up and resume included).

After each kill the metrics written since that launch's resume point are compared with the
uninterrupted run (loss, grad norm, lr, tokens seen: exact float equality), so every resumed
segment is judged, including those a later kill rolled back; at the end the whole metrics file
(every step once) and the final weights (torch.equal) are compared.

Usage: .venv/bin/python benchmarks/resume_exactness.py [--kills 20] [--seed 0] [--steps 96]
About two minutes on 2 shared cores (each launch pays Python + torch start-up).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from pathlib import Path

import torch
from rich.console import Console

from oreline.config import TokenizeConfig, TokenizerConfig, samples_dir
from oreline.train.checkpoint.format import read_meta
from oreline.train.checkpoint.load import load_model_state
from oreline.train.checkpoint.resume import find_resumable

EVERY, EVAL_EVERY, SLEEP = 4, 8, 0.05
KEYS = ("loss", "grad_norm", "lr", "tokens_seen")


def build_corpus(work: Path) -> dict[str, Path]:
    """Emma (nltk-gutenberg sample) in ~1,500-character documents → 512-token BPE → token shards."""
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.tokens.train_bpe import train_tokenizer

    with zipfile.ZipFile(samples_dir() / "english-prose" / "nltk-gutenberg.zip") as zf:
        text = zf.read("gutenberg/austen-emma.txt").decode("utf-8", "replace")
    docs, cur = [], ""
    for para in text.split("\n\n"):
        cur += " ".join(para.split()) + "\n\n"
        if len(cur) > 1500:
            docs.append(cur.strip())
            cur = ""
    path = work / "emma.jsonl"
    path.write_text("".join(json.dumps({"id": f"emma-{i}", "text": d}) + "\n" for i, d in enumerate(docs)))
    train_tokenizer([path], work / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=20))
    tokenize_corpus([path], work / "tokenizer", work / "tokens", TokenizeConfig(val_fraction=0.1), workers=1)
    return {"tokenizer": work / "tokenizer", "tokens": work / "tokens"}


def write_config(path: Path, runs: Path, corpus: dict[str, Path], steps: int) -> Path:
    path.write_text(f"""
[run]
name = "r"
runs_dir = "{runs}"
[model]
preset = "debug"
[train]
tokens = "{corpus["tokens"]}"
tokenizer = "{corpus["tokenizer"]}"
seq_len = 64
micro_batch = 4
steps = {steps}
log_every = 1
eval_every = {EVAL_EVERY}
eval_sequences = 8
[train.optim]
lr = 3e-3
warmup_steps = 8
[train.debug]
sleep_per_step_s = {SLEEP}
[checkpoint]
every = {EVERY}
keep_last = 2
[eval]
max_new_tokens = 4
prompts = ["It was"]
""")
    return path


def launch(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # same thread count in every run
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "oreline", "train", "-c", str(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _parse(lines: bytes) -> list[dict]:
    out = []
    for line in lines.splitlines():
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):  # a line a kill cut short
            out.append(json.loads(line))
    return out


# path -> (the file's bytes up to its last newline when last read, their records)
_parsed: dict[Path, tuple[bytes, list[dict]]] = {}


def records(run: Path) -> list[dict]:
    """metrics.jsonl's records; a line a kill cut short is left out.

    `wait_for` calls this every millisecond while a run appends to the file: parsing all of it
    each time took ~1.3 ms at 27 records, so the waiting process kept half a core busy, taken from
    the run it waited on. The complete lines read before are parsed once (the file's new content
    still starts with them; a run that rewrote the file, a resume purging later steps, is parsed
    again), so a call costs a read and the new lines."""
    path = run / "metrics.jsonl"
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return []
    complete = data[: data.rfind(b"\n") + 1]
    seen, recs = _parsed.get(path, (b"", []))
    recs = recs + _parse(complete[len(seen) :]) if complete.startswith(seen) else _parse(complete)
    _parsed[path] = (complete, recs)
    return recs + _parse(data[len(complete) :])


def has(run: Path, type_: str, step: int) -> bool:
    return any(r.get("type") == type_ and r.get("step") == step for r in records(run))


def wait_for(proc: subprocess.Popen, cond, timeout: float = 300.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError):  # a folder removed between exists() and stat()
            if cond():
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.001)
    return False


def resume_point(run: Path) -> int:
    path = find_resumable(run / "checkpoints", console=Console(file=io.StringIO()))
    return int(read_meta(path)["step"]) if path else 0


def pick(rng: random.Random, r: int, steps: int) -> tuple[str, int]:
    """A kill (kind, target step) ahead of resume point r."""
    kinds = ["step", "save", "eval", "random"]
    kind = rng.choice(kinds)
    nxt_save = (r // EVERY + 1 + rng.randint(0, 1)) * EVERY
    nxt_eval = (r // EVAL_EVERY + 1) * EVAL_EVERY
    if kind == "save" and nxt_save <= steps:
        return kind, nxt_save
    if kind == "eval" and nxt_eval <= steps:
        return kind, nxt_eval
    if kind == "random":
        return kind, 0
    return "step", min(rng.randint(r + 2, r + 2 * EVERY), steps)


def kill(proc: subprocess.Popen, run: Path, kind: str, t: int, rng: random.Random, launched: float) -> str:
    tmp = run / "checkpoints" / f".tmp-step-{t:08d}"
    if kind == "step":
        ok = wait_for(proc, lambda: has(run, "train", t - 1))
        time.sleep(rng.uniform(0.0, 2 * SLEEP))
        hit = f"during step {t}"
    elif kind == "save":  # a stale .tmp- folder of an earlier kill does not count: it must be this launch's
        ok = wait_for(
            proc, lambda: (tmp.exists() and tmp.stat().st_ctime >= launched) or has(run, "checkpoint", t)
        )
        hit = (
            f"during the save of step {t}"
            if tmp.exists() and not has(run, "checkpoint", t)
            else f"after the save of step {t}"
        )
    elif kind == "eval":
        ok = wait_for(proc, lambda: has(run, "checkpoint", t))
        hit = f"during the eval of step {t}"
    else:
        delay = rng.uniform(0.5, 8.0)
        end = time.monotonic() + delay
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(0.01)
        ok = True
        hit = f"{delay:.1f} s after launch"
    if not ok or proc.poll() is not None:
        proc.wait()
        return "finished"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if kind == "eval" and has(run, "eval", t):
        hit = f"after the eval of step {t}"
    if kind == "random":
        last = max((r["step"] for r in records(run) if r.get("type") == "train"), default=0)
        hit += f" (last logged step {last})"
    return hit


def segment_exact(recs: list[dict], ref: dict[int, dict], after: int) -> tuple[int, int]:
    """(steps compared, steps identical) among the train records past the resume point."""
    seg = [r for r in recs if r.get("type") == "train" and r["step"] > after]
    same = sum(all(r[k] == ref[r["step"]][k] for k in KEYS) for r in seg)
    return len(seg), same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oreline-resume-"))
    rng = random.Random(a.seed)
    try:
        corpus = build_corpus(work)
        t_ref = time.perf_counter()
        ref_proc = launch(write_config(work / "ref.toml", work / "ref", corpus, a.steps), work / "ref.log")
        ref_done: list[float] = []  # when the uninterrupted run ended (it runs alongside the killed one)
        threading.Thread(
            target=lambda: (ref_proc.wait(), ref_done.append(time.perf_counter())), daemon=True
        ).start()
        cfg = write_config(work / "killed.toml", work / "killed", corpus, a.steps)
        run = work / "killed" / "r"
        rows, launches, t_killed = [], 0, time.perf_counter()
        for i in range(a.kills):
            r = resume_point(run)
            kind, t = pick(rng, r, a.steps)
            launched = time.time()
            proc = launch(cfg, work / "killed.log")
            launches += 1
            hit = kill(proc, run, kind, t, rng, launched)
            if hit == "finished":
                print(f"kill {i + 1}: the run finished first (rc {proc.returncode}); stopping the kills")
                break
            rows.append({"kill": i + 1, "kind": kind, "resumed_from": r, "hit": hit, "recs": records(run)})
        proc = launch(cfg, work / "killed.log")
        launches += 1
        final_from = resume_point(run)
        rc = proc.wait()
        killed_s = time.perf_counter() - t_killed
        ref_rc = ref_proc.wait()
        while not ref_done:
            time.sleep(0.01)
        ref_s = ref_done[0] - t_ref
        if rc or ref_rc:
            print((work / "killed.log").read_text()[-3000:], (work / "ref.log").read_text()[-3000:])
            return 1

        ref = {rec["step"]: rec for rec in records(work / "ref" / "r") if rec.get("type") == "train"}
        exact_kills = 0
        print(f"{'kill':>4}  {'resumed from':>12}  {'steps checked':>13}  {'identical':>9}  killed")
        for row in rows:
            n, same = segment_exact(row["recs"], ref, row["resumed_from"])
            exact_kills += n == same
            print(f"{row['kill']:>4}  {row['resumed_from']:>12}  {n:>13}  {same:>9}  {row['hit']}")
        final = [rec for rec in records(run) if rec.get("type") == "train"]
        steps = [rec["step"] for rec in final]
        n, same = segment_exact(final, ref, 0)
        sd_a, _, _ = load_model_state(work / "ref" / "r")
        sd_b, _, _ = load_model_state(run)
        weights_equal = sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
        kinds = Counter(
            row["kind"] if not row["hit"].startswith("after") else row["kind"] + " (missed, after)"
            for row in rows
        )
        print(
            f"kills: {len(rows)} ({', '.join(f'{k}: {v}' for k, v in kinds.items())}), {launches} launches; "
            f"last launch resumed from step {final_from}"
        )
        print(f"resumed segments bit-identical to the uninterrupted run: {exact_kills}/{len(rows)}")
        print(
            f"final metrics: {same}/{len(ref)} steps identical, every step once: "
            f"{steps == list(range(1, a.steps + 1))}; final weights torch.equal: {weights_equal}"
        )
        print(
            f"wall time: uninterrupted {ref_s:.0f} s, killed + resumed {killed_s:.0f} s "
            f"({killed_s / ref_s:.1f}× the uninterrupted run; each launch pays start-up and replays "
            f"the steps since the last checkpoint)"
        )
        ok = exact_kills == len(rows) and same == len(ref) == a.steps and weights_equal
        return 0 if ok else 1
    finally:
        if a.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
