"""A DCP storage layer that writes tensors as their raw bytes: `RawTensorWriter` / `RawTensorReader`.

torch.distributed.checkpoint (DCP) stays the format and the API: planning, sharding, resharding at
load, `.metadata` and the per-rank `__<rank>_<n>.distcp` files are DCP's own, so FSDP-sharded saves
from every rank and loads at another world size work as before. Only how one tensor's bytes reach
the file changes. DCP's FileSystemWriter serialises every tensor with `torch.save` (a zip archive per
tensor, written through a Python callback) and its reader `torch.load`s each one back, far below
the disk's sequential write speed (docs/measurements.md). Here each tensor's memory is handed to `write()` as one memoryview (no copy, no archive), and the
result records DCP's usual `_StorageInfo(file, offset, length)` plus a transform descriptor
`RAW_DESCRIPTOR`. Dtype and shape need not be stored again: they are in the tensor's
`TensorStorageMetadata` chunk, which DCP writes to `.metadata` anyway.

Reading: items carrying `RAW_DESCRIPTOR` are read with `readinto` straight into the destination
tensor when it is a contiguous CPU tensor covering the whole stored chunk (the common case: same
world size), else into a scratch tensor that is narrowed and copied (resharding). Nothing is
unpickled for them, which is safer than `torch.load(weights_only=True)`. Tensor items without the
descriptor (checkpoints written by DCP's stock writer) go to DCP's own reader, which loads each with
`torch.load(weights_only=True)`. Non-tensor (BYTE_IO) items are refused: DCP would restore them with
`torch.load(weights_only=False)`, i.e. run whatever the pickle says, and oreline saves none.
`.metadata` is read by `metadata.read_dcp_metadata` (an allow-listed unpickler), not by
DCP's `pickle.load`. A read that fails (a data file shorter than its metadata says, a file of
another format) is a CheckpointError naming the file. DCP's stock `FileSystemReader` refuses a raw
checkpoint with "Unknown extension" instead of misreading it: load oreline checkpoints with
`RawTensorReader`.

Checksums: while writing, each file's xxh3-128 (sha256 when checkpoints are signed) is computed from
the same memory, in a helper thread that overlaps the writes (xxhash and hashlib release the GIL),
and left in `RawTensorWriter.file_digests`; the save hands them to `format.write_checksums`,
which then need not read the checkpoint back. Loads verify `checksums.json` against the files first.

Sources: torch/distributed/checkpoint/filesystem.py (`_write_files_from_queue`, `_write_item`,
`FileSystemReader.read_data`), whose file layout, bucketing and metadata this follows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future  # DCP waits on torch futures (.wait()), not concurrent ones

from oreline import compat
from oreline.errors import CheckpointError
from oreline.train.checkpoint.format import HASH_ALGO, CheckpointCorrupted, manifest_algo
from oreline.train.checkpoint.metadata import RAW_DESCRIPTOR, read_dcp_metadata

# Largest single write()/readinto(): big enough that syscalls cost nothing, small enough that a
# partial write on an odd file system is retried quickly.
_IO_CHUNK = 64 << 20


def _as_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's memory as a flat byte view (a contiguous CPU copy first only when needed)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return memoryview(b"")
    # a uint8 view works for every dtype numpy lacks (bfloat16, float8)
    return memoryview(t.view(torch.uint8).numpy())


def _write_all(fd: int, mv: memoryview) -> None:
    done = 0
    while done < len(mv):
        done += os.write(fd, mv[done : done + _IO_CHUNK])


_REPLACED_HINT = (
    "the file was truncated or replaced by another one; resume from another checkpoint "
    "(oreline checkpoint verify RUN_DIR) or start fresh with --resume none"
)


def _read_exact(fh, mv: memoryview, where: str) -> None:
    done = 0
    while done < len(mv):
        n = fh.readinto(mv[done : done + _IO_CHUNK])
        if not n:
            raise CheckpointError(f"{where}: file ended {len(mv) - done} bytes early", _REPLACED_HINT)
        done += n


def _internals() -> Any:
    """DCP's own records (so `.metadata` stays DCP's format), reached through oreline.compat."""
    found = compat.dcp_raw_writer_internals()
    if found is None:
        raise CheckpointError(
            "this torch does not offer the DCP internals raw tensor files are written with",
            "save with DCP's stock writer (save.py picks it automatically)",
        )
    return found


def raw_writer_available() -> bool:
    return compat.dcp_raw_writer_internals() is not None


class RawTensorWriter(FileSystemWriter):
    """DCP's FileSystemWriter, but tensors are written as raw bytes (see the module docstring).

    Same knobs: `thread_count` files per rank written in parallel, `sync_files` fsyncs each file.
    Async saves work unchanged (the inherited stager copies the state to CPU first).
    After a save, `file_digests` maps each file this rank wrote to {"bytes", "hash"} (xxh3-128),
    the entries `format.write_checksums` would otherwise compute by reading the file.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.file_digests: dict[str, dict[str, Any]] = {}
        # sha256 when checkpoints are signed (ORELINE_CHECKPOINT_KEY), else xxh3-128: the manifest's hash
        self.digest_algo = manifest_algo()

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        dcp_ = _internals()
        prefix = plan.storage_data  # DCP's _StoragePrefix
        buckets = [b for b in dcp_.split_by_size_and_type(self.thread_count, plan.items) if b] or [[]]
        jobs = [(f"{prefix.prefix}{i}{dcp_.DEFAULT_SUFFIX}", bucket) for i, bucket in enumerate(buckets)]
        if len(jobs) == 1:
            results = [self._write_file(*jobs[0], planner)]
        else:
            with ThreadPoolExecutor(len(jobs)) as pool:
                results = list(pool.map(lambda job: self._write_file(*job, planner), jobs))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result([r for file_results in results for r in file_results])
        return fut

    def _write_file(self, file_name: str, items: list, planner: SavePlanner) -> list[WriteResult]:
        path = self.fs.concat_path(self.path, file_name)
        results = []
        digest = xxhash.xxh3_128() if self.digest_algo == HASH_ALGO else hashlib.new(self.digest_algo)
        # one worker: updates run in submission order, overlapping the write of the same bytes
        hasher = ThreadPoolExecutor(1)
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644
        )  # never a planted link
        try:
            offset = 0
            for item in items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    mv, descriptors = data.getbuffer(), None  # DCP's own encoding of non-tensors
                else:
                    mv, descriptors = _as_bytes(data), [RAW_DESCRIPTOR]
                hasher.submit(digest.update, mv)  # (mv keeps the tensor's memory alive until hashed)
                _write_all(fd, mv)
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=len(mv),
                        storage_data=_internals().StorageInfo(file_name, offset, len(mv), descriptors),
                    )
                )
                offset += len(mv)
            if self.sync_files:
                os.fsync(fd)
        finally:
            os.close(fd)
            hasher.shutdown(wait=True)
        entry = {"bytes": offset, "hash": digest.hexdigest()}
        if self.digest_algo != HASH_ALGO:
            entry["algo"] = self.digest_algo
        self.file_digests[file_name] = entry
        return results


