"""Tracker records lost to an outage, a late server, a kill or a server that died at the end are
sent again from metrics.jsonl: on a resume (every step the tracker lacks, below its highest too),
as soon as the tracker works again, and after the fact by `oreline trackers sync RUN`; the
counts in trackers.json add up over a run's launches. Real MLflow throughout: a SQLite store, or
an `mlflow server` this test starts on 127.0.0.1, stops and starts again on the same port and store.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import time
from importlib import import_module
from pathlib import Path

import pytest

fixtures = import_module("oreline_test_train_fixtures")


def _load(name: str):
    """A sibling test module's helpers (loaded by path, not copied)."""
    spec = importlib.util.spec_from_file_location(f"oreline_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tt = _load("test_trackers")
offline_env = tt.offline_env  # (the fixture: no tracker touches the network or the user's home)


def train_rec(step: int) -> dict:
    """A train record as the loop writes it (the fields the trackers are sent)."""
    return {
        "type": "train",
        "time": 0.0,
        "step": step,
        "tokens_seen": 512 * step,
        "loss": 9.0 - step / 10,
        "lr": 1e-3,
    }


def eval_rec(step: int) -> dict:
    return {"type": "eval", "time": 0.0, "step": step, "val_loss": 8.0 - step / 10, "val_tokens": 1024}


def write_metrics(path: Path, steps: int, eval_every: int) -> list[dict]:
    recs = []
    for n in range(1, steps + 1):
        recs.append(train_rec(n))
        if n % eval_every == 0:
            recs.append(eval_rec(n))
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return recs


def test_resume_sends_every_step_the_tracker_lacks_not_only_those_above_its_highest(
    tmp_path, train_config, offline_env
):
    """The campaign's case: an outage from step 8 lost steps 8-13 and the evals at 8 and 12; the server
    came back and took 14-43; a SIGKILL at 44. The resume from the checkpoint at 40 sends 8-13 and
    the eval (below MLflow's highest step, 43), finishes ONE run holding every step once, and
    trackers.json counts the killed launch's failures too."""
    from oreline.train.trackers import Guarded, open_trackers, record_metrics
    from oreline.train.trackers.mlflow_tracker import MlflowTracker

    run = tmp_path / "t"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    recs = write_metrics(metrics, 44, 4)
    cfg = train_config(train__trackers=["mlflow"]).train
    # the killed launch: what reached MLflow before the kill, and the trackers.json it kept
    first = Guarded(MlflowTracker(run, cfg.mlflow, {}))
    for rec in recs:
        if not 8 <= rec["step"] <= 13 and rec["step"] < 44:
            first.submit("metrics", rec["type"], record_metrics(rec), rec["step"])
    first.close(timeout=60)
    killed = first.report()
    killed["failures"], killed["finished"] = (
        6,
        False,
    )  # (the outage's failed calls; the kill came before the end)
    (run / "trackers.json").write_text(json.dumps({"mlflow": killed}), encoding="utf-8")
    kept = [r for r in recs if r["step"] <= 40]  # the resume truncates metrics.jsonl at its checkpoint
    metrics.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")

    trackers = open_trackers(["mlflow"], run, cfg, {"mlflow": killed["state"]}, 40)
    for n in range(41, 45):  # the resumed launch's own steps
        for rec in (train_rec(n), *([eval_rec(n)] if n % 4 == 0 else [])):
            with metrics.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
            trackers.log(rec)
    report = trackers.close(60)["mlflow"]

    uri = f"sqlite:///{run / 'mlflow' / 'mlflow.db'}"
    (mrun,) = tt.mlflow_runs(uri)
    assert mrun.info.status == "FINISHED"
    assert sorted(tt.metric_steps(uri, mrun.info.run_id, "train/loss")) == list(range(1, 45))
    assert sorted(tt.metric_steps(uri, mrun.info.run_id, "eval/val_loss")) == list(range(4, 45, 4))
    assert report["missing"] == 0 and report["finished"], report
    assert report["failures"] == 6 and report["launches"] == 2, report  # the killed launch's count kept
    assert report["this_launch"]["resent"] == 8, report  # steps 8-13 and the evals at 8 and 12


def test_records_dropped_while_the_server_was_not_up_are_sent_when_it_comes_up(
    tmp_path, train_config, offline_env, monkeypatch
):
    """A server started after training: the calls it could not take were dropped after their
    retries (params and steps 1-6); the first call that succeeds sends them from metrics.jsonl."""
    from oreline.train import trackers
    from oreline.train.trackers.mlflow_tracker import MlflowTracker

    monkeypatch.setattr(trackers, "BACKOFF_FIRST_S", 0.01)  # 8 attempts in well under a second
    monkeypatch.setattr(trackers, "BACKOFF_MAX_S", 0.02)
    port = tt.free_port()
    # the server is the user's own: named by MLFLOW_TRACKING_URI, as a config file alone may not
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")  # nothing listens on it yet
    run = tmp_path / "t"
    run.mkdir()
    recs = write_metrics(run / "metrics.jsonl", 7, 3)
    cfg = train_config(train__trackers=["mlflow"], train__mlflow__tracking_uri=f"http://127.0.0.1:{port}")
    guarded = trackers.Guarded(MlflowTracker(run, cfg.train.mlflow, {}), run / "metrics.jsonl")
    feed = trackers.Trackers([guarded], {"train": {"steps": 7}})
    feed.log({"type": "start", "step": 0, "config_fingerprint": "abc"})
    for rec in recs[:-1]:  # steps 1-6
        feed.log(rec)
    deadline = time.monotonic() + 120
    while guarded.dropped < len(recs):  # every call so far, params first, dropped after its retries
        assert time.monotonic() < deadline, guarded.report()
        time.sleep(0.05)
    with tt.mlflow_server(tmp_path / "server", port) as (uri, _proc):
        feed.log(recs[-1])  # step 7: the server is up
        report = feed.close(60)["mlflow"]
        (mrun,) = tt.mlflow_runs(uri)
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "train/loss")) == list(range(1, 8))
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "eval/val_loss")) == [3, 6]
        assert mrun.data.params["config_fingerprint"] == "abc"
        assert mrun.info.status == "FINISHED"
    assert report["missing"] == 0 and report["finished"] and report["resent"] == len(recs), report
    assert report["failures"] >= len(recs) * trackers.MAX_ATTEMPTS


