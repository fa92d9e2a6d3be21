"""Optional keyed signatures of checkpoints: HMAC-SHA256 with a key from `ORELINE_CHECKPOINT_KEY`.

`checksums.json` (xxh3-128 of every file, and a hash of itself) detects corruption: a flipped byte,
a truncated or missing file. It cannot detect forgery: anyone who can write the folder can
recompute every entry. Users who share checkpoints, or load ones others can write to, set a secret
in `ORELINE_CHECKPOINT_KEY`:

- at save time the manifest is written with SHA-256 instead of xxh3-128 (an attacker who can find
  xxh3 collisions could swap a file under an unchanged manifest; SHA-256 is collision-resistant),
  and `signature.json` holds HMAC-SHA256(key, the bytes of checksums.json);
- at load and verify time a checkpoint without `signature.json`, with a MAC that does not match
  (compared with `hmac.compare_digest`), or with a non-cryptographic manifest is refused before
  any other file of it is read.

Without the key, nothing changes: checkpoints are not signed, signatures present are not checked.
`oreline checkpoint sign` signs checkpoints written before the key was set (intact ones only).
Costs, with the key set: SHA-256 instead of xxh3-128 while writing and verifying (measured on this
machine in docs/checkpoint-security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

KEY_ENV = "ORELINE_CHECKPOINT_KEY"
SIGNATURE = "signature.json"
SIGNED_ALGO = "sha256"  # the manifest's per-file hash when signing
CRYPTOGRAPHIC = {"sha256"}
MAC_ALGO = "hmac-sha256"


def signing_key() -> bytes | None:
    """The key from ORELINE_CHECKPOINT_KEY (UTF-8), or None when unset or empty."""
    key = os.environ.get(KEY_ENV, "")
    return key.encode("utf-8") if key else None


def key_id(key: bytes | None) -> str:
    """A short, non-secret name of a key (for caches and messages): not enough to recover it."""
    return hashlib.sha256(b"oreline-key-id:" + key).hexdigest()[:12] if key else "-"


def mac(key: bytes, manifest: bytes) -> str:
    return hmac.new(key, manifest, hashlib.sha256).hexdigest()


def signature_record(key: bytes, manifest: bytes) -> dict:
    """What signature.json holds for `manifest` (the bytes of checksums.json)."""
    return {"algo": MAC_ALGO, "signed": "checksums.json", "key_id": key_id(key), "mac": mac(key, manifest)}


def signature_problem(folder: Path, key: bytes, manifest: bytes, manifest_algo: str) -> str | None:
    """None when `manifest` (the bytes of checksums.json) carries a valid signature under `key`."""
    f = Path(folder) / SIGNATURE
    try:
        sig = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"not signed ({SIGNATURE} is missing) while {KEY_ENV} is set: unsigned checkpoints are refused"
    except (OSError, ValueError) as exc:
        return f"{SIGNATURE} is unreadable ({exc})"
    if not isinstance(sig, dict) or sig.get("algo") != MAC_ALGO or not isinstance(sig.get("mac"), str):
        return f"{SIGNATURE} is not an {MAC_ALGO} signature"
    if not hmac.compare_digest(sig["mac"].encode(), mac(key, manifest).encode()):
        return (
            f"{SIGNATURE} does not match checksums.json under the key in {KEY_ENV} "
            "(forged or modified, or signed with another key)"
        )
    if manifest_algo not in CRYPTOGRAPHIC:
        return f"checksums.json uses {manifest_algo}, which does not resist forgery; a signed manifest uses sha256"
    return None
