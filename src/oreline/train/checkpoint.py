"""Checkpoints: atomic save, verified resume, retention, model-only snapshots, and the CLI views.

Layout under `<run>/checkpoints/`:

    step-00000200/          a full, resumable checkpoint
      .metadata  __0_0.distcp ...   model + optimizer tensors (torch.distributed.checkpoint, one file per rank)
      meta.json             step, tokens, schedule, loader, RNG, stability window, config + fingerprints,
                            model_args, tokenizer_dir, world size, time, optimizer hyperparameters
      rng-rank00001.json    RNG states of ranks > 0 (rank 0's are in meta.json)
      checksums.json        size + xxh3-128 of every file above, and a hash of itself
    model-step-00000100/    model-only snapshot (model.safetensors + meta.json): for eval/export, never resumed
    latest                  a small file holding the newest complete checkpoint's name

Save (every rank calls `save_checkpoint`): rank 0 makes `.tmp-step-00000200/`; every rank writes its
shard with `dcp.save` (fsync per file); after a barrier rank 0 writes meta.json and checksums.json,
fsyncs, renames the folder to `step-00000200`, fsyncs the parent, replaces `latest` (write + rename)
and applies retention. A kill at any moment leaves either the complete folder or a `.tmp-` one,
which is never offered for resume (and is removed by the next save).

Only tensors go through DCP: the optimizer's param_groups (lr, betas, ...) are plain numbers and go
into meta.json, because DCP restores non-tensor objects with `torch.load(weights_only=False)`, i.e.
unpickling. Tensors are written as their raw bytes under DCP's own metadata
(`oreline.train.checkpoint_storage`: RawTensorWriter / RawTensorReader, which also computes the
files' checksums while writing); checkpoints of DCP's stock writer still load. Loading never
unpickles arbitrary objects: DCP's `.metadata` is read by an allow-listed unpickler
(`oreline.train.checkpoint_metadata`) and checked by `verify_checkpoint` before anything loads;
raw tensors are read into place, older torch.save ones load with `weights_only=True` inside DCP;
non-tensor (byte) items are refused; model-only snapshots are safetensors; everything else is
JSON. Checksums detect corruption, not forgery: with `ORELINE_CHECKPOINT_KEY` set, checkpoints are
signed and unsigned ones refused (`oreline.train.checkpoint_signature`, docs/checkpoint-security.md).
A failed load is a CheckpointError naming the file, not DCP's wrapped traceback.

Checksums (xxh3-128, why not sha256), listing, verification and the search for the newest valid
checkpoint live in `oreline.train.checkpoint_files`; the CLI tables in
`oreline.train.checkpoint_views`; RNG states and the resume-compatibility rule in
`oreline.train.checkpoint_resume`. All are re-exported here, so callers import everything from
`oreline.train.checkpoint`. With `RAW_TENSOR_FILES = False` (DCP's stock writer, torch.save per
tensor) saves turn off torch.save's per-record CRC32: checksums.json already covers every byte.

Retention: the newest `keep_last` (≥ 1) full checkpoints plus every step divisible by
`keep_every` (> 0) are kept, and the one `latest` names; model-only snapshots are all kept (they are
small and were asked for explicitly with `model_only_every`).

Async save (`checkpoint.async = true`, CUDA only): `dcp.async_save` stages the state to CPU memory
and writes in a background thread; finalisation (meta, checksums, rename) happens at the start of
the next save or in `wait_for_pending_save()`, which the loop calls before exiting. The time a save
blocks the step is in `last_save_stats()`; `find_resumable` (rollback) first finishes a pending save.
On CPU the option is ignored (logged once): staging a copy of the state costs about what writing it
does (`ASYNC_ON_CPU` lets tests run the same path with CPU tensors).

Public API: save_checkpoint, load_checkpoint, load_model_state, find_resumable, verify_checkpoint,
resolve_checkpoint, check_resume_compatible, capture_rng_state / restore_rng_state,
wait_for_pending_save, last_save_stats, apply_retention, list_checkpoints, read_meta, and the CLI
views print_checkpoints / verify_cli / inspect_cli.

Sources: torch.distributed.checkpoint (DCP) docs; torchtitan's checkpoint manager (async save,
`get_state_dict`/`set_state_dict`, retention by keep_latest_k).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from oreline import compat
from oreline.config import CheckpointConfig, fingerprint
from oreline.errors import CheckpointError
from oreline.train.checkpoint_files import (
    FORMAT_VERSION,
    FULL_RE,
    META,
    TMP_PREFIX,
    TRASH_PREFIX,
    dir_bytes,
    ensure_verified,
    fsync_dir,
    read_latest,
    read_meta,
    resolve_checkpoint,
    step_name,
    write_checksums,
    write_json_synced,
    write_latest,
)
from oreline.train.checkpoint_files import (
    find_resumable as find_resumable_on_disk,
)
from oreline.train.checkpoint_metadata import read_dcp_metadata
from oreline.train.checkpoint_resume import (
    capture_rng_state,
    restore_rng_state,
)
from oreline.train.checkpoint_storage import RawTensorReader, RawTensorWriter, raw_writer_available

log = logging.getLogger("oreline.checkpoint")

# Files (and threads) per rank in a DCP save. On the shared 2-core machine 2 threads were not
# reliably faster than 1 (benchmarks/checkpoint_io.py --write-threads N); hosts with idle cores
# may gain from more.
WRITE_THREADS = 1
# Tensors are written as their raw bytes (checkpoint_storage.RawTensorWriter) instead of one
# torch.save archive each; False selects DCP's stock FileSystemWriter (the benchmark's peer).
RAW_TENSOR_FILES = True
# ---------------------------------------------------------------------------------------------
# distributed helpers


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _barrier() -> None:
    if _world() > 1:
        dist.barrier()


def _no_dist() -> bool:
    return _world() == 1 and not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _no_zip_crc32():
    """torch.save (which DCP uses per tensor) computes a CRC32 of every record: on this CPU that was
    ~80% of a save's CPU time (benchmarks/checkpoint_io.py). checksums.json already covers every
    byte with xxh3-128, so the CRC is redundant; loading does not need it."""
    config = compat.torch_save_config()
    if config is None:  # outside the tested torch range: the CRC stays on (slower, same files)
        yield
        return
    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = before


# DCP warns on every call without a process group that it "assumes a single process": it does,
# that is what world 1 means. Filtered around each call, and for the whole process because async
# saves warn from DCP's background thread, where a catch_warnings() context does not reach.
_SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)


@contextlib.contextmanager
def _quiet_single_process():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
        yield


# ---------------------------------------------------------------------------------------------
# saving


@dataclass
class _PendingSave:
    future: Any
    finalize: Any  # () -> Path
    started: float


_PENDING: _PendingSave | None = None
_LAST_SAVE: dict[str, float] = {}
_ASYNC_NOTE_SHOWN = False
# Async save is for CUDA (see the module docstring). Tests set this to run the same background
# path with CPU tensors, where DCP's staging copy works the same way.
ASYNC_ON_CPU = False


def last_save_stats() -> dict[str, float]:
    """Timings of the last save: blocking_s (time the step waited), total_s, dcp_s (tensor files
    written and fsynced), checksum_s (checksums.json), bytes (rank 0's view)."""
    return dict(_LAST_SAVE)


def wait_for_pending_save() -> Path | None:
    """Finish an async save in flight (meta, checksums, rename). Call before exiting the loop."""
    global _PENDING
    if _PENDING is None:
        return None
    pending, _PENDING = _PENDING, None
    pending.future.result()
    path = pending.finalize()
    _LAST_SAVE["total_s"] = time.perf_counter() - pending.started
    return path


def find_resumable(ckpt_root: Path, console=None, skipped: list | None = None) -> Path | None:
    """Newest valid full checkpoint (see `checkpoint_files.find_resumable`), after finishing an async
    save in flight: a rollback right after a save must see that save, not report it incomplete."""
    wait_for_pending_save()
    return find_resumable_on_disk(ckpt_root, console=console, skipped=skipped)


def _json_param_groups(groups: list[dict]) -> list[dict]:
    """Optimizer hyperparameters as JSON (0-dim tensors become floats, tuples lists)."""
    out = []
    for g in groups:
        jg = {}
        for k, v in g.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            elif isinstance(v, tuple):
                v = list(v)
            jg[k] = v
        out.append(jg)
    json.dumps(out)  # fail here, not half-way through a save
    return out


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


def _full_meta(step: int, meta: dict, kind: str) -> dict:
    out = dict(meta)
    out.update(
        format_version=FORMAT_VERSION,
        kind=kind,
        step=int(step),
        world_size=_world(),
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        host=socket.gethostname(),
        torch_version=torch.__version__,
    )
    if isinstance(meta.get("config"), dict) and "config_fingerprint" not in meta:
        out["config_fingerprint"] = fingerprint(meta["config"])
    try:
        json.dumps(out)
    except (TypeError, ValueError) as exc:
        bad = [k for k, v in out.items() if not _json_ok(v)]
        raise CheckpointError(
            f"checkpoint meta is not JSON-serializable ({exc}; keys {bad})",
            "pass plain numbers, strings, lists and dicts in meta (state_dict() of helpers)",
        ) from None
    return out


def _json_ok(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _clean_leftovers(root: Path) -> None:
    """Remove folders of interrupted saves and deletions (rank 0, no save in flight)."""
    for p in root.iterdir():
        if p.is_dir() and (p.name.startswith(TMP_PREFIX) or p.name.startswith(TRASH_PREFIX)):
            shutil.rmtree(p, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    """Rename a complete temporary folder into place (replacing an older save of the same step)."""
    fsync_dir(tmp)
    if final.exists():
        trash = final.with_name(f"{TRASH_PREFIX}{final.name}")
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)
    fsync_dir(final.parent)


def _writer(folder: Path) -> dcp.FileSystemWriter:
    """DCP's file writer with fsync, WRITE_THREADS files per rank written in parallel; tensors as raw
    bytes (`checkpoint_storage.RawTensorWriter`) unless RAW_TENSOR_FILES is off."""
    writer = RawTensorWriter if RAW_TENSOR_FILES and raw_writer_available() else dcp.FileSystemWriter
    return writer(str(folder), sync_files=True, thread_count=WRITE_THREADS)


def _gather_digests(mine: dict[str, dict]) -> dict[str, dict]:
    """Every rank's file digests (computed while writing) on every rank; a collective, so it also
    stands for the barrier before rank 0 finalises."""
    if _world() == 1:
        return dict(mine)
    everyone: list[Any] = [None] * _world()
    dist.all_gather_object(everyone, mine)
    return {name: entry for ranks_files in everyone for name, entry in ranks_files.items()}


@contextlib.contextmanager
def _load_errors(path: Path):
    """A failed DCP load as the CheckpointError that caused it (DCP wraps every rank's exception in its
    own CheckpointException, a BaseException whose text is a traceback), or as one naming the folder."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        errors = [failure[0] for failure in exc.failures.values()]
        for err in errors:
            if isinstance(err, CheckpointError):
                raise err from None
        first = errors[0] if errors else exc
        raise CheckpointError(
            f"loading {path} failed ({type(first).__name__}: {str(first)[:300]})",
            "check it with oreline checkpoint verify; resume from another checkpoint or "
            "start fresh with --resume none",
        ) from None


def _reader(path: Path) -> RawTensorReader:
    """Reads raw-tensor files and, through DCP's own reader, torch.save ones (older checkpoints)."""
    return RawTensorReader(str(path))


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict,
    kind: str = "full",
    cfg: CheckpointConfig | None = None,
) -> Path:
    """Save a checkpoint atomically; every rank calls it. Returns the final folder.

    `meta` (JSON) should hold what resume needs besides tensors: tokens_seen, lr_multiplier, loader,
    stability, config (dict; its fingerprint is added), tokenizer/data fingerprints, model_args,
    tokenizer_dir. RNG states, world size, time and optimizer hyperparameters are added here.
    kind="model_only" writes `model-step-N/model.safetensors` (no optimizer; never resumed from).
    """
    global _PENDING, _ASYNC_NOTE_SHOWN
    cfg = cfg or CheckpointConfig()
    root = Path(ckpt_root)
    wait_for_pending_save()
    if kind not in ("full", "model_only"):
        raise CheckpointError(f"unknown checkpoint kind {kind!r}", "use kind='full' or kind='model_only'")
    t0 = time.perf_counter()
    name = step_name(step, kind)
    final, tmp = root / name, root / f"{TMP_PREFIX}{name}"
    rank = _rank()
    full_meta = _full_meta(step, meta, kind)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(root)
        tmp.mkdir()
    _barrier()

    if kind == "model_only":
        return _save_model_only(model, full_meta, tmp, final, t0)

    msd, osd = (
        get_state_dict(model, optimizer) if optimizer is not None else (get_model_state_dict(model), None)
    )
    state = {"model": msd}
    if osd is not None:
        state["optim"] = osd["state"]
        full_meta["optim_param_groups"] = _json_param_groups(osd["param_groups"])
    rng = capture_rng_state()
    if rank == 0:
        full_meta["rng"] = rng
    else:
        write_json_synced(tmp / f"rng-rank{rank:05d}.json", rng)

    writer = _writer(tmp)

    def finalize() -> Path:
        known = _gather_digests(getattr(writer, "file_digests", {}))  # also the barrier: all files written
        if rank == 0:
            write_json_synced(tmp / META, full_meta)
            t_sum = time.perf_counter()
            write_checksums(tmp, known)
            _LAST_SAVE["checksum_s"] = time.perf_counter() - t_sum
            _publish(tmp, final)
            write_latest(root, name)
            apply_retention(root, cfg)
            _LAST_SAVE["bytes"] = float(dir_bytes(final))
        _barrier()
        return final

    on_cuda = any(p.is_cuda for p in model.parameters())
    if cfg.async_save and (on_cuda or ASYNC_ON_CPU):
        # (raw tensor files need no CRC; with RAW_TENSOR_FILES off, torch.save's CRC32 stays on here: the
        # write runs in DCP's thread after this returns)
        future = dcp.async_save(state, storage_writer=writer, **compat.dcp_no_dist(_no_dist()))
        _PENDING = _PendingSave(future, finalize, t0)
        _LAST_SAVE.clear()
        _LAST_SAVE["blocking_s"] = time.perf_counter() - t0
        log.info("async checkpoint %s started: the step waited %.3f s", name, _LAST_SAVE["blocking_s"])
        return final
    if cfg.async_save and not _ASYNC_NOTE_SHOWN:
        log.warning("checkpoint.async is ignored on CPU: saving synchronously")
        _ASYNC_NOTE_SHOWN = True
    _LAST_SAVE.clear()
    t_dcp = time.perf_counter()
    with _quiet_single_process(), _no_zip_crc32():
        dcp.save(state, storage_writer=writer, **compat.dcp_no_dist(_no_dist()))
    _LAST_SAVE["dcp_s"] = time.perf_counter() - t_dcp
    path = finalize()
    _LAST_SAVE["blocking_s"] = _LAST_SAVE["total_s"] = time.perf_counter() - t0
    return path


def _save_model_only(model: torch.nn.Module, meta: dict, tmp: Path, final: Path, t0: float) -> Path:
    from safetensors.torch import save_file

    # full_state_dict gathers FSDP shards onto rank 0; names come without DDP/compile prefixes
    options = StateDictOptions(full_state_dict=True, cpu_offload=True) if _world() > 1 else None
    sd = get_model_state_dict(model, options=options)
    if _rank() == 0:
        # clone: safetensors refuses tensors that share memory (tied embeddings)
        tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in sd.items()}
        save_file(
            tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "step": str(meta["step"])}
        )
        with open(tmp / "model.safetensors", "rb+") as fh:
            os.fsync(fh.fileno())
        write_json_synced(tmp / META, meta)
        write_checksums(tmp)
        _publish(tmp, final)
        _LAST_SAVE.clear()
        _LAST_SAVE["bytes"] = float(dir_bytes(final))
    _barrier()
    _LAST_SAVE["blocking_s"] = _LAST_SAVE["total_s"] = time.perf_counter() - t0
    return final


