"""The report and the doctor on the artifacts of a REAL (tiny) training run, so the record contract
between oreline.train and these readers cannot drift apart unnoticed."""

from __future__ import annotations

import re
import shutil

import pytest

from oreline.config import load_config
from oreline.doctor.run import diagnose_run, run_checks
from oreline.report.html import render_report


@pytest.mark.slow
def test_report_and_doctor_read_a_real_training_run(healthy_template, tmp_path):
    from oreline.train.loop import train

    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    for part in ("data", "tokenizer", "tokens"):
        shutil.copytree(healthy_template / part, run / part)
    cfg = load_config(
        None,
        [
            "run.name=tiny",
            f"run.runs_dir={tmp_path / 'runs'}",
            "train.sources=[]",  # the demo config's mixture: this run has the one tokens/ folder
            "model.preset=debug",
            "train.seq_len=32",
            "train.micro_batch=2",
            "train.steps=10",
            "train.log_every=5",
            "train.eval_every=10",
            "train.eval_sequences=2",
            "train.optim.warmup_steps=2",
            "checkpoint.every=5",
            "eval.max_new_tokens=4",
            "eval.prompts=['Once upon']",
        ],
    )
    train(cfg, resume="none", allow_config_change=[])

    assert diagnose_run(run) == []
    skipped = {f.check for f in run_checks(run) if f.status == "skip"}
    # A 10-step run is too short for the trend checks, and train alone exports nothing; everything
    # else must have read real artifacts.
    assert skipped <= {"loss_not_falling", "throughput_falling", "grad_spikes", "export_format"}, skipped

    text = render_report(run)
    for sid in (
        "overview",
        "tokenizer",
        "tokens",
        "loss",
        "lr",
        "grad-norm",
        "throughput",
        "memory",
        "checkpoints",
        "events",
        "generations",
        "fingerprints",
    ):
        body = re.search(rf'<section id="{sid}">(.*?)</section>', text, re.S).group(1)
        assert "not available" not in body, (sid, body[:300])
    assert "step-00000010 (latest)" in text
