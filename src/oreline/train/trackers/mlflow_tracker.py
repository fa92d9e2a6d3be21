"""MLflow: one MLflow run per training run, continued across restarts by its run id.

The tracking URI is `train.mlflow.tracking_uri`, else MLFLOW_TRACKING_URI, else a SQLite file in
the run folder (`sqlite:///<run>/mlflow/mlflow.db`, no server; `mlflow ui --backend-store-uri`
the same URI shows it). A run's steps are known per record kind (`held_steps`: the steps of one
metric every record of that kind has), so a resume or `oreline trackers sync` sends it every
step it lacks, below its highest too (MLflow keeps a metric's points by step). MLflow's own HTTP client retries a failed request up to 7 times with
exponential backoff and waits 120 s per request; unless the user set them, oreline lowers these to
no retries and 10 s (MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT): the retries are
oreline's own (oreline.train.trackers.Guarded), on the tracker's thread, with calls buffered.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
BATCH = 100  # MLflow's limit on params per log_batch
MAX_METRICS = 1000  # MLflow's limit on metrics per log_batch


def tracking_uri(run_root: Path, configured: str | None) -> str:
    return (
        configured
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{Path(run_root) / 'mlflow' / 'mlflow.db'}"
    )


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:MAX_PARAM_CHARS]


# per record kind, a metric every record of that kind carries (an integer, never NaN): the steps
# it holds are the steps of that kind the run holds
HELD_KEYS = {"train": "train/tokens_seen", "eval": "eval/val_tokens", "tasks": "tasks/tokens_seen"}


class MlflowTracker:
    name = "mlflow"
    backfills = True  # a metric's history is keyed by step: a lower step is simply added

    def __init__(self, run_root: Path, cfg: Any, saved: dict[str, Any]):
        self.run_root = Path(run_root)
        self.uri = tracking_uri(run_root, cfg.tracking_uri)
        self.experiment = cfg.experiment
        # a saved run is continued only on the tracking server that holds it
        same_server = saved.get("tracking_uri") == self.uri
        self.run_id: str | None = saved.get("run_id") if same_server else None
        # oreline's own key for the run, tagged on it: MLflow picks run ids itself, and a checkpoint
        # written before the run was created (a slow server) still finds it by this key
        self.run_key: str = (saved.get("run_key") if same_server else None) or uuid.uuid4().hex
        self.resuming = same_server and bool(saved.get("run_key"))
        self.client: Any = None
        self.continued = False

    def open(self) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)
        if self.run_id is None and self.resuming:
            found = self.client.search_runs(
                experiment_ids=[e.experiment_id for e in self.client.search_experiments()],
                filter_string=f"tags.`oreline.run_key` = '{self.run_key}'",
                max_results=1,
            )
            self.run_id = found[0].info.run_id if found else None
        if self.run_id is not None:
            try:
                self.client.get_run(self.run_id)
                self.client.update_run(self.run_id, status="RUNNING")
                self.continued = True
                return
            except MlflowException as e:
                # deleted, or not on this server: a new run (never on a connection error, which is retried)
                if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                    raise
                self.run_id = None
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            artifacts = None
            if self.uri.startswith("sqlite:///"):  # next to the database, not in the working directory
                artifacts = (self.run_root / "mlflow" / "artifacts").resolve().as_uri()
            exp_id = self.client.create_experiment(self.experiment, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
        run = self.client.create_run(
            exp_id,
            run_name=self.run_root.name,
            tags={"oreline.run_dir": str(self.run_root.resolve()), "oreline.run_key": self.run_key},
        )
        self.run_id = run.info.run_id

    def held_step(self) -> tuple[int, set[str]] | None:
        held = self.held_steps()
        top = max((max(v) for v in held.values() if v), default=0)
        return (top, {k for k, v in held.items() if top in v}) if top else None

    def held_steps(self) -> dict[str, set[int]]:
        if not self.continued:
            return {}
        return {
            kind: {m.step for m in self.client.get_metric_history(self.run_id, key)}
            for kind, key in HELD_KEYS.items()
        }

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        held = self.client.get_run(self.run_id).data.params if self.continued else {}
        new, changed = [], []
        for key, value in params.items():
            text = _text(value)
            if key not in held:
                new.append(Param(key[:250], text))
            elif held[key] != text:  # a param cannot change: a resume under an allowed change is a tag
                changed.append(RunTag(f"changed_on_resume.{key}"[:250], text))
        for i in range(0, len(new), BATCH):
            self.client.log_batch(self.run_id, params=new[i : i + BATCH])
        for i in range(0, len(changed), BATCH):
            self.client.log_batch(self.run_id, tags=changed[i : i + BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def log_rows(self, rows: list[tuple[dict[str, float], int]]) -> None:
        """Several steps' metrics in as few requests as MLflow allows (1,000 metrics a batch):
        records sent again from metrics.jsonl after an outage, without a request per step."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        flat = [Metric(k, v, now, step) for metrics, step in rows for k, v in metrics.items()]
        for i in range(0, len(flat), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=flat[i : i + MAX_METRICS])

    def log_text(self, key: str, text: str, step: int) -> None:
        return None  # events are metrics (events/<kind>); generations stay in metrics.jsonl

    def log_summary(self, values: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        nums = [
            Metric(k, float(v), now, step)
            for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        tags = [
            RunTag(k, _text(v))
            for k, v in values.items()
            if not isinstance(v, int | float) or isinstance(v, bool)
        ]
        self.client.log_batch(self.run_id, metrics=nums, tags=tags)

    def finish(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "run_key": self.run_key, "tracking_uri": self.uri}
