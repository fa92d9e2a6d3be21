"""What the run doctor and the report read from a run directory, loaded once and never trusted.

`load_run(run_dir) -> RunArtifacts`: config.toml (raw TOML; a missing key falls back to oreline's
Config default), metrics.jsonl split by record type (lines that are not JSON objects are kept as
(line number, error) instead of failing), data/stats.json, tokenizer_stats.json, the token
manifest, fingerprint.json and lineage.json. An absent or unreadable file is None plus a reason,
never an exception: the doctor and the report turn the reason into "not checked" / "not
available" text.

Token shards are read only through oreline.tokens.shards (one reader of the format);
checkpoints are verified through oreline.train.checkpoint.verify.verify_checkpoint (the full
checksum check), with a basic completeness check when that module is absent.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oreline.config import expand
from oreline.errors import DataIntegrityError, OrelineError
from oreline.io import open_regular

EOS_TOKEN = "</s>"
CHECKPOINT_RE = re.compile(r"^(model-)?step-(\d+)$")


class NotAvailable(Exception):
    """A check cannot run because the artifact it reads is absent; the message says which."""


# ---------------------------------------------------------------------------------------------
# loading


# Integers longer than this are refused while parsing, so what the doctor and the report accept does
# not depend on the process-wide sys.set_int_max_str_digits limit (4300 by default; 0 lifts it,
# and then a 5,000-digit integer parses and overflows later in float()). 100 digits is ~10^100,
# beyond any step, token or byte count, and below float's 10^308.
MAX_INT_DIGITS = 100


_LONG_DIGITS = re.compile(rf"\d{{{MAX_INT_DIGITS + 1}}}")


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(digits.lstrip('-')):,} digits (more than {MAX_INT_DIGITS})")
    return int(digits)


def parse_json(text: str) -> Any:
    """json.loads for untrusted text: ValueError (never RecursionError) for anything that is not sane JSON.

    Python's json raises RecursionError on deeply nested input (a line of 100k "[") and
    ValueError on integers past the digit limit; both become ValueError with the reason.
    """
    try:
        if _LONG_DIGITS.search(text) is None:  # the common case, at C speed (the hook doubles the time)
            return json.loads(text)  # NaN / Infinity are accepted, as json.dumps writes them
        return json.loads(text, parse_int=_parse_int)  # a long digit run: a long integer, or one in a string
    except RecursionError:
        raise ValueError(
            "nested too deeply (more levels of arrays/objects than Python's json can parse)"
        ) from None


def read_json(path: Path) -> tuple[Any, str | None]:
    """(object, None) or (None, why it could not be read)."""
    if not path.is_file():
        return None, f"{path.name} absent"
    try:
        return parse_json(path.read_text(encoding="utf-8")), None
    except (
        OSError,
        ValueError,
    ) as exc:  # ValueError: UnicodeDecodeError, JSONDecodeError and parse_json's own
        return None, f"{path} unreadable ({exc})"


# Longest metrics.jsonl line read (a record is a few KB; the start record, with the whole config,
# tens of KB). A longer line is a bad line, skipped a window at a time: a 1 GB line took 2.5 GB.
MAX_METRICS_LINE_BYTES = 4 << 20


def read_metrics(path: Path) -> tuple[dict[str, list[dict]], list[tuple[int, str]]]:
    """metrics.jsonl → records by type, plus (line number, error) for lines that are not objects or
    are longer than MAX_METRICS_LINE_BYTES. Only a regular file is read (a FIFO would block)."""
    by_type: dict[str, list[dict]] = {}
    bad: list[tuple[int, str]] = []
    if not path.is_file():
        return by_type, bad
    try:
        fh = open_regular(path)
    except (OSError, OrelineError) as exc:
        return by_type, [(0, f"unreadable ({exc})")]
    with fh:
        for lineno, line in enumerate(_bounded_lines(fh, MAX_METRICS_LINE_BYTES), 1):
            if line is None:
                bad.append((lineno, f"longer than {MAX_METRICS_LINE_BYTES:,} bytes"))
                continue
            if not line.strip():
                continue
            try:
                rec = parse_json(line)
            except ValueError as exc:
                bad.append((lineno, str(exc)))
                continue
            if not isinstance(rec, dict):
                bad.append((lineno, f"not an object: {type(rec).__name__}"))
                continue
            by_type.setdefault(str(rec.get("type", "unknown")), []).append(rec)
    return by_type, bad


def _bounded_lines(fh, limit: int):
    """Lines of a binary file as text (UTF-8, bad bytes replaced), None for a line over `limit`
    bytes, which is skipped without being held."""
    while raw := fh.readline(limit + 1):
        if len(raw) > limit:
            while not raw.endswith(b"\n") and (raw := fh.readline(1 << 20)):
                pass
            yield None
            continue
        yield raw.decode("utf-8", "replace")


@dataclass
class RunArtifacts:
    """Everything the doctor and the report read from a run directory, loaded once."""

    root: Path
    config: dict = field(default_factory=dict)
    config_problem: str | None = None
    metrics: dict[str, list[dict]] = field(default_factory=dict)
    metrics_bad_lines: list[tuple[int, str]] = field(default_factory=list)
    data_stats: dict | None = None
    tokenizer_stats: dict | None = None
    manifest: dict | None = None
    fingerprint: dict | None = None
    lineage: dict | None = None
    hash_checkpoints: bool = True  # the doctor hashes every checkpoint file; the report checks sizes only

    def records(self, kind: str) -> list[dict]:
        return self.metrics.get(kind, [])

    @property
    def start(self) -> dict:
        starts = self.records("start")
        return starts[-1] if starts else {}

    def start_dict(self, key: str) -> dict:
        """A dict-valued field of the start record ({} when absent or of the wrong type)."""
        value = self.start.get(key)
        return value if isinstance(value, dict) else {}

    def start_list(self, key: str) -> list:
        value = self.start.get(key)
        return value if isinstance(value, list) else []

    def cfg(self, dotted: str) -> Any:
        """A config value from config.toml, else the default of oreline's Config model."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return _config_default(dotted)
            node = node[part]
        return node

    @property
    def tokenizer_dir(self) -> Path:
        configured = (
            self.config.get("train", {}).get("tokenizer")
            if isinstance(self.config.get("train"), dict)
            else None
        )
        return Path(expand(configured)) if configured else self.root / "tokenizer"

    @property
    def tokens_dir(self) -> Path:
        configured = (
            self.config.get("train", {}).get("tokens") if isinstance(self.config.get("train"), dict) else None
        )
        return Path(expand(configured)) if configured else self.root / "tokens"

    def checkpoint_dirs(self) -> list[Path]:
        """Complete checkpoints, full (step-N) and model-only (model-step-N), oldest step first;
        `.tmp-` folders of interrupted saves are not checkpoints (resume never offers them)."""
        ckpts = self.root / "checkpoints"
        if not ckpts.is_dir():
            return []
        found = [p for p in ckpts.iterdir() if p.is_dir() and CHECKPOINT_RE.match(p.name)]
        return sorted(found, key=lambda p: (int(CHECKPOINT_RE.match(p.name).group(2)), p.name))


