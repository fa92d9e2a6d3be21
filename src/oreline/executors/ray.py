"""Run tasks as Ray core tasks on a cluster, with the same live bar as the local pool.

Ray core tasks, not Ray Data: a task here is exactly the local pool's task (`fn(*job)`, writing
its own files under the names the stage gives it), so the output does not depend on the
executor. Ray Data would name its output files at random, and its groupby is much slower than
numpy for the dedup buckets (docs/measurements.md).

Failures, as in the local pool:
- a task that raised (a bug; data errors are recorded by the task functions themselves) is never
  retried (`retry_exceptions=False`): the exception reaches the caller, and the other tasks of the
  map are cancelled;
- a task whose worker process or node died is retried by Ray up to `data.ray.max_retries` times on
  any live node; one that dies again comes back as `TaskCrashed` naming its job (so the caller lists
  the input file in the run's errors, and a re-run retries it);
- a task Ray's memory monitor killed is retried `data.ray.max_oom_retries` times (Ray's own default
  is unbounded, so a file that kills every worker would loop forever). That is a cluster setting
  (`task_oom_retries`): oreline sets it on a Ray it starts itself; a running cluster takes it from
  `RAY_task_oom_retries` at `ray start`.

Progress: tasks put `(records, bytes)` increments on a small actor, fire-and-forget, and wait for
it once at their end (one round trip, so the driver's count is complete when the task is done);
the driver drains it four times a second into the bar, next to the count of live nodes. A lost increment
(the actor's node died) only makes the bar less precise. One actor serves the executor's maps one
after another: an actor starts a worker process of its own, ~1-3 s per map on 2 cores against
0.03 s for a map of trivial tasks with the actor kept (a data run makes a dozen maps, most of them
the dedup stages'; docs/measurements.md). It is killed when a task raises (the driver lives on
holding the exception, whose traceback holds the map's frame), when it died (its node), and when
the executor is dropped (Ray ends an actor once no handle is left); a map that starts while another
one holds it (threads) gets an actor of its own, killed at its end.

Connection (`data.ray.address`): empty starts a Ray on this machine for the run (also where another
one runs here or RAY_ADDRESS names one); `auto` joins the cluster this machine is part of;
`ray://host:10001` connects a Ray client. Every node must have
oreline and its data extras installed (the tasks import oreline by module name) and see the
inputs and the output folder under the same paths (a shared filesystem).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

import oreline.executors.progress as progress_mod
from oreline.config import RayConfig
from oreline.errors import ConfigError
from oreline.executors.interface import Resources, TaskCrashed
from oreline.executors.local import progress_bar
from oreline.io import write_new

INSTALL = "pip install 'oreline[ray]'"
NODES_EVERY_S = 2.0  # how often the bar asks Ray for the live nodes (a GCS round trip)


def import_ray():
    """The `ray` module, or a ConfigError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"executor 'ray' needs Ray, which is not installed ({exc})",
            f"install it with {INSTALL}, or run with --executor local",
        ) from exc
    return ray


class _SinkQueue:
    """The worker side of the progress actor: `put_nowait` as `Progress.flush` expects."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def put_nowait(self, item: tuple[int, int]) -> None:
        self.actor.put.remote(item)  # fire-and-forget: the task never waits for the driver


class _Sink:
    """Progress increments of every task, until the driver drains them (a Ray actor)."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []

    def put(self, item: tuple[int, int]) -> None:
        self.items.append(item)

    def drain(self) -> list[tuple[int, int]]:
        items, self.items = self.items, []
        return items


def _call(fn: Callable[..., Any], job: tuple, sink) -> Any:
    """One task on a Ray worker: fn(*job), with its progress going to the driver's actor."""
    progress_mod.set_progress_queue(_SinkQueue(sink) if sink is not None else None)
    try:
        return fn(*job)
    finally:
        progress_mod.set_progress_queue(None)
        if sink is not None:  # calls of one caller run in order: the task's increments are all in
            import ray

            with contextlib.suppress(Exception):
                ray.get(sink.put.remote((0, 0)), timeout=5)


