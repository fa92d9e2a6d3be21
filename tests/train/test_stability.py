"""StabilityMonitor: non-finite values, z-score spikes, history, state, bounded rollbacks."""

from __future__ import annotations

import json
import math
import random

import pytest

from oreline.config import StabilityConfig
from oreline.errors import TrainingError
from oreline.train.stability import StabilityMonitor


def noisy_losses(n: int, seed: int = 0, start: float = 6.0) -> list[tuple[float, float]]:
    """A falling loss with 1% noise and a grad norm around 1, like early training."""
    rng = random.Random(seed)
    return [
        (start * (0.995**i) * (1 + 0.01 * rng.gauss(0, 1)), 1.0 + 0.05 * rng.gauss(0, 1)) for i in range(n)
    ]


def warmed(cfg: StabilityConfig | None = None, n: int = 64) -> StabilityMonitor:
    mon = StabilityMonitor(cfg or StabilityConfig())
    for step, (loss, gn) in enumerate(noisy_losses(n)):
        assert mon.check(step, loss, gn) is None, step
        mon.accept(loss, gn)
    return mon


@pytest.mark.parametrize("loss,gn", [(math.nan, 1.0), (math.inf, 1.0), (5.0, math.nan), (5.0, -math.inf)])
def test_nonfinite_is_caught_from_the_first_step(loss, gn):
    mon = StabilityMonitor(StabilityConfig())
    a = mon.check(0, loss, gn)
    assert a is not None and a.kind == "nonfinite" and a.step == 0
    assert "non-finite" in a.describe()
    json.dumps(a.to_dict())  # NaN written as a string, still JSON


def test_loss_spike_and_grad_spike():
    mon = warmed()
    last = noisy_losses(64)[-1][0]
    a = mon.check(64, last * 3, 1.0)
    assert a is not None and a.kind == "loss_spike" and a.z > 6 and a.threshold == 6.0
    b = mon.check(64, last, 40.0)
    assert b is not None and b.kind == "grad_spike"
    assert mon.summary()["anomalies"] == {"loss_spike": 1, "grad_spike": 1}


def test_ordinary_noise_and_falling_loss_are_not_spikes():
    mon = warmed(n=400)  # 400 noisy steps, none flagged (asserted inside), window rolls over
    assert len(mon.losses) == 128
    assert mon.check(400, 0.1, 1.0) is None  # a sudden drop is progress, not instability


def test_no_spike_judgement_before_min_history():
    mon = StabilityMonitor(StabilityConfig(min_history=16))
    for step, (loss, gn) in enumerate(noisy_losses(15)):
        mon.accept(loss, gn)
        assert mon.check(step, 1000.0, 1000.0) is None
    mon.accept(5.9, 1.0)
    assert mon.check(16, 1000.0, 1.0).kind == "loss_spike"


def test_constant_series_needs_a_real_jump():
    mon = StabilityMonitor(StabilityConfig(loss_spike_min_ratio=1.0))  # isolate the σ floor
    for step in range(32):
        mon.accept(2.0, 1.0)  # clipped grad norm, loss plateau: std 0, floored at 0.1% of the mean
        assert mon.check(step, 2.0, 1.0) is None
    assert mon.check(32, 2.01, 1.0) is None  # 5σ of the floor: under the threshold
    assert mon.check(33, 2.02, 1.0).kind == "loss_spike"


def test_state_dict_is_json_and_resumes_the_same_decisions():
    mon = warmed()
    mon.record_skip()
    state = json.loads(json.dumps(mon.state_dict()))
    other = StabilityMonitor(StabilityConfig())
    other.load_state_dict(state)
    assert list(other.losses) == list(mon.losses) and other.counters == mon.counters
    for step, value in [(64, 5.0), (65, 9.0), (66, 30.0)]:
        a, b = mon.check(step, value, 1.0), other.check(step, value, 1.0)
        assert (a and (a.kind, a.z)) == (b and (b.kind, b.z))


def test_disabled_monitor_flags_nothing():
    mon = StabilityMonitor(StabilityConfig(enabled=False))
    assert mon.check(0, math.nan, math.nan) is None


