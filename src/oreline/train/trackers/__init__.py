"""Experiment trackers (`train.trackers`): TensorBoard, Weights & Biases, MLflow behind one small interface.

Each tracker is a module with a class of five calls (`Tracker`): `open` (create or continue its
run), `log_params`, `log_metrics(metrics, step)`, `log_text`, `log_summary`, `finish`, and
`state()`, what the checkpoint keeps of it (the run id). `MetricsLogger` (oreline.train.monitor)
hands every metrics.jsonl record to `Trackers.log`, on the main rank only; metrics.jsonl stays
the complete record whatever the trackers do.

Rules every tracker follows (enforced here, not in the tracker modules):

- **Never stops training.** Each tracker runs on its own thread behind a bounded queue (`Guarded`):
  the training loop only appends. A call that raises (server down, disk full, no network) is
  retried with backoff (0.5 s doubling to 30 s) while new calls queue up behind it; the first failure
  is reported once (a `tracker_failed` event in metrics.jsonl and a console warning naming the
  tracker and what to do); past `MAX_QUEUE` calls the oldest are dropped and counted. At the end a
  tracker gets `train.tracker_flush_s` seconds to send what it holds; what is left is counted as
  dropped. `<run>/trackers.json` lists, per tracker, its run, failures and dropped calls.
- **Steps never go backwards.** A tracker is sent a metric step only above the highest step it
  already holds (or at it, for a record kind it does not hold there: the eval after the train
  record of the same step). After a rollback to step S the steps S+1..F (F the failed step) are
  trained again: metrics.jsonl has them twice (with the `rollback` event between), the trackers
  keep the first values and go on at F+1; the rollback itself is shown at step F as
  `events/rollback` = 1 with `rollback/to_step` = S and `rollback/failed_step` = F.
- **One run across restarts.** `state()` goes into the checkpoint's meta (`trackers`); a resume
  passes it back, and the tracker continues the same MLflow run (by run id, or by the
  `oreline.run_key` tag when the checkpoint was written before the run existed) and the same
  online W&B run (`id` + `resume="allow"`). W&B offline cannot continue a run (wandb
  issue #2423): a resumed offline run is a NEW offline run in the same group (the first run's
  id), named `<name>-resume-<k>`, with `wandb_resumed_from` = the first run's id in its config; it
  holds every step 1..N (those up to the checkpoint sent again from metrics.jsonl), so the last
  offline run of a group is the complete one (`wandb sync <run>/wandb/offline-run-*` uploads them
  all; the earlier ones end where their process was killed).
- **Nothing lost for good.** metrics.jsonl holds every train, eval and tasks record, so a record a
  tracker did not take (a call dropped after `MAX_ATTEMPTS`, past `MAX_QUEUE`, at the end, or lost
  with a killed process) is *lost* only until the tracker works again: the tracker's thread sends
  every lost record again from metrics.jsonl as soon as a call succeeds (a server that came up late
  or came back after an outage), the first value of each step (a rollback's repeat is not sent). A
  tracker that reports which steps its run holds (MLflow: `held_steps`) is, on a resume, sent every
  record up to the checkpoint it lacks, below its highest step too; one that cannot take a step
  below its highest (`backfills = False`: W&B, which drops such steps) gets only those above it.
  `<run>/trackers.json` is written whenever a count changes, so a killed process's failures are
  kept, and a resume adds its counts to the earlier launches' (`launches`); `missing` is what the
  tracker still lacks. `oreline trackers sync RUN` (`sync_run`) sends a finished or stopped run's
  trackers what they lack and finishes their runs, after the fact.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

# The config keys that choose a server a tracker sends the run (and credentials) to
ENDPOINT_KEYS = ("train.mlflow.tracking_uri",)
MAX_QUEUE = 10_000  # calls buffered per tracker while it fails (a call is one record's values)
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 30.0
MAX_ATTEMPTS = 8  # failures of one call before it is dropped (~90 s of backoff)
CATCH_UP_BATCH = 50  # lost records sent again in one call (MLflow: ~20 metrics a record, 1,000 a request)


class Tracker(Protocol):
    """What one tracker module implements; every call may raise (the caller isolates it)."""

    name: str
    backfills: bool  # takes a metric step below the highest it holds (MLflow, TensorBoard; not W&B)

    def open(self) -> None:
        """Create the run, or continue the one `state` named at construction."""

    def held_step(self) -> tuple[int, set[str]] | None:
        """After open: the highest metric step the tracker's run already holds and the record kinds
        ("train", "eval") it holds at that step (None: nothing known)."""

    # optional: `held_steps() -> dict[str, set[int]]`, every step the run holds per record kind
    # ("train", "eval", "tasks"), for a tracker that can tell (MLflow): a resume sends it every
    # record it lacks, not only those above its highest step

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_text(self, key: str, text: str, step: int) -> None: ...

    def log_summary(self, values: dict[str, Any], step: int) -> None: ...

    def finish(self) -> None: ...

    def state(self) -> dict[str, Any]:
        """What the checkpoint keeps to continue the same run after a restart (the run id)."""


COUNTS = ("failures", "dropped", "not_resent", "resent")  # added up over a run's launches in trackers.json


class Guarded:
    """One tracker on its own thread: a bounded queue, retries with backoff, failures counted, and
    every record it lost sent again from metrics.jsonl once it works (see the module docstring)."""

    def __init__(
        self,
        tracker: Tracker,
        metrics: Path | None = None,
        resumed_step: int | None = None,
        max_queue: int = MAX_QUEUE,
        prior: dict[str, Any] | None = None,
    ):
        self.tracker = tracker
        self.name = tracker.name
        # the run's metrics.jsonl: where a lost record is read back from (None: nothing to read back)
        self.metrics = None if metrics is None else Path(metrics)
        # a resume at this step: the records up to it that the tracker does not hold (a killed
        # process's buffered calls, an outage's dropped ones, a new W&B offline run) are sent again
        self.resumed_step = resumed_step
        # the highest step sent and the record kinds sent at it: a metric step below it, or at it
        # for a kind already sent there, is not sent again (see the module docstring)
        self.high, self.high_kinds = 0, set()
        # (kind, step) of the records metrics.jsonl holds that the tracker did not take yet, and
        # those given up in this launch (sent MAX_ATTEMPTS times in vain, or not sendable)
        self.lost: set[tuple[str, int]] = set()
        self.given_up: set[tuple[str, int]] = set()
        self.lost_calls: list[tuple[str, tuple]] = []  # dropped params and summary calls, made again
        self.max_queue = max_queue
        self.queue: deque[tuple[str, tuple]] = deque()
        self.cv = threading.Condition()
        self.opened = False
        # the earlier launches' counts of this run (trackers.json), added to this launch's in report()
        self.prior = {k: int((prior or {}).get(k) or 0) for k in COUNTS}
        self.launches = int((prior or {}).get("launches") or (1 if prior else 0)) + 1
        self.failures = 0
        self.first_error: str | None = (prior or {}).get("first_error")
        self.dropped = 0
        self.not_resent = 0  # metric calls at steps the tracker already held (resume, rollback)
        self.resent = 0  # records sent again from metrics.jsonl after they were lost
        self._attempted: list[tuple[str, int]] | None = (
            None  # lost records being sent (MAX_ATTEMPTS: given up)
        )
        self.finished = False
        self.deadline: float | None = None
        self.closing = False
        self.thread = threading.Thread(target=self._work, name=f"oreline-tracker-{self.name}", daemon=True)
        self.thread.start()

    def submit(self, op: str, *args: Any) -> None:
        with self.cv:
            if len(self.queue) >= self.max_queue:
                self._drop(self.queue.popleft())
            self.queue.append((op, args))
            self.cv.notify()

    def _drop(self, item: tuple[str, tuple]) -> None:
        """Count a call as dropped; a metrics record stays lost until it is sent from metrics.jsonl."""
        self.dropped += 1
        op, args = item
        if op == "metrics" and self.metrics is not None:
            self.lost.add((args[0], args[2]))
        elif op in ("params", "summary"):
            self.lost_calls.append(item)

    def _open(self) -> None:
        t = self.tracker
        t.open()  # (again after a failure below: MLflow continues the run it made, by its id)
        steps = getattr(t, "held_steps", None)
        held_sets = steps() if steps is not None else None
        if held_sets:
            top = max((max(v) for v in held_sets.values() if v), default=0)
            held = (top, {k for k, v in held_sets.items() if top in v}) if top else None
        else:
            held = t.held_step()
        if held is not None and held[0] >= self.high:
            self.high, self.high_kinds = held[0], set(held[1])
        self.opened = True
        if self.resumed_step is None or self.metrics is None:
            return
        for rec in _records(self.metrics, self.resumed_step):
            kind, step = rec["type"], rec["step"]
            if held_sets is not None:  # every step it lacks, below its highest too
                if step not in held_sets.get(kind, ()):
                    self.lost.add((kind, step))
            elif step > self.high or (step == self.high and kind not in self.high_kinds):
                self.lost.add((kind, step))

    def _catch_up(self) -> None:
        """Send the lost records from metrics.jsonl (the first record of each step and kind), in
        file order, `CATCH_UP_BATCH` records a call where the tracker takes several steps at once
        (`log_rows`: one request, not one per step); the records of a call that succeeded leave
        `lost` at once, so a failure midway sends none twice."""
        backfills = getattr(self.tracker, "backfills", True)
        many = getattr(self.tracker, "log_rows", None)
        todo = set(self.lost)  # (an overflow may add to `lost` meanwhile: those wait for the next round)
        rows: list[tuple[tuple[str, int], dict[str, float]]] = []
        for rec in _records(self.metrics, max((step for _, step in todo), default=-1)) if todo else ():
            key = (rec["type"], rec["step"])
            if key not in todo or key not in self.lost or any(k == key for k, _ in rows):
                continue
            below = rec["step"] < self.high or (rec["step"] == self.high and key[0] in self.high_kinds)
            if not backfills and below:
                self.lost.discard(key)  # (W&B drops a step below the highest it holds)
                self.given_up.add(key)
                continue
            rows.append((key, record_metrics(rec)))
            if many is None or len(rows) >= CATCH_UP_BATCH:
                self._send_rows(rows, many)
                rows = []
        if rows:
            self._send_rows(rows, many)
        self._attempted = None
        while self.lost_calls:  # the run's params and summary, after its metrics
            self._apply_call(*self.lost_calls[0])
            self.lost_calls.pop(0)
            self.resent += 1
        # what metrics.jsonl does not hold (lines a resume truncated) cannot be sent
        self.given_up |= todo & self.lost
        self.lost -= todo

    def _send_rows(self, rows: list[tuple[tuple[str, int], dict[str, float]]], many: Any) -> None:
        self._attempted = [key for key, _ in rows]
        sendable = [(metrics, key[1]) for key, metrics in rows if metrics]
        if many is not None:
            many(sendable)
        else:
            for metrics, step in sendable:
                self.tracker.log_metrics(metrics, step)
        for key, _ in rows:
            self.lost.discard(key)
            self.resent += 1
            if key[1] > self.high:
                self.high, self.high_kinds = key[1], set()
            if key[1] == self.high:
                self.high_kinds.add(key[0])

    def _apply(self, op: str, args: tuple) -> None:
        if not self.opened:
            self._open()
        if self.lost or self.lost_calls:  # before any new call: a step's records in order
            self._catch_up()
        self._apply_call(op, args)

    def _apply_call(self, op: str, args: tuple) -> None:
        t = self.tracker
        if op == "metrics":
            self._metrics(*args)
        elif op == "event":  # shown at the highest step reached: never behind what was logged
            metrics, step = args
            if step > self.high:
                self.high, self.high_kinds = step, set()
            t.log_metrics(metrics, self.high)
        elif op == "text":
            key, text, step = args
            t.log_text(key, text, max(step, self.high))
        elif op == "params":
            t.log_params(*args)
        elif op == "summary":
            values, step = args
            t.log_summary(values, max(step, self.high))

    def _metrics(self, kind: str, metrics: dict[str, float], step: int) -> None:
        if step < self.high or (step == self.high and kind in self.high_kinds):
            self.not_resent += 1
            return
        self.tracker.log_metrics(metrics, step)
        self.lost.discard((kind, step))
        if step > self.high:
            self.high, self.high_kinds = step, set()
        self.high_kinds.add(kind)

    def _next(self) -> tuple[str, tuple] | None:
        """The call to make next (the caller holds `cv`): lost records first once the tracker is
        open (it works again), then the queue; None when closing with nothing left."""
        if (self.lost or self.lost_calls) and (self.opened or self.closing):
            return CATCH_UP
        if self.queue:
            return self.queue[0]
        return None

    def _work(self) -> None:
        delay, attempts = BACKOFF_FIRST_S, 0
        while True:
            with self.cv:
                while self._next() is None and not self.closing:
                    self.cv.wait()
                item = self._next()
                if item is None:
                    break
            self._attempted = None
            try:
                self._apply(*item)
            except Exception as e:  # noqa: BLE001 (any tracker error: it must never reach training)
                attempts += 1
                with self.cv:
                    self.failures += 1
                    if self.first_error is None:
                        self.first_error = f"{type(e).__name__}: {str(e)[:300]}"
                    if attempts >= MAX_ATTEMPTS:
                        # a call the tracker refuses every time (a value its client rejects) must
                        # not hold back every call behind it: counted as dropped, the next one goes
                        if self._attempted is not None:  # lost records it refuses: given up, not the call
                            self.lost.difference_update(self._attempted)
                            self.given_up.update(self._attempted)
                        elif item is not CATCH_UP and self.queue and self.queue[0] is item:
                            self._drop(self.queue.popleft())
                        delay, attempts = BACKOFF_FIRST_S, 0
                        continue
                    wait = delay
                    if self.deadline is not None:
                        wait = min(wait, self.deadline - time.monotonic())
                        if wait <= 0:
                            break
                    self.cv.wait(wait)  # woken early by close(); new calls queue up meanwhile
                delay = min(2 * delay, BACKOFF_MAX_S)
                continue
            delay, attempts = BACKOFF_FIRST_S, 0
            with self.cv:
                if item is not CATCH_UP and self.queue and self.queue[0] is item:
                    self.queue.popleft()  # (an overflow may have dropped it meanwhile)
        with self.cv:
            while self.queue:
                self._drop(self.queue.popleft())
        if self.opened:
            try:
                self.tracker.finish()
                self.finished = True
            except Exception as e:  # noqa: BLE001
                self.failures += 1
                self.first_error = self.first_error or f"{type(e).__name__}: {str(e)[:300]}"

    def close(self, timeout: float) -> None:
        """Let the thread send what it holds for up to `timeout` seconds, then finish the run."""
        with self.cv:
            self.closing = True
            if self.deadline is None:  # (Trackers.close sets every tracker's at once: they drain in parallel)
                self.deadline = time.monotonic() + timeout
            self.cv.notify_all()
        # a call hung inside the tracker's own client (no timeout of its own) is abandoned with
        # its daemon thread: the run has ended and its metrics.jsonl is complete
        # Trackers.close joins one after another: each waits until the shared deadline, not anew
        self.thread.join(max(0.0, self.deadline + 30.0 - time.monotonic()))

    def report(self) -> dict[str, Any]:
        """This tracker's entry of trackers.json: its run, whether it was opened and finished, the
        counts of every launch of the run so far, and `missing`, the records of metrics.jsonl it
        lacks now (`oreline trackers sync RUN` sends them)."""
        with self.cv:
            # after close, a call still queued behind a hung client is dropped with its thread
            queued = len(self.queue) if self.closing and self.thread.is_alive() else 0
            missing = len(self.lost) + len(self.given_up)
            mine = {
                "failures": self.failures,
                "dropped": self.dropped + queued,
                "not_resent": self.not_resent,
                "resent": self.resent,
            }
        return {
            "state": self._state(),
            "opened": self.opened,
            "finished": self.finished,
            **{k: self.prior[k] + v for k, v in mine.items()},
            "missing": missing,
            "first_error": self.first_error,
            "launches": self.launches,
            "this_launch": mine,
        }

    def _state(self) -> dict[str, Any]:
        try:
            return self.tracker.state()
        except Exception:  # noqa: BLE001
            return {}


CATCH_UP: tuple[str, tuple] = ("catch_up", ())  # the pseudo-call that sends lost records again


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def record_metrics(rec: dict[str, Any]) -> dict[str, float]:
    """A train or eval record's numeric fields as tracker metrics: {"train/loss": ...}; a field
    holding a dict of numbers (a mixture's per-source values: source_tokens, val_loss_sources)
    one level down, {"train/source_tokens/web": ...}, so each source is its own curve."""
    out: dict[str, float] = {}
    for key, value in rec.items():
        if key in Trackers.SKIP:
            continue
        if isinstance(value, dict):
            out.update({f"{rec['type']}/{key}/{k}": float(v) for k, v in value.items() if _numeric(v)})
        elif _numeric(value):
            out[f"{rec['type']}/{key}"] = float(value)
    return out


def _records(path: Path, upto: int) -> list[dict[str, Any]]:
    """metrics.jsonl's train and eval records of steps up to `upto`, in file order."""
    import json

    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written, or cut by a kill
        if (
            isinstance(rec, dict)
            and rec.get("type") in ("train", "eval", "tasks")
            and isinstance(rec.get("step"), int)
            and rec["step"] <= upto
        ):
            out.append(rec)
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1}} -> {"train.lr": 1}; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


