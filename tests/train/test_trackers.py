"""Experiment trackers (train.trackers) with the real packages: MLflow (a SQLite store, and a server
this test starts on 127.0.0.1 and stops) and W&B offline (its run files read back).

What is shown: every logged step reaches the trackers once, in order, with the config, fingerprints
and model size as params; a rollback never sends a step backwards; a killed and resumed run is ONE
MLflow run with steps 1..N and a documented pair of W&B offline runs in one group; a tracker that
is down or stops mid-run never stops training (one warning, metrics.jsonl complete).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from importlib import import_module
from pathlib import Path

import pytest

from oreline.train.loop import train

fixtures = import_module("oreline_test_train_fixtures")


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    """No tracker touches the network or the user's home: W&B offline, MLflow only where a test says."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    return {
        **os.environ,
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(folder: Path, port: int | None = None):
    """`mlflow server` on `port` (default: a free one) of 127.0.0.1 with a SQLite store in `folder`
    (started again on the same port and folder: the same server after an outage); yields (uri,
    process). Stopped (its process group, by id) at the end."""
    port = port or free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "server.log", "ab")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder / 'mlflow.db'}",
            "--artifacts-destination",
            (folder / "artifacts").as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its workers share the group: one killpg stops them all
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (folder / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not start in 120 s"
            time.sleep(0.5)
        yield uri, proc
    finally:
        stop_server(proc)
        log.close()


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def mlflow_service(tmp_path_factory):
    """service() → (uri, process) of one `mlflow server` shared by this module's server tests (each
    logs to an experiment of its own), started when first asked for: each start migrates a new
    SQLite store and imports the server anew (~12 CPU-seconds here). A test that stops it (test_mlflow_server_stopped_mid_run_training_finishes) leaves it stopped, and the next
    test that asks gets a new one. Every server is stopped at the end of the module."""
    with contextlib.ExitStack() as servers:
        current: list[tuple[str, subprocess.Popen]] = []

        def service() -> tuple[str, subprocess.Popen]:
            if not current or current[-1][1].poll() is not None:
                current.append(servers.enter_context(mlflow_server(tmp_path_factory.mktemp("mlflow-server"))))
            return current[-1]

        yield service


def mlflow_runs(uri: str, experiment: str = "oreline") -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


def metric_steps(uri: str, run_id: str, key: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    return [m.step for m in MlflowClient(uri).get_metric_history(run_id, key)]


def wandb_records(run_file: Path) -> list:
    """The protobuf records of a W&B offline run file (run-<id>.wandb): a 7-byte header (":W&B",
    magic, version), then LevelDB-log framing — 32 KiB blocks of chunks, each a 7-byte header
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and its bytes."""
    from wandb.proto import wandb_internal_pb2

    data = Path(run_file).read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out, block = 7, b"", [], 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if (kind == 0 and length == 0) or pos + 7 + length > len(data):
            break  # the end, or a record a kill cut short
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def wandb_run(folder: Path) -> dict:
    """An offline run folder's id, group, name, config, history rows and summary."""
    (run_file,) = folder.glob("run-*.wandb")
    out: dict = {"config": {}, "history": [], "summary": {}}
    for rec in wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out |= {"id": rec.run.run_id, "group": rec.run.run_group, "name": rec.run.display_name}
            out["config"] |= {u.key: json.loads(u.value_json) for u in rec.run.config.update}
        elif kind == "config":
            out["config"] |= {u.key: json.loads(u.value_json) for u in rec.config.update}
        elif kind == "history":
            out["history"].append(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            )
        elif kind == "summary":
            out["summary"] |= {
                (u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in rec.summary.update
            }
    return out


def wandb_steps(folder: Path) -> list[int]:
    """The train steps an offline run's file holds so far (none while it is being started)."""
    try:
        return [row["_step"] for row in wandb_run(folder)["history"] if "train/loss" in row]
    except Exception:  # noqa: BLE001 (no file yet, or its first bytes not written yet)
        return []


def test_sqlite_mlflow_and_offline_wandb_get_every_step_params_and_the_end(
    tmp_path, train_config, one_thread, offline_env
):
    """No server: MLflow on sqlite:///<run>/mlflow/mlflow.db, W&B offline in <run>/wandb."""
    cfg = train_config(
        train__steps=6, train__log_every=1, train__eval_every=3, train__trackers=["mlflow", "wandb"]
    )
    summary = train(cfg, resume="none")
    run = tmp_path / "t"
    recs = fixtures.read_metrics(run / "metrics.jsonl")
    start = recs[0]

    uri = f"sqlite:///{run / 'mlflow' / 'mlflow.db'}"
    (mrun,) = mlflow_runs(uri)
    assert mrun.info.status == "FINISHED"
    assert metric_steps(uri, mrun.info.run_id, "train/loss") == [1, 2, 3, 4, 5, 6]
    assert metric_steps(uri, mrun.info.run_id, "eval/val_loss") == [3, 6]
    params = mrun.data.params
    assert params["config_fingerprint"] == summary["config_fingerprint"] == start["config_fingerprint"]
    assert params["data_fingerprint"] == start["data_fingerprint"]
    assert params["tokenizer_fingerprint"] == start["tokenizer_fingerprint"]
    assert int(params["model.params"]) == start["model"]["params"] > 0
    assert params["config.train.steps"] == "6" and json.loads(params["config.train.trackers"]) == [
        "mlflow",
        "wandb",
    ]
    assert mrun.data.metrics["final/final_val_loss"] == pytest.approx(summary["final_val_loss"])

    (folder,) = (run / "wandb").glob("offline-run-*")
    w = wandb_run(folder)
    steps = [row["_step"] for row in w["history"] if "train/loss" in row]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [row["_step"] for row in w["history"] if "eval/val_loss" in row] == [3, 6]
    assert w["config"]["config_fingerprint"] == summary["config_fingerprint"]
    assert w["config"]["model.params"] == start["model"]["params"]
    assert w["summary"]["final/final_val_loss"] == pytest.approx(summary["final_val_loss"])
    assert w["group"] == w["id"] and w["name"] == "t"

    report = json.loads((run / "trackers.json").read_text())
    assert {n: (r["failures"], r["dropped"], r["finished"]) for n, r in report.items()} == {
        "mlflow": (0, 0, True),
        "wandb": (0, 0, True),
    }
    assert not (run / "tensorboard").exists()  # not listed in train.trackers: not written

    # `oreline run`'s export stage adds the export path to the finished runs it can reopen: the
    # MLflow run (still one, finished again); an offline W&B run cannot be reopened (left as it is)
    from oreline.train.trackers import log_after_training

    saved = {name: rep["state"] for name, rep in report.items()}
    after = log_after_training(run, cfg.train, saved, {"export_path": str(run / "export")})
    assert list(after) == ["mlflow"] and after["mlflow"]["failures"] == 0
    (mrun,) = mlflow_runs(uri)
    assert mrun.data.tags["export_path"] == str(run / "export") and mrun.info.status == "FINISHED"
    assert metric_steps(uri, mrun.info.run_id, "train/loss") == [1, 2, 3, 4, 5, 6]


def test_rollback_never_sends_a_step_backwards(tmp_path, train_config, one_thread, offline_env):
    """metrics.jsonl has step 4 twice around the rollback (test_loop); MLflow gets each step once,
    in order, and the rollback as events/rollback + rollback/to_step at the step it was seen."""
    cfg = train_config(
        train__steps=8,
        train__log_every=1,
        train__eval_every=0,
        checkpoint__every=3,
        train__debug__inject_nan_at_step=5,
        train__stability__action="rollback",
        eval__prompts=[],
        train__trackers=["mlflow"],
    )
    assert train(cfg, resume="none")["rollbacks"] == 1
    run = tmp_path / "t"
    trains = [r["step"] for r in fixtures.read_metrics(run / "metrics.jsonl") if r["type"] == "train"]
    assert trains == [1, 2, 3, 4, 4, 5, 6, 7, 8]
    uri = f"sqlite:///{run / 'mlflow' / 'mlflow.db'}"
    (mrun,) = mlflow_runs(uri)
    from mlflow.tracking import MlflowClient

    history = MlflowClient(uri).get_metric_history(mrun.info.run_id, "train/lr")
    in_order = [m.step for m in sorted(history, key=lambda m: m.timestamp)]
    assert in_order == [1, 2, 3, 4, 5, 6, 7, 8]
    assert metric_steps(uri, mrun.info.run_id, "events/rollback") == [5]
    assert mrun.data.metrics["rollback/to_step"] == 3 and mrun.data.metrics["rollback/failed_step"] == 5


def test_unreachable_mlflow_never_stops_training(
    tmp_path, train_config, one_thread, offline_env, monkeypatch
):
    """A tracking server that is not there: one `tracker_failed` event, the run finishes with every
    record in metrics.jsonl, and trackers.json counts what was dropped."""
    port = free_port()  # nothing listens on it
    # the user's own server, named in the environment (a config file alone may not name a server)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    cfg = train_config(
        train__steps=6,
        train__log_every=1,
        train__eval_every=0,
        train__trackers=["tensorboard", "mlflow"],
        train__tracker_flush_s=1.0,
    )
    t0 = time.monotonic()
    summary = train(cfg, resume="none")
    assert summary["step"] == 6 and time.monotonic() - t0 < 60
    run = tmp_path / "t"
    recs = fixtures.read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in recs if r["type"] == "train"] == [1, 2, 3, 4, 5, 6] and recs[-1][
        "type"
    ] == "end"
    failed = [r for r in recs if r.get("kind") == "tracker_failed"]
    assert len(failed) == 1 and failed[0]["values"]["tracker"] == "mlflow"
    assert "MLflow server" in failed[0]["message"]
    report = json.loads((run / "trackers.json").read_text())
    assert report["mlflow"]["failures"] >= 1 and report["mlflow"]["dropped"] >= 1
    assert not report["mlflow"]["finished"]
    assert report["tensorboard"]["failures"] == 0 and report["tensorboard"]["finished"]  # the others go on
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))


