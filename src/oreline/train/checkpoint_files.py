"""The on-disk checkpoint format: names, checksums, listing, verification, finding the one to resume.

A checkpoint is a folder (`step-00000200/` full, `model-step-00000100/` model-only; `.tmp-…` while
being written) holding `meta.json` and a `checksums.json` that lists every file's size and
xxh3-128 hash plus a hash of itself. `verify_checkpoint` re-reads every byte: a missing file, a
truncated one, a flipped byte or a temporary folder makes it invalid, and `find_resumable` passes
over invalid ones to the previous valid checkpoint, saying why. See `oreline.train.checkpoint` for
how checkpoints are written and loaded.

xxh3-128 (xxhash, ~11 GB/s here) rather than sha256 (~1.1 GB/s here): with the disk writing
~400 MB/s, sha256 alone would cost a quarter of the save bandwidth. It detects corruption
(truncation, flipped bytes), not tampering: anyone can recompute it. With `ORELINE_CHECKPOINT_KEY`
set, the manifest is written with sha256 and signed (HMAC-SHA256, `checkpoint_signature`), and
unsigned or mis-signed checkpoints are refused.

Verification also reads the DCP index `.metadata` of a full checkpoint, through the allow-listed
unpickler of `checkpoint_metadata` (never `pickle.load`), and checks that it describes only tensors
in files the manifest covers, each within its file: a `.metadata` that would run code, a pickled
(non-tensor) item, or a data file replaced by a shorter one of another format make the checkpoint
invalid before anything loads it, with the file named.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from oreline.errors import CheckpointError
from oreline.train.checkpoint_signature import (
    CRYPTOGRAPHIC,
    KEY_ENV,
    SIGNATURE,
    SIGNED_ALGO,
    key_id,
    signature_problem,
    signature_record,
    signing_key,
)

log = logging.getLogger("oreline.checkpoint")

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
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_json_synced(path: Path, obj: Any) -> None:
    write_file_synced(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


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


def _self_hash(checksums: dict) -> str:
    body = {k: v for k, v in checksums.items() if k != "self"}
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True).encode()).hexdigest()


def manifest_algo() -> str:
    """The per-file hash of a manifest written now: sha256 when checkpoints are signed, else xxh3-128."""
    return SIGNED_ALGO if signing_key() else HASH_ALGO


def write_checksums(folder: Path, known: dict[str, dict] | None = None) -> None:
    """checksums.json for every file in folder, and signature.json when ORELINE_CHECKPOINT_KEY is set.

    `known` holds {"bytes", "hash"[, "algo"]} entries (no "algo": xxh3-128) computed while a file
    was written (checkpoint_storage.RawTensorWriter); one is used only when its size matches the
    file on disk and its algorithm is the manifest's, every other file is read and hashed here."""
    known = known or {}
    key = signing_key()
    algo = manifest_algo()
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name not in (CHECKSUMS, SIGNATURE):
            rel = p.relative_to(folder).as_posix()
            size = p.stat().st_size
            entry = known.get(rel)
            if entry and entry["bytes"] == size and entry.get("algo", HASH_ALGO) == algo:
                files[rel] = {"bytes": size, "hash": entry["hash"]}
            else:
                files[rel] = {"bytes": size, "hash": file_digest(p, algo)}
    checksums = {"algo": algo, "files": files}
    checksums["self"] = _self_hash(checksums)
    write_json_synced(folder / CHECKSUMS, checksums)
    if key:
        write_json_synced(folder / SIGNATURE, signature_record(key, (folder / CHECKSUMS).read_bytes()))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# finding and verifying


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


