"""Hostile input, issue 45 item 2: a queued job runs exactly what was submitted.

A Slurm job may start hours after `oreline run --executor slurm` (or `ablate`, or `launch slurm`)
submitted it, as the user. Someone who can write the folder its config sits in (a group member,
under umask 002) edits the config in between: another corpus, another output folder. Each test
submits a job that stays in the queue (held), edits the config on disk, releases the job and shows
that it refused the edited config instead of running it; and that the folder with the job's inputs
is private (`oreline.job_inputs`).
"""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from oreline.errors import ConfigError

pytestmark = pytest.mark.hostile

CHANGED = "changed since this job was submitted"


def _state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv).get("JobState", "?")


def _release_and_wait(job: str, done, timeout: float = 240.0) -> str:
    """Release a held job and wait until it has left the queue or `done()` holds; its last state."""
    subprocess.run(["scontrol", "release", job], check=True, capture_output=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _state(job)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") or done():
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not end within {timeout:.0f} s (state {_state(job)})")


def _cancel(jobs: list[str]) -> None:
    if jobs:
        subprocess.run(["scancel", *jobs], check=False, capture_output=True)


RUN = """
[run]
name = "queued"
runs_dir = "{runs}"
[data]
inputs = ["{{samples}}/web-archives/dolma-wget-2024"]
workers = 1
[data.slurm]
sbatch_args = ["--hold"]
[tokenizer]
vocab_size = 512
[model]
preset = "debug"
[train]
seq_len = 64
micro_batch = 2
steps = 2
"""


@pytest.mark.slurm
def test_a_queued_stage_job_refuses_the_config_edited_while_it_waited(slurm_cluster, samples, tmp_path):
    from oreline.config import load_config
    from oreline.stages import submit_stage_jobs

    runs = tmp_path / "runs"
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(runs=runs))
    old = os.umask(0o002)  # a group-shared folder: before, jobs/ came out 0775 and config.toml 0664
    try:
        chain = submit_stage_jobs(load_config(path), console=Console(file=io.StringIO()))
    finally:
        os.umask(old)
    jobs = [c["job"] for c in chain]
    jobs_dir = runs / "queued" / "jobs"
    try:
        modes = [(p.stat().st_mode & 0o777) for p in (jobs_dir, jobs_dir / "config.toml")]
        # the edit a group member makes while the chain waits: the stage writes another run folder
        config = jobs_dir / "config.toml"
        text = config.read_text()
        assert 'name = "queued"' in text
        config.chmod(0o600)
        config.write_text(text.replace('name = "queued"', 'name = "edited"'))
        state = _release_and_wait(jobs[0], done=lambda: (runs / "edited").exists())
    finally:
        _cancel(jobs)
    log = jobs_dir / f"data-{jobs[0]}.out"
    text = log.read_text() if log.exists() else ""
    assert not (runs / "edited").exists(), "the stage job ran the edited config:\n" + text[-2000:]
    assert state == "FAILED" and CHANGED in " ".join(text.split()), (state, text[-2000:])
    assert modes == [0o700, 0o600]  # nobody else could read or change it in the first place


ABLATION = """
name = "abl"
out_dir = "{out}"
[[recipes]]
name = "a"
data = "{recipe}"
[[recipes]]
name = "b"
docs = "{docs}"
[validation]
recipe = "a"
[proxy]
tokens = 1000
"""

RECIPE = """
[data]
inputs = ["{inputs}"]
[data.slurm]
sbatch_args = ["--hold"]
"""


@pytest.mark.slurm
def test_a_queued_ablation_arm_job_refuses_the_ablation_edited_while_it_waited(slurm_cluster, tmp_path):
    from oreline.ablation import load_ablation, submit_arm_jobs
    from oreline.config import to_toml

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.format(inputs=tmp_path / "corpus"))
    path = tmp_path / "ablation.toml"
    path.write_text(ABLATION.format(out=tmp_path / "out", recipe=recipe, docs=tmp_path / "docs"))
    abl = load_ablation(path, executor="slurm")
    root = abl.root
    root.mkdir(parents=True)
    (root / "ablation.toml").write_text(to_toml(abl))  # as run_ablation writes it before submitting
    old = os.umask(0o002)
    try:
        submitted = submit_arm_jobs(abl, ["a-seed1234"], Console(file=io.StringIO()))
    finally:
        os.umask(old)
    jobs = [j["job"] for j in submitted]
    try:
        mode = (root / "jobs").stat().st_mode & 0o777
        # the recipe's own config file is no job input: its [data] keys travel in the submitted copy
        recipe.write_text(RECIPE.format(inputs="/elsewhere/corpus"))
        pinned = {p: load_ablation(p).recipes[0].data for p in (root / "jobs").glob("*.toml")}
        # the edit while the arm's job waits, to every ablation config in the folder
        for config in root.rglob("ablation.toml"):
            config.chmod(0o600)
            config.write_text(config.read_text().replace("tokens = 1000", "tokens = 999999"))
        state = _release_and_wait(jobs[0], done=lambda: False)
    finally:
        _cancel(jobs)
    log = root / "jobs" / f"a-seed1234-{jobs[0]}.out"
    text = " ".join(log.read_text().split()) if log.exists() else ""
    assert state == "FAILED" and CHANGED in text, (state, text[-2000:])
    assert list(pinned.values()) == [
        {"inputs": [str(tmp_path / "corpus")], "slurm": {"sbatch_args": ["--hold"]}}
    ]
    assert mode == 0o700


