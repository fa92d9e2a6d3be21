"""oreline.train.dist.init_distributed decides the data parallelism of a multi-process launch in
DistInfo.parallel and leaves the config as the user gave it: the config a run records (checkpoint
meta, metrics) does not depend on how it was launched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

RANK = """
import json
import os
from oreline.config import TrainConfig
from oreline.train import dist

cfg = TrainConfig()  # train.parallel = "none", as in every shipped config
info = dist.init_distributed(cfg)
# one write(2) of a line under PIPE_BUF: the two ranks share the pipe, and print() writes the text
# and its newline apart, so two ranks' lines could run together ("RESULT {..}RESULT {..}")
line = "RESULT " + json.dumps({"rank": info.rank, "config": cfg.parallel, "launch": info.parallel}) + "\\n"
os.write(1, line.encode())
dist.cleanup()
dist.leave(0)  # as `oreline train` ends a rank (oreline.train.dist.leave says why)
"""


def test_nproc_launch_trains_with_ddp_and_leaves_the_config_as_given(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    # what `oreline train --nproc 2` sets for its ranks (oreline.train.torchrun.launch_torchrun)
    env = {**os.environ, "ORELINE_LAUNCHED_NPROC": "2", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(
        (
            json.loads(line.split(" ", 1)[1])
            for line in proc.stdout.splitlines()
            if line.startswith("RESULT ")
        ),
        key=lambda r: r["rank"],
    )
    assert results == [
        {"rank": 0, "config": "none", "launch": "ddp"},
        {"rank": 1, "config": "none", "launch": "ddp"},
    ], proc.stdout