def verify_checkpoint(path: Path, check_signature: bool = True) -> tuple[bool, list[str]]:
    """Check completeness and checksums of one checkpoint folder. Returns (ok, problems).

    With ORELINE_CHECKPOINT_KEY set (and `check_signature`), its signature is checked first."""
    path = Path(path)
    problems: list[str] = []
    if not path.is_dir():
        return False, [f"{path} is not a directory"]
    if path.name.startswith(TMP_PREFIX):
        problems.append("incomplete save (temporary folder: the save was interrupted)")
    try:
        manifest = (path / CHECKSUMS).read_bytes()
        checksums = json.loads(manifest)
    except FileNotFoundError:
        return False, problems + [f"{CHECKSUMS} is missing"]
    except (OSError, ValueError) as exc:
        return False, problems + [f"{CHECKSUMS} is unreadable ({exc})"]
    if not isinstance(checksums, dict) or checksums.get("self") != _self_hash(checksums):
        return False, problems + [f"{CHECKSUMS} is corrupted (its own hash does not match)"]
    algo = checksums.get("algo", HASH_ALGO)
    files = checksums.get("files", {})
    shape = _manifest_problem(algo, files)
    if shape:
        return False, problems + [f"{CHECKSUMS} {shape}"]
    key = signing_key() if check_signature else None
    if key:  # before anything else of the folder is read: a forged checkpoint is not parsed at all
        bad_signature = signature_problem(path, key, manifest, algo)
        if bad_signature:
            return False, problems + [bad_signature]
    for rel, want in sorted(files.items()):
        f = path / rel
        if not f.is_file():
            problems.append(f"{rel} is missing")
            continue
        size = f.stat().st_size
        if size != want["bytes"]:
            problems.append(f"{rel} has {size} bytes, expected {want['bytes']} (truncated or overwritten)")
        elif file_digest(f, algo) != want["hash"]:
            problems.append(f"{rel} checksum mismatch (corrupted)")
    if META not in files:
        problems.append(f"{META} is not covered by {CHECKSUMS}")
    else:
        meta = read_meta(path)
        if meta is None:
            problems.append(f"{META} is unreadable (not a JSON object)")
        elif meta.get("kind") == "full" and ".metadata" not in files:
            problems.append("DCP .metadata is missing from the checkpoint")
        elif meta.get("kind") == "model_only" and "model.safetensors" not in files:
            problems.append("model.safetensors is missing from the snapshot")
        elif meta.get("kind") == "full" and not problems:
            problems += _dcp_problems(path, files)
    for extra in [*path.glob("*.distcp"), *path.glob("rng-rank*.json")]:
        if extra.name not in files:
            problems.append(f"{extra.name} is not covered by {CHECKSUMS} (stray file)")
    return not problems, problems


def _manifest_problem(algo: object, files: object) -> str | None:
    """None when checksums.json's algorithm and file table have the shape write_checksums writes."""
    if algo not in KNOWN_ALGOS:
        return f"names an unknown hash algorithm {str(algo)[:40]!r}"
    if not isinstance(files, dict):
        return "has no file table"
    for rel, want in files.items():
        if (
            not isinstance(rel, str)
            or rel.startswith("/")
            or any(p in ("", ".", "..") for p in rel.split("/"))
        ):
            return f"lists {str(rel)[:80]!r}, which is not a path inside the checkpoint"
        if not (
            isinstance(want, dict) and type(want.get("bytes")) is int and isinstance(want.get("hash"), str)
        ):
            return f"has an invalid entry for {rel}"
    return None