def private_session_root() -> Path:
    """Where a Ray that oreline starts keeps its sessions (logs, sockets, the files its processes
    share): `ray/` inside a folder of this user's, 0700 (`oreline.job_inputs.private_folder`),
    instead of /tmp/ray, which every user can enter. Ray makes its own folder 0777 whatever it
    finds, so the closed folder is the one above it. RAY_TMPDIR, when set, is where it goes."""
    from oreline.job_inputs import private_folder

    root = Path(os.environ.get("RAY_TMPDIR") or "/tmp") / f"oreline-ray-{os.getuid()}"
    return private_folder(root) / "ray"


def private_auth_token() -> Path | None:
    """The token of a Ray that oreline starts, readable by this user only; None where there is no file.

    Ray 2.60 turns token authentication on for a Ray that `ray.init()` starts and, when no token
    exists, writes a new one to ~/.ray/auth_token with the process's umask: 0644 (or 0664), so any
    user of the machine could read it and submit tasks that run as this user. So the token file
    (RAY_AUTH_TOKEN_PATH, or Ray's default path) is written here first, 0600 in a 0700 folder,
    and Ray finds it; one that exists is made 0600 when it is ours. A token passed in RAY_AUTH_TOKEN,
    or authentication turned off (RAY_AUTH_MODE=disabled), leaves nothing to write."""
    import importlib.util
    import secrets
    import stat

    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if importlib.util.find_spec("ray._private.authentication") is None:  # a Ray without token auth
        return None
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    try:
        # Ray's own token: 32 random bytes in hex (ray._private.authentication), 0600 from creation
        write_new(path, secrets.token_hex(32).encode(), mode=0o600)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, 0o600)
    return path


