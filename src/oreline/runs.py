"""The run directory: where every artifact of a run lives, and what produced what.

runs/NAME/
  config.toml  fingerprint.json  lineage.json
  data/  tokenizer/  tokens/  checkpoints/  metrics.jsonl  tensorboard/  eval/  export/  report.html

`lineage.json` records, per stage, the fingerprints of the stage's inputs and settings and of
what it produced; `oreline run` uses it to skip stages whose inputs and settings are unchanged.

A run folder is oreline's like an --out folder (`oreline.outdir.claim_folder`, kind "run"):
`oreline run` and `oreline train` claim it before writing anything, so `run.name=NAME` naming a
folder of the user's files is refused instead of overwriting its config.toml or deleting its
extra/. A folder an oreline version before markers wrote is recognised by its own
fingerprint.json, or by holding nothing but stage folders (data/, tokenizer/, tokens/,
checkpoints/), each of which its own command guards and none of which a run deletes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oreline.config import Config
from oreline.errors import OrelineError
from oreline.io import write_json_atomic

# every top-level name `oreline run` / `oreline train` write in a run folder (where a planted link is
# refused). Not wandb/: W&B writes it itself, with links of its own (latest-run, debug logs), and
# oreline writes nothing through it.
RUN_NAMES = re.compile(
    r"config\.toml|fingerprint\.json|lineage\.json|data|extra|tokenizer|tokens|checkpoints|metrics\.jsonl|"
    r"tensorboard|mlflow|trackers\.json|eval|export|report\.html|previous|jobs|debug|\.oreline-owner|\.oreline-lock.*"
)
_STAGE_FOLDERS = {"data", "tokenizer", "tokens", "checkpoints"}
_HEX = re.compile(r"[0-9a-f]{16,}")


def is_legacy_run(folder: Path) -> bool:
    """A run folder written before `.oreline-owner` existed: its fingerprint.json is the one
    `oreline run` (section "run") or `oreline train` (the four fingerprints) writes, or it holds only
    stage folders (what `oreline tokenize --out runs/NAME/tokens` and the like leave)."""
    try:
        fp = json.loads((folder / "fingerprint.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        fp = None
    if isinstance(fp, dict) and (
        fp.get("section") == "run"
        or all(
            isinstance(fp.get(k), str) and _HEX.fullmatch(fp[k])
            for k in ("config", "tokenizer", "data", "train")
        )
    ):
        return True
    entries = [p for p in folder.iterdir() if not p.name.startswith(".oreline-lock")]
    return bool(entries) and all(
        p.name in _STAGE_FOLDERS and p.is_dir() and not p.is_symlink() for p in entries
    )


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def for_config(cls, cfg: Config) -> RunDir:
        """runs_dir/name; a name that would leave runs_dir (absolute, `..`) is refused."""
        from oreline.errors import ConfigError
        from oreline.outdir import safe_child

        try:
            return cls(safe_child(Path(cfg.run.runs_dir), cfg.run.name, "run.name"))
        except OrelineError as exc:
            raise ConfigError(
                f"run.name={cfg.run.name!r} does not name a folder inside run.runs_dir={cfg.run.runs_dir!r}",
                "use a plain name such as run.name=my-run (set run.runs_dir to choose where runs go)",
            ) from exc

    def claim(self, command: str) -> RunDir:
        """Make the run folder oreline's (creating it) before anything is written in it; a folder of
        the user's files, of another oreline kind, or holding planted links is refused."""
        from oreline.outdir import claim_folder

        claim_folder(
            self.root,
            "run",
            command,
            reserved=RUN_NAMES.fullmatch,
            legacy=is_legacy_run,
            choose="choose another run.name (or run.runs_dir): a run folder holds only what oreline writes",
        )
        return self

    def remove_if_only_marker(self) -> None:
        """Undo the claim of a folder this command created when it failed before writing anything
        but the ownership marker (a refused start: a config or input error), so that no empty
        folder holding `.oreline-owner` alone stays behind. Anything else in it keeps it."""
        from oreline.outdir import OWNER

        try:
            if {p.name for p in self.root.iterdir()} != {OWNER} or self.root.is_symlink():
                return
            (self.root / OWNER).unlink()
            self.root.rmdir()
        except OSError:  # (a read-only folder, a file appearing meanwhile: it stays as it is)
            pass

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def lineage_path(self) -> Path:
        return self.root / "lineage.json"

    def lineage(self) -> dict[str, Any]:
        if self.lineage_path.is_file():
            return json.loads(self.lineage_path.read_text())
        return {}

    def record_stage(self, stage: str, record: dict[str, Any]) -> None:
        lineage = self.lineage()
        lineage[stage] = record
        write_json_atomic(self.lineage_path, lineage)