FAILED_HINT = {
    "mlflow": "check that the MLflow server at the tracking URI is up (train.mlflow.tracking_uri, "
    "MLFLOW_TRACKING_URI)",
    "wandb": "check the W&B credentials and network, or set train.wandb.mode = 'offline'",
    "tensorboard": "check the disk space and permissions of <run>/tensorboard",
}


class Trackers:
    """The trackers of one run, fed metrics.jsonl's records (only the main rank has any)."""

    SKIP = {"type", "step", "time"}

    def __init__(self, guarded: list[Guarded], config: dict[str, Any] | None = None):
        self.guarded = guarded
        self.config = config or {}
        self.warned: set[str] = set()
        self.last_step = 0
        self._counts: tuple = ()

    def __bool__(self) -> bool:
        return bool(self.guarded)

    def _each(self, op: str, *args: Any) -> None:
        for g in self.guarded:
            g.submit(op, *args)

    def log(self, rec: dict[str, Any]) -> None:
        kind, step = rec.get("type"), rec.get("step")
        if not isinstance(step, int):
            return
        self.last_step = max(self.last_step, step)
        if kind in ("train", "eval", "tasks"):
            metrics = record_metrics(rec)
            if metrics:
                self._each("metrics", kind, metrics, step)
        elif kind == "start":
            self._each("params", self.params(rec))
        elif kind == "event":
            metrics = {f"events/{rec.get('kind')}": 1.0}
            values = rec.get("values") if isinstance(rec.get("values"), dict) else {}
            if rec.get("kind") == "rollback":
                metrics.update({f"rollback/{k}": float(v) for k, v in values.items() if _numeric(v)})
            self._each("event", metrics, step)
            self._each("text", "events", f"{rec.get('kind')}: {rec.get('message')}", step)
        elif kind == "generation":
            self._each(
                "text", f"generation/{rec.get('mode')}", f"**{rec.get('prompt')}**{rec.get('text')}", step
            )
        elif kind == "end":
            values = {f"final/{k}": v for k, v in rec.items() if k not in self.SKIP and _numeric(v)}
            self._each("summary", values, step)

    def params(self, start: dict[str, Any]) -> dict[str, Any]:
        """The config (dotted keys, the data mixture included) and the start record's fingerprints,
        model size and setup: what a tracker shows as the run's parameters."""
        out = {f"config.{k}": v for k, v in flatten(self.config).items()}
        for key, value in start.items():
            if key in self.SKIP or key in ("schedule",):
                continue
            if isinstance(value, dict):
                out.update({f"{key}.{k}": v for k, v in flatten(value).items()})
            else:
                out[key] = value
        return out

    def new_failures(self) -> list[dict[str, Any]]:
        """One `tracker_failed` event per tracker, the first time it failed."""
        out = []
        for g in self.guarded:
            if g.failures and g.name not in self.warned:
                self.warned.add(g.name)
                out.append(
                    {
                        "type": "event",
                        "step": self.last_step,
                        "kind": "tracker_failed",
                        "values": {"tracker": g.name, "error": g.first_error},
                        "action": "training goes on; the tracker's calls are buffered and retried",
                        "message": f"tracker {g.name} failed ({g.first_error}); training goes on and its "
                        f"calls are retried, metrics.jsonl stays complete: {FAILED_HINT.get(g.name, '')}",
                    }
                )
        return out

    def changed_report(self) -> dict[str, Any] | None:
        """Every tracker's report when a count changed since the last call (None otherwise): what
        `<run>/trackers.json` is rewritten with during the run, so a killed process's counts stay."""
        counts = tuple(
            (g.opened, g.finished, g.failures, g.dropped, g.resent, len(g.lost) + len(g.given_up))
            for g in self.guarded
        )
        if counts == self._counts:
            return None
        self._counts = counts
        return {g.name: g.report() for g in self.guarded}

    def state_dict(self) -> dict[str, Any]:
        """What the checkpoint keeps: each tracker's run (its id), to continue it after a restart."""
        return {g.name: g._state() for g in self.guarded}

    def close(self, timeout: float) -> dict[str, Any]:
        """Let every tracker send what it holds (in parallel, `timeout` seconds each) and finish its run;
        returns each tracker's report (run, failures, dropped calls)."""
        for g in self.guarded:
            with g.cv:
                g.closing = True
                g.deadline = time.monotonic() + timeout
                g.cv.notify_all()
        for g in self.guarded:
            g.close(timeout)
        return {g.name: g.report() for g in self.guarded}


