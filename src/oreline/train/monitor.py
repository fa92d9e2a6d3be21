"""Training metrics: MFU against a device peak, memory, and one logger (the loss breakdown by
target class is `oreline.model.scoring.loss_breakdown`).

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022, appendix B) = achieved model FLOPs
per second / peak FLOPs per second, where model FLOPs per token are 6N plus attention
(`oreline.model.presets.flops_per_token`). The peak is a table of NVIDIA's dense (no
sparsity) figures for known GPUs; an unknown GPU gets `mfu = null` and a message naming it, never
a guess. A CPU has no spec sheet to believe, so its peak is MEASURED: fp32 matmuls of this
model's shapes (forward x·Wᵀ and both backward products), timed once per process and cached.

`MetricsLogger` writes every record to `metrics.jsonl` (one JSON object per line, flushed, the
record types are listed in `oreline.train.loop`), hands it to the experiment trackers
(`oreline.train.trackers`: TensorBoard, W&B, MLflow per `train.trackers`), and prints a short
line to the console; only the main rank logs. `TimingWindow` sums a train record's timings over
the steps since the previous one.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from oreline.io import open_append, write_lines_atomic
from oreline.train import comm_timing, dist

# ---------------------------------------------------------------------------------------------
# device peak FLOPs

# Dense (no 2:4 sparsity) peak FLOP/s from NVIDIA's data sheets: (bf16 tensor, tf32 tensor, fp32).
# Ordered: more specific names first ("H100 PCIe" before "H100", "A100" before "A10").
GPU_PEAKS: list[tuple[str, str, tuple[float | None, float | None, float]]] = [
    (r"H200", "NVIDIA H200 (SXM)", (989e12, 494.5e12, 67e12)),
    (r"H100.*PCIe", "NVIDIA H100 PCIe", (756e12, 378e12, 51e12)),
    (r"H100.*NVL", "NVIDIA H100 NVL", (835e12, 417.5e12, 60e12)),
    (r"H100|H800", "NVIDIA H100 SXM", (989e12, 494.5e12, 67e12)),
    (r"A100|A800", "NVIDIA A100", (312e12, 156e12, 19.5e12)),
    (r"L40S", "NVIDIA L40S", (362e12, 183e12, 91.6e12)),
    (r"\bL4\b", "NVIDIA L4", (121e12, 60e12, 30.3e12)),
    (r"\bA10\b", "NVIDIA A10", (125e12, 62.5e12, 31.2e12)),
    (r"RTX A6000", "NVIDIA RTX A6000", (154.8e12, 77.4e12, 38.7e12)),
    (r"V100", "NVIDIA V100", (None, None, 15.7e12)),  # no bf16, no tf32 on Volta
    (r"RTX 4090", "NVIDIA GeForce RTX 4090", (165.2e12, 82.6e12, 82.6e12)),
    (r"RTX 3090", "NVIDIA GeForce RTX 3090", (71e12, 35.6e12, 35.6e12)),
]


def gpu_peak_flops(name: str, precision: str, tf32: bool) -> tuple[float | None, str]:
    """(peak FLOP/s or None, source) for a GPU name as torch.cuda.get_device_name() gives it."""
    for pattern, label, (bf16, tf32_peak, fp32) in GPU_PEAKS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            if precision == "bf16":
                peak, kind = bf16, "bf16 dense"
            elif tf32:
                peak, kind = tf32_peak, "tf32 dense"
            else:
                peak, kind = fp32, "fp32"
            if peak is None:
                return None, f"{label} has no {kind} peak (precision {precision}): mfu not computed"
            return peak, f"{label} {kind} data sheet ({peak / 1e12:g} TFLOP/s)"
    return None, (
        f"unknown GPU {name!r}: no peak FLOPs in oreline.train.monitor.GPU_PEAKS, mfu not "
        f"computed (add its dense {precision} peak to the table)"
    )


def model_matmul_shapes(args: Any, tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of one block's projections and the output head for `tokens` rows."""
    hd = args.dim // args.n_heads
    q, kv, d, f = args.n_heads * hd, args.n_kv_heads * hd, args.dim, args.ffn_dim
    return [
        (tokens, d, q),
        (tokens, d, kv),
        (tokens, d, kv),
        (tokens, q, d),
        (tokens, d, f),
        (tokens, d, f),
        (tokens, f, d),
        (tokens, d, args.vocab_size),
    ]


