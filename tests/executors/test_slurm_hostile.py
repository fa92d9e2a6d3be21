"""Hostile input against the Slurm side of oreline (issue 32, items 1 and 2).

- Someone who can write the run's work/slurm/*/ folder swaps the array job's script between
  oreline writing it and sbatch reading it, or before a retry: nothing they write there is run,
  because sbatch reads every submission's script on stdin (tests/executors/test_slurm_seal.py
  covers the job and result files: sealed JSON, no pickle); the folders are created 0700.
- A config value with a newline, a space or an option of its own that would reach a script
  (data.slurm.partition, sbatch_args, time limits, run.name) is refused when the config is loaded,
  naming the key; a value that reaches an #SBATCH line is one token as sbatch reads it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from oreline.config import load_config
from oreline.errors import ClusterError, ConfigError

pytestmark = pytest.mark.hostile


def _attacker(root: Path, marker: Path, stop: threading.Event) -> None:
    """Overwrite every script-looking file under root with one that records its environment."""
    attack = f"#!/usr/bin/env bash\nenv > {marker}\n"
    while not stop.is_set():
        for path in root.rglob("*") if root.is_dir() else []:
            script = path.is_file() and (path.suffix == ".sbatch" or path.name == "submitted.txt")
            if script and path.read_text(errors="replace") != attack:
                path.write_text(attack)
        time.sleep(0.005)


@pytest.mark.slurm
def test_a_script_swapped_in_the_work_folder_never_runs_and_the_folders_are_private(slurm_cluster, tmp_path):
    from oreline.config import SlurmConfig
    from oreline.data.pipeline.perplexity_cutoffs import task_sample
    from oreline.executors.interface import TaskCrashed
    from oreline.executors.slurm import SlurmExecutor

    work, marker = tmp_path / "w", tmp_path / "attacker-ran"
    (work / "slurm").mkdir(parents=True)
    (work / "slurm").chmod(0o777)  # left open by a umask or a shared parent: made private again
    stop = threading.Event()
    thread = threading.Thread(target=_attacker, args=(work / "slurm", marker, stop), daemon=True)
    thread.start()
    old = os.umask(0o002)
    try:
        # a task that fails, so the stage is submitted again: a retry of the same script path ran
        # the attacker's script with the stage's key in its environment
        ex = SlurmExecutor(SlurmConfig(max_retries=1, poll_s=0.3), work=work)
        missing = ([str(tmp_path / "missing.parquet")], str(tmp_path / "never.json"), 5)
        [crashed] = ex.map(task_sample, [missing], label="swap")
    finally:
        os.umask(old)
        stop.set()
        thread.join()
    assert not marker.exists(), "the attacker's script ran as the user:\n" + marker.read_text()[:500]
    assert isinstance(crashed, TaskCrashed)
    folder = work / "slurm" / "swap-0"
    assert len(list((folder / "logs").glob("*.out"))) == 2  # both attempts ran oreline's own task
    for path in [work / "slurm", folder, folder / "logs", folder / "results"]:
        assert path.stat().st_mode & 0o777 == 0o700, path
    assert (folder / "jobs.json").stat().st_mode & 0o777 == 0o600


def test_a_work_slurm_folder_that_is_a_link_or_someone_elses_is_refused(tmp_path):
    from oreline.executors.slurm import private_folder

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "slurm").symlink_to(elsewhere)
    with pytest.raises(ClusterError, match="not a folder"):
        private_folder(tmp_path / "slurm")
    mine = private_folder(tmp_path / "new")
    assert mine.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('data.slurm.partition="debug\\ntouch X"', "data.slurm.partition"),
        ('data.slurm.partition="debug --uid=0"', "data.slurm.partition"),
        ('data.slurm.time_limit="1:00:00\\ntouch X"', "data.slurm.time_limit"),
        ('data.slurm.stage_time_limit="1:00:00 --uid=0"', "data.slurm.stage_time_limit"),
        ('data.slurm.sbatch_args=["--qos=low\\ntouch X"]', "data.slurm.sbatch_args"),
        ('data.slurm.sbatch_args=["--comment=a b"]', "data.slurm.sbatch_args"),
        ('data.slurm.sbatch_args=["--export=LD_PRELOAD=/tmp/x.so"]', "data.slurm.sbatch_args"),
        ('data.slurm.sbatch_args=["--wrap=touch X"]', "data.slurm.sbatch_args"),
        ('run.name="demo\\ntouch X"', "run.name"),
        ('run.runs_dir="runs\\r\\ntouch X"', "run.runs_dir"),
    ],
)
def test_a_config_value_that_would_become_a_script_line_is_refused_at_load(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_plain_slurm_settings_still_load():
    cfg = load_config(
        None,
        [
            "data.slurm.partition=debug,gpu",
            'data.slurm.sbatch_args=["--account=abc", "--qos=low", "--exclusive"]',
            'data.slurm.time_limit="1-12:00:00"',
            "run.name=my run",
        ],
    )
    assert cfg.data.slurm.partition == "debug,gpu" and cfg.data.slurm.sbatch_args[-1] == "--exclusive"


def test_the_launch_script_refuses_a_value_that_sbatch_or_bash_would_split(tmp_path):
    from oreline.train.launch import slurm_script

    config = tmp_path / "c.toml"
    config.write_text("")
    for options in (
        {"partition": "debug\ntouch X"},
        {"partition": "debug --uid=0"},
        {"job_name": "x\ntouch X"},
        {"time_limit": "1:00:00\ntouch X"},
    ):
        with pytest.raises(ConfigError):
            slurm_script(config, 1, 0, **options)


@pytest.mark.slurm
def test_a_run_name_with_spaces_and_options_is_one_job_name_as_sbatch_reads_it(slurm_cluster, tmp_path):
    from oreline.executors.slurm import slurm_call, submit
    from oreline.train.launch import slurm_script

    config = tmp_path / "c.toml"
    config.write_text('[run]\nname = "my run --partition=nowhere --chdir=/"\n')
    text = slurm_script(config, 1, 0, cpus_per_task=1, time_limit="5")
    job = submit(text, ["--hold", f"--chdir={tmp_path}", f"--output={tmp_path}/%j.out"])
    try:
        shown = slurm_call(["scontrol", "show", "job", job]).stdout
    finally:
        subprocess.run(["scancel", job], check=False)
    assert "JobName=oreline-my_run_--partition_nowhere_--chdir__" in shown, shown
    assert "Partition=debug" in shown and f"WorkDir={tmp_path}" in shown, shown