def destinations(
    names: list[str],
    run_root: Path,
    tracker_cfg: Any,
    command_line: frozenset[str] = frozenset(),
    tensorboard_dir: Path | None = None,
) -> dict[str, str]:
    """Where each tracker of `names` sends the run, one line each, as printed at the start of
    training; raises ConfigError for a destination the config file may not choose.

    The rule (docs/security.md, "Tracker destinations and credentials"): a remote destination
    comes from the user, not from a config file, because the credentials in the environment go
    wherever it points. MLflow's tracking URI from a config file may be a local store or the
    server of MLFLOW_TRACKING_URI (`mlflow_tracker.destination`); W&B's server has no config key
    at all (WANDB_BASE_URL, or W&B's own login settings); TensorBoard writes files only."""
    out: dict[str, str] = {}
    for name in names:
        if name == "tensorboard":
            out[name] = f"event files in {tensorboard_dir or Path(run_root) / 'tensorboard'}"
        elif name == "mlflow":
            from oreline.train.trackers.mlflow_tracker import destination, redact

            uri, source = destination(
                run_root, tracker_cfg.mlflow.tracking_uri, "train.mlflow.tracking_uri" in command_line
            )
            out[name] = f"{redact(uri)} (from {source}), experiment {tracker_cfg.mlflow.experiment!r}"
        elif name == "wandb":
            from oreline.train.trackers.wandb_tracker import destination

            out[name] = destination(run_root, tracker_cfg.wandb)
    return out