def test_trackers_sync_completes_and_finishes_a_run_whose_server_was_down(
    tmp_path, train_config, one_thread, offline_env, oreline_cli, monkeypatch
):
    """Training ended while the MLflow server was down: its run is incomplete and not finished, a
    relaunch has nothing to train and says how to finish it, and `oreline trackers sync RUN`
    (the server up again) sends every step, the params and the end summary, and finishes it."""
    from oreline.config import to_toml
    from oreline.train.loop import train

    port = tt.free_port()
    # the server is the user's own: named by MLFLOW_TRACKING_URI, as a config file alone may not
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    cfg = train_config(
        train__steps=6,
        train__log_every=1,
        train__eval_every=3,
        checkpoint__every=3,
        train__trackers=["mlflow"],
        train__mlflow__tracking_uri=f"http://127.0.0.1:{port}",
        train__mlflow__experiment="synced",
        train__tracker_flush_s=1.0,
    )
    summary = train(cfg, resume="none")
    run = tmp_path / "t"
    before = json.loads((run / "trackers.json").read_text())["mlflow"]
    assert not before["finished"] and before["missing"] > 0, before

    config = tmp_path / "run.toml"
    config.write_text(to_toml(cfg), encoding="utf-8")
    code, out = oreline_cli(
        "train", "-c", str(config), env={**offline_env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    )
    assert code == 0 and "nothing to do" in out, out
    assert f"oreline trackers sync {run}" in " ".join(out.split()), out

    with tt.mlflow_server(tmp_path / "server", port) as (uri, _proc):
        code, out = oreline_cli(
            "trackers",
            "sync",
            str(run),
            env={**offline_env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"},
        )
        assert code == 0, out
        (mrun,) = tt.mlflow_runs(uri, "synced")
        assert mrun.info.status == "FINISHED"
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "train/loss")) == [1, 2, 3, 4, 5, 6]
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "eval/val_loss")) == [3, 6]
        assert mrun.data.params["config_fingerprint"] == summary["config_fingerprint"]
        assert mrun.data.metrics["final/final_val_loss"] == pytest.approx(summary["final_val_loss"])
        trains = [r for r in fixtures.read_metrics(run / "metrics.jsonl") if r["type"] == "train"]
        from mlflow.tracking import MlflowClient

        sent = {m.step: m.value for m in MlflowClient(uri).get_metric_history(mrun.info.run_id, "train/loss")}
        assert sent == {r["step"]: pytest.approx(r["loss"]) for r in trains}
        # a second sync has nothing left to send and keeps the one run
        code, out = oreline_cli(
            "trackers",
            "sync",
            str(run),
            env={**offline_env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"},
        )
        assert code == 0 and "0 records sent" in out, out
        assert len(tt.mlflow_runs(uri, "synced")) == 1
    after = json.loads((run / "trackers.json").read_text())["mlflow"]
    assert after["finished"] and after["missing"] == 0 and after["launches"] == 3, after
    assert after["failures"] >= before["failures"] and after["state"]["run_id"] == mrun.info.run_id


@pytest.mark.slow
def test_an_outage_then_a_kill_then_a_resume_ends_in_one_complete_run_with_every_failure_counted(
    tmp_path, prose_tokens, offline_env
):
    """Real processes: the server stops mid-run and the trainer is SIGKILLed during the outage;
    trackers.json, kept as the counts changed, holds the killed launch's failures. The server comes
    back (same port, same store) and `--resume auto` ends ONE finished MLflow run with every step
    once; the counts add up over both launches."""
    kr = tt._kill_resume()
    steps, experiment = 40, "outage"
    settings = dict(
        train__trackers=["mlflow"],
        train__mlflow__experiment=experiment,
        train__steps=steps,
        train__tracker_flush_s=120.0,  # (a loaded machine: the resumed launch sends what the killed one lost)
    )
    config = kr.write_config(
        tmp_path / "run.toml", tmp_path / "runs", prose_tokens, **settings, train__debug__sleep_per_step_s=0.4
    )
    run = tmp_path / "runs" / "r"
    port, store = tt.free_port(), tmp_path / "server"
    uri = f"http://127.0.0.1:{port}"
    env = {**offline_env, "MLFLOW_TRACKING_URI": uri}
    log = tmp_path / "train.log"
    with tt.mlflow_server(store, port) as (_uri, server):
        proc = tt.launch(config, log, env)

        def sent_some() -> bool:
            runs = tt.mlflow_runs(uri, experiment)
            return bool(runs) and bool(tt.metric_steps(uri, runs[0].info.run_id, "train/loss"))

        deadline = time.monotonic() + 300
        while not sent_some():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        tt.stop_server(server)  # the outage
    outage_from = max(r["step"] for r in fixtures.read_metrics(run / "metrics.jsonl") if r["type"] == "train")

    def failed_and_past_a_checkpoint() -> bool:
        try:
            report = json.loads((run / "trackers.json").read_text())["mlflow"]
        except (OSError, ValueError, KeyError):
            return False
        ckpts = [int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*")]
        return report["failures"] >= 1 and any(c > outage_from for c in ckpts)

    while not failed_and_past_a_checkpoint():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # during the outage: its buffered calls die with it
    proc.wait()
    killed = json.loads((run / "trackers.json").read_text())["mlflow"]
    assert not kr.has(run, "end", steps)

    with tt.mlflow_server(store, port):  # back: the same server, the same store
        kr.write_config(
            config, tmp_path / "runs", prose_tokens, **settings, train__debug__sleep_per_step_s=0.0
        )
        proc = tt.launch(config, log, env)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        (mrun,) = tt.mlflow_runs(uri, experiment)
        assert mrun.info.status == "FINISHED"
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "train/loss")) == list(range(1, steps + 1))
        evals = [s for s in range(1, steps + 1) if s % kr.EVAL_EVERY == 0 or s == steps]  # (and the last)
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "eval/val_loss")) == evals
    report = json.loads((run / "trackers.json").read_text())["mlflow"]
    assert report["launches"] == 2 and report["failures"] >= killed["failures"] >= 1, report
    assert report["missing"] == 0 and report["finished"], report


