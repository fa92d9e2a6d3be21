"""Ray retries a task its memory monitor killed without limit by default; oreline caps it at
`data.ray.max_oom_retries`, so an input that kills every worker it lands on comes back as a crash
result naming its job (the caller lists the file in the run's errors) instead of looping forever.

A Ray of oreline's own (not the shared test cluster: the kill threshold is a node setting read when
Ray starts), in a subprocess so this test process never connects to Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # one Ray start and three OOM kills, ~25 s here

DRIVER = Path(__file__).with_name("ray_oom_driver.py")


def test_a_task_killed_for_memory_is_retried_max_oom_retries_times_then_is_a_crash_result(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'oreline[ray]'")
    attempts = tmp_path / "attempts"
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(attempts), "2"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["type"] == "TaskCrashed", result
    assert result["error"].startswith("OutOfMemoryError (after Ray's retries)"), result
    # the first attempt and exactly max_oom_retries more: neither Ray's unbounded default nor
    # data.ray.max_retries (1), which counts deaths of other kinds
    assert result["attempts"] == 3, result