GENERIC_SHAPES = ((2048, 1024, 1024), (2048, 1024, 4096), (2048, 4096, 1024))


def measure_cpu_matmul_peak(
    shapes: tuple[tuple[int, int, int], ...] = GENERIC_SHAPES,
    reps: int = 3,
    dtype: torch.dtype = torch.float32,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """FLOP/s of the forward and backward matmuls of `shapes` on this CPU in `dtype` (best of reps).

    For each (M, K, N): y = x·Wᵀ (forward), dx = dy·W and dW = dyᵀ·x (backward), i.e. the three
    products a Linear layer costs in training, 2·M·K·N FLOPs each. Timed with every product
    backend this torch has (its BLAS and oneDNN, see oreline.model.kernels.matmul) and the FASTER one is
    the peak: MFU is then a share of the best this CPU does, not of a slow library's figure.
    Measured once per process and arguments (cached; `measure_cpu_matmul_peak.cache_clear()` forgets).
    `clock=time.process_time` gives FLOPs per CPU-second (every busy thread counted) instead.
    """
    return _measured_peak(tuple(tuple(int(x) for x in s) for s in shapes), int(reps), dtype, clock)


@lru_cache(maxsize=8)
def _measured_peak(
    shapes: tuple[tuple[int, int, int], ...], reps: int, dtype: torch.dtype, clock: Callable[[], float]
) -> float:
    from oreline.model.kernels import matmul

    gen = torch.Generator().manual_seed(0)
    mats = []
    for m, k, n in shapes:
        mats.append(
            (
                torch.randn(m, k, generator=gen).to(dtype),
                torch.randn(n, k, generator=gen).to(dtype),
                torch.randn(m, n, generator=gen).to(dtype),
            )
        )
    flops = sum(3 * 2 * m * k * n for m, k, n in shapes)

    def run_once(backend: str) -> None:
        for x, w, dy in mats:
            matmul.mm_nt(x, w, backend)
            matmul.mm_nn(dy, w, backend)
            matmul.mm_tn(dy, x, backend)

    best = math.inf
    # oneDNN only changes fp32 products (matmul.mm_* are torch's own for other dtypes)
    for backend in matmul.available_backends() if dtype == torch.float32 else ["blas"]:
        run_once(backend)  # warm-up: allocations, thread pool, oneDNN primitives
        for _ in range(reps):
            t0 = clock()
            run_once(backend)
            best = min(best, clock() - t0)
    return flops / best


measure_cpu_matmul_peak.cache_clear = _measured_peak.cache_clear  # type: ignore[attr-defined]


def device_peak_flops(
    device: torch.device, precision: str, shapes: tuple[tuple[int, int, int], ...] | None = None
) -> tuple[float | None, str]:
    """(peak FLOP/s or None, where the figure comes from) for the training device."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
        return gpu_peak_flops(name, precision, tf32)
    if device.type == "cpu":
        if precision == "bf16" and not cpu_native_bf16():
            # emulated bf16 is ~100× below the fp32 peak here: timing it would take minutes
            return None, "CPU without native bf16: no bf16 peak measured, mfu not computed"
        shapes = shapes or GENERIC_SHAPES
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        peak = measure_cpu_matmul_peak(tuple(shapes), dtype=dtype)
        desc = ", ".join(f"{m}×{k}×{n}" for m, k, n in dict.fromkeys(shapes))
        return peak, (
            f"measured: {precision} forward+backward matmuls of shapes {desc} on "
            f"{torch.get_num_threads()} threads ({peak / 1e9:.1f} GFLOP/s)"
        )
    return None, f"no peak FLOPs known for device type {device.type!r}: mfu not computed"


def cpu_native_bf16() -> list[str]:
    """The CPU's native bf16 instruction sets (Linux /proc/cpuinfo flags avx512_bf16, amx_bf16), if any.

    Without them bf16 matmuls are emulated and ran ~20× slower than fp32 on this project's Zen 3
    machines; with AMX (Sapphire Rapids and later) bf16 autocast trained the demo model ~1.5×
    faster than fp32 (process CPU time, 1 thread).
    """
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak: float | None) -> float | None:
    if not peak or not math.isfinite(tokens_per_s_per_device):
        return None
    return flops_per_token * tokens_per_s_per_device / peak


def mfu_fields(flops_per_token: float, tokens_per_s_per_device: float, peak: float | None) -> dict[str, Any]:
    """A train record's MFU: {"mfu": ratio or None}, plus "mfu_above_peak" when the ratio is over 1.

    A ratio over 1 is not a utilisation: the peak it divides by was measured too low. On a CPU the
    peak is timed once at start-up, and cores busy with other work then (seen here: "mfu 186.9%"
    with five other jobs on two cores) make later, faster steps exceed it. Such a step records no
    MFU; the ratio is kept under its own name so that the figure is not lost, and the console says
    why instead of printing a utilisation above 100%.
    """
    value = mfu(flops_per_token, tokens_per_s_per_device, peak)
    if value is not None and value > 1.0:
        return {"mfu": None, "mfu_above_peak": value}
    return {"mfu": value}


# ---------------------------------------------------------------------------------------------
# step timings


@dataclass
class TimingWindow:
    """Timings of the steps since the last train record (host clocks; a step that reads has waited
    for the device, so the window's sum is the device's time even though single steps are not)."""

    steps: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    data: float = 0.0
    tokens: int = 0
    _t0: float = 0.0
    _cpu0: float = 0.0

    def start_step(self) -> None:
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()

    def end_step(self, data_seconds: float, tokens: int) -> None:
        self.steps += 1
        self.seconds += time.perf_counter() - self._t0
        self.cpu += time.process_time() - self._cpu0
        self.data += data_seconds
        self.tokens += tokens

    def take(self, info: dist.DistInfo) -> dict[str, float | None]:
        """The window's rates for a train record (seconds averaged over ranks; tokens are global
        already), and a new window."""
        comm = comm_timing.COMM.take()
        seconds, data = self.seconds, self.data
        if info.distributed:
            seconds, data, comm = dist.mean_over_ranks([seconds, data, comm])
        steps, cpu, tokens = self.steps, self.cpu, self.tokens
        self.steps, self.seconds, self.cpu, self.data, self.tokens = 0, 0.0, 0.0, 0.0, 0
        return {
            "tokens_per_s": tokens / seconds,
            "step_ms": 1000 * seconds / steps,
            # process CPU time (all threads) per step: cpu_ms / step_ms is how many cores were busy
            "cpu_ms": 1000 * cpu / steps,
            "data_ms": 1000 * data / steps,
            "data_wait_frac": data / seconds,
            "comm_ms": 1000 * comm / steps if info.distributed else None,
            "comm_frac": comm / seconds if info.distributed else None,
        }


# ---------------------------------------------------------------------------------------------
# memory


@lru_cache(maxsize=1)
def _process(pid: int) -> Any:
    import psutil

    return psutil.Process(pid)


def memory_stats(device: torch.device) -> dict[str, float | None]:
    """Process RSS and, on CUDA, allocated / reserved / peak allocated memory in MB."""
    out: dict[str, float | None] = {
        "rss_mb": _process(os.getpid()).memory_info().rss / 2**20,
        "cuda_alloc_mb": None,
        "cuda_reserved_mb": None,
        "cuda_peak_mb": None,
    }
    if device.type == "cuda":
        out["cuda_alloc_mb"] = torch.cuda.memory_allocated(device) / 2**20
        out["cuda_reserved_mb"] = torch.cuda.memory_reserved(device) / 2**20
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


# ---------------------------------------------------------------------------------------------
# the logger


def json_safe(value: Any) -> Any:
    """NaN and ±inf are not JSON: write them as null (the event records say what they were)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def truncate_metrics(path: Path, step: int) -> int:
    """Drop records of steps after `step` (a resumed run re-does them); returns how many.

    Records without a step (start, ...) are kept; the file is rewritten atomically.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1  # a line cut by a kill mid-write
            continue
        if isinstance(rec.get("step"), int) and rec["step"] > step:
            dropped += 1
            continue
        kept.append(line)
    write_lines_atomic(path, kept)
    return dropped


def _fmt(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


class MetricsLogger:
    """metrics.jsonl + the experiment trackers (oreline.train.trackers; TensorBoard by default) +
    console; a no-op on ranks other than the main one.

    metrics.jsonl is written first and flushed: it is complete whatever a tracker does. A tracker's
    first failure is written here once, as a `tracker_failed` event.
    """

    def __init__(
        self,
        jsonl: Path,
        tensorboard_dir: Path | None,
        console: Any = None,
        enabled: bool = True,
        purge_after_step: int | None = None,
        trackers: Any = None,
        flush_s: float = 30.0,
    ):
        self.enabled = enabled
        self.console = console
        self.path = Path(jsonl)
        self.trackers = trackers
        self.flush_s = flush_s
        self.tracker_report: dict[str, Any] = {}
        self._said_above_peak = False
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if purge_after_step is not None:
            truncate_metrics(self.path, purge_after_step)
        self.fh = open_append(self.path)  # (closed in close()); never through a planted link
        if self.trackers is None:
            from oreline.train.trackers import open_trackers

            names = ["tensorboard"] if tensorboard_dir is not None else []
            self.trackers = open_trackers(
                names,
                self.path.parent,
                None,
                None,
                purge_after_step if purge_after_step is not None and purge_after_step >= 0 else None,
                tensorboard_dir=tensorboard_dir,
                purge_after_step=purge_after_step,
            )

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"type": record.get("type"), "time": round(time.time(), 3), **record}
        self._write(record)
        self.trackers.log(record)
        for warning in self.trackers.new_failures():
            self._write({"type": "event", "time": round(time.time(), 3), **warning})
        changed = self.trackers.changed_report() if self.trackers else None
        if changed:  # kept as they change: a killed process's failures are still counted on resume
            import contextlib

            from oreline.io import write_json_atomic

            # (a full disk: the end writes it again; metrics.jsonl, written first, is the record)
            with contextlib.suppress(OSError):
                write_json_atomic(self.path.parent / "trackers.json", changed)

    def _write(self, record: dict[str, Any]) -> None:
        self.fh.write(json.dumps(json_safe(record), ensure_ascii=False) + "\n")
        self.fh.flush()
        self._console(record)

    def tracker_state(self) -> dict[str, Any]:
        """Each tracker's run (for the checkpoint's meta: a resume continues the same runs)."""
        return self.trackers.state_dict() if self.enabled else {}

    def _console(self, r: dict[str, Any]) -> None:
        c = self.console
        if c is None:
            return
        from rich.markup import escape

        kind = r["type"]
        if kind == "train":
            mem = (
                f"rss {r['rss_mb']:,.0f} MB"
                if r.get("cuda_alloc_mb") is None
                else f"cuda {r['cuda_alloc_mb']:,.0f}/{r['cuda_peak_mb']:,.0f} MB"
            )
            mfu_s = "—" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
            if r.get("mfu_above_peak") is not None:
                mfu_s = "— (above the measured peak)"
                if not self._said_above_peak:
                    self._said_above_peak = True
                    c.print(
                        f"[yellow]step {r['step']} ran at {100 * r['mfu_above_peak']:.0f}% of the peak FLOPs "
                        "measured at start-up: that peak was measured too low (on a CPU: other work "
                        "loaded the cores then), so MFU is not reported for such steps. Measure on an "
                        "idle machine for a meaningful MFU.[/yellow]",
                        highlight=False,
                    )
            c.print(
                f"step {r['step']:>6} | loss {_fmt(r['loss'], '.4f')} (tok {_fmt(r['loss_token'], '.3f')} "
                f"eos {_fmt(r['loss_eos'], '.3f')} bos {_fmt(r['loss_bos'], '.3f')}) | lr {r['lr']:.3e} | "
                f"gnorm {_fmt(r['grad_norm'], '.3f')}{'*' if r.get('clipped') else ''} | "
                f"{r['tokens_per_s']:,.0f} tok/s | mfu {mfu_s} | {r['step_ms']:,.0f} ms/step "
                f"(data {100 * r['data_wait_frac']:.1f}%) | {mem}",
                highlight=False,
            )
        elif kind == "eval":
            # the validation set it was measured on (train.eval_sequences; older records lack it)
            seqs = r.get("val_sequences")
            on = f"({seqs:,} seqs, {r['val_tokens']:,} tokens) " if seqs is not None else ""
            c.print(
                f"[bold]eval[/] step {r['step']} | val loss {_fmt(r['val_loss'], '.4f')} {on}"
                f"ppl {_fmt(r['val_ppl'], ',.2f')} bpb {_fmt(r['val_bpb'], '.4f')} "
                f"(tok {_fmt(r['val_loss_token'], '.3f')} eos {_fmt(r['val_loss_eos'], '.3f')} "
                f"bos {_fmt(r['val_loss_bos'], '.3f')}) | train loss {_fmt(r.get('train_loss'), '.4f')}",
                highlight=False,
            )
        elif kind == "generation":
            c.print(
                f"  [dim]{r['mode']}[/] {escape(repr(r['prompt']))} → {escape(repr(r['text']))}",
                highlight=False,
            )
        elif kind == "event":
            c.print(
                f"[yellow]event[/] step {r.get('step')} {r.get('kind')}: {escape(str(r.get('message')))}"
                + (f" → {r['action']}" if r.get("action") else ""),
                highlight=False,
            )
        elif kind == "checkpoint":
            c.print(
                f"checkpoint step {r['step']} ({r['kind']}) → {r['path']} "
                f"({r['seconds']:.2f} s, {r['bytes'] / 2**20:,.1f} MB)",
                highlight=False,
            )

    def close(self) -> None:
        """Flush the trackers (train.tracker_flush_s at most), write <run>/trackers.json, close the file."""
        if not self.enabled:
            return
        self.tracker_report = self.trackers.close(self.flush_s) if self.trackers else {}
        self.fh.close()
        if not self.tracker_report:
            return
        from oreline.io import write_json_atomic

        write_json_atomic(self.path.parent / "trackers.json", self.tracker_report)
        for name, rep in self.tracker_report.items():
            if rep["this_launch"]["failures"] or rep["missing"] or not rep["finished"]:
                lacks = (
                    f"its run lacks {rep['missing']} records" if rep["missing"] else "it holds every record"
                )
                msg = (
                    f"tracker {name}: {rep['failures']} failed calls, {rep['dropped']} dropped and "
                    f"{rep['resent']} sent again from metrics.jsonl; {lacks}"
                    + ("" if rep["finished"] else " and was not finished")
                    + f" (first error: {rep['first_error']}); metrics.jsonl holds every record "
                    f"(details in {self.path.parent / 'trackers.json'})"
                    + (
                        f"; once the tracker is reachable, `oreline trackers sync {self.path.parent}` sends "
                        "what it lacks and finishes its run"
                        if rep["missing"] or not rep["finished"]
                        else ""
                    )
                )
                if self.console is not None:
                    from rich.markup import escape

                    self.console.print(f"[yellow]warning[/]: {escape(msg)}", highlight=False)
