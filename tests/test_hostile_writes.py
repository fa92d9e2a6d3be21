"""Writes through planted links (issue 45 item 4; `-m hostile`).

oreline creates no symbolic links, so a link inside a folder oreline owns was planted. Each test
plants one where oreline, or a library it drives, writes: the run's eval/ (`oreline eval --tasks`),
a result file's own name, metrics.jsonl, the TensorBoard, MLflow and W&B folders, the Slurm jobs
folder. Before this change each wrote through the link into the folder or file it points at; now
the write is refused with one PlantedLink naming the link, and what it points at is untouched.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from oreline.config import MlflowConfig, WandbConfig
from oreline.io import PlantedLink, open_append, real_folder, write_json_atomic, write_text_atomic
from oreline.outdir import OWNER
from oreline.runs import RunDir

pytestmark = pytest.mark.hostile
_NAME = "oreline_test_train_fixtures"  # the prose tokens of tests/train/conftest.py, as tests/eval uses them
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).parent / "train" / "conftest.py")
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])
prose_tokens = sys.modules[_NAME].prose_tokens
SRC = Path(__file__).resolve().parents[1] / "src" / "oreline"


def _run(tmp_path: Path) -> Path:
    """A run folder oreline claimed (its .oreline-owner written), as `oreline run` leaves it."""
    return RunDir(tmp_path / "runs" / "r").claim("oreline run").root


def _victim(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder of the user's, with a file whose name oreline would write."""
    victim = tmp_path / "notes"
    victim.mkdir()
    (victim / "tasks-step-3.json").write_text("my notes\n")
    (victim / "metrics.jsonl").write_text("my metrics\n")
    return victim, _snapshot(victim)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_linked_sub_folder_of_a_run_is_never_written_through(tmp_path):
    run = _run(tmp_path)
    victim, before = _victim(tmp_path)
    (run / "eval").symlink_to(victim)
    with pytest.raises(
        PlantedLink, match=f"{re.escape(str(run / 'eval'))} is a symbolic link .*inside the oreline folder"
    ):
        write_json_atomic(run / "eval" / "tasks-step-3.json", {"core": 0.5})
    with pytest.raises(PlantedLink):
        write_text_atomic(run / "eval" / "deeper" / "x.txt", "x")  # also below the linked folder
    assert _snapshot(victim) == before


def test_a_link_at_a_files_own_name_is_refused_and_its_target_kept(tmp_path):
    run = _run(tmp_path)
    victim, before = _victim(tmp_path)
    (run / "metrics.jsonl").symlink_to(victim / "metrics.jsonl")
    with pytest.raises(PlantedLink, match="metrics.jsonl: it is a symbolic link"):
        open_append(run / "metrics.jsonl")
    (run / "eval").mkdir()
    (run / "eval" / "tasks-step-3.json").symlink_to(victim / "tasks-step-3.json")
    with pytest.raises(PlantedLink, match="symbolic link"):
        write_json_atomic(run / "eval" / "tasks-step-3.json", {})
    assert _snapshot(victim) == before
    assert (run / "metrics.jsonl").is_symlink()  # left as it was, for the user to look at


def test_the_training_metrics_log_refuses_a_linked_metrics_jsonl(tmp_path):
    from oreline.train.monitor import MetricsLogger

    run = _run(tmp_path)
    victim, before = _victim(tmp_path)
    (run / "metrics.jsonl").symlink_to(victim / "metrics.jsonl")
    with pytest.raises(PlantedLink, match="metrics.jsonl"):
        MetricsLogger(run / "metrics.jsonl", None)
    assert _snapshot(victim) == before


