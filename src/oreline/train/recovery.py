"""Checkpoints inside the training loop: what they hold, saving, resuming, rolling back.

- `checkpoint_meta`: everything besides tensors that resume needs (step, tokens, lr multiplier,
  counters, loader position, stability window, config + fingerprints, model args, the tokenizer
  and token folders); `save_checkpoint` adds RNG states, world size and optimizer settings.
- `resume_if_asked`: `--resume auto` takes the newest valid full checkpoint (invalid ones are
  reported as `checkpoint_invalid` events and skipped), PATH a given one, none starts fresh. The
  config is compared first, from meta.json alone (a changed model fails with the keys, not with a
  tensor shape error), then model, optimizer, RNG, loader and stability state are restored, and
  the `train.init_from` lineage the run started with is carried on. A weights-only snapshot named
  by --resume is refused with the hint to start from it with `train.init_from`.
- `move_previous_training`: a fresh start moves what an earlier run left (checkpoints, metrics,
  TensorBoard) to `<run>/previous/<time>/`, so neither a later resume nor a rollback can pick
  up a stranger's checkpoint.
- `rollback`: reload the last full checkpoint of THIS run, multiply the lr multiplier by
  `lr_factor`, and move the loader on past the failed step's batches (PaLM §5.1).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from oreline.config import Config, to_dict
from oreline.model.kernels.matmul import adopt_recorded
from oreline.model.kernels.select import use_matmul_backend
from oreline.runs import RunDir
from oreline.train.monitor import MetricsLogger
from oreline.train.session import Setup, TrainState


def checkpoint_meta(cfg: Config, s: Setup, state: TrainState, stability: Any) -> dict[str, Any]:
    return {  # RNG states, world size and optimizer hyperparameters are added by save_checkpoint
        "step": state.step,
        "tokens_seen": state.tokens_seen,
        "lr_multiplier": state.lr_multiplier,
        "skipped_steps": state.skipped_steps,
        "rollbacks": state.rollbacks,
        "debug_injected": list(state.debug_injected),
        "loss_sum": state.loss_sum,
        "loss_count": state.loss_count,
        "last_loss": state.last_loss,
        "loader": s.loader.state_dict(),
        "stability": stability.state_dict(),
        "config": to_dict(cfg),
        "config_fingerprint": s.fingerprints["train"],
        "tokenizer_fingerprint": s.fingerprints["tokenizer"],
        "data_fingerprint": s.fingerprints["data"],
        "model_args": s.args.to_dict(),
        "tokenizer_dir": str(s.tokenizer_dir.resolve()),
        "tokens_dir": str(s.tokens_dir.resolve()),
        # the fp32 product backend on CPU: a resume keeps it (oreline.model.kernels.matmul.adopt_recorded)
        "cpu_matmul": s.cpu_matmul,
        # where the weights came from when the run started from train.init_from (None: the seed)
        "init_from": s.lineage,
    }


def save(cfg: Config, s: Setup, state: TrainState, stability: Any, kind: str, log: MetricsLogger) -> Path:
    from oreline.train.checkpoint.format import dir_bytes
    from oreline.train.checkpoint.save import save_checkpoint

    t0 = time.perf_counter()
    # the trackers' runs (ids): a resume continues them (rank 0 writes meta.json; others have none)
    meta = {**checkpoint_meta(cfg, s, state, stability), "trackers": log.tracker_state()}
    path = save_checkpoint(
        s.run.checkpoints,
        state.step,
        s.model,
        s.optimizer,
        meta,
        kind=kind,
        cfg=cfg.checkpoint,
    )
    log.log(
        {
            "type": "checkpoint",
            "step": state.step,
            "path": str(path),
            "kind": kind,
            "seconds": time.perf_counter() - t0,
            "bytes": dir_bytes(path),
        }
    )
    return Path(path)


def move_previous_training(run: RunDir) -> Path | None:
    """A fresh start must not mix with what an earlier run left: move it to <run>/previous/<time>/.

    Left in place, an old step-N checkpoint would be the one a later `--resume auto` (or a
    rollback) picks, and old metrics would interleave with the new run's. Nothing is deleted.
    """
    old = [p for p in (run.checkpoints, run.metrics, run.tensorboard) if p.exists()]
    if not old:
        return None
    import shutil

    dest = run.root / "previous" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    from oreline.io import real_folder

    real_folder(dest)  # the moves are renames: never into a folder a planted previous/ link names
    for path in old:
        shutil.move(str(path), str(dest / path.name))
    return dest


def _restore(meta: dict, s: Setup, state: TrainState) -> None:
    state.step = int(meta["step"])
    state.tokens_seen = int(meta["tokens_seen"])
    state.lr_multiplier = float(meta.get("lr_multiplier", 1.0))
    state.skipped_steps = int(meta.get("skipped_steps", 0))
    state.rollbacks = int(meta.get("rollbacks", 0))
    state.debug_injected = list(meta.get("debug_injected", []))
    state.loss_sum = float(meta.get("loss_sum", 0.0))
    state.loss_count = int(meta.get("loss_count", 0))
    state.last_loss = meta.get("last_loss")


def resume_if_asked(
    cfg: Config, s: Setup, state: TrainState, stability: Any, resume: str, allow: list[str], say: Any
) -> tuple[Path | None, list[dict]]:
    """Load the checkpoint `resume` names (auto: the newest valid one).

    Returns (path or None when starting fresh, event records to log: invalid checkpoints passed
    over, the resume itself with the config keys that were allowed to differ).
    """
    if resume == "none":
        return None, []
    from oreline.errors import CheckpointError
    from oreline.train.checkpoint.format import CheckpointCorrupted, read_meta
    from oreline.train.checkpoint.load import load_checkpoint
    from oreline.train.checkpoint.resume import (
        check_resume_batch,
        check_resume_compatible,
        compute_changes,
        find_resumable,
    )
    from oreline.train.checkpoint.verify import forget_verified

    # A resume reads checkpoints as a new process would: what an earlier train() in this process
    # wrote is not trusted (its files may have changed since); the load verifies what it reads.
    forget_verified()
    events: list[dict] = []

    def passed_over(bad: Path, problems: list[str]) -> None:
        events.append(
            {
                "type": "event",
                "step": None,
                "kind": "checkpoint_invalid",
                "values": {"path": str(bad), "problems": list(problems)},
                "action": "skipped",
                "message": f"checkpoint {bad} is invalid ({'; '.join(problems)}): not resumed from",
            }
        )

    below: int | None = None
    while True:
        if resume == "auto":
            if not s.run.checkpoints.is_dir():
                return None, []
            skipped: list = []
            path = find_resumable(s.run.checkpoints, console=_Say(say), skipped=skipped, below=below)
            for bad, problems in skipped:
                passed_over(bad, problems)
            if path is None:
                return None, events
        else:
            path = Path(resume)
        if resume == "auto":  # never on from a checkpoint a damaged token shard may have reached
            from oreline.train.shard_damage import refuse_damaged

            refuse_damaged(s.run.checkpoints, path)
        saved = read_meta(path) or {}  # read once per candidate: every check below is from it
        if resume != "auto":
            kind = saved.get("kind")
            if kind is not None and kind != "full":  # weights only: a start, not a continuation
                raise CheckpointError(
                    f"{path} is a {kind} snapshot (weights only: no optimizer state, schedule or data "
                    "position), so a run cannot resume from it",
                    f'start a new run from its weights with train.init_from = "{path}" (and --resume auto or '
                    "none), or resume from a step-* checkpoint",
                )
        # Compatibility first, from meta.json alone: a changed model must fail with the keys, not
        # with a tensor shape error half-way through loading.
        changed = check_resume_compatible(
            saved,
            to_dict(cfg),
            allow,
            fingerprints=s.fingerprints,
            model_args=s.args.to_dict(),
        )
        check_resume_batch(saved, s.batch, allow)  # same global batch at any world size
        try:
            meta = load_checkpoint(path, s.model, s.optimizer)  # also restores this rank's RNG states
            break
        except CheckpointCorrupted as exc:
            # A data file's bytes differ from the manifest (found by the rank reading it, and told
            # to every rank by DCP's load): with --resume auto the next older checkpoint is loaded
            # over the partly overwritten tensors, as if this one had been passed over in the search.
            if resume != "auto":
                raise
            say(f"[yellow]skipping checkpoint {path.name}: {exc.problem}[/]")
            passed_over(path, [exc.problem])
            below = int(saved["step"])  # (meta.json itself was verified)
    _restore(meta, s, state)
    s.lineage = meta.get("init_from")  # the run started from these weights; init_from is not read again
    s.loader.load_state_dict(meta["loader"])
    phase = getattr(s.loader, "new_phase", None)
    if phase is not None:  # the config's mixture differs from the checkpoint's: a new phase from here
        weights = {n: float(w) for n, w in phase.normalised().items()}
        say(f"mixture changed at resume: a new phase from step {state.step} with weights {weights}")
        events.append(
            {
                "type": "event",
                "step": state.step,
                "kind": "phase",
                "values": {
                    "start_sequence": phase.start,
                    "weights": weights,
                    "why": phase.why,
                    "source_sequences": s.loader.source_sequences(),
                },
                "action": "new_phase",
                "message": f"mixture changed at resume: phase from step {state.step} with weights {weights}; "
                "each source continues from its own count",
            }
        )
    stability.load_state_dict(meta.get("stability", {}))
    if s.cpu_matmul is not None:
        backend, note = adopt_recorded(meta.get("cpu_matmul"), cfg.train.cpu_matmul, s.cpu_matmul, str(path))
        if backend != s.cpu_matmul:
            use_matmul_backend(s.model, backend)
            s.cpu_matmul, s.cpu_matmul_source = backend, f"recorded in the checkpoint {path}"
        if note:
            say(note)
    switched = compute_changes(saved, to_dict(cfg))
    if switched:  # a compute choice changed (bf16 ↔ fp8): allowed, and recorded as a warning
        say(f"[yellow]warning:[/] resumed with another compute setting ({'; '.join(switched)})")
        events.append(
            {
                "type": "event",
                "step": state.step,
                "kind": "compute_change",
                "values": {"changes": switched},
                "action": "warn",
                "message": "resumed with another compute setting: "
                + "; ".join(switched)
                + " (same checkpoint format; the loss may step at the switch)",
            }
        )
    say(
        f"resumed from {path} at step {state.step} ({state.tokens_seen:,} tokens seen)"
        + (f"; allowed config changes: {', '.join(changed)}" if changed else "")
    )
    events.append(
        {
            "type": "event",
            "step": state.step,
            "kind": "resume",
            "values": {
                "path": str(path),
                "tokens_seen": state.tokens_seen,
                "allowed_changes": changed,
                "cpu_matmul": s.cpu_matmul,
            },
            "action": "resume",
            "message": f"resumed from {path} at step {state.step}",
        }
    )
    return Path(path), events


class _Say:
    """A console-like object (print) for helpers that report, bound to rank-0 printing."""

    def __init__(self, say: Any):
        self.print = say


def rollback(
    s: Setup,
    state: TrainState,
    stability: Any,
    target: Path,
    failed_step: int,
    cfg: Config,
    log: MetricsLogger,
) -> None:
    """Reload `target`, scale the lr multiplier, and move the loader past the offending batches.

    The loader is NOT rewound: it stands after the failed step's batches, and skips
    `skip_batches` more steps' worth, so neither the offending data nor its neighbours are
    replayed (PaLM §5.1 skipped the ~200-500 batches around a spike).
    """
    from oreline.train.checkpoint.load import load_checkpoint

    stab = cfg.train.stability
    multiplier = state.lr_multiplier * stab.lr_factor
    injected = list(state.debug_injected)
    skipped, rollbacks = state.skipped_steps, state.rollbacks + 1
    meta = load_checkpoint(target, s.model, s.optimizer)
    if s.after_optimizer_step is not None:
        # fp8 + FSDP2: the weights' fp8 scales were computed from the weights just replaced; the
        # next all-gather must use the restored weights' own
        s.after_optimizer_step()
    _restore(meta, s, state)
    state.lr_multiplier, state.rollbacks, state.skipped_steps = multiplier, rollbacks, skipped
    state.debug_injected = sorted(set(injected) | set(state.debug_injected))
    stability.restore_window(meta.get("stability", {}))
    for _ in range(stab.skip_batches * cfg.train.grad_accum):
        s.loader.next_batch()
    log.log(
        {
            "type": "event",
            "step": state.step,
            "kind": "rollback",
            "values": {
                "failed_step": failed_step,
                "to_step": state.step,
                "lr_multiplier": multiplier,
                "skipped_batches": stab.skip_batches,
                "checkpoint": str(target),
            },
            "action": "rollback",
            "message": f"rolled back to {target} (step {state.step}) after step {failed_step}; lr × {multiplier:.3g}, "
            f"data moved on by {stab.skip_batches} step(s) past the failed one",
        }
    )
