"""Verifying a checkpoint folder against its manifest, once per process; signing a verified one.

`verify_checkpoint` re-reads every byte: a missing file, a truncated one, a flipped byte, a stray
data file or a temporary folder make it invalid, with the problems named. With
`ORELINE_CHECKPOINT_KEY` set, the signature (`signature`) is checked first, before any other file
of the folder is read, and unsigned checkpoints are refused.

Verification also reads the DCP index `.metadata` of a full checkpoint, through the allow-listed
unpickler of `metadata` (never `pickle.load`), and checks that it describes only tensors in files
the manifest covers, each within its file: a `.metadata` that would run code, a pickled
(non-tensor) item, or a data file replaced by a shorter one of another format make the checkpoint
invalid before anything loads it, with the file named.

`verify_checkpoint` is verification on demand (`oreline checkpoint verify | ls | inspect | sign`).
Loading a full checkpoint does not hash it all first: `reading_check` verifies everything but the
bytes of the tensor data files, and each rank hashes the data files it reads as it reads them
(`raw_tensors.RawTensorReader`), so each byte is hashed once, by the rank that reads it, instead of
every rank reading the whole checkpoint before loading it. A checkpoint this process wrote
(its digests were computed while writing) or already read is trusted (`mark_verified`): a
rollback hashes no data file. The search for the checkpoint to resume (`resume.find_resumable`) checks
with `contents=False` too; a data file found corrupted while loading makes `--resume auto` fall
back to the next older checkpoint (`oreline.train.recovery`). Model-only snapshots are verified
whole (`ensure_verified`). Like `format`, this module imports torch only when a full checkpoint's
index is checked.
"""

from __future__ import annotations

import json
from pathlib import Path

from oreline.errors import CheckpointError
from oreline.train.checkpoint.format import (
    CHECKSUMS,
    HASH_ALGO,
    KNOWN_ALGOS,
    META,
    TMP_PREFIX,
    file_digest,
    read_meta,
    self_hash,
    write_checksums,
)
from oreline.train.checkpoint.signature import KEY_ENV, key_id, signature_problem, signing_key

DATA_SUFFIX = ".distcp"  # DCP's tensor data files: hashed by the reader as it reads them


def verify_checkpoint(
    path: Path, check_signature: bool = True, contents: bool = True
) -> tuple[bool, list[str]]:
    """Check completeness and checksums of one checkpoint folder. Returns (ok, problems).

    With ORELINE_CHECKPOINT_KEY set (and `check_signature`), its signature is checked first.
    `contents=False` checks everything but the bytes of the tensor data files (`*.distcp`): their
    presence and sizes, and every other file hashed (meta.json, RNG states, the DCP index); the
    ranks that load the checkpoint hash the data files as they read them (`reading_check`)."""
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
    if not isinstance(checksums, dict) or checksums.get("self") != self_hash(checksums):
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
        elif (contents or not rel.endswith(DATA_SUFFIX)) and file_digest(f, algo) != want["hash"]:
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

    from oreline.train.checkpoint.metadata import RAW_DESCRIPTOR, byte_items, read_dcp_metadata

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


_VERIFIED: set[tuple[str, int, int, str]] = set()  # (folder, manifest mtime and size, key id)


def _verified_key(path: Path) -> tuple[str, int, int, str] | None:
    try:
        st = (path / CHECKSUMS).stat()
    except OSError:
        return None
    return (str(path.resolve()), st.st_mtime_ns, st.st_size, key_id(signing_key()))


def mark_verified(path: Path) -> None:
    """Record that `path` is known intact in this process (this process wrote it, or read and
    verified it), so loading it again (a rollback) does not hash it again."""
    key = _verified_key(Path(path))
    if key is not None:
        _VERIFIED.add(key)


def forget_verified() -> None:
    """Make the next load verify again (benchmarks; files changed behind this process's back)."""
    _VERIFIED.clear()


def reading_check(path: Path) -> tuple[dict[str, dict], str] | None:
    """Before a full checkpoint is read: everything but its data files' bytes verified now
    (`verify_checkpoint(contents=False)`: manifest, signature, sizes, small files, the DCP index;
    cheap); returns (manifest entries, algorithm) the reader checks the data files it reads
    against, or None when this process wrote or read the checkpoint already (`mark_verified`).

    So a resume hashes each byte once, on the rank that reads it, in the same pass that reads it,
    instead of every rank hashing the whole checkpoint first, and a rollback hashes no data file."""
    path = Path(path)
    ok, problems = verify_checkpoint(path, contents=False)
    if not ok:
        raise CheckpointError(
            f"checkpoint {path} is invalid: {'; '.join(problems)}",
            "resume from an older one (--resume auto skips invalid ones) or --resume none",
        )
    key = _verified_key(path)
    if key is not None and key in _VERIFIED:
        return None
    checksums = json.loads((path / CHECKSUMS).read_bytes())
    return checksums["files"], checksums.get("algo", HASH_ALGO)


def ensure_verified(path: Path) -> None:
    """Verify once per process (a resume verifies in find_resumable, then loads)."""
    path = Path(path)
    key = _verified_key(path)
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
