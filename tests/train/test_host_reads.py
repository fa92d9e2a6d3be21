"""No host synchronisation on ordinary steps: the loop reads no device value unless it logs,
evaluates, checkpoints or stops (oreline.train.loop, oreline.train.host_reads).

`train.debug.count_host_reads` runs every step under a dispatch mode that counts
`aten._local_scalar_dense` (what `.item()`, `float(t)`, `int(t)`, `bool(t)` call) and copies from
a device to the CPU; each rank writes the per-step counts. A real debug-preset run on the prose
fixture, in this process and as 2 gloo ranks (DDP and FSDP2) under torchrun.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from oreline.train.loop import train

from .conftest import read_metrics, write_config

# A step that logs (and does nothing else) makes at most two transfers: the verdicts and values of
# the steps since the last read, and (2 ranks) the timings averaged over ranks. On CPU both are
# `.tolist()` of host tensors, which no op reports, so 0 is what these runs see; on CUDA they are
# the two device → host copies.
LOG_STEP_READS = 2


def host_reads(run, rank: int = 0) -> list[dict]:
    return json.loads((run / "debug" / f"host-reads-rank{rank:05d}.json").read_text())


def check(steps: list[dict], bound: int) -> None:
    ordinary = [s for s in steps if not s["why"]]
    assert len(ordinary) >= 5, steps
    assert all(s["reads"] == 0 for s in ordinary), [s for s in ordinary if s["reads"]]
    logs = [s for s in steps if s["why"] == ["log"]]
    assert logs, steps
    assert all(0 <= s["reads"] <= bound for s in logs), logs
    # the counter is live inside the run: the final evaluation reads its losses on the host
    assert steps[-1]["why"] == ["log", "eval"] and steps[-1]["reads"] > 0, steps[-1]


def test_ordinary_steps_read_nothing_from_the_device(tmp_path, train_config, one_thread):
    cfg = train_config(
        train__steps=12,
        train__log_every=5,
        train__eval_every=0,
        train__debug__count_host_reads=True,
        train__stability__min_history=2,  # spikes are judged from step 3 on: the judging runs too
        train__debug__inject_nan_at_step=7,  # an ordinary step: skipped on the device, read at step 10
        eval__prompts=[],
    )
    summary = train(cfg, resume="none")
    steps = host_reads(tmp_path / "t")
    assert [s["step"] for s in steps] == list(range(1, 13))
    check(steps, LOG_STEP_READS)
    assert steps[6] == {"step": 7, "why": [], "reads": 0, "ops": {}}
    recs = read_metrics(tmp_path / "t" / "metrics.jsonl")
    assert [(r["step"], r["kind"], r["action"]) for r in recs if r["type"] == "event"] == [
        (7, "nonfinite", "skip")
    ]
    assert summary["skipped_steps"] == 1


def test_unfused_adamw_reads_the_verdict_once_per_step(tmp_path, train_config, one_thread):
    """optim.fused=false: torch's other AdamW paths take no found_inf, so the verdict is read (the
    documented fallback, one read per step)."""
    cfg = train_config(
        train__steps=6,
        train__log_every=5,
        train__eval_every=0,
        train__optim__fused=False,
        train__debug__count_host_reads=True,
        train__debug__inject_nan_at_step=3,
        eval__prompts=[],
    )
    assert train(cfg, resume="none")["skipped_steps"] == 1
    ordinary = [s for s in host_reads(tmp_path / "t") if not s["why"]]
    assert [s["step"] for s in ordinary] == [2, 3, 4]
    # the skipped step reads only the verdict; the others also read torch's own AdamW step counts
    # (CPU tensors on the foreach path, one per parameter, so not a device wait on CUDA either)
    assert ordinary[1]["ops"] == {"_local_scalar_dense": 1}, ordinary
    assert all(s["reads"] > 1 for s in (ordinary[0], ordinary[2])), ordinary


def test_without_torchs_found_inf_hook_the_fused_path_reads_the_verdict(
    tmp_path, train_config, one_thread, monkeypatch
):
    """optimizer.found_inf is a private hook of torch's Adam, reached through oreline.compat only: on
    a torch outside the tested range (compat's own switch) the fused optimizer's run says so once
    and falls back to reading the verdict on the host, and still skips the NaN step."""
    import warnings

    from oreline import compat

    monkeypatch.setattr(compat, "_forced_untested", True)
    compat.reset_warnings()
    cfg = train_config(
        train__steps=6,
        train__log_every=5,
        train__eval_every=0,
        train__cpu_matmul="blas",
        train__debug__count_host_reads=True,
        train__debug__inject_nan_at_step=3,
        eval__prompts=[],
    )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            assert train(cfg, resume="none")["skipped_steps"] == 1
    finally:
        compat.reset_warnings()
    assert [str(w.message) for w in caught if "fused AdamW kernel" in str(w.message)], [
        str(w.message) for w in caught
    ]
    ordinary = [s for s in host_reads(tmp_path / "t") if not s["why"]]
    assert ordinary[1]["step"] == 3 and ordinary[1]["ops"] == {"_local_scalar_dense": 1}, ordinary


def write_run_config(path, runs, corpus, parallel: str) -> None:
    write_config(
        path,
        runs,
        corpus,
        {
            "run.name": "r",
            "train.micro_batch": 2,
            "train.grad_accum": 2,
            "train.steps": 12,
            "train.log_every": 5,
            "train.eval_every": 0,
            "train.eval_sequences": 4,
            "train.parallel": parallel,
            "train.stability.min_history": 2,
            "train.debug.count_host_reads": True,
            "train.debug.inject_nan_at_step": 7,
            "checkpoint.every": 0,
            "eval.prompts": [],
        },
    )


@pytest.mark.slow  # two 2-rank runs under torchrun (~40 s on the shared 2 cores)
def test_two_gloo_ranks_read_nothing_on_ordinary_steps(tmp_path, prose_tokens):
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    procs = {}
    for parallel in ("ddp", "fsdp"):
        cfg = tmp_path / f"{parallel}.toml"
        write_run_config(cfg, tmp_path / parallel, prose_tokens, parallel)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        cmd += ["-m", "oreline", "train", "-c", str(cfg), "--resume", "none"]
        procs[parallel] = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for parallel, proc in procs.items():
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, out[-4000:]
        run = tmp_path / parallel / "r"
        for rank in (0, 1):
            steps = host_reads(run, rank)
            assert [s["step"] for s in steps] == list(range(1, 13))
            check(steps, LOG_STEP_READS)
        events = [r for r in read_metrics(run / "metrics.jsonl") if r["type"] == "event"]
        assert [(r["step"], r["kind"], r["action"]) for r in events] == [(7, "nonfinite", "skip")]


@pytest.mark.parametrize("action", ["skip", "rollback"])
def test_verdicts_read_later_act_as_if_read_at_once(tmp_path, train_config, one_thread, action):
    """A NaN at step 6 read at once (every step logs) and read at step 8 (the next checkpoint):
    the same events, losses, learning rates and final weights; a rollback returns to step 4 either way."""
    from oreline.train.checkpoint.load import load_model_state

    common = dict(
        train__steps=12,
        train__eval_every=0,
        train__debug__inject_nan_at_step=6,
        train__stability__action=action,
        checkpoint__every=4,
        eval__prompts=[],
    )
    now = train(train_config(run__name="now", train__log_every=1, **common), resume="none")
    later = train(train_config(run__name="later", train__log_every=5, **common), resume="none")
    recs = {name: read_metrics(tmp_path / name / "metrics.jsonl") for name in ("now", "later")}
    events = {
        name: [
            (r["step"], r["kind"], r["action"], r["message"].replace(f"/{name}/", "/RUN/"))
            for r in rs
            if r["type"] == "event"
        ]
        for name, rs in recs.items()
    }
    assert events["now"] == events["later"] and events["now"][0][:3] == (6, "nonfinite", action)
    if action == "rollback":
        assert events["now"][1][:3] == (4, "rollback", "rollback")
    final = {
        name: {r["step"]: (r["loss"], r["lr"]) for r in rs if r["type"] == "train"}
        for name, rs in recs.items()
    }
    assert {k: final["now"][k] for k in final["later"]} == final["later"]  # bit for bit
    for key in ("skipped_steps", "rollbacks", "final_train_loss", "final_val_loss", "tokens_seen"):
        assert now[key] == later[key], key
    a, b = (load_model_state(tmp_path / name)[0] for name in ("now", "later"))
    assert all(torch.equal(a[k], b[k]) for k in a)
