"""Run as a script by test_ray_oom.py: one task that grows until Ray's memory monitor kills it,
mapped through oreline's RayExecutor on a Ray it starts itself (`data.ray.address` empty).

The kill threshold is set 4 GiB above the machine's memory in use now, so the task is killed after
it has taken up to 4 GiB. The margin is wide because the threshold is fixed when Ray starts, while
Ray's own processes and whatever runs beside the test (CI runs the Slurm tests alongside) keep
taking memory: with 1 GiB, the memory in use stayed above the threshold after the first kill, and
Ray killed each retry's worker before it ran a line of the task (CI saw 1 attempt instead of 3). The task runs as this script's
`__main__` code (pickled by value), so the Ray workers need nothing but oreline.

    python ray_oom_driver.py ATTEMPTS_FILE MAX_OOM_RETRIES
prints one line, `RESULT ` and JSON: the result's type, its error text, and how many attempts the
task made (Ray forwards its raylet's OOM reports to this process's stdout too, in no fixed order).
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil

HEADROOM = 4 * 2**30  # the task is killed after taking at most this much
CEILING = (
    10 * 2**30
)  # it gives up (and returns) here, so a missing kill fails the test instead of the machine


def grow(attempts: str) -> str:
    with open(attempts, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    blocks = []
    while len(blocks) * 128 * 2**20 < CEILING:
        block = bytearray(128 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just reserved
        blocks.append(block)
        time.sleep(0.05)
    return "survived"


def main() -> None:
    attempts, retries = sys.argv[1], int(sys.argv[2])
    vm = psutil.virtual_memory()
    threshold = (vm.total - vm.available + HEADROOM) / vm.total
    # read by the raylet that ray.init starts below (a Ray of oreline's own); Ray spells them so
    os.environ["RAY_memory_usage_threshold"] = f"{threshold:.4f}"  # noqa: SIM112
    os.environ["RAY_memory_monitor_refresh_ms"] = "100"  # noqa: SIM112
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from oreline.config import RayConfig
    from oreline.executors.ray import RayExecutor

    executor = RayExecutor(RayConfig(max_oom_retries=retries))
    (result,) = executor.map(grow, [(attempts,)], label="oom")
    with open(attempts) as fh:
        tried = len(fh.read().split())
    found = {"type": type(result).__name__, "error": getattr(result, "error", ""), "attempts": tried}
    print("RESULT " + json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
