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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

import oreline.train.checkpoint.async_save as async_save
from oreline import compat
from oreline.config import CheckpointConfig, fingerprint
from oreline.errors import CheckpointError
from oreline.train.checkpoint.dcp_calls import (
    async_save_group,
    barrier,
    no_process_group,
    no_zip_crc32,
    pinned_stager,
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
    dir_bytes,
    fsync_dir,
    read_latest,
    step_name,
    write_checksums,
    write_json_synced,
    write_latest,
)
from oreline.train.checkpoint.raw_tensors import RawTensorWriter, raw_writer_available
from oreline.train.checkpoint.rng import capture_rng_state

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


def _gather_digests(mine: dict[str, dict]) -> dict[str, dict]:
    """Every rank's file digests (computed while writing) on every rank; a collective, so it also
    stands for the barrier before rank 0 finalises."""
    if world() == 1:
        return dict(mine)
    everyone: list[Any] = [None] * world()
    dist.all_gather_object(everyone, mine)
    return {name: entry for ranks_files in everyone for name, entry in ranks_files.items()}


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
    if me == 0:
        root.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(root)
        tmp.mkdir()
    barrier()

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
    if me == 0:
        full_meta["rng"] = rng
    else:
        write_json_synced(tmp / f"rng-rank{me:05d}.json", rng)

    writer = _writer(tmp)

    def finalize() -> Path:
        known = _gather_digests(getattr(writer, "file_digests", {}))  # also the barrier: all files written
        if me == 0:
            write_json_synced(tmp / META, full_meta)
            t_sum = time.perf_counter()
            write_checksums(tmp, known)
            _LAST_SAVE["checksum_s"] = time.perf_counter() - t_sum
            _publish(tmp, final)
            write_latest(root, name)
            apply_retention(root, cfg)
            _LAST_SAVE["bytes"] = float(dir_bytes(final))
        barrier()
        return final

    on_cuda = any(p.is_cuda for p in model.parameters())
    if cfg.async_save and (on_cuda or async_save.ASYNC_ON_CPU):
        # (raw tensor files need no CRC; with RAW_TENSOR_FILES off, torch.save's CRC32 stays on here: the
        # write runs in DCP's thread after this returns)
        stager = pinned_stager(state, on_cuda)
        if stager:  # what the writer's own stage() sets: the tensors it gets are on the CPU already
            writer.per_thread_copy_ahead = 0
        future = dcp.async_save(
            state,
            storage_writer=writer,
            process_group=async_save_group(),
            **stager,
            **compat.dcp_no_dist(no_process_group()),
        )

        def finalize_later() -> Path:
            path = finalize()
            _LAST_SAVE["total_s"] = time.perf_counter() - t0
            return path

        async_save.start(future, finalize_later)
        _LAST_SAVE.clear()
        _LAST_SAVE["blocking_s"] = time.perf_counter() - t0
        log.info("async checkpoint %s started: the step waited %.3f s", name, _LAST_SAVE["blocking_s"])
        return final
    if cfg.async_save and not _ASYNC_NOTE_SHOWN:
        log.warning("checkpoint.async is ignored on CPU: saving synchronously")
        _ASYNC_NOTE_SHOWN = True
    _LAST_SAVE.clear()
    t_dcp = time.perf_counter()
    with quiet_single_process(), no_zip_crc32():
        dcp.save(state, storage_writer=writer, **compat.dcp_no_dist(no_process_group()))
    _LAST_SAVE["dcp_s"] = time.perf_counter() - t_dcp
    path = finalize()
    _LAST_SAVE["blocking_s"] = _LAST_SAVE["total_s"] = time.perf_counter() - t0
    return path


def _save_model_only(model: torch.nn.Module, meta: dict, tmp: Path, final: Path, t0: float) -> Path:
    from safetensors.torch import save_file

    # full_state_dict gathers FSDP shards onto rank 0; names come without DDP/compile prefixes
    options = StateDictOptions(full_state_dict=True, cpu_offload=True) if world() > 1 else None
    sd = get_model_state_dict(model, options=options)
    if rank() == 0:
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
    barrier()
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
