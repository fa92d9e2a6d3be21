"""train.eval_tasks (issue 28): downstream tasks scored inside the loop, written to metrics.jsonl,
TensorBoard and the report; under DDP the ranks split the items and report the totals."""

from __future__ import annotations

import os
from importlib import import_module
from pathlib import Path

import pytest
from rich.console import Console

from oreline.errors import InputError
from oreline.train.loop import train

fixtures = import_module("oreline_test_train_fixtures")
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115


def test_eval_tasks_in_the_loop_reach_metrics_tensorboard_and_the_report(train_config, one_thread):
    cfg = train_config(
        train__steps=10,
        train__eval_every=10,
        train__eval_tasks=["copa", "lambada"],
        train__eval_tasks_every=5,
        train__eval_tasks_max_items=16,
        checkpoint__model_only_every=10,
    )
    summary = train(cfg, console=QUIET)
    run = Path(summary["run_dir"])
    recs = [r for r in fixtures.read_metrics(run / "metrics.jsonl") if r["type"] == "tasks"]
    assert [r["step"] for r in recs] == [5, 10]
    for r in recs:
        assert r["items"] == {"copa": 16, "lambada": 16} and r["chance"]["copa"] == 0.5
        assert 0.0 <= r["acc"]["copa"] <= 1.0 and r["tokens_seen"] > 0
        centered = {n: (r["acc"][n] - r["chance"][n]) / (1 - r["chance"][n]) for n in ("copa", "lambada")}
        assert r["centered"] == pytest.approx(centered)
        assert r["core"] == pytest.approx(sum(centered.values()) / 2)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(run / "tensorboard"))
    tb.Reload()
    assert [(e.step, e.value) for e in tb.Scalars("tasks/acc/copa")] == [
        (r["step"], pytest.approx(r["acc"]["copa"])) for r in recs
    ]
    # the final model's evaluation as `oreline run` writes it (stages.stage_eval), in the report too
    from oreline.eval.downstream import downstream_cli
    from oreline.report.html import write_report

    final = downstream_cli(run, "copa", out=run / "eval" / "tasks-final.json", max_items=16)
    assert final["step"] == 10 and final["tasks"]["copa"]["items"] == 16
    html = Path(write_report(run)).read_text(encoding="utf-8")
    section = html.split('<section id="downstream"')[1].split("</section>")[0]
    assert "downstream accuracy" in section and "copa" in section and "not available" not in section
    assert "tasks-final.json" in section and "CORE" in section


def test_an_unknown_eval_task_fails_before_the_first_step(train_config):
    with pytest.raises(InputError, match="unknown task 'nope'"):
        train(train_config(train__eval_tasks=["copa", "nope"]), console=QUIET)


@pytest.mark.slow
def test_ranks_split_the_items_and_report_the_totals(prose_tokens, tmp_path):
    """1 process, DDP and FSDP2 on 2 ranks (15 items: 8 and 7 per rank): the same item count and
    the same accuracies (the weights differ only in the float reduction order, so at most a near
    tie could flip; none does here)."""
    import subprocess
    import sys

    settings = {
        "run.name": "r",
        "train.micro_batch": 2,
        "train.grad_accum": 2,
        "train.steps": 4,
        "train.optim.warmup_steps": 2,
        "train.eval_every": 4,
        "train.eval_sequences": 8,
        "train.eval_tasks": ["copa", "winogrande"],
        "train.eval_tasks_max_items": 15,
        "eval.prompts": ["Emma"],
        "eval.max_new_tokens": 2,
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs = {}
    for name, extra, nproc in (
        ("one", {"train.grad_accum": 4}, 1),
        ("ddp", {"train.parallel": "ddp"}, 2),
        ("fsdp", {"train.parallel": "fsdp"}, 2),
    ):
        cfg = fixtures.write_config(
            tmp_path / f"{name}.toml", tmp_path / name, prose_tokens, settings | extra
        )
        cmd = [sys.executable, "-m", "oreline", "train", "-c", str(cfg)]
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   "-m", "oreline", "train", "-c", str(cfg)]  # fmt: skip
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
        procs[name] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log)
    got = {}
    for name, (proc, log) in procs.items():
        assert proc.wait(timeout=500) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
        log.close()
        recs = fixtures.read_metrics(tmp_path / name / "r" / "metrics.jsonl")
        (rec,) = [r for r in recs if r["type"] == "tasks"]
        got[name] = rec
    for name in ("ddp", "fsdp"):
        assert got[name]["items"] == {"copa": 15, "winogrande": 15}, name
        assert got[name]["acc"] == got["one"]["acc"] and got[name]["acc_norm"] == got["one"]["acc_norm"], (
            name,
            got[name],
            got["one"],
        )