def _config_default(dotted: str) -> Any:
    from oreline.config import Config, to_dict

    node: Any = to_dict(Config())
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def load_run(run_dir: str | Path) -> RunArtifacts:
    root = Path(run_dir)
    run = RunArtifacts(root=root)
    cfg_path = root / "config.toml"
    if cfg_path.is_file():
        try:
            run.config = tomllib.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            run.config_problem = f"config.toml unreadable ({exc})"
        except RecursionError:
            run.config_problem = "config.toml unreadable (nested too deeply to parse)"
    else:
        run.config_problem = "config.toml absent"
    run.metrics, run.metrics_bad_lines = read_metrics(root / "metrics.jsonl")
    run.data_stats, _ = read_json(root / "data" / "stats.json")
    run.tokenizer_stats, _ = read_json(run.tokenizer_dir / "tokenizer_stats.json")
    run.manifest, _ = read_json(run.tokens_dir / "manifest.json")
    run.fingerprint, _ = read_json(root / "fingerprint.json")
    run.lineage, _ = read_json(root / "lineage.json")
    return run


# ---------------------------------------------------------------------------------------------
# small helpers


def is_finite(value: Any) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range (records built elsewhere than parse_json)
        return False


def step_of(record: dict, default: int = -1) -> int:
    """A record's step; a missing or malformed one is `default` (evidence still prints)."""
    value = record.get("step")
    return int(value) if is_finite(value) else default


