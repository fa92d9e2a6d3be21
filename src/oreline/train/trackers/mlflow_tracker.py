"""MLflow: one MLflow run per training run, continued across restarts by its run id.

The tracking URI is `train.mlflow.tracking_uri`, else MLFLOW_TRACKING_URI, else a SQLite file in
the run folder (`sqlite:///<run>/mlflow/mlflow.db`, no server; `mlflow ui --backend-store-uri`
the same URI shows it). A server named only by a config file is refused (`destination`): the
user's MLflow credentials go to the server the URI names. A run's steps are known per record kind
(`held_steps`: the steps of one metric every record of that kind has), so a resume or `oreline
trackers sync` sends it every step it lacks, below its highest too (MLflow keeps a metric's points
by step). MLflow's own HTTP client retries a failed request up to 7 times with exponential backoff
and waits 120 s per request; unless the user set them, oreline lowers these to no retries and 10 s
(MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT): the retries are oreline's own
(oreline.train.trackers.Guarded), on the tracker's thread, with calls buffered.
No response body over MAX_RESPONSE_BYTES is read (`bound_responses`).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from oreline.errors import ConfigError, OrelineError

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
# The largest response body read from a tracking server: a page of metric history or a run with
# every param is a few MB; a server that sends more is refused, not held in memory whole
MAX_RESPONSE_BYTES = 64 << 20
BATCH = 100  # MLflow's limit on params per log_batch
MAX_METRICS = 1000  # MLflow's limit on metrics per log_batch


# What MLflow's HTTP client sends to whatever server the tracking URI names, on every request
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
DEFAULT_PORTS = {"http": 80, "https": 443}


def is_local(uri: str) -> bool:
    """A store on this machine's file system: a path, `file:` or `sqlite:///FILE`. Anything else
    (http(s), a database server, databricks, a plugin's scheme) is a destination over the network."""
    if uri.strip() in ("databricks", "databricks-uc", "uc"):  # MLflow's names for Databricks servers
        return False
    parts = urlsplit(uri)
    if len(parts.scheme) <= 1:  # a path (or a Windows drive letter)
        return True
    if parts.scheme == "file":
        return parts.netloc in ("", "localhost")
    return parts.scheme == "sqlite" and parts.netloc == ""


def origin(uri: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of a URI: what decides which server receives a request (None: no port
    can be read from it, so it matches nothing)."""
    parts = urlsplit(uri)
    try:
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    return parts.scheme.lower(), (parts.hostname or parts.netloc).lower(), port


def redact(uri: str) -> str:
    """The URI without a password in it (user:password@host), for what oreline prints."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def destination(run_root: Path, configured: str | None, from_command_line: bool = False) -> tuple[str, str]:
    """(tracking URI, where it came from). Raises ConfigError for a network destination that only
    a config file names.

    A config file is often somebody else's (a colleague's, one copied from the web), while the
    MLflow credentials in the environment are meant for the user's own server, and MLflow sends
    them, with every param and the run's path, to whatever host the URI names. So a config file
    may name a local store, or a server with the same scheme, host and port as MLFLOW_TRACKING_URI
    (where the credentials are meant to go); any other server must come from the user: the
    command line (a dotted override) or MLFLOW_TRACKING_URI itself."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if not configured:
        if env:
            return env, "MLFLOW_TRACKING_URI"
        return f"sqlite:///{Path(run_root) / 'mlflow' / 'mlflow.db'}", "the default, a SQLite file in the run"
    if from_command_line:
        return configured, "the command line"
    if is_local(configured):
        return configured, "the config file (a local store)"
    if env and origin(env) is not None and origin(env) == origin(configured):
        return configured, "the config file, on the server of MLFLOW_TRACKING_URI"
    shown = redact(configured)
    host = urlsplit(configured).hostname or shown
    raise ConfigError(
        f"train.mlflow.tracking_uri = {shown!r} comes from the config file: it would send the run "
        f"(every config value, the run's path) and the MLflow credentials of this environment "
        f"({', '.join(CREDENTIALS)}) to {host}, and a config file may name only a local store "
        "(a path, file:, sqlite:///FILE) or the server of MLFLOW_TRACKING_URI",
        f"if {host} is your own server, say so yourself: pass train.mlflow.tracking_uri={shown} on the "
        f"command line or set MLFLOW_TRACKING_URI={shown}; otherwise remove the key from the config "
        "(MLflow then logs to MLFLOW_TRACKING_URI, else to a SQLite file in the run folder)",
    )


def tracking_uri(run_root: Path, configured: str | None, from_command_line: bool = False) -> str:
    return destination(run_root, configured, from_command_line)[0]


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:MAX_PARAM_CHARS]


class ResponseTooLarge(OrelineError):
    """A tracking server sent a response body over MAX_RESPONSE_BYTES."""


def _read_bounded(response: Any, *args: Any, **kwargs: Any) -> Any:
    """A `requests` response hook: read the body here, at most MAX_RESPONSE_BYTES (decoded), before
    requests would read all of it. Hooks run before a non-streamed body is read, and a body that
    is set here is what `response.content` / `.text` / `.json()` return."""
    limit = MAX_RESPONSE_BYTES
    declared = response.headers.get("Content-Length", "")
    too_large = declared.isdigit() and int(declared) > limit
    chunks, total = [], 0
    while not too_large:
        chunk = response.raw.read(1 << 20, decode_content=True)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        too_large = total > limit
    if too_large:
        response.close()
        raise ResponseTooLarge(
            f"the MLflow server at {redact(response.url)} sent a response over {limit >> 20} MiB "
            f"({'Content-Length ' + declared if declared.isdigit() else 'more than that read'}); "
            "no MLflow response is that large",
            "check that the tracking URI names an MLflow server (training goes on; the call is retried)",
        )
    response._content = b"".join(chunks)
    response._content_consumed = True
    response.raw.release_conn()  # read to its end: the connection can serve the next request
    return response


def bound_responses() -> None:
    """Bound every response body MLflow's HTTP client reads in this process (`_read_bounded`).

    MLflow reads responses itself (requests, without a size limit) from sessions it makes and
    caches; it offers no way to pass a session or a hook, so the function it gets them from is
    wrapped to add the hook to each session it returns. The only MLflow client in an oreline
    process is this tracker's. An MLflow without that function is left unbounded."""
    from mlflow.utils import request_utils

    get = getattr(request_utils, "_get_request_session", None)
    if get is None or getattr(get, "oreline_bounded", False):
        return

    def bounded_session(*args: Any, **kwargs: Any) -> Any:
        session = get(*args, **kwargs)
        if _read_bounded not in session.hooks["response"]:
            session.hooks["response"].append(_read_bounded)
        return session

    bounded_session.oreline_bounded = True  # type: ignore[attr-defined]
    request_utils._get_request_session = bounded_session


# per record kind, a metric every record of that kind carries (an integer, never NaN): the steps
# it holds are the steps of that kind the run holds
HELD_KEYS = {"train": "train/tokens_seen", "eval": "eval/val_tokens", "tasks": "tasks/tokens_seen"}


class MlflowTracker:
    name = "mlflow"
    backfills = True  # a metric's history is keyed by step: a lower step is simply added

    def __init__(self, run_root: Path, cfg: Any, saved: dict[str, Any], from_command_line: bool = False):
        self.run_root = Path(run_root)
        self.uri = tracking_uri(run_root, cfg.tracking_uri, from_command_line)
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

        bound_responses()
        if self.uri.startswith("sqlite:///"):
            from oreline.io import real_folder, refuse_planted

            # SQLite opens the database by name, through whatever link sits at it or above it
            db = Path(self.uri.removeprefix("sqlite:///"))
            real_folder(db.parent)
            refuse_planted(db)
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
