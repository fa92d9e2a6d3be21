"""TensorBoard (the default tracker): event files in <run>/tensorboard/.

On resume `purge_step` (the checkpoint's step + 1) makes TensorBoard hide the events at or after
it that the killed process wrote, so the plots read as one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TensorBoardTracker:
    name = "tensorboard"
    backfills = True  # an event at a lower step is added to its curve

    def __init__(self, folder: Path, purge_step: int | None = None):
        self.folder = Path(folder)
        self.purge_step = purge_step
        self.writer: Any = None

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        from oreline.io import real_folder

        real_folder(self.folder)  # the writer follows links: a planted tensorboard/ link is refused first
        self.writer = SummaryWriter(str(self.folder), purge_step=self.purge_step)

    def held_step(self) -> tuple[int, set[str]] | None:
        # its files hold every step up to the checkpoint's; purge_step hides what came after
        return (self.purge_step - 1, {"train", "eval"}) if self.purge_step else None

    def log_params(self, params: dict[str, Any]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in params.items())
        self.writer.add_text("params", "| key | value |\n|---|---|\n" + rows, 0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_text(self, key: str, text: str, step: int) -> None:
        self.writer.add_text(key, text, step)

    def log_summary(self, values: dict[str, Any], step: int) -> None:
        for key, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
            else:
                self.writer.add_text(key, str(value), step)

    def finish(self) -> None:
        self.writer.flush()
        self.writer.close()

    def state(self) -> dict[str, Any]:
        return {"dir": str(self.folder)}