def test_trackers_sync_of_a_run_without_checkpoints_finds_its_trackers_in_trackers_json(
    tmp_path, train_config, one_thread, offline_env, oreline_cli, monkeypatch
):
    """No checkpoint records the run's config (checkpoint.every = 0), and the default config lists
    only TensorBoard: the tracker trackers.json names is synced all the same, on its own server."""
    from oreline.train.loop import train

    port = tt.free_port()
    # the server is the user's own: named by MLFLOW_TRACKING_URI, as a config file alone may not
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    cfg = train_config(
        train__steps=4,
        train__optim__warmup_steps=2,
        train__log_every=1,
        train__eval_every=2,
        train__trackers=["mlflow"],
        train__mlflow__tracking_uri=f"http://127.0.0.1:{port}",
        train__tracker_flush_s=1.0,
    )
    train(cfg, resume="none")
    run = tmp_path / "t"
    assert not list(run.glob("checkpoints/step-*"))
    with tt.mlflow_server(tmp_path / "server", port) as (uri, _proc):
        code, out = oreline_cli(
            "trackers",
            "sync",
            str(run),
            env={**offline_env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"},
        )
        assert code == 0 and "tensorboard: left as it is" in out, out
        (mrun,) = tt.mlflow_runs(uri)
        assert mrun.info.status == "FINISHED"
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "train/loss")) == [1, 2, 3, 4]
        assert sorted(tt.metric_steps(uri, mrun.info.run_id, "eval/val_loss")) == [2, 4]