def test_the_launch_script_pins_the_config_and_a_changed_config_is_refused(tmp_path, oreline_cli):
    from oreline.job_inputs import digest
    from oreline.train.launch import slurm_script

    config = tmp_path / "c.toml"
    config.write_text('[run]\nname = "pinned"\n[model]\npreset = "debug"\n')
    text = slurm_script(config, 1, 0, cpus_per_task=1, time_limit="5")
    [line] = [x for x in text.splitlines() if "-m oreline train -c" in x]
    assert f"--config-sha256 {digest(config.read_bytes())}" in line, line
    sha = line.split("--config-sha256 ")[1].split()[0]
    # what every rank's `oreline train` does when the job starts after the config was edited
    config.write_text('[run]\nname = "pinned"\n[model]\npreset = "debug"\n[train]\ninit_from = "/x"\n')
    code, out = oreline_cli("train", "-c", str(config), "--config-sha256", sha)
    assert code != 0 and CHANGED in " ".join(out.split()), out[-2000:]
    assert not (Path("runs") / "pinned").exists()


def test_a_pinned_config_replaced_by_a_link_is_refused_even_with_the_same_bytes(tmp_path):
    from oreline.config import load_config
    from oreline.job_inputs import digest

    config = tmp_path / "config.toml"
    config.write_text('[run]\nname = "x"\n')
    sha = digest(config.read_bytes())
    assert load_config(config, sha256=sha).run.name == "x"
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_bytes(config.read_bytes())
    config.unlink()
    config.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(config, sha256=sha)


def test_the_requeue_notice_is_never_written_through_a_planted_link(tmp_path):
    from oreline.train.shutdown import ask_for_requeue

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    target = tmp_path / ".oreline-requeue-77"
    # the temporary name the notice was written under was known in advance: a link planted there
    (tmp_path / f".{target.name}.tmp-{os.getpid()}").symlink_to(victim)
    env = {"ORELINE_REQUEUE_FILE": str(target), "SLURM_JOB_ID": "77"}
    assert ask_for_requeue("checkpoints/step-4", env=env) == "77"
    assert victim.read_text() == "the user's file\n"
    assert target.read_text() == "checkpoints/step-4\n" and not target.is_symlink()
    assert target.stat().st_mode & 0o077 == 0


def test_an_ablation_jobs_folder_planted_as_a_link_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    from oreline.ablation import load_ablation, submit_arm_jobs
    from oreline.errors import ClusterError

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.format(inputs=tmp_path / "corpus"))
    path = tmp_path / "ablation.toml"
    path.write_text(ABLATION.format(out=tmp_path / "out", recipe=recipe, docs=tmp_path / "docs"))
    abl = load_ablation(path, executor="slurm")
    abl.root.mkdir(parents=True)
    project = tmp_path / "project"  # a folder of the user's, which the jobs would have gone into
    project.mkdir(mode=0o755)
    project.chmod(0o755)
    (abl.root / "jobs").symlink_to(project)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # nothing may reach sbatch either way
    with pytest.raises(ClusterError, match="is a link"):
        submit_arm_jobs(abl, ["a-seed1234"], Console(file=io.StringIO()))
    assert list(project.iterdir()) == [] and project.stat().st_mode & 0o777 == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's takes root (CI runs as root)")
def test_a_jobs_folder_of_another_user_is_refused_and_one_of_ours_left_open_is_closed(tmp_path):
    from oreline.errors import ClusterError
    from oreline.job_inputs import private_folder

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 54321, 54321)
    with pytest.raises(ClusterError, match="owned by another user"):
        private_folder(theirs)
    ours = tmp_path / "ours"
    ours.mkdir()
    ours.chmod(0o775)  # what umask 002 made of RUN/jobs before
    assert private_folder(ours).stat().st_mode & 0o777 == 0o700
