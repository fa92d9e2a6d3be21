"""The run directory: where every artifact of a run lives, and what produced what.

runs/NAME/
  config.toml  fingerprint.json  lineage.json
  data/  tokenizer/  tokens/  checkpoints/  metrics.jsonl  tensorboard/  eval/  export/  report.html

`lineage.json` records, per stage, the fingerprints of the stage's inputs and settings and of
what it produced; `oreline run` uses it to skip stages whose inputs and settings are unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oreline.config import Config
from oreline.errors import OrelineError
from oreline.io import write_json_atomic


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
