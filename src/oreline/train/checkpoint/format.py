"""The on-disk checkpoint format: names, meta.json, `latest`, checksums.json, listing.

A checkpoint is a folder (`step-00000200/` full, `model-step-00000100/` model-only; `.tmp-…` while
being written) holding `meta.json` and a `checksums.json` that lists every file's size and
xxh3-128 hash plus a hash of itself; `latest` (a small file beside the folders) names the newest
complete full checkpoint. What checks a folder against its manifest is `verify`.

xxh3-128 (xxhash) rather than sha256: about ten times faster, so hashing costs a save little of
the disk's bandwidth (docs/measurements.md). It detects corruption
(truncation, flipped bytes), not tampering: anyone can recompute it. With `ORELINE_CHECKPOINT_KEY`
set, the manifest is written with sha256 and signed (HMAC-SHA256, `signature`).

Nothing here imports torch: `oreline doctor` lists and verifies checkpoints without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from oreline.errors import CheckpointError
from oreline.io import open_nofollow
from oreline.train.checkpoint.signature import (
    CRYPTOGRAPHIC,
    SIGNATURE,
    SIGNED_ALGO,
    signature_record,
    signing_key,
)

FORMAT_VERSION = 1
META = "meta.json"
CHECKSUMS = "checksums.json"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
HASH_ALGO = "xxh3_128"
KNOWN_ALGOS = {HASH_ALGO} | CRYPTOGRAPHIC
FULL_RE = re.compile(r"^step-(\d{8,})$")
MODEL_RE = re.compile(r"^model-step-(\d{8,})$")


def step_name(step: int, kind: str = "full") -> str:
    return f"step-{step:08d}" if kind == "full" else f"model-step-{step:08d}"


# ---------------------------------------------------------------------------------------------
# files and hashing


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_synced(path: Path, data: bytes) -> None:
    """Write `data` in place (inside a `.tmp-` folder, or a temporary name then renamed), fsynced;
    never through a link planted at the name."""
    with open_nofollow(path) as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def write_json_synced(path: Path, obj: Any) -> None:
    write_file_synced(path, json_bytes(obj))


def write_latest(root: Path, name: str) -> None:
    tmp = root / f"{TMP_PREFIX}{LATEST}"
    write_file_synced(tmp, (name + "\n").encode())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


def file_digest(path: Path, algo: str = HASH_ALGO) -> str:
    h = xxhash.xxh3_128() if algo == "xxh3_128" else hashlib.new(algo)
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def self_hash(checksums: dict) -> str:
    body = {k: v for k, v in checksums.items() if k != "self"}
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True).encode()).hexdigest()


def manifest_algo() -> str:
    """The per-file hash of a manifest written now: sha256 when checkpoints are signed, else xxh3-128."""
    return SIGNED_ALGO if signing_key() else HASH_ALGO


def digest_entry(data: bytes) -> dict[str, Any]:
    """The manifest entry of bytes a rank is about to write (a small file: RNG states, meta.json)."""
    algo = manifest_algo()
    h = xxhash.xxh3_128(data) if algo == HASH_ALGO else hashlib.new(algo, data)
    entry: dict[str, Any] = {"bytes": len(data), "hash": h.hexdigest()}
    if algo != HASH_ALGO:
        entry["algo"] = algo
    return entry


class CheckpointCorrupted(CheckpointError):
    """A checkpoint's file differs from its manifest, found while reading it (`problem` says how)."""

    def __init__(self, path: Path, problem: str, hint: str):
        super().__init__(f"checkpoint {path} is invalid: {problem}", hint)
        self.path, self.problem = Path(path), problem

    def __reduce__(self):  # DCP gathers a rank's load error to every rank by pickling it
        return (CheckpointCorrupted, (self.path, self.problem, self.hint))