def test_unknown_tracker_is_a_config_error(train_config):
    from oreline.errors import ConfigError

    with pytest.raises((ConfigError, ValueError), match="tensorboard, wandb|'tensorboard', 'wandb'"):
        train_config(train__trackers=["neptune"])


# ---------------------------------------------------------------------------------------------
# subprocess runs against a real MLflow server

kill_resume = None


def _kill_resume():
    """tests/train/test_kill_resume_train.py's launch and kill helpers (loaded by path, not copied)."""
    global kill_resume
    if kill_resume is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "oreline_test_kill_resume_train", Path(__file__).with_name("test_kill_resume_train.py")
        )
        kill_resume = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kill_resume)
    return kill_resume


def launch(config: Path, log: Path, env: dict) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "oreline", "train", "-c", str(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
def test_killed_and_resumed_run_is_one_mlflow_run_and_one_wandb_group(
    tmp_path, prose_tokens, offline_env, mlflow_service
):
    kr = _kill_resume()
    steps = 48  # slower steps than the kill tests': the kill waits for both trackers to have started
    experiment = "killed-and-resumed"  # the server is the module's: this test's runs are its own
    settings = dict(
        train__trackers=["mlflow", "wandb"], train__mlflow__experiment=experiment, train__steps=steps
    )
    config = kr.write_config(
        tmp_path / "run.toml", tmp_path / "runs", prose_tokens, **settings, train__debug__sleep_per_step_s=0.4
    )
    run = tmp_path / "runs" / "r"
    uri, _server = mlflow_service()
    env = {**offline_env, "MLFLOW_TRACKING_URI": uri}
    log = tmp_path / "train.log"
    proc = launch(config, log, env)

    def both_started() -> bool:  # past the first checkpoint, each tracker holding some steps
        runs = mlflow_runs(uri, experiment)
        return (
            kr.has(run, "train", 6)
            and any(wandb_steps(f) for f in (run / "wandb").glob("offline-run-*"))
            and bool(runs)
            and bool(metric_steps(uri, runs[0].info.run_id, "train/loss"))
        )

    deadline = time.monotonic() + 300
    while not both_started():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # mid-run: the newest checkpoint is the resume point
    proc.wait()
    assert not kr.has(run, "end", steps)
    resume_at = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
    # the resumed run needs no slow steps (nothing is killed in it); train.debug.* do not count as a
    # config change on resume (checkpoint/resume.py NOT_COUNTED), so this is the same run resumed
    kr.write_config(config, tmp_path / "runs", prose_tokens, **settings, train__debug__sleep_per_step_s=0.0)
    proc = launch(config, log, env)  # --resume auto is the default
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    resumed = [r for r in fixtures.read_metrics(run / "metrics.jsonl") if r.get("kind") == "resume"]
    assert len(resumed) == 1 and resumed[0]["step"] == resume_at

    (mrun,) = mlflow_runs(uri, experiment)  # ONE run, continued
    assert mrun.info.status == "FINISHED"
    assert metric_steps(uri, mrun.info.run_id, "train/loss") == list(range(1, steps + 1))
    evals = [s for s in range(1, steps + 1) if s % kr.EVAL_EVERY == 0]
    assert metric_steps(uri, mrun.info.run_id, "eval/val_loss") == evals
    # the setting changed for the resumed run is a tag beside the kept param (a param cannot change)
    key = "config.train.debug.sleep_per_step_s"
    assert float(mrun.data.params[key]) == 0.4 and float(mrun.data.tags[f"changed_on_resume.{key}"]) == 0.0
    trains = {r["step"]: r for r in fixtures.read_metrics(run / "metrics.jsonl") if r["type"] == "train"}
    from mlflow.tracking import MlflowClient

    sent = {m.step: m.value for m in MlflowClient(uri).get_metric_history(mrun.info.run_id, "train/loss")}
    assert sent == {s: pytest.approx(r["loss"]) for s, r in trains.items()}  # resume is bit-exact

    # W&B offline cannot continue a run (wandb #2423): the resumed training is a second offline
    # run in the first one's group, named <name>-resume-1, that holds every step (those up to the
    # checkpoint sent again from metrics.jsonl); the first ends where it was killed
    runs = sorted((wandb_run(f) for f in (run / "wandb").glob("offline-run-*")), key=lambda w: w["name"])
    assert [w["name"] for w in runs] == ["r", "r-resume-1"]
    first, second = runs
    assert second["group"] == first["group"] == first["id"] != second["id"]
    assert second["config"]["wandb_resumed_from"] == first["id"]
    first_steps = [row["_step"] for row in first["history"] if "train/loss" in row]
    second_steps = [row["_step"] for row in second["history"] if "train/loss" in row]
    assert second_steps == list(range(1, steps + 1))
    # (the first may lag its metrics.jsonl: its calls still queued when the kill came are lost)
    assert first_steps == list(range(1, len(first_steps) + 1)) and len(first_steps) < steps


@pytest.mark.slow
def test_mlflow_server_stopped_mid_run_training_finishes(tmp_path, prose_tokens, offline_env, mlflow_service):
    kr = _kill_resume()
    steps = 48  # long enough for the tracker to start (seconds on a loaded machine) before the end
    experiment = "server-stopped"  # the server is the module's (this test stops it): its runs are its own
    config = kr.write_config(
        tmp_path / "run.toml",
        tmp_path / "runs",
        prose_tokens,
        train__trackers=["mlflow"],
        train__mlflow__experiment=experiment,
        train__tracker_flush_s=2.0,
        train__steps=steps,
        train__debug__sleep_per_step_s=0.4,
        checkpoint__every=0,
    )
    run = tmp_path / "runs" / "r"
    log = tmp_path / "train.log"
    uri, server = mlflow_service()
    proc = launch(config, log, {**offline_env, "MLFLOW_TRACKING_URI": uri})

    def sent_some() -> bool:
        runs = mlflow_runs(uri, experiment)
        return bool(runs) and bool(metric_steps(uri, runs[0].info.run_id, "train/loss"))

    deadline = time.monotonic() + 300
    while not sent_some():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    stop_server(server)  # mid-run
    assert not kr.has(run, "end", steps)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    recs = fixtures.read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in recs if r["type"] == "train"] == list(range(1, steps + 1))
    assert recs[-1]["type"] == "end"
    failed = [r for r in recs if r.get("kind") == "tracker_failed"]
    assert len(failed) == 1 and failed[0]["values"]["tracker"] == "mlflow"
    report = json.loads((run / "trackers.json").read_text())["mlflow"]
    assert report["failures"] >= 1 and report["dropped"] >= 1
    assert "tracker mlflow" in log.read_text()  # the end's warning with the dropped count


