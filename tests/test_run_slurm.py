"""`oreline run --executor slurm`: every stage its own Slurm job, chained with afterok, on the local
cluster (scripts/local-slurm.sh; CI starts it). The driver returns at once; the chain runs crawl to
report (the data tasks as array jobs), and a local `oreline run` afterwards finds nothing to redo."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from rich.console import Console

from oreline.config import load_config
from oreline.errors import OrelineError
from oreline.stages import STAGES, run_all, stage_plan

MINI = """
[run]
name = "chain"
runs_dir = "{runs}"
[data]
inputs = ["{{samples}}/web-archives/dolma-wget-2024"]
extra_inputs = ["{{samples}}/english-prose/tinyshakespeare.txt.gz"]
workers = 1
[data.slurm]
poll_s = 0.3
[data.langid]
languages = ["en"]
[tokenizer]
vocab_size = 512
[tokenize]
val_fraction = 0.05
workers = 1
[model]
preset = "debug"
[train]
seq_len = 64
micro_batch = 2
steps = 4
log_every = 2
eval_every = 4
eval_sequences = 2
[checkpoint]
every = 4
[eval]
batches = 1
max_new_tokens = 4
prompts = ["To be"]
"""


def _state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv).get("JobState", "?")


@pytest.mark.slurm
@pytest.mark.slow
def test_stage_chain_runs_crawl_to_report_as_afterok_jobs(slurm_cluster, samples, tmp_path):
    path = tmp_path / "chain.toml"
    path.write_text(MINI.format(runs=tmp_path / "runs"))
    t0 = time.monotonic()
    driver = subprocess.run(
        [sys.executable, "-m", "oreline", "run", "-c", str(path), "--executor", "slurm"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    driver_s = time.monotonic() - t0
    run = tmp_path / "runs" / "chain"
    chain = json.loads((run / "jobs" / "chain.json").read_text())
    assert [c["stage"] for c in chain] == STAGES
    for before, job in zip(chain, chain[1:], strict=False):
        out = subprocess.run(["scontrol", "show", "job", job["job"]], capture_output=True, text=True).stdout
        assert f"afterok:{before['job']}" in out or _state(job["job"]) in ("RUNNING", "COMPLETED"), out
    last = chain[-1]["job"]
    deadline = time.monotonic() + 600
    while _state(last) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") and time.monotonic() < deadline:
        time.sleep(0.5)
    logs = {c["stage"]: (run / "jobs" / f"{c['stage']}-{c['job']}.out") for c in chain}
    states = {c["stage"]: _state(c["job"]) for c in chain}
    assert set(states.values()) == {"COMPLETED"}, (
        states,
        {k: p.read_text()[-1500:] for k, p in logs.items() if p.exists()},
    )
    print(f"driver returned in {driver_s:.1f} s; chain {states}")
    lineage = json.loads((run / "lineage.json").read_text())
    assert all(lineage[s]["finished"] for s in STAGES)
    assert (run / "report.html").is_file() and (run / "export" / "config.json").is_file()
    assert list((run / "data" / "work" / "slurm").glob("filter-*"))  # the data tasks ran as array jobs
    # the executor is not part of a stage's key: run here, nothing is left to do
    assert [a for _, a in stage_plan(load_config(path))] == ["skip"] * len(STAGES)


def test_a_stage_job_refuses_to_run_before_its_predecessors(samples, tmp_path):
    path = tmp_path / "chain.toml"
    path.write_text(MINI.format(runs=tmp_path / "runs"))
    with pytest.raises(OrelineError) as err:
        run_all(load_config(path), console=Console(stderr=True), only="tokenizer")
    assert "stage tokenizer needs data first" in str(err.value)
    assert not (tmp_path / "runs" / "chain" / "tokenizer").exists()
