"""Writing a checkpoint: `save_checkpoint` (atomic publish), retention, model-only snapshots.

Every rank calls `save_checkpoint`: rank 0 makes `.tmp-step-00000200/`; every rank writes its
shard with `dcp.save` (fsync per file) through `raw_tensors.RawTensorWriter`, which hashes each
file while writing it; the digests are gathered (a collective, so also the barrier), then rank 0
writes meta.json and checksums.json (`format.write_checksums`), fsyncs, renames the folder to
`step-00000200`, fsyncs the parent, replaces `latest` (write + rename) and applies retention. A
kill at any moment leaves either the complete folder or a `.tmp-` one, which is never offered for
resume (and is removed by the next save).

Only tensors go through DCP: the optimizer's param_groups (lr, betas, ...) are plain numbers and go
into meta.json, with RNG states (`rng`), world size, time and versions, because DCP restores
non-tensor objects by unpickling. With `RAW_TENSOR_FILES = False` (DCP's stock writer, torch.save
per tensor) saves turn off torch.save's per-record CRC32: checksums.json already covers every byte.
With `checkpoint.async` on CUDA the tensor files are written in the background and the rest of the
save happens later (`async_save`). `last_save_stats()` says how long the step waited.

Retention: the newest `keep_last` (≥ 1) full checkpoints plus every step divisible by
`keep_every` (> 0) are kept, and the one `latest` names; model-only snapshots are all kept (they are
small and were asked for explicitly with `model_only_every`).

Sources: torch.distributed.checkpoint (DCP) docs; torchtitan's checkpoint manager (async save,
`get_state_dict`/`set_state_dict`, retention by keep_latest_k).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

import oreline.train.checkpoint.async_save as async_save
from oreline import compat
from oreline.config import CheckpointConfig, fingerprint
from oreline.errors import CheckpointError
from oreline.io import check_guards
from oreline.outdir import LockLost
from oreline.train.checkpoint.dcp_calls import (
    async_save_group,
    no_process_group,
    no_zip_crc32,
    pinned_stager,
    publish_group,
    quiet_single_process,
    rank,
    world,
)
from oreline.train.checkpoint.format import (
    FORMAT_VERSION,
    FULL_RE,
    META,
    TMP_PREFIX,
    TRASH_PREFIX,
    digest_entry,
    dir_bytes,
    fsync_dir,
    json_bytes,
    read_latest,
    step_name,
    write_checksums,
    write_file_synced,
    write_json_synced,
    write_latest,
)
from oreline.train.checkpoint.raw_tensors import RawTensorWriter, raw_writer_available
from oreline.train.checkpoint.rng import capture_rng_state
from oreline.train.checkpoint.verify import mark_verified

log = logging.getLogger("oreline.checkpoint")

# Files (and threads) per rank in a DCP save. On the shared 2-core machine 2 threads were not
# reliably faster than 1 (benchmarks/checkpoint_io.py --write-threads N); hosts with idle cores
# may gain from more.
WRITE_THREADS = 1
# Tensors are written as their raw bytes (raw_tensors.RawTensorWriter) instead of one torch.save
# archive each; False selects DCP's stock FileSystemWriter (the benchmark's peer).
RAW_TENSOR_FILES = True

_LAST_SAVE: dict[str, float] = {}  # last_save_stats()
_ASYNC_NOTE_SHOWN = False


def last_save_stats() -> dict[str, float]:
    """Timings of the last save: blocking_s (time the step waited), total_s, dcp_s (tensor files
    written and fsynced), checksum_s (checksums.json), bytes (rank 0's view)."""
    return dict(_LAST_SAVE)


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


def _full_meta(step: int, meta: dict, kind: str) -> dict:
    out = dict(meta)
    out.update(
        format_version=FORMAT_VERSION,
        kind=kind,
        step=int(step),
        world_size=world(),
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
    bytes (`raw_tensors.RawTensorWriter`) unless RAW_TENSOR_FILES is off."""
    writer = RawTensorWriter if RAW_TENSOR_FILES and raw_writer_available() else dcp.FileSystemWriter
    return writer(str(folder), sync_files=True, thread_count=WRITE_THREADS)


def _index_files(writer: Any, folder: Path) -> set[str]:
    """The data files DCP's index names (rank 0, after the tensor write): DCP gathered every rank's
    write results to build it, so it is the ranks' own account, not a listing of the folder."""
    names = getattr(writer, "index_files", None)  # RawTensorWriter.finish records them
    if names is None:  # DCP's stock writer
        from oreline.train.checkpoint.metadata import read_dcp_metadata

        names = {info.relative_path for info in read_dcp_metadata(folder).storage_data.values()}
    return set(names)


def _state_bytes(state: Any) -> int:
    """Bytes of the tensors of a state dict (global sizes: for sharded tensors, all ranks' shares)."""
    if isinstance(state, dict):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    return 0


def _fmt(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _problem(exc: BaseException | None) -> tuple[str, int | None] | None:
    """What went wrong in a save, as (text, errno), picklable for the other ranks; None: nothing.

    DCP hands a rank's exception back wrapped in its CheckpointException (a BaseException whose
    text is a traceback): the first wrapped exception is what is told."""
    if exc is None:
        return None
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}", exc.errno
    return f"{type(exc).__name__}: {str(exc)[:300]}", None


def _lock_lost(exc: LockLost) -> tuple[str, int]:
    """A lost lock as a save's problem, for every rank: its text, and ENOLCK to tell it apart."""
    return str(exc), errno.ENOLCK


def _failed(
    root: Path, name: str, problem: tuple[str, int | None], need: int | None
) -> CheckpointError | LockLost:
    """The error a failed save ends the run with: the folder, the bytes it needs, what to do."""
    text, errno_ = problem
    if errno_ == errno.ENOLCK:  # this process lost the run folder's lock (`_lock_lost`)
        return LockLost(text)
    latest = read_latest(root)
    resume = (
        f"--resume auto continues from {latest}"
        if latest
        else "--resume auto starts over (no checkpoint yet)"
    )
    if errno_ in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = f"{_fmt(shutil.disk_usage(root).free)} free"
        except OSError:
            free = "free space unknown"
        needs = f"a checkpoint needs about {_fmt(need)}, {free}" if need else free
        return CheckpointError(
            f"no space left on the device of {root} while writing checkpoint {name} ({needs}; {text}); "
            "the unfinished save was removed",
            f"free space there (or lower checkpoint.keep_last, or put runs_dir on a larger disk), then run "
            f"the same command again: {resume}",
        )
    return CheckpointError(
        f"writing checkpoint {name} in {root} failed ({text}); the unfinished save was removed",
        f"fix the file system of {root}, then run the same command again: {resume}",
    )


def _agree(problem: tuple[str, int | None] | None, group: Any = None) -> tuple[str, int | None] | None:
    """Every rank's problem (or None) to every rank; the first one. A collective, so it also stands
    for a barrier: a rank that failed alone does not leave the others waiting at the next one."""
    if world() == 1:
        return problem
    everyone: list[Any] = [None] * world()
    dist.all_gather_object(everyone, problem, group=group)
    return next((p for p in everyone if p is not None), None)


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
    A save that fails (a full disk) removes its `.tmp-` folder and raises a CheckpointError on
    every rank, naming the folder and, for a full disk, the bytes a checkpoint needs.
    """
    global _ASYNC_NOTE_SHOWN
    cfg = cfg or CheckpointConfig()
    root = Path(ckpt_root)
    async_save.wait_for_pending_save()  # one save in flight at a time
    if kind not in ("full", "model_only"):
        raise CheckpointError(f"unknown checkpoint kind {kind!r}", "use kind='full' or kind='model_only'")
    t0 = time.perf_counter()
    name = step_name(step, kind)
    final, tmp = root / name, root / f"{TMP_PREFIX}{name}"
    me = rank()
    full_meta = _full_meta(step, meta, kind)
    need: int | None = None

    def fail(problem: tuple[str, int | None]) -> CheckpointError:
        if me == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        return _failed(root, name, problem, need)

    problem = None
    if me == 0:
        try:
            # a process whose lock was taken over (it was suspended past its lease) must not save,
            # publish or clean up in the folder the new holder writes: checked before each of them
            check_guards(root)
            root.mkdir(parents=True, exist_ok=True)
            _clean_leftovers(root)
            tmp.mkdir()
        except OSError as exc:
            problem = _problem(exc)
        except LockLost as exc:
            problem = _lock_lost(exc)
    problem = _agree(problem)  # (the barrier before every rank writes into tmp)
    if problem:
        raise fail(problem)

    if kind == "model_only":
        return _save_model_only(model, full_meta, tmp, final, t0, fail)

    msd, osd = (
        get_state_dict(model, optimizer) if optimizer is not None else (get_model_state_dict(model), None)
    )
    state = {"model": msd}
    if osd is not None:
        state["optim"] = osd["state"]
        full_meta["optim_param_groups"] = _json_param_groups(osd["param_groups"])
    need = _state_bytes(state)
    rng = capture_rng_state()
    # what this rank wrote besides its tensor files, with digests: the manifest is built from
    # what the ranks report, never from a listing of the folder
    mine: dict[str, dict] = {}
    if me == 0:
        full_meta["rng"] = rng
    else:
        rng_name, data = f"rng-rank{me:05d}.json", json_bytes(rng)
        try:
            write_file_synced(tmp / rng_name, data)
            mine[rng_name] = digest_entry(data)
        except OSError as exc:
            problem = _problem(exc)
    problem = _agree(problem)
    if problem:
        raise fail(problem)

    writer = _writer(tmp)

    def finalize(write_error: BaseException | None, group: Any = None) -> Path:
        """meta.json, checksums.json, the rename into place, `latest`, retention (rank 0); every
        rank calls it once its tensor files are written (or failed)."""
        reported: dict[str, dict] = {}
        problems: list[Any] = [(_problem(write_error), {**mine, **getattr(writer, "file_digests", {})})]
        if world() > 1:  # also the barrier: every rank's files are written
            problems = [None] * world()
            dist.all_gather_object(
                problems,
                (_problem(write_error), {**mine, **getattr(writer, "file_digests", {})}),
                group=group,
            )
        problem = next((p for p, _ in problems if p is not None), None)
        for _, entries in problems:
            reported.update(entries)
        if problem is None and me == 0:
            try:
                check_guards(root)
                meta_bytes = json_bytes(full_meta)
                write_file_synced(tmp / META, meta_bytes)
                reported[META] = digest_entry(meta_bytes)
                t_sum = time.perf_counter()
                names = set(reported) | {META, ".metadata"} | _index_files(writer, tmp)
                write_checksums(tmp, reported, names=names)
                _LAST_SAVE["checksum_s"] = time.perf_counter() - t_sum
                _publish(tmp, final)
                write_latest(root, name)
                apply_retention(root, cfg)
                _LAST_SAVE["bytes"] = float(dir_bytes(final))
            except LockLost as exc:
                problem = _lock_lost(exc)
            except (OSError, CheckpointError) as exc:
                problem = _problem(exc) if isinstance(exc, OSError) else (exc.message, None)
        problem = _agree(problem, group)  # (the barrier after the publish)
        if problem:
            raise fail(problem)
        mark_verified(final)  # written here, digests computed while writing: a rollback need not hash it
        return final

    on_cuda = any(p.is_cuda for p in model.parameters())
    if cfg.async_save and (on_cuda or async_save.ASYNC_ON_CPU):
        # (raw tensor files need no CRC; with RAW_TENSOR_FILES off, torch.save's CRC32 stays on here: the
        # write runs in DCP's thread after this returns)
        stager = pinned_stager(state, on_cuda)
        if stager:  # what the writer's own stage() sets: the tensors it gets are on the CPU already
            writer.per_thread_copy_ahead = 0
        group = publish_group()  # (made here, on every rank at the same point: new_group is a collective)
        future = dcp.async_save(
            state,
            storage_writer=writer,
            process_group=async_save_group(),
            **stager,
            **compat.dcp_no_dist(no_process_group()),
        )

        def publish(write_error: BaseException | None) -> Path:
            path = finalize(write_error, group)
            _LAST_SAVE["total_s"] = time.perf_counter() - t0
            log.info("async checkpoint %s published after %.1f s", name, _LAST_SAVE["total_s"])
            return path

        async_save.start(future, publish)
        _LAST_SAVE.clear()
        _LAST_SAVE["blocking_s"] = time.perf_counter() - t0
        log.info("async checkpoint %s started: the step waited %.3f s", name, _LAST_SAVE["blocking_s"])
        return final
    if cfg.async_save and not _ASYNC_NOTE_SHOWN:
        log.warning("checkpoint.async is ignored on CPU: saving synchronously")
        _ASYNC_NOTE_SHOWN = True
    _LAST_SAVE.clear()
    t_dcp = time.perf_counter()
    write_error: BaseException | None = None
    try:
        with quiet_single_process(), no_zip_crc32():
            dcp.save(state, storage_writer=writer, **compat.dcp_no_dist(no_process_group()))
    except (Exception, CheckpointException) as exc:  # DCP's own is a BaseException (every rank gets it)
        write_error = exc
    _LAST_SAVE["dcp_s"] = time.perf_counter() - t_dcp
    path = finalize(write_error)
    _LAST_SAVE["blocking_s"] = _LAST_SAVE["total_s"] = time.perf_counter() - t0
    return path


def _save_model_only(
    model: torch.nn.Module, meta: dict, tmp: Path, final: Path, t0: float, fail: Any
) -> Path:
    from safetensors.torch import save_file

    # full_state_dict gathers FSDP shards onto rank 0; names come without DDP/compile prefixes
    options = StateDictOptions(full_state_dict=True, cpu_offload=True) if world() > 1 else None
    sd = get_model_state_dict(model, options=options)
    problem = None
    if rank() == 0:
        # clone: safetensors refuses tensors that share memory (tied embeddings)
        tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in sd.items()}
        try:
            save_file(
                tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "step": str(meta["step"])}
            )
            with open(tmp / "model.safetensors", "rb+") as fh:
                os.fsync(fh.fileno())
            write_json_synced(tmp / META, meta)
            write_checksums(tmp, names=["model.safetensors", META])  # the two files written here
            check_guards(final.parent)
            _publish(tmp, final)
            _LAST_SAVE.clear()
            _LAST_SAVE["bytes"] = float(dir_bytes(final))
        except OSError as exc:
            problem = _problem(exc)
        except LockLost as exc:
            problem = _lock_lost(exc)
        except Exception as exc:  # safetensors reports a full disk as its own error type
            problem = (f"{type(exc).__name__}: {str(exc)[:300]}", _errno_in(exc))
    problem = _agree(problem)  # (the barrier: rank 0 has published, or failed)
    if problem:
        raise fail(problem)
    _LAST_SAVE["blocking_s"] = _LAST_SAVE["total_s"] = time.perf_counter() - t0
    return final


def _errno_in(exc: BaseException) -> int | None:
    """ENOSPC/EDQUOT when an error that is no OSError says so in its text (safetensors' Rust errors)."""
    text = str(exc)
    if "No space left on device" in text or "os error 28" in text:
        return errno.ENOSPC
    if "Disk quota exceeded" in text:
        return errno.EDQUOT
    return None


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
