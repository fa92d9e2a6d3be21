"""When a training step does something besides training: the one place that says what is due.

`Schedule(cfg).at(n, stop)` is step n's `Due`: a train record (`train.log_every`, the first and
the last step), a full checkpoint (`checkpoint.every` and the last step), a model-only checkpoint
(`checkpoint.model_only_every`, and the last step when no full ones are kept), validation
(`train.eval_every` and the last step), greedy generations (`train.generate_every`, or with
validation when it is 0) and a stop request (a host flag the loop ORs over ranks). `finished`
says when the loop ends.

Why one place: a step that is due for anything reads the device (oreline.train.loop: one
transfer settles every step since the last read), so the rules that decide *whether* a step
reads and the rules that decide *what* it then does must be the same rules; a resumed run asks
the same questions of the checkpoint's step to complete what a kill left undone.
"""

from __future__ import annotations

from dataclasses import dataclass

from oreline.config import Config


@dataclass(frozen=True)
class Due:
    """What step n does besides training."""

    log: bool = False
    full_checkpoint: bool = False
    model_only_checkpoint: bool = False
    eval: bool = False
    generate: bool = False
    stop: bool = False

    @property
    def why(self) -> list[str]:
        """Why the step reads the device (oreline.train.host_reads' words); empty: an ordinary step."""
        reasons = (
            ("log", self.log),
            ("checkpoint", self.full_checkpoint or self.model_only_checkpoint),
            ("eval", self.eval or self.generate),
            ("stop", self.stop),
        )
        return [why for why, due in reasons if due]


class Schedule:
    """Every "is it due at step n" rule of a training run (module docstring)."""

    def __init__(self, cfg: Config):
        tc, ckpt = cfg.train, cfg.checkpoint
        self.steps = tc.steps
        self.log_every, self.eval_every, self.generate_every = tc.log_every, tc.eval_every, tc.generate_every
        self.every, self.model_only_every = ckpt.every, ckpt.model_only_every
        self.has_tasks, self.tasks_every = bool(tc.eval_tasks), tc.eval_tasks_every

    @property
    def keeps_weights(self) -> bool:
        """Whether any checkpoint is scheduled (a stop still writes one)."""
        return bool(self.every or self.model_only_every)

    def finished(self, step: int) -> bool:
        return step >= self.steps

    def log(self, n: int) -> bool:
        return n % self.log_every == 0 or n == 1 or n == self.steps

    def eval(self, n: int) -> bool:
        return bool(self.eval_every and n % self.eval_every == 0) or n == self.steps

    def tasks(self, n: int) -> bool:
        """Downstream tasks (train.eval_tasks) every train.eval_tasks_every steps and at the last."""
        return self.has_tasks and (bool(self.tasks_every and n % self.tasks_every == 0) or n == self.steps)

    def generate(self, n: int) -> bool:
        if self.generate_every:
            return n % self.generate_every == 0
        return self.eval(n)

    def full_checkpoint(self, n: int) -> bool:
        return bool(self.every and (n % self.every == 0 or n == self.steps))

    def model_only_checkpoint(self, n: int) -> bool:
        """Model-only weights, unless a full checkpoint (which holds them) is written at n."""
        every = self.model_only_every
        last = n == self.steps and not self.every
        return not self.full_checkpoint(n) and bool(every and (n % every == 0 or last))

    def at(self, n: int, stop: bool = False) -> Due:
        return Due(
            self.log(n),
            self.full_checkpoint(n),
            self.model_only_checkpoint(n),
            self.eval(n),
            self.generate(n),
            stop,
        )