class _StreamCheck:
    """The digest of one data file, fed by the bytes the reader reads (in a helper thread) and by
    the bytes between and after them, read here: a file a rank reads from is hashed whole, in the
    same forward pass, and compared with its manifest entry at the end."""

    def __init__(self, fh, where: str, want: dict, algo: str):
        self.fh, self.where, self.want = fh, where, want
        self.digest = xxhash.xxh3_128() if algo == HASH_ALGO else hashlib.new(algo)
        self.hasher = ThreadPoolExecutor(1)  # updates run in submission order
        self.pos = 0  # bytes hashed so far (the file's first `pos` bytes)

    def skip_to(self, offset: int) -> None:
        """Hash the bytes from where hashing stands up to `offset` (read here: no tensor needs them)."""
        if offset <= self.pos:
            return
        self.fh.seek(self.pos)
        while self.pos < offset:
            chunk = self.fh.read(min(_IO_CHUNK, offset - self.pos))
            if not chunk:
                break  # the file is shorter: the size check in `finish` says so
            self.hasher.submit(self.digest.update, chunk)
            self.pos += len(chunk)

    def read(self, offset: int, mv: memoryview) -> None:
        """`mv` now holds the file's bytes from `offset`: hash what of them is not hashed yet."""
        self.skip_to(offset)
        if offset + len(mv) > self.pos:
            self.hasher.submit(self.digest.update, mv[self.pos - offset :])
            self.pos = offset + len(mv)

    def finish(self, size: int) -> None:
        self.skip_to(size)
        self.hasher.shutdown(wait=True)
        if self.pos != self.want["bytes"] or self.digest.hexdigest() != self.want["hash"]:
            what = (
                f"has {self.pos} bytes, expected {self.want['bytes']} (truncated or overwritten)"
                if self.pos != self.want["bytes"]
                else "checksum mismatch (corrupted)"
            )
            raise CheckpointCorrupted(
                Path(self.where).parent, f"{Path(self.where).name} {what}", _REPLACED_HINT
            )

    def abandon(self) -> None:
        self.hasher.shutdown(wait=True)