def test_the_owned_folder_itself_may_be_a_link(tmp_path):
    """A scratch disk behind the run folder (or runs_dir) is the user's choice, not a planted link."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "runs").symlink_to(scratch)
    run = _run(tmp_path)
    write_json_atomic(run / "eval" / "a.json", {"ok": 1})
    with open_append(run / "metrics.jsonl") as fh:
        fh.write("{}\n")
    assert json.loads((scratch / "r" / "eval" / "a.json").read_text()) == {"ok": 1}


@pytest.mark.slow  # a debug model scores two items of one task (~10 s)
def test_oreline_eval_tasks_never_writes_through_a_linked_eval_folder(tmp_path, oreline_cli, prose_tokens):
    """`oreline eval RUN --tasks` writes eval/tasks-step-N.json and .items.jsonl into the run's
    eval/; a link planted there (even in a run folder an older oreline wrote, with no marker) got
    both written into the folder it points at, overwriting a file of the same name."""
    import torch

    from oreline.model.llama import Llama, ModelArgs
    from oreline.model.presets import PRESETS, llama_ffn_dim
    from oreline.tokens.train_bpe import load_tokenizer
    from oreline.train.checkpoint.save import save_checkpoint

    spec = dict(PRESETS["debug"])
    spec["ffn_dim"] = llama_ffn_dim(spec["dim"], spec.pop("multiple_of"))
    torch.manual_seed(0)
    model = Llama(ModelArgs(**spec))
    model.init_weights(torch.Generator().manual_seed(0))
    meta = {
        "model_args": model.args.to_dict(),
        "tokenizer_dir": str(prose_tokens["tokenizer"]),
        "tokens_seen": 0,
        "config": {"train": {"seq_len": 64}},
        "tokenizer_fingerprint": load_tokenizer(prose_tokens["tokenizer"]).fingerprint,
    }
    victim, before = _victim(tmp_path)
    for name, claimed in (("owned", True), ("legacy", False)):
        run = tmp_path / name
        save_checkpoint(run / "checkpoints", 3, model, None, meta, kind="model_only")
        if claimed:
            (run / OWNER).write_text(json.dumps({"kind": "run"}))
        (run / "eval").symlink_to(victim)
        code, text = oreline_cli("eval", str(run), "--tasks", "copa", "--max-items", "2")
        assert code != 0, text
        assert f"{run / 'eval'} is a symbolic link" in text and "Traceback" not in text, text
        assert _snapshot(victim) == before, name


def test_tracker_folders_are_checked_before_the_library_writes(tmp_path, monkeypatch):
    """TensorBoard, MLflow (its SQLite file) and W&B write their folders themselves, following links."""
    from oreline.train.trackers.mlflow_tracker import MlflowTracker
    from oreline.train.trackers.tensorboard import TensorBoardTracker
    from oreline.train.trackers.wandb_tracker import WandbTracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = _run(tmp_path)
    victim, before = _victim(tmp_path)
    for name in ("tensorboard", "mlflow", "wandb"):
        (run / name).symlink_to(victim)
    with pytest.raises(PlantedLink, match="tensorboard is a symbolic link"):
        TensorBoardTracker(run / "tensorboard").open()
    with pytest.raises(PlantedLink, match="mlflow is a symbolic link"):
        MlflowTracker(run, MlflowConfig(), {}).open()
    with pytest.raises(PlantedLink, match="wandb is a symbolic link"):
        WandbTracker(run, WandbConfig(mode="offline"), {}).open()
    assert _snapshot(victim) == before


def test_a_folder_slurm_writes_logs_into_must_be_a_real_one(tmp_path):
    """The jobs/ folder of `oreline run --executor slurm` (Slurm writes each job's log there itself)."""
    run = _run(tmp_path)
    victim, before = _victim(tmp_path)
    (run / "jobs").symlink_to(victim)
    with pytest.raises(PlantedLink, match="jobs is a symbolic link"):
        real_folder(run / "jobs")
    os.unlink(run / "jobs")
    assert real_folder(run / "jobs").is_dir() and not (run / "jobs").is_symlink()
    assert _snapshot(victim) == before


# Writes that bypass oreline.io: each line here is a write the no-follow writer cannot do, with why.
ALLOWED = {
    "quality/classifier.py": ['open(train_file, "w"'],  # fastText's input, in a fresh mkdtemp folder
    "quality/reference_lm.py": ['open(os.devnull, "w")'],
    "storage.py": ['os.fdopen(fd, "wb")', 'open(target, "wb")'],  # mkstemp's file; a fresh mkdtemp folder
    "slurm_script.py": ['os.fdopen(fd, "w"'],  # O_EXCL|O_NOFOLLOW temporary, then renamed
    "executors/slurm.py": ['os.fdopen(fd, "wb")'],  # the same
}
BARE = re.compile(
    r"\.write_text\(|\.write_bytes\(|shutil\.copy(?!fileobj)|json\.dump\(|(?<!\w)(fd)?open\([^)]*[\"'][wax]b?[\"']"
)


def test_every_write_in_src_goes_through_the_no_follow_writer():
    """No bare write_text/write_bytes/shutil.copy/json.dump/open(…, "w"|"a") outside oreline/io.py,
    beside the few listed above (each of which creates its file with O_EXCL or in a fresh folder)."""
    bare = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "io.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BARE.search(line) and not any(ok in line for ok in ALLOWED.get(rel, [])):
                bare.append(f"{rel}:{n}: {line.strip()}")
    assert not bare, (
        "writes that bypass oreline.io (use io.write_atomic / open_append / open_nofollow):\n"
        + "\n".join(bare)
    )
