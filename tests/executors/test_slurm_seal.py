"""The Slurm executor's job and result files are pickles: one planted or changed in the work folder
is refused before anything is unpickled. No cluster needed: this is the array task's own code."""

from __future__ import annotations

import os
import pickle

import pytest

from oreline.errors import ClusterError
from oreline.executors.slurm import JOBS_FILE, KEY_ENV, run_pack, seal, unseal


class _RunsACommand:
    """A pickle whose loading writes a marker file (what a forged jobs file would do)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_jobs_file_sealed_with_another_key_is_refused_before_unpickling(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    folder = tmp_path / "filter-0"
    (folder / "results").mkdir(parents=True)
    forged = pickle.dumps({"fn": len, "jobs": [(_RunsACommand(str(marker)),)], "pack": 1})
    (folder / JOBS_FILE).write_bytes(seal(forged, "a key the attacker chose"))
    monkeypatch.setenv(KEY_ENV, "the key of the submitting process")
    with pytest.raises(ClusterError, match="does not carry the seal") as err:
        run_pack(folder, 0)
    assert str(folder / JOBS_FILE) in str(err.value)
    assert not marker.exists()

    (folder / JOBS_FILE).write_bytes(forged)  # no seal at all
    with pytest.raises(ClusterError, match="does not carry the seal"):
        run_pack(folder, 0)
    assert not marker.exists()


def test_sealed_jobs_run_and_their_results_are_sealed(tmp_path, monkeypatch):
    folder = tmp_path / "filter-0"
    (folder / "results").mkdir(parents=True)
    key = "k" * 64
    (folder / JOBS_FILE).write_bytes(
        seal(pickle.dumps({"fn": divmod, "jobs": [(7, 2), (9, 4)], "pack": 2}), key)
    )
    monkeypatch.setenv(KEY_ENV, key)
    assert run_pack(folder, 0) == 0
    results = sorted((folder / "results").glob("*.pkl"))
    assert [unseal(p.read_bytes(), key, p) for p in results] == [(3, 1), (2, 1)]
    with pytest.raises(ClusterError, match="does not carry the seal"):
        unseal(results[0].read_bytes(), "another key", results[0])
    monkeypatch.delenv(KEY_ENV)
    (folder / "results" / results[0].name).unlink()
    with pytest.raises(ClusterError):  # a task started without the key refuses too
        run_pack(folder, 0)
