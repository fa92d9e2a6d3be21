"""One Slurm array task: `python -m oreline.executors.slurm_task FOLDER BASE INDEX` runs pack BASE + INDEX
of the jobs the SlurmExecutor wrote into FOLDER as sealed JSON (see oreline.executors.slurm and
oreline.executors.wire): it checks the seal, runs only a task function oreline lists, and writes
each result as sealed JSON."""

from __future__ import annotations

import sys
from pathlib import Path

from oreline.executors.slurm import run_pack


def main(argv: list[str]) -> int:
    folder, base, index = argv
    return run_pack(Path(folder), int(base) + int(index))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