def apply_retention(root: Path, cfg: CheckpointConfig) -> list[Path]:
    """Delete full checkpoints outside keep_last / keep_every (never the `latest` one). Returns deleted."""
    fulls = sorted(
        (int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := FULL_RE.match(p.name))
    )
    keep = {s for s, _ in fulls[-cfg.keep_last :]}
    if cfg.keep_every > 0:
        keep |= {s for s, _ in fulls if s % cfg.keep_every == 0}
    latest = read_latest(root)
    deleted = []
    for s, p in fulls:
        if s in keep or p.name == latest:
            continue
        trash = p.with_name(f"{TRASH_PREFIX}{p.name}")
        os.rename(p, trash)  # a kill mid-delete leaves a .trash- folder, never a half step- folder
        shutil.rmtree(trash, ignore_errors=True)
        deleted.append(p)
    return deleted


# ---------------------------------------------------------------------------------------------
# loading


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, restore_rng: bool = True
) -> dict:
    """Load a full checkpoint into the live model (and optimizer) in place; return its meta.

    Verifies checksums first (once per process). Restores this rank's RNG states unless told not to.
    """
    path = Path(path)
    ensure_verified(path)
    meta = read_meta(path) or {}
    if meta.get("kind") != "full":
        raise CheckpointError(
            f"{path} is a {meta.get('kind')} snapshot: it holds no optimizer state",
            "resume from a step-* checkpoint, or start fresh with --resume none",
        )
    if optimizer is not None and "optim_param_groups" not in meta:
        raise CheckpointError(f"{path} was saved without optimizer state", "resume with --resume none")
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
        with _quiet_single_process(), _load_errors(path):
            dcp.load(state, storage_reader=_reader(path), **compat.dcp_no_dist(_no_dist()))
        set_model_state_dict(model, state["model"])
    elif not _load_single_process(path, model, optimizer, meta):
        msd, osd = get_state_dict(model, optimizer)  # initialises empty AdamW state with a zero-lr step
        state = {"model": msd, "optim": osd["state"]}
        with _quiet_single_process(), _load_errors(path):
            dcp.load(state, storage_reader=_reader(path), **compat.dcp_no_dist(_no_dist()))
        groups = _restore_param_groups(meta["optim_param_groups"], osd["param_groups"])
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict={"state": state["optim"], "param_groups": groups},
        )
    if restore_rng:
        rank = _rank()
        rng_file = path / f"rng-rank{rank:05d}.json"
        source = path / META if rank == 0 and "rng" in meta else rng_file
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
            log.warning(
                "no RNG state for rank %d in %s (saved with fewer ranks): RNG not restored", rank, path
            )
    return meta


def _load_single_process(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict
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
    with _quiet_single_process(), _load_errors(path):
        dcp.load(state, storage_reader=_reader(path), **compat.dcp_no_dist(True))
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
    ensure_verified(path)
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
        with _quiet_single_process(), _load_errors(path):
            dcp.load(holder, storage_reader=_reader(path), **compat.dcp_no_dist(True))
        sd = holder["model"]
    if "model_args" not in meta:
        raise CheckpointError(
            f"{path}/{META} has no model_args", "this checkpoint was not written by oreline train"
        )
    return sd, ModelArgs.from_dict(meta["model_args"]), meta
