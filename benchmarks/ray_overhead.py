"""What running `oreline data` as Ray tasks costs against the local process pool, on the sample inputs.

Peers measured in the same run, on the same 6 sample WARC files (samples/web-archives):
- local: `run_data` with the local executor, a 2-process pool (this machine has 2 cores);
- ray (cold): the same on a 2-node Ray cluster on this machine (ray.cluster_utils.Cluster, one
  CPU per node, i.e. the same 2 cores), the first run of the driver: its Ray workers start and
  import oreline's step modules during the run;
- ray (warm): the same again in the same driver (Ray keeps the job's workers).
Both executors write byte-identical output (tests/executors/test_ray.py); this only measures cost.

Figures printed:
- wall seconds of each run, and the ratio to local;
- CPU-seconds of the whole process tree (this process and every descendant: pool workers, the
  forkserver, the Ray nodes' raylets, GCS and workers), sampled every 0.1 s by psutil — the extra
  CPU Ray spends on its own daemons shows up here;
- per-task overhead: wall time of a map of 200 no-op tasks (`os.getpid`) on each executor, divided
  by the task count (a pool round trip against a Ray task submission + result fetch);
- the cluster's start-up time (not included in the runs).

Usage: .venv/bin/python benchmarks/ray_overhead.py [--noop 200]
(~1–2 minutes on 2 cores; timings on a shared machine are noisy — compare the ratios.)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import psutil

from oreline.config import EMBEDDED_SAMPLES, load_config
from oreline.data.pipeline.run import run_data
from oreline.executors import make_executor

INPUTS = [
    "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
    "commoncrawl-samples/whirlwind.warc.gz",
    "dolma-wget-2024/sample-0000.warc.gz",
    "dolma-wget-2024/sample-0001.warc.gz",
    "ia-blackbook-2008/IAH-20080430204825-00000-blackbook.warc.gz",
    "warcio-edge-cases/example.warc.gz",
]


class TreeCPU:
    """CPU-seconds used by this process and its descendants between start() and stop()."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.seen: dict[tuple[int, float], float] = {}  # (pid, create time) -> last CPU seconds
        self._stop = threading.Event()

    def _sample(self) -> None:
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                self.seen[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                continue

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def start(self) -> TreeCPU:
        self._sample()
        self.base = dict(self.seen)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self.thread.join()
        self._sample()
        return sum(v - self.base.get(k, 0.0) for k, v in self.seen.items())


def measure(label: str, fn) -> tuple[float, float]:
    cpu = TreeCPU().start()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return wall, cpu.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noop", type=int, default=200, help="no-op tasks for the per-task overhead")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    inputs = [str(EMBEDDED_SAMPLES / "web-archives" / p) for p in INPUTS]
    tmp = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    rows: list[tuple[str, float, float]] = []

    wall, cpu = measure("local", lambda: run_data(inputs, tmp / "local", load_config(), workers=2))
    rows.append(("local (2-process pool)", wall, cpu))
    local_exec = make_executor("local", workers=2)
    noop = [()] * args.noop
    t0 = time.perf_counter()
    local_exec.map(os.getpid, noop, label="noop")
    local_task = (time.perf_counter() - t0) / args.noop

    import ray
    from ray.cluster_utils import Cluster

    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    startup = time.perf_counter() - t0
    try:
        cfg = load_config(overrides=["data.executor=ray", f"data.ray.address={cluster.address}"])
        for name in ("ray (cold workers)", "ray (warm workers)"):
            out = tmp / name.split()[1].strip("(")
            wall, cpu = measure(name, lambda out=out: run_data(inputs, out, cfg))
            rows.append((f"{name}, 2 nodes", wall, cpu))
        ray_exec = make_executor("ray", ray=cfg.data.ray)
        ray_exec.map(os.getpid, [()] * 4, label="noop")  # workers up
        t0 = time.perf_counter()
        ray_exec.map(os.getpid, noop, label="noop")
        ray_task = (time.perf_counter() - t0) / args.noop
    finally:
        ray.shutdown()
        cluster.shutdown()

    same = all(
        sorted(p.read_bytes() for p in (tmp / "local" / "docs").iterdir())
        == sorted(p.read_bytes() for p in (tmp / run / "docs").iterdir())
        for run in ("cold", "warm")
    )
    print(f"\n6 sample WARC files ({sum(Path(i).stat().st_size for i in inputs) / 1e6:.1f} MB)")
    print(f"{'executor':34} {'wall s':>8} {'× local':>8} {'CPU s':>8} {'× local':>8}")
    for name, wall, cpu in rows:
        print(f"{name:34} {wall:8.2f} {wall / rows[0][1]:8.2f} {cpu:8.2f} {cpu / rows[0][2]:8.2f}")
    print(
        f"per-task overhead (no-op tasks, {args.noop}): local pool {local_task * 1e3:.2f} ms, "
        f"ray {ray_task * 1e3:.2f} ms ({ray_task / local_task:.1f}×)"
    )
    print(f"2-node cluster start-up: {startup:.1f} s (not in the runs); docs identical to local: {same}")


if __name__ == "__main__":
    main()
