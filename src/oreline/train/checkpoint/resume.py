"""Resume rules: which checkpoint a run continues from, and whether its config may differ.

- `find_resumable(root)`: the newest valid full checkpoint, passing over invalid ones (reported,
  and listed in `skipped`) and interrupted saves (`.tmp-` folders). It is the one search: a
  `--resume auto`, a rollback and `load.resolve_checkpoint` all use it. It checks everything but
  the bytes of the tensor data files (`verify_checkpoint(contents=False)`): those are hashed by
  the ranks that read them while loading, and a load that finds one corrupted makes
  `--resume auto` search again below that step (`below`). In the process that
  started an async save it first finishes that save (`async_save.wait_for_pending_save`), so a
  search right after a save sees it complete; a fresh process has nothing in flight and sees on
  disk what a kill left: the last complete checkpoint, the interrupted one skipped.
- `check_resume_compatible(meta, current_config, allow_keys)`: a resume under a different config is
  refused, listing the differing dotted keys (`oreline.config.diff_keys`), unless
  `--allow-config-change KEY` names them. Model and tokenizer keys, a different `model_args` or
  tokenizer fingerprint are refused even when named: the saved tensors would not fit the model,
  or token ids would mean other strings. Keys under `NOT_COUNTED` (train.debug.*: the test
  tools and observers; train.cpu_allocator) never block a resume: they are returned with the
  allowed changes, so the resume event records them. A key the checkpoint's config has but this oreline no longer knows
  (train.eval_batches, replaced by train.eval_sequences) is not a change either: it cannot be set
  any more, as a key added later at its default changes nothing.
  Compute choices that leave the saved tensors as they are
  (`COMPUTE_CHOICES`: train.precision between bf16 and fp8, the fp8 settings) need no
  `--allow-config-change`: `compute_changes` names them and the run records a warning event.
"""

from __future__ import annotations

import logging
from pathlib import Path

from oreline.config import Config, diff_keys, to_dict, upgrade_saved
from oreline.errors import CheckpointError, TrainingError
from oreline.train.checkpoint.async_save import wait_for_pending_save
from oreline.train.checkpoint.format import checkpoints_root, latest_problem, list_checkpoints
from oreline.train.checkpoint.verify import verify_checkpoint

log = logging.getLogger("oreline.checkpoint")


def find_resumable(
    ckpt_root: Path, console=None, skipped: list | None = None, below: int | None = None
) -> Path | None:
    """Newest valid full checkpoint under ckpt_root (or a run dir). Invalid ones are reported and skipped.

    An async save this process has in flight is finished first: right after a save the search
    must find that save, not report its `.tmp-` folder as interrupted (see the module docstring).
    Every rank calls this at the same point when a save may be in flight (finishing it is a
    collective). `skipped`, if given, receives (path, problems) for every checkpoint passed over.
    `below`: only checkpoints of earlier steps (the search again after a load found one corrupted).
    """
    wait_for_pending_save()
    entries = [
        e
        for e in list_checkpoints(ckpt_root)
        if e.kind in ("full", "incomplete") and (below is None or e.step < below)
    ]
    note = latest_problem(checkpoints_root(ckpt_root)) if below is None else None
    if note:  # said before the search, so the fallback below is not a surprise
        msg = f"{note}: falling back to the newest valid checkpoint"
        if console is not None:
            console.print(f"[yellow]{msg}[/]")
        else:
            log.warning(msg)
    newest_ok = None
    for e in sorted(entries, key=lambda e: (e.step, e.kind == "full"), reverse=True):
        if e.kind == "incomplete":
            problems = ["incomplete save (temporary folder: the save was interrupted)"]
        else:
            ok, problems = verify_checkpoint(e.path, contents=False)  # the load hashes what it reads
            if ok:
                newest_ok = e.path
                break
        msg = f"skipping checkpoint {e.path.name}: {'; '.join(problems)}"
        if console is not None:
            console.print(f"[yellow]{msg}[/]")
        else:
            log.warning(msg)
        if skipped is not None:
            skipped.append((e.path, problems))
    return newest_ok


NEVER_ALLOWED = {
    "model.": "the model shape would not match the saved tensors",
    "tokenizer.": "token ids would mean different strings than the model learned",
}


# Settings that do not count as a config change on resume, with why. train.debug.* are the
# tools of tests and investigations (a slower step, a parameter digest, an injected NaN): a kill
# test that resumes without its sleep, or a resume that adds a digest, is the same run.
NOT_COUNTED = {
    "train.debug.": "debug settings: test tools and observers",
    # glibc's malloc thresholds: host memory and speed, never a value the run computes (a requeue
    # may take the lean allocator where memory is short)
    "train.cpu_allocator": "the CPU allocator: memory and speed, not what the run computes",
}


_ABSENT = object()

# Keys whose change is a compute choice, not a change of what the checkpoint holds: allowed on
# resume without --allow-config-change, each with the values it may move between (None: any),
# and reported as a warning (the loss curve may step at the switch). fp8 keeps bf16's fp32
# weights, moments and state dict keys (oreline.train.float8), so a run can switch both ways.
COMPUTE_CHOICES: dict[str, frozenset | None] = {
    "train.precision": frozenset({"bf16", "fp8"}),
    "train.fp8_recipe": None,
    "train.fp8_filter": None,
    "train.fp8_emulate": None,
}


def compute_changes(meta: dict, current_config: dict) -> list[str]:
    """The COMPUTE_CHOICES keys that differ between the checkpoint's config and this one, each as
    "key: old → new" (what the run's warning event says)."""
    saved = meta.get("config")
    if not isinstance(saved, dict):
        return []
    out = []
    for key, values in COMPUTE_CHOICES.items():
        old, new = _lookup(saved, key), _lookup(current_config, key)
        if old is _ABSENT or new is _ABSENT or old == new:
            continue
        if values is None or {old, new} <= values:
            out.append(f"{key}: {old} → {new}")
    return out


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return _ABSENT
        d = d[part]
    return d


