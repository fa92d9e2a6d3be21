"""A real 2-node Ray cluster on this machine (one CPU per node), shared by the Ray tests of a run.

Module-scoped, and every Ray test lives in test_ray.py: the driver disconnects and the nodes stop
when that module is done, so the rest of the suite runs without Ray's threads in the test process
(some tests fork) or its ~1 GB of RAM. (A "package" scope would last the whole session here: the
test folders have no __init__.py.)

Started with `ray.cluster_utils.Cluster`: a head node and a worker node, each its own raylet and
worker processes, talking over the machine's own address. Start-up measured here: 6.5 s on a quiet
machine, 22 s at load average 13; 10 processes, 823 MiB RSS idle. The cluster's settings are those oreline sets on a Ray it
starts itself (`task_oom_retries`), so the tests see the executor's own failure behaviour, with one
exception: the head checks its nodes' health every 0.5 s and declares a node dead after 3 failed
checks (Ray's defaults: every 3 s, 5 failures), so a node a test kills is declared dead, and its
tasks retried, ~1.5 s after the kill instead of ~15 s. A check that does not answer still waits
Ray's 10 s timeout, so a live node on a loaded machine is not declared dead.
Tests that kill a node add a node of their own and kill that one (by the processes the fixture's
cluster started for it), so the shared cluster keeps its two nodes.

Without Ray installed the tests are skipped with the install command as the reason (CI installs
it through the `dev` extra, so there they always run).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip(
        "ray", reason="Ray is not installed: pip install 'oreline[ray]' (the dev extra includes it)"
    )
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no phoning home from a test run
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": {
                "task_oom_retries": 1,
                "health_check_period_ms": 500,
                "health_check_failure_threshold": 3,
            },
        },
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def ray_overrides(ray_cluster) -> list[str]:
    """Config overrides that run `oreline data` / `tokenize` as Ray tasks on the test cluster."""
    return ["data.executor=ray", f"data.ray.address={ray_cluster.address}", "tokenize.executor=ray"]
