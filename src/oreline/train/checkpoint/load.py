"""Reading checkpoints: into a live model and optimizer (resume, rollback), or as a state dict
without building a model (eval, export), and finding the checkpoint a path means.

- `load_checkpoint(path, model, optimizer)`: a full checkpoint, in place, with this rank's RNG
  states; returns its meta. Loading at another world size works (DCP reshards).
- `load_model_state(path)`: (state_dict, ModelArgs, meta) from a full checkpoint, a model-only
  snapshot or a run directory.
- `resolve_checkpoint(path)`: a checkpoint folder itself, or a run's `latest` valid checkpoint, or
  its newest valid one (`resume.find_resumable`), or its newest model-only snapshot.

Loading never unpickles arbitrary objects: everything but the tensor data files is verified first,
the data files as they are read (`verify.reading_check`; a checkpoint this process wrote or read
is trusted), DCP's `.metadata` is read by the allow-listed unpickler (`metadata`), raw
tensors are read into place and older torch.save ones with `weights_only=True`
(`raw_tensors.RawTensorReader`), non-tensor (byte) items are refused, model-only snapshots are
safetensors, everything else is JSON. A failed load is a CheckpointError naming the file, not
DCP's wrapped traceback. A checkpoint this process is still writing asynchronously is finished
before it is read (`async_save`): a rollback right after a save returns to that save.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from oreline import compat
from oreline.errors import CheckpointError
from oreline.train.checkpoint.async_save import wait_for_pending_save
from oreline.train.checkpoint.dcp_calls import load_errors, no_process_group, quiet_single_process, rank
from oreline.train.checkpoint.format import (
    CHECKSUMS,
    META,
    checkpoints_root,
    list_checkpoints,
    read_latest,
    read_meta,
)
from oreline.train.checkpoint.metadata import read_dcp_metadata
from oreline.train.checkpoint.raw_tensors import RawTensorReader
from oreline.train.checkpoint.resume import find_resumable
from oreline.train.checkpoint.rng import restore_rng_state
from oreline.train.checkpoint.verify import ensure_verified, mark_verified, reading_check, verify_checkpoint

log = logging.getLogger("oreline.checkpoint")


def _reader(path: Path, expect: tuple[dict[str, dict], str] | None) -> RawTensorReader:
    """Reads raw-tensor files and, through DCP's own reader, torch.save ones (older checkpoints),
    checking the data files it reads against `expect` (`verify.reading_check`)."""
    return RawTensorReader(str(path), expect)


def _restore_param_groups(saved: list[dict], current: list[dict]) -> list[dict]:
    """JSON param_groups back into the types the live optimizer uses (tuples, tensors)."""
    out = []
    for sg, cg in zip(saved, current, strict=True):
        g = dict(sg)
        for k, cur in cg.items():
            if k in g and k != "params":
                if isinstance(cur, tuple):
                    g[k] = tuple(g[k])
                elif isinstance(cur, torch.Tensor):
                    g[k] = torch.tensor(g[k], dtype=cur.dtype, device=cur.device)
        out.append(g)
    return out


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, restore_rng: bool = True
) -> dict:
    """Load a full checkpoint into the live model (and optimizer) in place; return its meta.

    Verifies everything but the data files first and the data files this rank reads as it reads
    them (`verify.reading_check`; nothing for a checkpoint this process wrote or read already): a
    corrupted data file is a `CheckpointCorrupted` raised after the model's tensors were partly
    overwritten, so the caller loads another checkpoint or stops. Restores this rank's RNG states
    unless told not to.
    An async save in flight is finished first: it may be the very checkpoint asked for (a rollback
    right after a save); every rank calls this at the same point.
    """
    path = Path(path)
    wait_for_pending_save()
    meta = read_meta(path) or {}
    if meta.get("kind") == "full":
        expect = reading_check(path)
        meta = read_meta(path) or {}  # (as verified)
    else:
        ensure_verified(path)
        raise CheckpointError(
            f"{path} is a {meta.get('kind')} snapshot: it holds no optimizer state",
            "resume from a step-* checkpoint, or start fresh with --resume none",
        )
    if optimizer is not None and "optim_param_groups" not in meta:
        raise CheckpointError(f"{path} was saved without optimizer state", "resume with --resume none")
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
        with quiet_single_process(), load_errors(path):
            dcp.load(state, storage_reader=_reader(path, expect), **compat.dcp_no_dist(no_process_group()))
        set_model_state_dict(model, state["model"])
    elif not _load_single_process(path, model, optimizer, meta, expect):
        msd, osd = get_state_dict(model, optimizer)  # initialises empty AdamW state with a zero-lr step
        state = {"model": msd, "optim": osd["state"]}
        with quiet_single_process(), load_errors(path):
            dcp.load(state, storage_reader=_reader(path, expect), **compat.dcp_no_dist(no_process_group()))
        groups = _restore_param_groups(meta["optim_param_groups"], osd["param_groups"])
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict={"state": state["optim"], "param_groups": groups},
        )
    mark_verified(path)  # every byte read matched: a rollback to it reads without hashing
    if restore_rng:
        me = rank()
        rng_file = path / f"rng-rank{me:05d}.json"
        source = path / META if me == 0 and "rng" in meta else rng_file
        if source.is_file():
            try:
                restore_rng_state(meta["rng"] if source.name == META else json.loads(source.read_text()))
            except (
                ValueError,
                KeyError,
                TypeError,
                IndexError,
                RuntimeError,
            ) as exc:  # JSON of another shape
                raise CheckpointError(
                    f"{source}: the RNG state is unreadable ({type(exc).__name__}: {exc})",
                    "resume from another checkpoint, or start fresh with --resume none",
                ) from None
        else:
            log.warning("no RNG state for rank %d in %s (saved with fewer ranks): RNG not restored", me, path)
    return meta


def _load_single_process(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict,
    expect: tuple[dict[str, dict], str] | None,
) -> bool:
    """World 1, plain parameters: load without `get_state_dict`'s optimizer initialisation.

    The generic path asks `get_state_dict` for a state to load into, and for an optimizer that has
    not stepped yet it makes one by running a zero-lr step over every parameter — for the 125m
    preset on this CPU that step cost more than the whole load. Here the optimizer tensors to fill
    are allocated from DCP's metadata instead, and handed to `optimizer.load_state_dict` in its own
    format (which is what `set_state_dict` ends with too). Returns False, loading nothing, when the
    names do not line up (wrapped or sharded models): the caller then takes the generic path.
    """
    if dist.is_available() and dist.is_initialized():
        return False
    params = dict(model.named_parameters())
    names = {id(p): n for n, p in params.items()}
    saved_groups = meta["optim_param_groups"]
    if len(saved_groups) != len(optimizer.param_groups) or any(
        [names.get(id(p)) for p in g["params"]] != sg["params"]
        for g, sg in zip(optimizer.param_groups, saved_groups, strict=True)
    ):
        return False
    optim_state: dict[str, dict[str, torch.Tensor]] = {}
    for key, tmd in read_dcp_metadata(path).state_dict_metadata.items():
        if not key.startswith("optim.") or not hasattr(tmd, "size"):
            continue
        fqn, skey = key.removeprefix("optim.").rsplit(".", 1)  # "<param fqn>.<exp_avg|step|...>"
        if fqn not in params:
            return False
        device = params[fqn].device if tmd.size else torch.device("cpu")  # AdamW keeps `step` on the CPU
        optim_state.setdefault(fqn, {})[skey] = torch.empty(
            tmd.size, dtype=tmd.properties.dtype, device=device
        )
    state = {"model": get_model_state_dict(model), "optim": optim_state}
    with quiet_single_process(), load_errors(path):
        dcp.load(state, storage_reader=_reader(path, expect), **compat.dcp_no_dist(True))
    set_model_state_dict(model, state["model"])
    native: dict[str, Any] = {"state": {}, "param_groups": []}
    groups = _restore_param_groups(saved_groups, optimizer.param_groups)
    index = 0
    for live, group in zip(optimizer.param_groups, groups, strict=True):
        ids = []
        for p in live["params"]:
            if names[id(p)] in optim_state:
                native["state"][index] = optim_state[names[id(p)]]
            ids.append(index)
            index += 1
        native["param_groups"].append({**group, "params": ids})
    optimizer.load_state_dict(native)
    return True


def load_model_state(path: Path) -> tuple[dict[str, torch.Tensor], Any, dict]:
    """(state_dict, ModelArgs, meta) from a full checkpoint, a model-only snapshot or a run directory.

    Full checkpoints are read without building a model: empty tensors are made from DCP's metadata
    (global shapes, so FSDP-sharded saves come back whole) and DCP fills them.
    """
    from oreline.model.llama import ModelArgs

    path = resolve_checkpoint(path)
    full = (read_meta(path) or {}).get("kind") == "full"
    expect = reading_check(path) if full else ensure_verified(path)
    meta = read_meta(path) or {}
    if meta.get("kind") == "model_only":
        from safetensors.torch import load_file

        try:
            sd = load_file(str(path / "model.safetensors"))
        except Exception as exc:  # safetensors parses a JSON header and raw bytes: it never unpickles
            raise CheckpointError(
                f"{path / 'model.safetensors'} is not a readable safetensors file ({exc})",
                "use another checkpoint, or re-export this one",
            ) from None
    else:
        md = read_dcp_metadata(path)
        sd = {}
        for key, tmd in md.state_dict_metadata.items():
            if key.startswith("model.") and hasattr(tmd, "size"):
                sd[key.removeprefix("model.")] = torch.empty(tmd.size, dtype=tmd.properties.dtype)
        holder = {"model": sd}
        with quiet_single_process(), load_errors(path):
            dcp.load(holder, storage_reader=_reader(path, expect), **compat.dcp_no_dist(True))
        sd = holder["model"]
    if "model_args" not in meta:
        raise CheckpointError(
            f"{path}/{META} has no model_args", "this checkpoint was not written by oreline train"
        )
    return sd, ModelArgs.from_dict(meta["model_args"]), meta


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder itself, or a run / checkpoints folder → its latest valid checkpoint."""
    path = Path(path)
    wait_for_pending_save()  # `latest` and the folders as they are once a save in flight is published
    if (path / META).is_file() or (path / CHECKSUMS).is_file():
        return path
    root = checkpoints_root(path)
    latest = read_latest(root)  # (when it names nothing valid, find_resumable below says so)
    if latest and verify_checkpoint(root / latest, contents=False)[0]:  # the load hashes what it reads
        return root / latest
    found = find_resumable(root)
    if found is not None:
        return found
    for e in reversed(list_checkpoints(root)):
        if e.kind == "model_only" and verify_checkpoint(e.path)[0]:
            return e.path
    raise CheckpointError(
        f"no valid checkpoint under {path}",
        "train first (oreline train) or pass a checkpoint folder (oreline checkpoint ls RUN_DIR)",
    )
