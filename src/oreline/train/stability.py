"""The stability rules: non-finite values and loss / grad-norm spikes, judged before the optimizer step.

Who does what:
- `DeviceJudge` judges each step on the training device (the loop reads nothing on an ordinary
  step, oreline.train.loop) and its verdict masks the optimizer update there;
- `StabilityMonitor` is the host side: when the loop reads the verdicts (`settle`), it hands each
  to `record_verdict` and then `accept` / `observe`, `record_skip` or `record_rollback`; it keeps
  the window, the counters and the anomaly log, and is saved in the checkpoint;
- `reference_judgement` is the same rules in plain Python, one step at a time: the oracle the
  tests hold `DeviceJudge` against (`StabilityMonitor.check` runs it with the monitor's
  bookkeeping). The loop never calls it.

Actions (`train.stability.action`) on an anomaly: "skip" (the update is masked, `record_skip`),
"rollback" (reload the last good checkpoint, scale the lr by `lr_factor`, move the loader past the
offending batches, `record_rollback`, which raises `TrainingError` past `max_retries`), or "log"
(step anyway). A NaN/inf is never stepped.

Rules, in order:
1. **nonfinite**: the loss or the grad norm is NaN or ±inf. Judged from the first step.
2. **loss_spike** / **grad_spike**: the value's z-score against the window exceeds `z_threshold`
   (default 6σ, σ as below). Only *upward* deviations count: a loss that falls fast is progress, not instability.
   Spikes are judged once the window holds `min_history` (default 16) healthy steps; the window keeps
   the last `window` (default 128) accepted steps.

Statistics: the window's median, and 1.4826 × its median absolute deviation as σ. The window holds
the values of every step after the lr warmup, skipped ones included (`observe`): a window of
accepted steps only never saw a new level, so once the grad norm settled above 4× the early mean
(the lr peaking) every later step was "a spike" and skipped, and a skipped step changes nothing,
so the next one was alike: 277 of 300 steps skipped on Gutenberg prose (issue 35). With skipped
values in the window the baseline follows the run's real level, and the median and MAD keep one
real spike from moving it. Warmup steps never join: a rising lr legitimately raises the norm, so
judging waits until `min_history` steps after warmup are in the window (NaN/inf is judged from
the first step). A storm that skipping does not end escalates: `max_consecutive_skips` skipped
steps in a row roll back to the last full checkpoint with lr × `lr_factor` (bounded by
`max_retries`), and without a checkpoint, or past the bound, the run stops with an error naming
the values, the window and the fix.
A spike must also be large in absolute terms: above `loss_spike_min_ratio` (default 1.2) × the window
mean for the loss and `grad_spike_min_ratio` (default 4) × the mean for the grad norm. Small batches
give heavy-tailed grad norms: in the demo run (batch 8 × 256 tokens) healthy steps reached 2.5× the
window mean at z ≈ 15-21 because the window's σ is tiny, and skipping them silently reshaped a healthy
run. Clipping already bounds such steps; the ratio keeps the monitor for real blow-ups (the 50×
injected spike, a diverging run).
The standard deviation has a floor of `REL_SIGMA_FLOOR` × |mean| so that a nearly constant series
(a loss plateau, a clipped grad norm) does not turn ordinary jitter into a 6σ "spike".
This follows the practice of skipping or rolling back on loss spikes described for large runs
(PaLM, Chowdhery et al. 2022, §5.1: restart from a checkpoint ~100 steps before the spike and skip
~200-500 batches; OPT-175B logbook: lower the lr and restart from the last checkpoint).

Distributed: the decision must be the same on every rank, otherwise ranks diverge (one steps, one
skips) and the next collective hangs. The loop therefore all-reduces the loss and computes the
*global* grad norm before judging; every rank then holds the same values and makes the same
deterministic computation.

On the device (`DeviceJudge`): the same rules with tensors, in float64, on a copy of the host
monitor's window (`DeviceJudge.load` copies it after a start, resume or rollback). The device sums
in a fixed order (not `math.fsum`), so a value within a few ulps of a threshold could be judged
differently than by `reference_judgement`; the device's verdict is the one applied and recorded.

State (`state_dict()`) is JSON: the window values, counters and anomaly log. It is saved in the
checkpoint meta so that a resumed run judges step N exactly as the uninterrupted run did.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field

import torch

from oreline.config import StabilityConfig
from oreline.errors import TrainingError

REL_SIGMA_FLOOR = 1e-3  # σ is at least 0.1% of the window mean (see the module docstring)
MAX_LOGGED_ANOMALIES = 100  # anomalies kept in the state (the counters keep counting past this)
KINDS = ("ok", "nonfinite", "loss_spike", "grad_spike")  # DeviceJudge's verdict codes


@dataclass
class Anomaly:
    """What went wrong at one step: kind is "nonfinite", "loss_spike" or "grad_spike"."""

    kind: str
    step: int
    values: dict[str, float | None]
    z: float | None = None
    threshold: float | None = None
    mean: float | None = None
    std: float | None = None

    def describe(self) -> str:
        vals = ", ".join(f"{k}={v:.6g}" if v is not None else f"{k}=None" for k, v in self.values.items())
        if self.kind == "nonfinite":
            return f"step {self.step}: non-finite value ({vals})"
        return (
            f"step {self.step}: {self.kind} ({vals}; z={self.z:.1f} > {self.threshold:g}σ "
            f"over window median {self.mean:.6g} ± {self.std:.3g})"
        )

    def to_dict(self) -> dict:
        # JSON cannot hold NaN/inf portably: write them as strings ("nan", "inf")
        out = asdict(self)
        out["values"] = {k: _json_float(v) for k, v in self.values.items()}
        return out


def _json_float(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return str(v)


def _is_finite(v: float | None) -> bool:
    return v is None or math.isfinite(v)


MAD_TO_SIGMA = 1.4826  # σ of a normal distribution = 1.4826 × its median absolute deviation


def window_stats(values: deque[float] | list[float]) -> tuple[float, float]:
    """The window's centre and spread: median, and 1.4826 × the median absolute deviation (σ for
    normal data) with the relative floor, in float64. Robust statistics, because the window also
    holds the values of skipped steps (see the module docstring): one spike moves neither."""
    ordered = sorted(values)
    med = _median(ordered)
    mad = _median(sorted(abs(v - med) for v in ordered))
    return med, max(MAD_TO_SIGMA * mad, REL_SIGMA_FLOOR * abs(med), 1e-12)


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return 0.5 * (ordered[(n - 1) // 2] + ordered[n // 2])


@dataclass
class StabilityCounters:
    checked: int = 0
    accepted: int = 0
    skipped: int = 0
    rollbacks: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


def reference_judgement(
    cfg: StabilityConfig,
    losses: deque[float],
    grad_norms: deque[float],
    step: int,
    loss: float,
    grad_norm: float | None,
) -> Anomaly | None:
    """The rules (module docstring) in plain Python for one step against the windows: None when
    healthy. The oracle for `DeviceJudge.judge`, which the loop uses; nothing here is on its path."""
    loss = float(loss)
    grad_norm = None if grad_norm is None else float(grad_norm)
    values = {"loss": loss, "grad_norm": grad_norm}
    if not (_is_finite(loss) and _is_finite(grad_norm)):
        return Anomaly("nonfinite", step, values)
    return _spike(cfg, "loss_spike", step, loss, losses, values) or (
        _spike(cfg, "grad_spike", step, grad_norm, grad_norms, values) if grad_norm is not None else None
    )


def _spike(
    cfg: StabilityConfig, kind: str, step: int, value: float, window: deque[float], values: dict
) -> Anomaly | None:
    if len(window) < cfg.min_history:
        return None
    mean, std = window_stats(window)
    z = (value - mean) / std
    min_ratio = cfg.loss_spike_min_ratio if kind == "loss_spike" else cfg.grad_spike_min_ratio
    if z > cfg.z_threshold and value > min_ratio * mean:
        return Anomaly(kind, step, values, z=z, threshold=cfg.z_threshold, mean=mean, std=std)
    return None


class StabilityMonitor:
    """The host side of the stability rules: window, counters, anomaly log, rollback bound and
    their checkpointed state (module docstring)."""

    def __init__(self, cfg: StabilityConfig):
        self.cfg = cfg
        self.losses: deque[float] = deque(maxlen=cfg.window)
        self.grad_norms: deque[float] = deque(maxlen=cfg.window)
        self.counters = StabilityCounters()
        self.anomalies: list[dict] = []
        # rollbacks since the run last got past the step that caused one (bounded by max_retries);
        # replayed healthy steps *before* that step do not reset it, or the bound would never bite
        self.retries_in_a_row = 0
        self.last_rollback_step = -1
        self.last_checked_step = -1
        self.consecutive_skips = 0  # skipped steps in a row (train.stability.max_consecutive_skips)

    # -- the reference judgement (tests only: the loop judges on the device) --------------------

    def check(self, step: int, loss: float, grad_norm: float | None) -> Anomaly | None:
        """`reference_judgement` of one step against this monitor's window, with the bookkeeping
        `record_verdict` does for the device's verdict. Returns None when healthy. The loop never
        calls it: it is how tests run the rules without a device and check `DeviceJudge` against them."""
        if not self.cfg.enabled:
            return None
        self.counters.checked += 1
        self.last_checked_step = step
        anomaly = reference_judgement(self.cfg, self.losses, self.grad_norms, step, loss, grad_norm)
        if anomaly is not None:
            self._count(anomaly)
        return anomaly

    def accept(self, loss: float, grad_norm: float | None, observe: bool = True) -> None:
        """A healthy (or knowingly accepted) step: counted, and its values join the window when
        `observe` (the loop observes steps after the lr warmup only)."""
        if observe:
            self.observe(loss, grad_norm)
        self.counters.accepted += 1
        self.consecutive_skips = 0
        if self.last_checked_step > self.last_rollback_step:
            self.retries_in_a_row = 0

    def observe(self, loss: float, grad_norm: float | None) -> None:
        """Add a step's finite values to the window: accepted steps and skipped ones alike, so the
        baseline follows the run's real level instead of freezing at the last accepted one."""
        loss = float(loss)
        if math.isfinite(loss):
            self.losses.append(loss)
        if grad_norm is not None and math.isfinite(float(grad_norm)):
            self.grad_norms.append(float(grad_norm))

    def record_verdict(
        self, step: int, loss: float, grad_norm: float | None, kind: str, z: float, mean: float, std: float
    ) -> Anomaly | None:
        """Count and log the verdict `DeviceJudge` reached on the device for this step (the loop's
        `settle`); returns its anomaly, None when healthy."""
        if not self.cfg.enabled and kind != "nonfinite":
            return None
        if self.cfg.enabled:
            self.counters.checked += 1
            self.last_checked_step = step
        values = {"loss": float(loss), "grad_norm": None if grad_norm is None else float(grad_norm)}
        if kind == "ok":
            return None
        if kind == "nonfinite":
            anomaly = Anomaly("nonfinite", step, values)
        else:
            anomaly = Anomaly(kind, step, values, z=z, threshold=self.cfg.z_threshold, mean=mean, std=std)
        if self.cfg.enabled:
            self._count(anomaly)
        return anomaly

    def _count(self, anomaly: Anomaly) -> None:
        self.counters.by_kind[anomaly.kind] = self.counters.by_kind.get(anomaly.kind, 0) + 1
        if len(self.anomalies) < MAX_LOGGED_ANOMALIES:
            self.anomalies.append(anomaly.to_dict())

    # -- actions the loop took -------------------------------------------------------------------

    def record_skip(self) -> bool:
        """Count a skipped step; True when `max_consecutive_skips` steps in a row were skipped: a
        storm that skipping cannot end (a skipped step changes nothing, so the next one is alike)."""
        self.counters.skipped += 1
        self.consecutive_skips += 1
        limit = self.cfg.max_consecutive_skips
        return bool(limit) and self.consecutive_skips >= limit

    def storm_error(self, anomaly: Anomaly, rolled_back: str = "") -> TrainingError:
        """The error that ends a run whose skips did not stop (nothing to roll back to, or past
        max_retries rollbacks): the cause, the values, the window and the fix."""
        return TrainingError(
            f"training is unstable: {self.consecutive_skips} steps in a row were skipped, the last "
            f"{anomaly.describe()}" + (f"; {rolled_back}" if rolled_back else ""),
            "lower train.optim.lr or raise train.optim.warmup_steps; if these values are the run's "
            "normal level, raise train.stability.grad_spike_min_ratio / loss_spike_min_ratio or "
            "train.stability.max_consecutive_skips (0 never escalates), or set checkpoint.every so a "
            "storm can roll back (train.stability.action)",
        )

    def record_rollback(self, anomaly: Anomaly | None = None, where: str = "") -> None:
        """Count a rollback; past `max_retries` rollbacks without a healthy step in between, stop."""
        self.counters.rollbacks += 1
        self.retries_in_a_row += 1
        self.last_rollback_step = max(
            self.last_rollback_step, anomaly.step if anomaly is not None else self.last_checked_step
        )
        if self.retries_in_a_row > self.cfg.max_retries:
            what = anomaly.describe() if anomaly is not None else "repeated anomalies"
            raise TrainingError(
                f"training is unstable: {what}; {self.retries_in_a_row - 1} rollbacks"
                + (f" to {where}" if where else "")
                + " did not help",
                "lower train.optim.lr, raise train.optim.warmup_steps or check the data near this step "
                "(oreline doctor run RUN_DIR); train.stability.max_retries bounds the retries",
            )

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """JSON-able state: window values (exact floats), counters, anomaly log."""
        return {
            "losses": list(self.losses),
            "grad_norms": list(self.grad_norms),
            "counters": asdict(self.counters),
            "anomalies": list(self.anomalies),
            "retries_in_a_row": self.retries_in_a_row,
            "last_rollback_step": self.last_rollback_step,
            "consecutive_skips": self.consecutive_skips,
        }

    def load_state_dict(self, state: dict) -> None:
        self.losses = deque((float(v) for v in state.get("losses", [])), maxlen=self.cfg.window)
        self.grad_norms = deque((float(v) for v in state.get("grad_norms", [])), maxlen=self.cfg.window)
        counters = dict(state.get("counters", {}))
        self.counters = StabilityCounters(**{**asdict(StabilityCounters()), **counters})
        self.anomalies = list(state.get("anomalies", []))
        self.retries_in_a_row = int(state.get("retries_in_a_row", 0))
        self.last_rollback_step = int(state.get("last_rollback_step", -1))
        self.consecutive_skips = int(state.get("consecutive_skips", 0))

    def restore_window(self, state: dict) -> None:
        """Rollback: take the window of the checkpoint rolled back to, keep counters and retries.

        (On resume use `load_state_dict`, which restores everything.)
        """
        self.losses = deque((float(v) for v in state.get("losses", [])), maxlen=self.cfg.window)
        self.grad_norms = deque((float(v) for v in state.get("grad_norms", [])), maxlen=self.cfg.window)

    def summary(self) -> dict:
        """Counters for metrics and the final report."""
        c = self.counters
        return {
            "checked": c.checked,
            "skipped": c.skipped,
            "rollbacks": c.rollbacks,
            "anomalies": dict(c.by_kind),
        }