def write_checksums(
    folder: Path, known: dict[str, dict] | None = None, names: Iterable[str] | None = None
) -> None:
    """checksums.json, and signature.json when ORELINE_CHECKPOINT_KEY is set.

    `names`: the files the manifest lists, exactly — for a checkpoint, what its ranks report they
    wrote (a listing of the folder can miss files other nodes just wrote on NFS); a reported file
    that is not there is a CheckpointError. None: every file in the folder (one that this process
    wrote alone). `known` holds {"bytes", "hash"[, "algo"]} entries (no "algo": xxh3-128) computed
    while a file was written (raw_tensors.RawTensorWriter, `digest_entry`); one is used only when
    its size matches the file on disk and its algorithm is the manifest's, every other file is
    read and hashed here."""
    known = known or {}
    key = signing_key()
    algo = manifest_algo()
    if names is None:
        rels = [
            p.relative_to(folder).as_posix()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (CHECKSUMS, SIGNATURE)
        ]
    else:
        rels = sorted(set(names) - {CHECKSUMS, SIGNATURE})
    files = {}
    for rel in rels:
        p = folder / rel
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(
                f"{p} was reported written by a rank but is not there",
                "put the run folder (run.runs_dir) on a file system every node sees, then train again: "
                "--resume auto continues from the last checkpoint",
            ) from None
        entry = known.get(rel)
        if entry and entry["bytes"] == size and entry.get("algo", HASH_ALGO) == algo:
            files[rel] = {"bytes": size, "hash": entry["hash"]}
        else:
            files[rel] = {"bytes": size, "hash": file_digest(p, algo)}
    checksums = {"algo": algo, "files": files}
    checksums["self"] = self_hash(checksums)
    write_json_synced(folder / CHECKSUMS, checksums)
    if key:
        write_json_synced(folder / SIGNATURE, signature_record(key, (folder / CHECKSUMS).read_bytes()))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# listing


@dataclass
class CheckpointEntry:
    path: Path
    kind: str  # "full", "model_only", "incomplete"
    step: int | None


def checkpoints_root(path: Path) -> Path:
    """A run directory's checkpoints/ folder, or the path itself."""
    path = Path(path)
    return path / "checkpoints" if (path / "checkpoints").is_dir() else path


def _latest(root: Path) -> tuple[str | None, str | None]:
    """(the checkpoint name `latest` holds, or None; what is wrong with it, or None)."""
    f = Path(root) / LATEST
    try:
        data = f.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{f} is unreadable ({exc.strerror or exc})"
    try:
        name = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, f"{f} is not text ({len(data)} bytes of binary data)"
    if not (FULL_RE.match(name) or MODEL_RE.match(name)):
        return None, f"{f} holds {name[:60]!r}, which is not a checkpoint name"
    if not (Path(root) / name).is_dir():
        return name, f"{f} names {name}, which no longer exists"
    return name, None


def read_latest(root: Path) -> str | None:
    """The checkpoint name `latest` holds; None when it is missing or holds no checkpoint name."""
    return _latest(root)[0]


def latest_problem(root: Path) -> str | None:
    """What is wrong with `latest` (binary, not a checkpoint name, names a missing folder), or None."""
    return _latest(root)[1]


def list_checkpoints(root: Path) -> list[CheckpointEntry]:
    """Every checkpoint-like folder under root, oldest step first (incomplete saves included)."""
    root = checkpoints_root(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if not p.is_dir():
            continue
        name = p.name.removeprefix(TMP_PREFIX)
        m_full, m_model = FULL_RE.match(name), MODEL_RE.match(name)
        if not (m_full or m_model):
            continue
        step = int((m_full or m_model).group(1))
        kind = "incomplete" if p.name.startswith(TMP_PREFIX) else ("full" if m_full else "model_only")
        out.append(CheckpointEntry(p, kind, step))
    return sorted(out, key=lambda e: (e.step, e.kind != "incomplete", e.kind))


def read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads((Path(path) / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None
