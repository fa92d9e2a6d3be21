"""Schedule: every "is it due at step n" rule in one place; StepResult: one step's named values."""

from __future__ import annotations

import torch

from oreline.config import CheckpointConfig, Config, TrainConfig
from oreline.train.schedule import Schedule
from oreline.train.step import StepResult


def _due_steps(schedule: Schedule, rule: str, steps: int) -> list[int]:
    return [n for n in range(1, steps + 1) if getattr(schedule.at(n), rule)]


def test_every_rule_over_a_run():
    cfg = Config(
        train=TrainConfig(steps=10, log_every=4, eval_every=5, generate_every=0),
        checkpoint=CheckpointConfig(every=5, model_only_every=3),
    )
    s = Schedule(cfg)
    assert _due_steps(s, "log", 10) == [1, 4, 8, 10]  # the first and the last step always log
    assert _due_steps(s, "eval", 10) == [5, 10]
    assert _due_steps(s, "generate", 10) == [5, 10]  # generate_every = 0: with validation
    assert _due_steps(s, "full_checkpoint", 10) == [5, 10]
    assert _due_steps(s, "model_only_checkpoint", 10) == [3, 6, 9]  # never where a full one holds the weights
    assert s.at(7).why == [] and s.at(7, stop=True).why == ["stop"]  # an ordinary step reads nothing
    assert s.at(10).why == ["log", "checkpoint", "eval"]
    assert not s.finished(9) and s.finished(10) and s.keeps_weights


def test_generations_on_their_own_schedule_and_the_last_model_kept_without_full_checkpoints():
    cfg = Config(
        train=TrainConfig(steps=7, log_every=100, eval_every=0, generate_every=3),
        checkpoint=CheckpointConfig(every=0, model_only_every=5),
    )
    s = Schedule(cfg)
    assert _due_steps(s, "eval", 7) == [7]  # the end always evaluates
    assert _due_steps(s, "generate", 7) == [3, 6]
    assert _due_steps(s, "model_only_checkpoint", 7) == [5, 7]
    assert s.at(2).why == [] and s.at(3).why == ["eval"]


def test_step_result_packs_and_reads_back_by_name():
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    sums = torch.tensor([6.0, 3.0, 1.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    on_device = StepResult(
        t(2.5), t(0.75), torch.tensor(False), torch.tensor(True), t(3.0), t(7.5), t(1.0), t(0.1), sums
    )
    read = StepResult.unpack(on_device.pack().tolist())
    assert (read.loss, read.grad_norm, read.applied, read.clipped) == (2.5, 0.75, False, True)
    assert (read.kind, read.z, read.mean, read.std) == ("grad_spike", 7.5, 1.0, 0.1)
    assert read.sums == sums.tolist()
