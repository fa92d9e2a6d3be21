"""Run folders (`runs/NAME`) are oreline's like --out folders (issue 32, items 5 and 6; `-m hostile`).

`run.runs_dir=R run.name=victim` naming a folder of the user's files used to overwrite its
config.toml and lineage.json and delete its extra/ (`oreline run`), or overwrite config.toml and
then crash on the user's fingerprint.json (`oreline train`). Both now refuse the folder before
writing anything; a folder an earlier oreline run wrote is still reused, and a planted link among
the names a run writes is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oreline.config import load_config
from oreline.outdir import OWNER, NotOurFolder

# the user's folder of the issue: names a run writes (extra/, config.toml, lineage.json,
# fingerprint.json) holding the user's own content, beside a git repository
USER_FILES = {
    "extra/keep.txt": b"my extra notes",
    "config.toml": b"[tool]\nmine = true\n",
    "lineage.json": b'{"my": "lineage"}',
    "fingerprint.json": b"my fingerprints, not JSON",
    ".git/HEAD": b"ref: refs/heads/main\n",
}


def user_folder(root: Path) -> Path:
    for rel, data in USER_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def assert_untouched(root: Path) -> None:
    for rel, data in USER_FILES.items():
        assert (root / rel).read_bytes() == data, rel
    assert sorted(p.name for p in root.iterdir()) == sorted({rel.split("/")[0] for rel in USER_FILES})


@pytest.mark.hostile
def test_oreline_run_refuses_a_user_folder_and_writes_nothing(tmp_path):
    from oreline.stages import run_all

    victim = user_folder(tmp_path / "R" / "victim")
    cfg = load_config(
        None,
        [
            f"run.runs_dir={tmp_path / 'R'}",
            "run.name=victim",
            f"data.inputs=[{json.dumps(str(tmp_path / 'no-input.warc.gz'))}]",
            "data.extra_inputs=[]",
        ],
    )
    with pytest.raises(NotOurFolder, match=r"victim is not empty .*choose another run.name"):
        run_all(cfg)
    assert_untouched(victim)


@pytest.mark.hostile
def test_oreline_train_refuses_a_user_folder_and_writes_nothing(tmp_path, train_config):
    from oreline.train.loop import train

    victim = user_folder(tmp_path / "t")  # train_config's run folder: runs_dir tmp_path, name "t"
    with pytest.raises(NotOurFolder, match="not created by oreline train"):
        train(train_config(), resume="none")
    assert_untouched(victim)


@pytest.mark.hostile
def test_a_planted_link_in_a_run_folder_is_refused(tmp_path, train_config):
    """config.toml -> the user's own file, in a folder oreline created: train wrote through it."""
    from oreline.outdir import claim_folder
    from oreline.train.loop import train

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.toml").write_text("[tool]\nmine = true\n")
    root = claim_folder(
        tmp_path / "t", "run", "oreline run"
    )  # oreline's run folder, as `oreline run` made it
    os.symlink(mine / "config.toml", root / "config.toml")
    with pytest.raises(NotOurFolder, match=r"symbolic links .*config.toml -> .*mine/config.toml"):
        train(train_config(), resume="none")
    assert (mine / "config.toml").read_text() == "[tool]\nmine = true\n"
    assert sorted(p.name for p in root.iterdir()) == [OWNER, "config.toml"]  # nothing else written


def test_run_folders_oreline_wrote_are_reused(tmp_path):
    """A folder with the run marker, one an oreline version before markers wrote (its
    fingerprint.json, or only stage folders) is claimed; another kind's folder is not."""
    from oreline.config import write_resolved
    from oreline.runs import RunDir

    ours = RunDir(tmp_path / "a").claim("oreline run")
    (ours.root / "config.toml").write_text("x = 1\n")
    assert RunDir(tmp_path / "a").claim("oreline train").root == ours.root

    old = tmp_path / "old"  # `oreline run` of an earlier version: config.toml + fingerprint.json
    write_resolved(load_config(), old, section="run")
    (old / "notes.md").write_text("the user's notes beside the run")
    RunDir(old).claim("oreline run")
    assert json.loads((old / OWNER).read_text())["adopted"] == "legacy"

    stages = tmp_path / "stages"  # `oreline tokenize --out runs/NAME/tokens` before the first train
    (stages / "tokens").mkdir(parents=True)
    (stages / "checkpoints").mkdir()
    RunDir(stages).claim("oreline train")

    other = tmp_path / "tok"
    other.mkdir()
    (other / OWNER).write_text(json.dumps({"kind": "tokens"}))
    with pytest.raises(NotOurFolder, match="holds oreline 'tokens' output, not 'run'"):
        RunDir(other).claim("oreline train")


@pytest.mark.parametrize("command", ["train", "run"])
def test_a_refused_start_leaves_no_run_folder_holding_the_marker_alone(tmp_path, command):
    """A command refused after its claim (train: the demo's token sources do not exist; run: a
    misspelt --from) left runs/NAME/ behind holding `.oreline-owner` alone."""
    from rich.console import Console

    from oreline.errors import OrelineError
    from oreline.stages import run_all
    from oreline.train.loop import train

    cfg = load_config(None, [f"run.runs_dir={json.dumps(str(tmp_path))}"])

    def refused() -> None:
        with pytest.raises(OrelineError, match="token folders that do not exist|unknown stage 'trian'"):
            train(cfg) if command == "train" else run_all(cfg, "trian", console=Console(stderr=True))

    refused()
    assert not (tmp_path / "demo").exists()
    # a folder that was there before keeps its marker: only what this command created goes
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / OWNER).write_text(json.dumps({"kind": "run"}))
    refused()
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == [OWNER]