class RawTensorReader(FileSystemReader):
    """Reads what RawTensorWriter wrote (and, through DCP's own reader, what FileSystemWriter wrote).

    Never unpickles: `.metadata` through the allow-listed reader, raw tensors by `readinto`, stock
    tensors by `torch.load(weights_only=True)`, non-tensor items refused.

    `expect` (the manifest's file entries and algorithm, `verify.reading_check`): every data file
    this rank reads from is hashed as it is read (raw tensor files) or before it is read (stock
    ones, which torch.load parses) and a mismatch is a `CheckpointCorrupted` naming the file.
    None: the checkpoint is trusted (this process wrote or verified it)."""

    def __init__(self, path: str, expect: tuple[dict[str, dict], str] | None = None) -> None:
        super().__init__(path)
        self.expect = expect

    def _want(self, rel: str, where: str) -> dict:
        want = self.expect[0].get(rel) if self.expect else None
        if want is None:  # (verify.reading_check refuses a data file the manifest does not cover)
            raise CheckpointError(
                f"{where} is not covered by the checkpoint's checksums.json", _REPLACED_HINT
            )
        return want

    def read_metadata(self) -> Metadata:  # (no **kwargs: DCP then tries no rank-local fallback file)
        md = read_dcp_metadata(Path(self.path))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        # (fqn, chunk offsets) -> (dtype, chunk sizes): what a raw chunk's bytes are
        self._chunks: dict[tuple[str, tuple[int, ...]], tuple[torch.dtype, torch.Size]] = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for chunk in md.chunks:
                    self._chunks[(fqn, tuple(chunk.offsets))] = (md.properties.dtype, chunk.sizes)

    def _is_raw(self, index: MetadataIndex) -> bool:
        return RAW_DESCRIPTOR in (getattr(self.storage_data[index], "transform_descriptors", None) or ())

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for r in plan.items:
            if r.type == LoadItemType.BYTE_IO:
                rel = self.storage_data[r.storage_index].relative_path
                raise CheckpointError(
                    f"{Path(self.path) / rel}: {r.storage_index.fqn} is stored as a pickled object (a DCP byte "
                    f"item, declared in {Path(self.path) / '.metadata'}); oreline checkpoints hold only "
                    "tensors and never unpickle",
                    "do not load this checkpoint: it was not written by oreline",
                )
        raw = [r for r in plan.items if self._is_raw(r.storage_index)]
        other = [r for r in plan.items if not self._is_raw(r.storage_index)]
        if other and self.expect is not None:  # hashed before torch.load parses it
            for rel in sorted({self.storage_data[r.storage_index].relative_path for r in other}):
                where = str(Path(self.path) / rel)
                with open(where, "rb") as fh:
                    check = _StreamCheck(fh, where, self._want(rel, where), self.expect[1])
                    check.finish(os.fstat(fh.fileno()).st_size)
        if other:
            try:
                super().read_data(dataclasses.replace(plan, items=other), planner)  # synchronous
            except Exception as exc:  # torch.load(weights_only=True) refusing or failing on a data file
                files = sorted({self.storage_data[r.storage_index].relative_path for r in other})
                raise CheckpointError(
                    f"{', '.join(str(Path(self.path) / f) for f in files)}: not readable as "
                    f"torch.save tensors ({type(exc).__name__}: {str(exc)[:300]})",
                    _REPLACED_HINT,
                ) from None
        per_file: dict[str, list] = {}
        for req in raw:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for rel, reqs in per_file.items():
            reqs.sort(key=lambda r: self.storage_data[r.storage_index].offset)  # one forward pass per file
            where = str(Path(self.path) / rel)
            try:
                fh = open(where, "rb", buffering=0)  # noqa: SIM115 (closed below)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot open {where} ({exc.strerror or exc})", _REPLACED_HINT
                ) from None
            with fh:
                size = os.fstat(fh.fileno()).st_size
                check = (
                    None
                    if self.expect is None
                    else _StreamCheck(fh, where, self._want(rel, where), self.expect[1])
                )
                try:
                    for req in reqs:
                        self._read_one(fh, req, planner, where, size, check)
                    if check is not None:
                        check.finish(size)
                finally:
                    if check is not None:
                        check.abandon()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_one(
        self, fh, req, planner: LoadPlanner, where: str, size: int, check: _StreamCheck | None
    ) -> None:
        info = self.storage_data[req.storage_index]  # DCP's _StorageInfo
        key = (req.storage_index.fqn, tuple(req.storage_index.offset or ()))
        if key not in self._chunks:
            raise CheckpointError(
                f"{where}: .metadata stores {key[0]} at offsets {key[1]}, which is no chunk of it",
                _REPLACED_HINT,
            )
        dtype, sizes = self._chunks[key]
        target = planner.resolve_tensor(req).detach()
        whole = tuple(req.storage_offsets) == (0,) * len(sizes) and tuple(req.lengths) == tuple(sizes)
        direct = whole and target.device.type == "cpu" and target.is_contiguous() and target.dtype == dtype
        buf = target if direct else torch.empty(sizes, dtype=dtype)
        nbytes = buf.numel() * buf.element_size()
        if nbytes != info.length:
            raise CheckpointError(
                f"{where}: {req.storage_index.fqn} holds {info.length} bytes, its metadata says {nbytes}",
                _REPLACED_HINT,
            )
        if info.offset + nbytes > size:
            raise CheckpointError(
                f"{where} is {size} bytes, but {req.storage_index.fqn} lies at bytes "
                f"{info.offset}..{info.offset + nbytes}",
                _REPLACED_HINT,
            )
        if check is not None:
            check.skip_to(info.offset)  # (the bytes before this item, hashed in the same pass)
        fh.seek(info.offset)
        if nbytes:
            mv = memoryview(buf.reshape(-1).view(torch.uint8).numpy())
            _read_exact(fh, mv, where)
            if check is not None:
                check.read(info.offset, mv)
        if not direct:
            for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                buf = buf.narrow(dim, start, length)
            target.copy_(buf)
        planner.commit_tensor(req, target)