def test_rollbacks_are_bounded_until_the_run_gets_past_the_bad_step():
    mon = warmed(StabilityConfig(max_retries=2))
    bad = mon.check(100, math.nan, 1.0)
    mon.record_rollback(bad)
    for step in range(90, 100):  # replayed healthy steps before the bad one do not reset the bound
        mon.check(step, 5.0, 1.0)
        mon.accept(5.0, 1.0)
    mon.record_rollback(mon.check(100, math.nan, 1.0))
    with pytest.raises(TrainingError, match="step 100") as err:
        mon.record_rollback(mon.check(100, math.nan, 1.0))
    assert "max_retries" in str(err.value) and mon.counters.rollbacks == 3


def test_getting_past_the_bad_step_resets_the_bound():
    mon = warmed(StabilityConfig(max_retries=1))
    mon.record_rollback(mon.check(100, math.nan, 1.0))
    mon.check(101, 5.0, 1.0)
    mon.accept(5.0, 1.0)
    mon.record_rollback(mon.check(200, math.nan, 1.0))  # a new incident, first retry: no error
    assert mon.counters.rollbacks == 2


def test_restore_window_keeps_counters():
    mon = warmed()
    saved = mon.state_dict()
    mon.accept(5.0, 1.0)
    mon.record_rollback(mon.check(70, math.nan, 1.0))
    mon.restore_window(saved)
    assert list(mon.losses) == saved["losses"] and mon.counters.rollbacks == 1


def test_heavy_tailed_grad_norms_of_small_batches_are_not_spikes():
    """The demo run's case: a tight window (0.53 ± 0.05) and a healthy step at 2.5× the mean is
    z ≈ 15, yet only a step above grad_spike_min_ratio × the mean (4×) is a spike."""
    rng = random.Random(1)
    mon = StabilityMonitor(StabilityConfig())
    for _ in range(128):
        mon.accept(5.2 + 0.05 * rng.gauss(0, 1), 0.53 + 0.05 * rng.gauss(0, 1))
    assert mon.check(200, 5.3, 1.30) is None
    assert mon.check(201, 5.3, 2.5).kind == "grad_spike"
    assert mon.check(202, 5.9, 0.5) is None  # 1.13× the mean loss: noise at this batch size
    assert mon.check(203, 6.5, 0.5).kind == "loss_spike"


def test_device_judge_reaches_the_monitors_verdicts():
    """DeviceJudge (the loop's judge, on tensors) against StabilityMonitor.check on one series: a
    noisy start, a constant plateau (σ floor), spikes of both kinds, NaN/inf, a window that rolls
    over, and a reload of the window from the monitor (resume, rollback)."""
    import torch

    from oreline.train.stability import KINDS, DeviceJudge

    cfg = StabilityConfig(window=32, min_history=8)
    mon, judge = StabilityMonitor(cfg), DeviceJudge(cfg, torch.device("cpu"))
    series = noisy_losses(60) + [(3.0, 1.0)] * 20
    series[20], series[30], series[40] = (30.0, 1.0), (4.0, 40.0), (math.nan, 1.0)
    series[50], series[70] = (4.0, math.inf), (3.0 * 1.1, 1.0)  # 10% above a plateau: under the ratio
    kinds = []
    for step, (loss, gn) in enumerate(series):
        if step == 45:  # as after a resume: the device takes the host's window
            judge = DeviceJudge(cfg, torch.device("cpu"))
            judge.load(mon)
        expected = mon.check(step, loss, gn)
        lt, gt = torch.tensor(loss, dtype=torch.float64), torch.tensor(gn, dtype=torch.float64)
        kind, z, mean, std = judge.judge(lt, gt).tolist()
        assert KINDS[int(kind)] == (expected.kind if expected else "ok"), step
        if expected is not None and expected.z is not None:
            assert (z, mean, std) == pytest.approx((expected.z, expected.mean, expected.std), rel=1e-12)
        applied = expected is None
        if applied:
            mon.accept(loss, gn)
        judge.accept(lt, gt, torch.tensor(applied))
        kinds.append(KINDS[int(kind)])
    assert kinds.count("loss_spike") == 1 and kinds.count("grad_spike") == 1 and kinds.count("nonfinite") == 2
    host = torch.tensor(list(mon.losses), dtype=torch.float64)
    assert torch.equal(judge.losses[-len(host) :], host) and int(judge.n_losses) == len(host)