def series(records: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) for records that have a finite value under key (no step: the record's index)."""
    return [(step_of(r, i), float(r[key])) for i, r in enumerate(records) if is_finite(r.get(key))]


def same_fingerprint(a: str, b: str) -> bool:
    """Equal, or one is a prefix (≥ 8 hex digits) of the other: short forms are common in headers."""
    a, b = str(a).lower().removeprefix("sha256:"), str(b).lower().removeprefix("sha256:")
    n = min(len(a), len(b))
    return n >= 8 and a[:n] == b[:n]


def tokenizer_fingerprint(tokenizer_json: Path) -> str:
    """The tokens layer's fingerprint: sha256 of the canonical tokenizer.json."""
    from oreline.tokens.train_bpe import canonical_fingerprint

    return canonical_fingerprint(tokenizer_json.read_text(encoding="utf-8"))


def eos_id(run: RunArtifacts) -> int:
    """EOS as the tokenizer defines it; the manifest's eos_id only as a last resort, since a wrong
    id there is exactly the bug this check looks for."""
    specials = (run.tokenizer_stats or {}).get("special_tokens") or {}
    if EOS_TOKEN in specials:
        return int(specials[EOS_TOKEN])
    tok, _ = read_json(run.tokenizer_dir / "tokenizer.json")
    for added in (tok or {}).get("added_tokens", []) if isinstance(tok, dict) else []:
        if added.get("content") == EOS_TOKEN:
            return int(added["id"])
    if is_finite((run.manifest or {}).get("eos_id")):
        return int(run.manifest["eos_id"])
    raise NotAvailable(f"no {EOS_TOKEN} token in {run.tokenizer_dir} and no eos_id in the manifest")


def shard_paths(run: RunArtifacts) -> list[tuple[str, Path]]:
    """Manifest shard names as paths; a name that leaves the token folder is never opened."""
    from oreline.outdir import safe_child

    out = []
    for s in (run.manifest or {}).get("shards") or []:
        try:
            out.append((str(s.get("name")), safe_child(run.tokens_dir, s.get("name"), "manifest.json")))
        except DataIntegrityError:
            continue
    return out


def shard_header_fingerprints(run: RunArtifacts) -> list[tuple[str, str]]:
    shards = shards_module()
    out = []
    for name, path in shard_paths(run):
        try:
            out.append((name, shards.read_header(path).fingerprint))
        except (OSError, ValueError, DataIntegrityError):
            continue  # an unreadable shard is eos_missing's evidence
    return out


def shards_module():
    """The tokens layer's shard reader (never a second parser of the format)."""
    try:
        from oreline.tokens import shards
    except ImportError as exc:
        raise NotAvailable(f"oreline.tokens.shards is not importable ({exc})") from None
    return shards


def document_ends(shard) -> Any:
    """The last token of each document, from the shard's memory-mapped document index."""
    import numpy as np

    offsets = np.asarray(shard.offsets, dtype=np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    nonempty = ends > starts
    last = np.full(len(starts), -1, dtype=np.int64)  # an empty document has no EOS either
    last[nonempty] = np.asarray(shard.tokens)[ends[nonempty] - 1]
    return last


def latest_target(latest: Path) -> Path | None:
    if latest.is_symlink():
        return latest.parent / latest.readlink()
    if latest.is_file():
        name = latest.read_text(encoding="utf-8", errors="replace").strip()
        return latest.parent / name if name else None
    return latest if latest.is_dir() else None


def quick_verify_checkpoint(ckpt: Path) -> tuple[bool, list[str]]:
    """Completeness without hashing: meta.json readable, every file checksums.json lists present with
    its recorded size. Milliseconds for any model size (the report uses it; the doctor hashes)."""
    meta, problem = read_json(ckpt / "meta.json")
    if not isinstance(meta, dict):
        return False, [problem or "meta.json is not an object"]
    sums, problem = read_json(ckpt / "checksums.json")
    if not isinstance(sums, dict):
        return False, [problem or "checksums.json is not an object"]
    files = sums.get("files") or {}
    bad = [
        rel
        for rel, want in files.items()
        if not (ckpt / rel).is_file() or (ckpt / rel).stat().st_size != (want or {}).get("bytes")
    ]
    return (False, [f"missing or resized: {', '.join(bad[:3])}"]) if bad else (True, [])


def verify_checkpoint_dir(ckpt: Path, hash_files: bool = True) -> tuple[bool, list[str]]:
    """oreline.train.checkpoint.verify.verify_checkpoint (every file hashed) when it exists, else a basic
    completeness check; hash_files=False: the size-only `quick_verify_checkpoint`."""
    if not hash_files and (ckpt / "checksums.json").exists():
        return quick_verify_checkpoint(ckpt)
    try:  # the verifier imports torch only to check a full checkpoint's DCP index
        from oreline.train.checkpoint.verify import verify_checkpoint
    except ImportError:
        verify_checkpoint = None
    if verify_checkpoint is not None:
        try:
            ok, problems = verify_checkpoint(ckpt)
            return bool(ok), [str(p) for p in problems]
        except Exception as exc:  # a verifier that crashes on a file is that file's problem
            return False, [f"verify_checkpoint raised {type(exc).__name__}: {exc}"]
    meta, problem = read_json(ckpt / "meta.json")
    if meta is None:
        return False, [problem or "meta.json unreadable"]
    if not isinstance(meta, dict) or "step" not in meta:
        return False, ["meta.json has no step"]
    listed = meta.get("checksums") or meta.get("files") or {}
    names = list(listed) if isinstance(listed, dict) else [str(x) for x in listed]
    missing = [n for n in names if not (ckpt / n).is_file()]
    if missing:
        return False, [f"missing files listed in meta.json: {', '.join(missing[:5])}"]
    return True, []