class DeviceJudge:
    """`reference_judgement` and `StabilityMonitor.observe` on the training device: no value leaves it.

    The windows are float64 buffers of `cfg.window` values, the newest last, the valid ones
    right-aligned after zeros (adding 0.0 is exact, so the sums only see the values, always in
    the same order: a resumed run judges bit for bit like the uninterrupted one).
    `judge` returns the step's verdict as a float64 vector [kind code (index into KINDS), z,
    window mean, window std] (z, mean, std of the spiking value; 0 otherwise).
    """

    def __init__(self, cfg: StabilityConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.losses = torch.zeros(cfg.window, dtype=torch.float64, device=device)
        self.grad_norms = torch.zeros(cfg.window, dtype=torch.float64, device=device)
        self.n_losses = torch.zeros((), dtype=torch.float64, device=device)
        self.n_grad_norms = torch.zeros((), dtype=torch.float64, device=device)

    def load(self, monitor: StabilityMonitor) -> None:
        """Take the host monitor's windows (start, resume, rollback): the one transfer host → device."""
        for buf, count, values in (
            (self.losses, self.n_losses, list(monitor.losses)),
            (self.grad_norms, self.n_grad_norms, list(monitor.grad_norms)),
        ):
            host = torch.zeros(self.cfg.window, dtype=torch.float64)
            if values:
                host[-len(values) :] = torch.tensor(values, dtype=torch.float64)
            buf.copy_(host)
            count.fill_(len(values))

    def _spike(
        self, value: torch.Tensor, window: torch.Tensor, count: torch.Tensor, min_ratio: float
    ) -> tuple[torch.Tensor, ...]:
        n = window.numel()
        valid = torch.arange(n, device=self.device) >= n - count
        med = self._median(torch.where(valid, window, math.inf), count)
        mad = self._median(torch.where(valid, (window - med).abs(), math.inf), count)
        std = torch.maximum(MAD_TO_SIGMA * mad, (REL_SIGMA_FLOOR * med.abs()).clamp(min=1e-12))
        z = (value - med) / std
        enough = count >= max(self.cfg.min_history, 1)
        return enough & (z > self.cfg.z_threshold) & (value > min_ratio * med), z, med, std

    def _median(self, padded: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Median of the `count` finite values of `padded` (the rest +inf), as `_median` takes it."""
        ordered = torch.sort(padded).values
        c = count.clamp(min=1.0).long()
        lo = ordered.gather(0, ((c - 1) // 2).reshape(1))[0]
        hi = ordered.gather(0, (c // 2).reshape(1))[0]
        return 0.5 * (lo + hi)

    def judge(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        loss, grad_norm = loss.double(), grad_norm.double()
        nonfinite = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        if not self.cfg.enabled:
            return torch.stack([nonfinite.double(), zero, zero, zero])
        ls, lz, lm, lsd = self._spike(loss, self.losses, self.n_losses, self.cfg.loss_spike_min_ratio)
        gs, gz, gm, gsd = self._spike(
            grad_norm, self.grad_norms, self.n_grad_norms, self.cfg.grad_spike_min_ratio
        )
        gs = gs & ~ls  # the loss is judged first, as in reference_judgement
        kind = torch.where(nonfinite, 1.0, torch.where(ls, 2.0, torch.where(gs, 3.0, 0.0)))
        pick = [torch.where(ls, a, torch.where(gs, b, 0.0)) for a, b in ((lz, gz), (lm, gm), (lsd, gsd))]
        pick = [torch.where(nonfinite, 0.0, v) for v in pick]
        return torch.stack([kind.double(), *pick])

    def accept(self, loss: torch.Tensor, grad_norm: torch.Tensor, applied: torch.Tensor) -> None:
        """`StabilityMonitor.observe` where `applied` (a bool tensor: the loop passes "after warmup and
        no rollback pending") holds: finite values join the window."""
        for buf, count, value in (
            (self.losses, self.n_losses, loss.double()),
            (self.grad_norms, self.n_grad_norms, grad_norm.double()),
        ):
            take = applied & torch.isfinite(value)
            shifted = torch.cat([buf[1:], value.reshape(1)])
            buf.copy_(torch.where(take, shifted, buf))
            count.copy_(torch.where(take, (count + 1).clamp(max=float(buf.numel())), count))