def check_destinations(cfg: Any) -> None:
    """Refuse a tracker server that only the config file names (`destinations`), before any work:
    `oreline train` before it builds anything, `oreline run` before its first stage."""
    from oreline.config import command_line_keys

    destinations(cfg.train.trackers, Path(cfg.run.runs_dir) / cfg.run.name, cfg.train, command_line_keys(cfg))


def command_line_endpoints(cfg: Any) -> list[str]:
    """The tracker servers the user's command line named, as overrides (`key="value"`): a job that
    reads the resolved config from a file gets them on its own command line again."""
    from oreline.config import command_line_keys

    keys = command_line_keys(cfg)
    return [f"{key}={json.dumps(cfg.train.mlflow.tracking_uri)}" for key in ENDPOINT_KEYS if key in keys]


def open_trackers(
    names: list[str],
    run_root: Path,
    tracker_cfg: Any,
    saved: dict[str, Any] | None,
    resumed_step: int | None,
    config: dict[str, Any] | None = None,
    tensorboard_dir: Path | None = None,
    purge_after_step: int | None = None,
    command_line: frozenset[str] = frozenset(),
) -> Trackers:
    """The trackers `names` for the run in `run_root`, continuing the runs `saved` (a checkpoint's
    `trackers`) when resuming at `resumed_step` (None: a fresh start). Nothing here touches the network: each tracker opens
    its run on its own thread, so a tracker that cannot start never delays or stops training.
    `command_line`: the config keys the user set on the command line (`command_line_keys`), which
    may name a tracker server that a config file may not (`destinations`)."""
    saved = saved or {}
    made: list[Tracker] = []
    for name in names:
        made.append(
            _make(
                name,
                run_root,
                tracker_cfg,
                saved.get(name) or {},
                tensorboard_dir,
                purge_after_step,
                command_line,
            )
        )
    metrics = Path(run_root) / "metrics.jsonl"
    # a resume adds its counts to the earlier launches' (a fresh start moved those away)
    prior = read_reports(run_root) if resumed_step is not None else {}
    return Trackers([Guarded(t, metrics, resumed_step, prior=prior.get(t.name)) for t in made], config)