class RayExecutor:
    """Ray core tasks on the cluster `config.address` names (a local Ray when empty)."""

    name = "ray"

    def __init__(self, config: RayConfig | None = None, console: Console | None = None):
        self.config = config or RayConfig()
        self.console = console
        self.ray = import_ray()
        self._remote = None
        self._sink_cls = None
        self._idle_sink = None  # the progress actor between maps (module docstring: Progress)
        self._sink_lock = threading.Lock()
        self.rates = progress_mod.Rates()  # what the last map's tasks reported (records, bytes)
        self.nodes = 0  # live nodes the last map saw

    def connect(self) -> None:
        """Join (or start) the cluster once per process; later maps reuse the connection."""
        ray = self.ray
        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        address = self.config.address.strip()
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "logging_level": "WARNING"}
        if address:
            kwargs["address"] = address
        else:  # a Ray of our own: its settings are ours to choose
            # "local": ray.init() without an address joins the cluster in RAY_ADDRESS or the last
            # one started on this machine (/tmp/ray/ray_current_cluster), and then refuses the
            # settings below ("_system_config must not be provided"): a user's own Ray, or a test
            # cluster beside this run, made `oreline data` fail
            kwargs["address"] = "local"
            kwargs["include_dashboard"] = False
            kwargs["_system_config"] = {"task_oom_retries": self.config.max_oom_retries}
            kwargs["_temp_dir"] = str(private_session_root())
            private_auth_token()
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"cannot connect to Ray at {address or 'a new local instance'}: {exc}",
                "check data.ray.address ('auto' on a cluster node, ray://HOST:10001 for a client, "
                "empty for a local Ray) and that the cluster is up (`ray status`)",
            ) from exc

    def live_nodes(self) -> int:
        return sum(1 for n in self.ray.nodes() if n.get("Alive"))

    def _take_sink(self):
        """The executor's progress actor if no map holds it, else a new one; emptied of what a task
        of an earlier map may have put after that map's last drain."""
        with self._sink_lock:
            sink, self._idle_sink = self._idle_sink, None
        if sink is not None:
            try:
                self.ray.get(sink.drain.remote(), timeout=30)
                return sink
            except Exception:  # it died with its node, or does not answer: a new one
                with contextlib.suppress(Exception):
                    self.ray.kill(sink)
        return self._sink()

    def _give_back_sink(self, sink) -> None:
        with self._sink_lock:
            if self._idle_sink is None:
                self._idle_sink = sink
                return
        self.ray.kill(sink)  # another map's actor is kept already

    def _sink(self):
        """The progress actor, placed on the driver's node when possible (it outlives worker nodes)."""
        ray = self.ray
        if self._sink_cls is None:
            self._sink_cls = ray.remote(num_cpus=0, max_restarts=0)(_Sink)
        try:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context().get_node_id()
            strategy = NodeAffinitySchedulingStrategy(here, soft=True)
            return self._sink_cls.options(scheduling_strategy=strategy).remote()
        except Exception:  # a client driver has no node of its own: anywhere will do
            return self._sink_cls.remote()

    def map(
        self,
        fn: Callable[..., Any],
        jobs: Sequence[tuple],
        *,
        label: str,
        resources: Resources = Resources(),
    ) -> list[Any]:
        results: list[Any] = [None] * len(jobs)
        if not jobs:
            return results
        self.connect()
        ray = self.ray
        from ray.exceptions import RayError, RayTaskError

        if self._remote is None:
            self._remote = ray.remote(_call)
        memory_mb = resources.memory_mb or self.config.memory_mb
        options: dict[str, Any] = {
            # the stage's label names its tasks: `ray list tasks`, the dashboard and the workers'
            # process titles (ray::dedup:buckets) say which stage a task belongs to
            "name": label,
            "num_cpus": resources.cpus,
            "max_retries": self.config.max_retries,
            "retry_exceptions": False,
        }
        if memory_mb:
            options["memory"] = int(memory_mb) * 1024 * 1024
        remote = self._remote.options(**options)
        sink = self._take_sink()
        refs = [remote.remote(fn, tuple(job), sink) for job in jobs]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        rates = self.rates = progress_mod.Rates()
        console = self.console or Console(stderr=True)
        nodes, nodes_at = self.live_nodes(), time.monotonic()

        asked: list = []  # the drain call in flight: never dropped, so no increment is lost
        sink_lost: list = []  # the actor died (its node): not kept for the next map

        def drain(wait: float = 0.0) -> None:
            if not asked:
                asked.append(sink.drain.remote())
            ready, _ = ray.wait(asked, timeout=wait)
            if ready:
                ref = asked.pop()
                try:
                    for item in ray.get(ref):
                        rates.add(item)
                except Exception:  # the actor's node died: the bar goes on without rates
                    sink_lost.append(True)

        with progress_bar(console) as bar:
            tid = bar.add_task(label, total=len(jobs), rate="")
            while pending:
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.25)
                for ref in done:
                    i = index[ref]
                    try:
                        results[i] = ray.get(ref)
                    except RayTaskError as exc:  # the task raised: a bug, as in the local pool
                        for other in pending:
                            ray.cancel(other, force=False)
                        ray.kill(sink)  # the driver lives on: the actor would stay on the cluster
                        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                        raise cause from None
                    except RayError as exc:  # worker, node or memory: Ray's retries are spent
                        results[i] = TaskCrashed(
                            tuple(jobs[i]), f"{type(exc).__name__} (after Ray's retries): {str(exc)[:300]}"
                        )
                    bar.update(tid, advance=1)
                drain()
                if time.monotonic() - nodes_at >= NODES_EVERY_S:
                    nodes, nodes_at = self.live_nodes(), time.monotonic()
                rate = rates.text()
                bar.update(tid, rate=(rate + " · " if rate else "") + f"{nodes} node(s)")
        drain(wait=30.0)  # what is still in flight, then what the last tasks put
        drain(wait=30.0)
        self.nodes = nodes
        if sink_lost or asked:  # dead, or a drain still unanswered after 30 s
            with contextlib.suppress(Exception):
                ray.kill(sink)
        else:
            self._give_back_sink(sink)
        return results
