"""A token shard damaged under a running job: the error the trainer stops with, and the resume
that must not continue from a checkpoint trained on the damage.

The loader (oreline.tokens.loader) finds the damage and raises `ShardDamaged`; what it cannot know
is what the damage means for the run's checkpoints, which is what the user must act on:

- kind "changed" (the shard was cut, replaced or rewritten since launch): the loader checks a
  shard's identity before every read, so nothing of the changed file was trained on and every
  checkpoint is good; the error names the newest one. Put the shard back and `--resume auto`.
- kind "content" (ids outside the vocabulary in a file whose identity is the one opened): the
  damage may have been trained on before one id fell outside the vocabulary, since the shard's
  content was last verified (tokenize, or a launch with verify="full"). The error lists the
  checkpoints written since then and names the newest one written before (the last good one).
  The list is kept in `<run>/checkpoints/shard-damage.json`, so that after the shard is restored
  `--resume auto` refuses those checkpoints instead of continuing from one without a word
  (`refuse_damaged`); `--resume PATH` resumes from a checkpoint the user names.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from oreline.errors import CheckpointError, DataIntegrityError, ShardDamaged

RECORD = "shard-damage.json"


def _written(entry_path: Path) -> float | None:
    try:
        return (entry_path / "meta.json").stat().st_mtime
    except OSError:
        return None


def _when(t: float | None) -> str:
    return "an unknown time" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def damage_error(exc: ShardDamaged, checkpoints: Path, step: int) -> DataIntegrityError:
    """The error a run stops with at step `step` for `exc`, naming the checkpoints it concerns;
    for content damage, the suspect checkpoints are recorded for the next `--resume auto`."""
    from oreline.train.checkpoint.format import list_checkpoints

    full = [e for e in list_checkpoints(checkpoints) if e.kind == "full"]
    if exc.kind == "changed":
        good = full[-1].path if full else None
        where = (
            f"every checkpoint holds only data read before the change; the newest, {good}, is the last good one"
            if good
            else "no checkpoint was written yet"
        )
        return DataIntegrityError(
            f"step {step}: {exc.message}; {where}",
            f"{exc.hint}; then resume with --resume auto"
            if good
            else f"{exc.hint}; then start the run again",
        )
    since = exc.verified_at
    suspect = [e for e in full if since is None or (_written(e.path) or 0.0) > since]
    before = [e for e in full if e not in suspect]
    good = before[-1].path if before else None
    names = ", ".join(e.path.name for e in suspect) or "none"
    record = {
        "shard": exc.path,
        "step": step,
        "found": time.time(),
        "verified_at": since,
        "suspect": [e.path.name for e in suspect],
        "last_good": good.name if good else None,
    }
    try:
        from oreline.io import write_json_atomic

        write_json_atomic(Path(checkpoints) / RECORD, record)
    except OSError:
        pass  # (the error still lists them)
    then = (
        f"resume from {good} with --resume {good}"
        if good
        else "start the run again (--resume none): no checkpoint predates the last verification"
    )
    return DataIntegrityError(
        f"step {step}: {exc.message}. The shard's content was last verified at {_when(since)}; the "
        f"checkpoints written since may hold training on its damaged tokens: {names}"
        + (f"; the last good checkpoint is {good}" if good else ""),
        f"restore the shard (or re-run oreline tokenize, `oreline tokens verify` checks it), then {then}",
    )


def refuse_damaged(checkpoints: Path, path: Path) -> None:
    """CheckpointError when `--resume auto` picked a checkpoint that shard-damage.json lists."""
    try:
        record: dict[str, Any] = json.loads((Path(checkpoints) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(record, dict) or Path(path).name not in (record.get("suspect") or []):
        return
    good = record.get("last_good")
    raise CheckpointError(
        f"{path} was written after token shard {record.get('shard')} was last verified, and the run found "
        f"that shard damaged at step {record.get('step')}: it may hold training on the damaged tokens",
        (
            f"resume from the last good checkpoint with --resume {Path(checkpoints) / good}"
            if good
            else "start the run again with --resume none"
        )
        + f", or, if you know the damage was never read, delete {Path(checkpoints) / RECORD} and resume with --resume auto",
    )
