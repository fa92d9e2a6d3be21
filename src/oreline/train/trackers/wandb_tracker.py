"""Weights & Biases: offline by default (runs saved in <run>/wandb/ for `wandb sync`), online
with credentials.

`train.wandb.mode = "auto"` is online when WANDB_API_KEY is set (and WANDB_MODE is not offline),
offline otherwise; oreline never asks for a login. An online run is continued after a restart with
its id and `resume="allow"`. An offline run cannot be continued (wandb issue #2423): the resumed
training is a new offline run in the same group (the first run's id unless train.wandb.group
says otherwise), named `<name>-resume-<k>`, with `wandb_resumed_from` in its config; the steps up to
the checkpoint are sent to it again from metrics.jsonl, so the last offline run of a group holds
every step 1..N. WANDB_SILENT is set unless the user set it, and W&B does not capture the
console (oreline's own output stays clean).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

_ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"


def resolve_mode(configured: str) -> str:
    if configured != "auto":
        return configured
    online = os.environ.get("WANDB_API_KEY") and os.environ.get("WANDB_MODE", "") not in (
        "offline",
        "dryrun",
        "disabled",
    )
    return "online" if online else "offline"


def destination(run_root: Path, cfg: Any) -> str:
    """Where the run goes, in words: the folder of an offline run, the server of an online one.

    The server is never the config's to choose (there is no config key for it): WANDB_BASE_URL,
    else what `wandb login --host` saved, else W&B's cloud."""
    where = f"project {cfg.project!r}" + (f", entity {cfg.entity!r}" if cfg.entity else "")
    if resolve_mode(cfg.mode) == "offline":
        return f"offline, files in {Path(run_root) / 'wandb'} ({where}; `wandb sync` uploads them)"
    server = os.environ.get("WANDB_BASE_URL")
    server = (
        f"{server} (WANDB_BASE_URL)"
        if server
        else "W&B's login host (https://api.wandb.ai unless `wandb login --host` chose another)"
    )
    return f"online, {server}, {where}"


def new_id() -> str:
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))  # W&B's own id alphabet and length


class WandbTracker:
    name = "wandb"
    backfills = False  # W&B drops a step below the highest its run holds

    def __init__(self, run_root: Path, cfg: Any, saved: dict[str, Any]):
        self.run_root = Path(run_root)
        self.cfg = cfg
        self.mode = resolve_mode(cfg.mode)
        self.first_id = saved.get("first_id") or saved.get("id")
        self.name_ = saved.get("name") or self.run_root.name
        self.resumes = int(saved.get("resumes", 0))
        self.resume: str | None = None
        self.extra: dict[str, Any] = {}
        if saved.get("id") and self.mode == "online" and saved.get("mode") == "online":
            self.id = saved["id"]  # the same online run, continued
            self.resume = "allow"
        else:
            self.id = new_id()
            if saved.get("id"):  # offline cannot continue a run: a new one in the same group
                self.resumes += 1
                self.extra = {"wandb_resumed_from": self.first_id, "resume_index": self.resumes}
        self.first_id = self.first_id or self.id
        self.group = cfg.group or saved.get("group") or self.first_id
        self.run: Any = None

    def open(self) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        from oreline.io import real_folder

        # W&B writes <run>/wandb/ itself (with links of its own inside it): the folder must be a real one
        real_folder(Path(self.run_root) / "wandb")
        name = self.name_ if self.resume or not self.extra else f"{self.name_}-resume-{self.resumes}"
        self.run = wandb.init(
            project=self.cfg.project,
            entity=self.cfg.entity,
            group=self.group,
            name=name,
            id=self.id,
            resume=self.resume,
            dir=str(self.run_root),
            mode=self.mode,
            config=self.extra or None,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
            reinit="create_new",
        )

    def held_step(self) -> tuple[int, set[str]] | None:
        return None  # W&B itself ignores steps below a resumed online run's last one

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_text(self, key: str, text: str, step: int) -> None:
        return None  # events are metrics (events/<kind>); generations stay in metrics.jsonl

    def log_summary(self, values: dict[str, Any], step: int) -> None:
        self.run.summary.update(values)

    def finish(self) -> None:
        self.run.finish()

    def state(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "first_id": self.first_id,
            "group": self.group,
            "name": self.name_,
            "mode": self.mode,
            "resumes": self.resumes,
        }