def _dcp_problems(path: Path, files: dict) -> list[str]:
    """What makes a full checkpoint's DCP index unloadable: a `.metadata` the allow-listed unpickler
    refuses, pickled (non-tensor) items, data files the manifest does not cover, items that lie
    outside their file or whose byte count does not fit their shape."""
    import torch

    from oreline.train.checkpoint_metadata import RAW_DESCRIPTOR, byte_items, read_dcp_metadata

    try:
        md = read_dcp_metadata(path)
    except CheckpointError as exc:
        return [exc.message]
    stored_in = {index.fqn: info.relative_path for index, info in md.storage_data.items()}
    out = [
        f".metadata declares {key} as a pickled (non-tensor) item in {stored_in.get(key, 'no file')}: oreline "
        "checkpoints hold only tensors and never unpickle"
        for key in byte_items(md)[:3]
    ]
    extent: dict[str, int] = {}
    for index, info in md.storage_data.items():
        extent[info.relative_path] = max(extent.get(info.relative_path, 0), info.offset + info.length)
        item = md.state_dict_metadata[index.fqn]
        if RAW_DESCRIPTOR in (getattr(info, "transform_descriptors", None) or ()) and hasattr(item, "chunks"):
            chunk = next((c for c in item.chunks if tuple(c.offsets) == tuple(index.offset or ())), None)
            want = None if chunk is None else torch.Size(chunk.sizes).numel() * item.properties.dtype.itemsize
            if want != info.length:
                out.append(
                    f".metadata: {index.fqn} in {info.relative_path} has {info.length} bytes, its shape "
                    f"needs {want}"
                )
    for rel, end in sorted(extent.items()):
        if rel not in files:
            out.append(f".metadata names data file {rel}, which {CHECKSUMS} does not cover")
        elif files[rel]["bytes"] < end:
            out.append(
                f"{rel} has {files[rel]['bytes']} bytes, but .metadata places tensors up to byte {end} "
                "(replaced by a file of another format, or truncated)"
            )
    return out


def sign_checkpoint(path: Path) -> None:
    """Sign a checkpoint written without the key: it must verify intact first (sizes, hashes, a safe
    index); then the manifest is rewritten with sha256 and signed. Signing vouches for the bytes as
    they are now, so sign only checkpoints whose origin you trust."""
    path = Path(path)
    if not signing_key():
        raise CheckpointError(
            f"cannot sign {path}: {KEY_ENV} is not set", f"export {KEY_ENV}=<your secret key>"
        )
    ok, problems = verify_checkpoint(path, check_signature=False)
    if not ok:
        raise CheckpointError(
            f"{path} is invalid, not signing it: {'; '.join(problems)}",
            "sign only intact checkpoints (oreline checkpoint verify)",
        )
    write_checksums(path)
    forget_verified()


def read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads((Path(path) / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


_VERIFIED: set[tuple[str, int, int, str]] = set()


def forget_verified() -> None:
    """Make the next load verify again (benchmarks; files changed behind this process's back)."""
    _VERIFIED.clear()


def ensure_verified(path: Path) -> None:
    """Verify once per process (a resume verifies in find_resumable, then loads)."""
    try:
        st = (path / CHECKSUMS).stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size, key_id(signing_key()))
    except OSError:
        key = None
    if key is not None and key in _VERIFIED:
        return
    ok, problems = verify_checkpoint(path)
    if not ok:
        raise CheckpointError(
            f"checkpoint {path} is invalid: {'; '.join(problems)}",
            "resume from an older one (--resume auto skips invalid ones) or --resume none",
        )
    if key is not None:
        _VERIFIED.add(key)


def find_resumable(ckpt_root: Path, console=None, skipped: list | None = None) -> Path | None:
    """Newest valid full checkpoint under ckpt_root (or a run dir). Invalid ones are reported and skipped.

    `skipped`, if given, receives (path, problems) for every checkpoint passed over.
    """
    entries = [e for e in list_checkpoints(ckpt_root) if e.kind in ("full", "incomplete")]
    note = latest_problem(checkpoints_root(ckpt_root))
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
            ok, problems = verify_checkpoint(e.path)
            if ok:
                newest_ok = e.path
                st = (e.path / CHECKSUMS).stat()
                _VERIFIED.add((str(e.path.resolve()), st.st_mtime_ns, st.st_size, key_id(signing_key())))
                break
        msg = f"skipping checkpoint {e.path.name}: {'; '.join(problems)}"
        if console is not None:
            console.print(f"[yellow]{msg}[/]")
        else:
            log.warning(msg)
        if skipped is not None:
            skipped.append((e.path, problems))
    return newest_ok


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder itself, or a run / checkpoints folder → its latest valid checkpoint."""
    path = Path(path)
    if (path / META).is_file() or (path / CHECKSUMS).is_file():
        return path
    root = checkpoints_root(path)
    latest = read_latest(root)  # (when it names nothing valid, find_resumable below says so)
    if latest and verify_checkpoint(root / latest)[0]:
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