def test_a_call_mlflow_refuses_every_time_is_dropped_and_the_calls_behind_it_still_go(
    tmp_path, offline_env, monkeypatch
):
    """A metric name MLflow's client rejects (it validates names before any request) fails every
    attempt: after MAX_ATTEMPTS it is counted as dropped, and the call queued behind it is sent."""
    from mlflow.tracking import MlflowClient

    from oreline.config import MlflowConfig
    from oreline.train import trackers
    from oreline.train.trackers.mlflow_tracker import MlflowTracker

    monkeypatch.setattr(trackers, "BACKOFF_FIRST_S", 0.01)  # 8 attempts in well under a second
    monkeypatch.setattr(trackers, "BACKOFF_MAX_S", 0.02)
    guarded = trackers.Guarded(MlflowTracker(tmp_path, MlflowConfig(), {}))
    guarded.submit("metrics", "train", {"train/bad name!": 1.0}, 1)
    guarded.submit("metrics", "train", {"train/loss": 2.5}, 2)
    guarded.close(timeout=60)
    report = guarded.report()
    assert report["dropped"] == 1 and report["failures"] == trackers.MAX_ATTEMPTS, report
    assert "bad name!" in report["first_error"], report
    client = MlflowClient(tracking_uri=guarded.tracker.uri)
    run_id = report["state"]["run_id"]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == [(2, 2.5)]
    assert client.get_metric_history(run_id, "train/bad name!") == []
    assert client.get_run(run_id).info.status == "FINISHED"