def _removed(key: str, current: dict, defaults: dict) -> bool:
    """A key of a config section that this oreline no longer has (the section still exists; a
    free-form value such as model.rope_scaling is not a section): its saved value cannot be set
    any more, so it is no change the user made."""
    parent = key.rsplit(".", 1)[0] if "." in key else None
    return (
        parent is not None
        and isinstance(_lookup(defaults, parent), dict)
        and _lookup(defaults, key) is _ABSENT
        and _lookup(current, key) is _ABSENT
    )


def check_resume_compatible(
    meta: dict,
    current_config: dict,
    allow_keys: list[str] | None = None,
    *,
    fingerprints: dict[str, str] | None = None,
    model_args: dict | None = None,
) -> list[str]:
    """Refuse to resume under a different config unless the differing keys are allowed.

    `allow_keys` (from --allow-config-change) names dotted keys or sections ("train.optim" allows
    "train.optim.lr"). Model and tokenizer keys are never allowed; nor are a different model_args or
    tokenizer fingerprint (when given). A different data fingerprint is allowed only if "data" is named.
    Returns the differing keys that were allowed, then the ones that do not count (`NOT_COUNTED`),
    for the run's event log.
    """
    # compute choices (bf16 ↔ fp8) are allowed as they are; the caller warns (compute_changes)
    allow = list(allow_keys or []) + [c.split(":")[0] for c in compute_changes(meta, current_config)]
    saved = meta.get("config")
    if isinstance(saved, dict):  # an older oreline's spellings (true for "full") are no change
        saved = upgrade_saved(saved)
    diffs = diff_keys(saved, current_config) if isinstance(saved, dict) else []
    if diffs:
        # A key the checkpoint's config does not have was added by a later oreline; at its default
        # it changes nothing, so a checkpoint written before the key existed resumes without
        # --allow-config-change (a non-default value is still a change the user must allow).
        defaults = to_dict(Config())
        diffs = [
            k
            for k in diffs
            if not (_lookup(saved, k) is _ABSENT and _lookup(current_config, k) == _lookup(defaults, k))
            and not _removed(k, current_config, defaults)
        ]
    free = [k for k in diffs if any(k.startswith(prefix) for prefix in NOT_COUNTED)]
    diffs = [k for k in diffs if k not in free]

    def allowed(key: str) -> bool:
        return any(key == a or key.startswith(a + ".") for a in allow)

    never = [(k, why) for k in diffs for prefix, why in NEVER_ALLOWED.items() if k.startswith(prefix)]
    if model_args is not None and meta.get("model_args") not in (None, model_args):
        never.append(
            (
                "model_args " + ", ".join(diff_keys(meta["model_args"], model_args)),
                "the model shape would not match the saved tensors",
            )
        )
    fps = fingerprints or {}
    saved_tok = meta.get("tokenizer_fingerprint")
    if fps.get("tokenizer") and saved_tok and fps["tokenizer"] != saved_tok:
        never.append(
            (
                f"tokenizer fingerprint {saved_tok[:12]}… → {fps['tokenizer'][:12]}…",
                NEVER_ALLOWED["tokenizer."],
            )
        )
    if never:
        what = "; ".join(f"{k} ({why})" for k, why in never)
        raise CheckpointError(
            f"cannot resume from step {meta.get('step')}: {what}",
            "start a new run (another run.name, or --resume none), or undo the change",
        )
    refused = [k for k in diffs if not allowed(k)]
    saved_data = meta.get("data_fingerprint")
    if fps.get("data") and saved_data and fps["data"] != saved_data and not allowed("data"):
        refused.append("data (token shards differ from the ones the checkpoint was trained on)")
    if refused:
        raise CheckpointError(
            f"the config differs from the checkpoint's (step {meta.get('step')}) in: {', '.join(refused)}",
            "undo the change, or allow it with --allow-config-change "
            + " --allow-config-change ".join(k.split(" ")[0] for k in refused),
        )
    return [k for k in diffs if allowed(k)] + free


def check_resume_batch(meta: dict, batch: dict, allow: list[str]) -> None:
    """Refuse to resume with a global batch other than the checkpoint's (unless 'global_batch' is allowed).

    A 2-rank checkpoint resumed on 1 rank with the same grad_accum would silently train on half
    the batch the run was designed for; the arithmetic of both is in the message.
    """
    tc = (meta.get("config") or {}).get("train") or {}
    world = meta.get("world_size")
    if not tc or world is None or "global_batch" in allow:
        return
    saved = int(tc["micro_batch"]) * int(tc["grad_accum"]) * int(world) * int(tc["seq_len"])
    if saved == batch["tokens"]:
        return
    per_step = batch["micro"] * batch["world"] * batch["seq_len"]
    need = saved / per_step
    raise TrainingError(
        f"the checkpoint (step {meta.get('step')}) was trained with global batch = micro {tc['micro_batch']} × accum "
        f"{tc['grad_accum']} × world {world} × seq_len {tc['seq_len']} = {saved:,} tokens; this run has micro "
        f"{batch['micro']} × accum {batch['accum']} × world {batch['world']} × seq_len {batch['seq_len']} = "
        f"{batch['tokens']:,} tokens",
        (
            f"set train.grad_accum={need:g} and pass --allow-config-change train.grad_accum"
            if need == int(need) and need >= 1
            else "change train.micro_batch / grad_accum / the number of processes"
        )
        + ", or pass --allow-config-change global_batch to resume with the new batch on purpose",
    )
