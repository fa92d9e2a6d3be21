"""The Slurm executor's job and result files: sealed JSON, never pickles. A file planted or changed
in the work folder is refused before anything in it is decoded, and even a correctly sealed file
cannot name a function or class outside oreline's lists. No cluster needed: this is the array
task's own code (oreline.executors.slurm.run_pack) and the codec (oreline.executors.wire)."""

from __future__ import annotations

import json
import pickle

import pytest

from oreline.config import load_config
from oreline.errors import ClusterError
from oreline.executors import wire
from oreline.executors.slurm import JOBS_FILE, KEY_ENV, run_pack, seal, unseal

SAMPLE = "oreline.data.pipeline.perplexity_cutoffs:task_sample"


def _folder(tmp_path):
    folder = tmp_path / "filter-0"
    (folder / "results").mkdir(parents=True)
    return folder


class _RunsACommand:
    """A pickle whose loading writes a marker file (what a forged pickle would do)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_jobs_file_sealed_with_another_key_is_refused_before_decoding(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    folder = _folder(tmp_path)
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


def test_a_sealed_pickle_is_still_not_loaded(tmp_path, monkeypatch):
    """Whoever holds the key (the array task's environment leaked) still cannot make a task load code."""
    marker, key = tmp_path / "ran", "k" * 64
    folder = _folder(tmp_path)
    forged = pickle.dumps({"fn": len, "jobs": [(_RunsACommand(str(marker)),)], "pack": 1, "retries": 0})
    (folder / JOBS_FILE).write_bytes(seal(forged, key))
    monkeypatch.setenv(KEY_ENV, key)
    with pytest.raises(ClusterError, match="is not a jobs file oreline wrote"):
        run_pack(folder, 0)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("fn", "value", "refusal"),
    [
        ("os:system", [], "not a task function oreline runs on Slurm"),
        ("subprocess:check_call", [], "not a task function oreline runs on Slurm"),
        (SAMPLE, {"$dataclass": "subprocess:Popen", "fields": {"args": "true"}}, "not a dataclass oreline"),
        (SAMPLE, {"$config": "__class__", "fields": {}}, "not an oreline config section"),
        (SAMPLE, {"$numpy": "object", "value": 1}, "numpy scalar of dtype 'object'"),
        (SAMPLE, {"__reduce__": "os.system"}, "oreline does not write"),
    ],
)
def test_a_sealed_jobs_file_cannot_name_code_outside_oreline_lists(tmp_path, monkeypatch, fn, value, refusal):
    folder, key = _folder(tmp_path), "k" * 64
    doc = {
        "format": wire.FORMAT,
        "kind": "jobs",
        "fn": fn,
        "jobs": [{"$tuple": [value]}],
        "pack": 1,
        "retries": 0,
    }
    (folder / JOBS_FILE).write_bytes(seal(json.dumps(doc).encode(), key))
    monkeypatch.setenv(KEY_ENV, key)
    with pytest.raises(ClusterError, match=refusal):
        run_pack(folder, 0)
    assert not list((folder / "results").iterdir())


def test_sealed_jobs_run_and_their_results_are_sealed_json(tmp_path, monkeypatch):
    from oreline.data.pipeline.perplexity_cutoffs import task_sample

    folder, key = _folder(tmp_path), "k" * 64
    jobs = [([], str(tmp_path / "a.json"), 3), ([], str(tmp_path / "b.json"), 3)]
    data = wire.dumps("jobs", fn=SAMPLE, jobs=jobs, pack=2, retries=0)
    (folder / JOBS_FILE).write_bytes(seal(data, key))
    monkeypatch.setenv(KEY_ENV, key)
    assert run_pack(folder, 0) == 0
    results = sorted((folder / "results").glob("*.json"))
    got = [wire.loads(unseal(p.read_bytes(), key, p), "result", p)["value"] for p in results]
    assert got == [task_sample(*job) for job in jobs]
    with pytest.raises(ClusterError, match="does not carry the seal"):
        unseal(results[0].read_bytes(), "another key", results[0])
    monkeypatch.delenv(KEY_ENV)
    (folder / "results" / results[0].name).unlink()
    with pytest.raises(ClusterError):  # a task started without the key refuses too
        run_pack(folder, 0)


def test_what_tasks_pass_and_return_comes_back_equal_and_of_the_same_types(tmp_path):
    import math
    from pathlib import Path

    import numpy as np

    from oreline.tokens.tokenize import Task

    cfg = load_config(None, ["data.dedup.threshold=0.7"])
    values = [
        cfg,
        cfg.data.dedup,
        Task(3, "p.parquet", (0, 2), "tok", "fp", "out", "g", 2**40, 100, 5),
        {1: {"a": (1, 2.5, None, True)}, "x": [Path("/a b"), b"\x00\xff"], (1, "k"): -3},
        [np.int64(-5), np.uint64(2**64 - 1), np.float32(1.5), np.bool_(True), math.inf],
    ]
    for value in values:
        back = wire.loads(wire.dumps("result", value=value), "result", "f")["value"]
        assert back == value and type(back) is type(value)
    [back] = wire.loads(wire.dumps("result", value=[math.nan]), "result", "f")["value"]
    assert math.isnan(back)
    nested = wire.loads(wire.dumps("result", value=values[-1]), "result", "f")["value"]
    assert [type(v) for v in nested] == [type(v) for v in values[-1]]
    with pytest.raises(TypeError, match="cannot travel"):
        wire.dumps("result", value=object())


def test_every_listed_task_function_exists():
    for name in wire.TASKS | wire.DATACLASSES:
        module, _, qualname = name.partition(":")
        obj = __import__(module, fromlist=["x"])
        for part in qualname.split("."):
            obj = getattr(obj, part)
        assert f"{obj.__module__}:{obj.__qualname__}" == name