def read_reports(run_root: Path) -> dict[str, dict[str, Any]]:
    """`<run>/trackers.json`: each tracker's run and counts ({} when there is none, or it is unreadable)."""
    import json

    try:
        data = json.loads((Path(run_root) / "trackers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def incomplete(reports: dict[str, dict[str, Any]]) -> list[str]:
    """The trackers whose run lacks records of metrics.jsonl or was never finished, per trackers.json."""
    return [
        name
        for name, rep in reports.items()
        if not rep.get("finished") or rep.get("missing") or (rep.get("dropped") and "missing" not in rep)
    ]


def _make(
    name: str,
    run_root: Path,
    tc: Any,
    saved: dict[str, Any],
    tensorboard_dir: Path | None,
    purge_after_step: int | None,
    command_line: frozenset[str] = frozenset(),
) -> Tracker:
    if name == "tensorboard":
        from oreline.train.trackers.tensorboard import TensorBoardTracker

        purge = None if purge_after_step is None else purge_after_step + 1
        return TensorBoardTracker(tensorboard_dir or run_root / "tensorboard", purge_step=purge)
    if name == "wandb":
        from oreline.train.trackers.wandb_tracker import WandbTracker

        return WandbTracker(run_root, tc.wandb, saved)
    if name == "mlflow":
        from oreline.train.trackers.mlflow_tracker import MlflowTracker

        return MlflowTracker(run_root, tc.mlflow, saved, "train.mlflow.tracking_uri" in command_line)
    raise ValueError(f"unknown tracker {name!r}: train.trackers takes tensorboard, wandb, mlflow")


def log_after_training(
    run_root: Path,
    train_cfg: Any,
    saved: dict[str, Any],
    values: dict[str, Any],
    command_line: frozenset[str] = frozenset(),
) -> dict:
    """Add `values` (the export path, ...) to the summary of the runs a finished training logged to
    (`saved`: its last checkpoint's `trackers`). MLflow and online W&B runs are reopened by id; an
    offline W&B run cannot be (wandb #2423) and TensorBoard needs no copy, so both are left as they
    are (the export sits in the run folder beside them). Failures are counted, never raised; each tracker gets `train.tracker_flush_s` seconds.
    Returns each tracker's report."""
    reports = {}
    for name in train_cfg.trackers:
        state = saved.get(name) or {}
        if name == "wandb" and (state.get("mode") != "online" or not state.get("id")):
            continue
        if name == "mlflow" and not state.get("run_key"):
            continue
        if name == "tensorboard":  # the path is in the run folder beside it; no extra event file
            continue
        g = Guarded(_make(name, Path(run_root), train_cfg, state, None, None, command_line))
        g.submit("summary", values, 0)
        g.close(train_cfg.tracker_flush_s)
        reports[name] = g.report()
    return reports


def sync_run(
    run_root: Path,
    train_cfg: Any,
    config: dict[str, Any] | None = None,
    command_line: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """`oreline trackers sync RUN`: send each tracker of a run (train.trackers) every train, eval and
    tasks record of its metrics.jsonl that the tracker's run lacks, the run's params and end
    summary, and finish that run — after the fact, when a server was down at the end, came up late
    or the process was killed. The run to continue is the one trackers.json names (else the newest
    checkpoint's `trackers`), on the server it was made on; with none, a new one is made. MLflow is
    sent every step it lacks; an online W&B run only its steps above the highest it holds (W&B
    drops lower ones); an offline W&B run cannot be continued (`wandb sync` uploads it) and
    TensorBoard's event files are in the run folder: both are left as they are. Rewrites
    `<run>/trackers.json`; returns {tracker: its report, or {"skipped": why}}.

    The server recorded in trackers.json or a checkpoint is an artifact's word, as a config file's
    is (`destination`): it is used when it is a local store or the server of MLFLOW_TRACKING_URI;
    `train.mlflow.tracking_uri` on the command line (`command_line`) names the server instead."""
    run_root = Path(run_root)
    metrics = run_root / "metrics.jsonl"
    if not metrics.is_file():
        from oreline.errors import InputError

        raise InputError(
            f"{run_root} has no metrics.jsonl: it is not a training run folder (or no training started in it)",
            "name the run folder that `oreline train` wrote (the one with metrics.jsonl and checkpoints/)",
        )
    from oreline.outdir import FolderLock

    # one writer of the run's trackers: never beside a training that is still sending to them
    with FolderLock(run_root, "oreline trackers sync"):
        return _sync(run_root, metrics, train_cfg, config, command_line)


def _sync(
    run_root: Path, metrics: Path, train_cfg: Any, config: dict[str, Any] | None, command_line: frozenset[str]
) -> dict[str, Any]:
    import json

    from oreline.io import write_json_atomic

    reports = read_reports(run_root)
    saved = {name: rep.get("state") or {} for name, rep in reports.items()}
    if not all(saved.get(n) for n in train_cfg.trackers):
        saved = {**_newest_checkpoint_trackers(run_root), **{k: v for k, v in saved.items() if v}}
    start, end, last = None, None, 0
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("type") == "start" and start is None:
            start = rec
        elif rec.get("type") == "end":
            end = rec
        if isinstance(rec.get("step"), int):
            last = max(last, rec["step"])
    out: dict[str, Any] = {}
    # the config's trackers and those trackers.json names (a run without a checkpoint has no
    # recorded config: the default one may not list the trackers it logged to)
    for name in dict.fromkeys([*train_cfg.trackers, *(n for n in reports if n in FAILED_HINT)]):
        state = saved.get(name) or {}
        if name == "tensorboard":
            out[name] = {"skipped": f"its event files are in {run_root / 'tensorboard'}"}
            continue
        if name == "wandb" and state.get("mode", "offline") != "online":
            out[name] = {
                "skipped": f"an offline W&B run cannot be continued: wandb sync {run_root}/wandb/offline-run-*"
            }
            continue
        cfg = train_cfg
        named = "train.mlflow.tracking_uri" in command_line
        if name == "mlflow" and state.get("tracking_uri") and not named:  # the server the run was made on
            cfg = train_cfg.model_copy(
                update={"mlflow": train_cfg.mlflow.model_copy(update={"tracking_uri": state["tracking_uri"]})}
            )
        made = _make(name, run_root, cfg, state, None, None, command_line if named else frozenset())
        g = Guarded(made, metrics, last, prior=reports.get(name))
        feed = Trackers([g], config)
        if start is not None:
            feed.log(start)
        if end is not None:
            feed.log(end)
        else:  # (the lost records are sent when the tracker opens: one call to open it)
            g.submit(*CATCH_UP)
        out[name] = feed.close(train_cfg.tracker_flush_s)[name]
        reports[name] = out[name]
    write_json_atomic(run_root / "trackers.json", reports)
    return out


def _newest_checkpoint_trackers(run_root: Path) -> dict[str, Any]:
    from oreline.train.checkpoint.format import list_checkpoints, read_meta

    try:
        entries = list_checkpoints(Path(run_root) / "checkpoints")
    except (OSError, ValueError):
        return {}
    for entry in sorted((e for e in entries if e.kind != "incomplete"), key=lambda e: e.step, reverse=True):
        saved = (read_meta(entry.path) or {}).get("trackers")
        if isinstance(saved, dict):
            return saved
    return {}
