"""GPU figures in one unattended run: environment, throughput and MFU, the torchtitan peer, async
checkpoint stall, NaN recovery and host syncs — one table.

    .venv/bin/python benchmarks/gpu_check.py [--device auto|cuda|cpu] [--preset 1b,125m]
        [--fp8-preset 3b] [--time-limit 480] [--out table.md]
        [--sections env,nan,syncs,async,kernels,throughput,flex,fp8]

On CUDA (one H200 is what it is sized for) every row is real: the presets (default `1b` then
`125m`) at seq 2048 in bf16, FSDP2 (oreline.train.dist.wrap_model with its bf16 mixed-precision
policy, on a one-rank process group) with the largest micro-batch that fits (doubling until
torch.cuda.OutOfMemoryError), activation checkpointing off and on, eager and with torch.compile
(oreline's regional compile). tokens/s are timed over whole optimizer steps (forward, backward,
clip, AdamW) after warm-up steps; MFU = oreline's flops_per_token (6·N + attention) × tokens/s over
the device's dense bf16 peak from oreline.train.monitor.GPU_PEAKS (H200: 989 TFLOP/s dense bf16,
NVIDIA's H200 data sheet; the 1,979 figure there is with 2:4 sparsity). On a CPU the same
sections run with the debug preset and tiny sizes (fp32, MFU against oreline's measured matmul
peak), so the script has run end to end before it first meets a GPU (tests/benchmarks).

Sections (each in its own try/except: a failure is a row saying so, never a crash):
- env: `oreline doctor env --distributed` findings (CUDA, NCCL, devices, ...).
- throughput: as above. The model uses `train.kernels = "auto"` (the reference on CUDA); one more
  eager row uses the fused kernels of oreline.model.kernels (`train.kernels = "cpu"`), the
  measurement that decides whether "auto" should choose them on CUDA too.
- torchtitan: its Llama 3 model (the PyPI release, if importable here; never installed at run time;
  0.2.2 measured) at the same shape, batch and FSDP2/bf16 setting, timed by the same step function,
  eager and compiled per block as its own `apply_compile` does. Per preset the rows run eager,
  then the peer, then compiled, so the time limit cuts compilation first.
- async checkpoint: oreline.train.checkpoint.save.save_checkpoint, blocking vs `checkpoint.async`
  (DCP async_save) twice (the first async save makes the pinned staging buffers): how long the
  training thread stalled, the next step's time, and whether the checkpoint holds the weights of
  its step (compared tensor by tensor).
- NaN: `oreline.train.loop.train` with `train.debug.inject_nan_at_step` (the mechanism the tests
  use): the step is skipped and training goes on with finite losses.
- syncs: the same train() under torch.cuda.set_sync_debug_mode("warn"), every synchronising call
  recorded with the oreline line that made it and attributed to the step it fell in (ordinary,
  logging, or outside any step), beside the per-step host reads of train.debug.count_host_reads.
- kernels: forward + backward of each eager RMSNorm (reference, fused, F.rms_norm) and RoPE
  (reference, fused, complex product) candidate at a 1b shape in bf16; on CUDA the fastest is
  recorded for this GPU (oreline.model.kernels.cuda_choice), and `train.kernels = "auto"` — the
  throughput rows that follow included — computes with it. Runs before the throughput rows.
- flex: `train.doc_mask` through FlexAttention against the dense SDPA mask (logits, and on CUDA
  every gradient: equal or DIFFERENT), then on CUDA the doc_mask throughput of both, eager and
  compiled, on the first preset. torchtitan builds its block-causal mask from EOS ids inside its
  own model call: no peer row.
- fp8: `--fp8-preset` (default 3b, Llama-3.2-3B's shape: the largest preset whose FSDP2 training
  state fits one GPU, where fp8's GEMMs are large) in bf16 beside fp8 (torchao tensorwise,
  torchao's size filter, FSDP2 fp8 all-gather: what `train.precision = "fp8"` trains with), eager
  then compiled, AC off, and torchtitan's model converted by the same torchao call when
  torchtitan is installed. MFU is against the bf16 peak for both, so fp8's gain shows as MFU. A GPU
  below compute capability 8.9 skips them; a CPU emulates fp8 in every projection (the path runs).
  A baseline row that is a throughput row's measurement (the same `Setting`: the CPU run, or
  `--fp8-preset` naming a throughput preset) shows that row's result instead of timing it again.
- levers (after the peer, before the compiled rows): selective vs full activation checkpointing and
  the chunked vs the full loss, each pair at the eager AC-off micro-batch (`lever_rows`).
Rows not reached before --time-limit say so. Order: env, NaN, syncs, async, kernels, then the
first preset's throughput, flex and fp8 rows, then the other presets' throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

Row = tuple[str, str, str]


@dataclass(frozen=True)
class Setting:
    """What defines one `one_throughput` measurement of oreline's own model (its arguments that
    change the number; the size's max_batch, warmup and steps are the same for every row of a
    run, and the micro-batch is the largest that fits under them). A later section reuses a throughput result by this key, never by its row's label,
    so a renamed label can neither re-measure nor pick another setting's result."""

    preset: str
    precision: str
    compile: bool
    ac: bool
    seq: int
    kernels: str = "auto"


class TimeLimit(Exception):
    """Raised in the main thread when --time-limit is reached (a section's row then says so)."""


class Budget:
    """The time left; at the limit a SIGALRM stops whatever section runs (the table still prints)."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        if hasattr(signal, "setitimer"):
            signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, seconds)

    @staticmethod
    def _expired(signum, frame):
        raise TimeLimit("time limit reached: section stopped")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def stop(self) -> None:
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)


# ---------------------------------------------------------------------------------------------
# sizes: the real ones on CUDA, tiny ones on a CPU


def sizes(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"seq": 2048, "max_batch": 64, "warmup": 3, "steps": 10, "precision": "bf16"}
    return {"seq": 64, "max_batch": 2, "warmup": 1, "steps": 1, "precision": "fp32"}


def peak_flops(device: torch.device, precision: str, args, tokens: int) -> tuple[float | None, str]:
    from oreline.train.monitor import device_peak_flops, model_matmul_shapes

    return device_peak_flops(device, precision, tuple(model_matmul_shapes(args, tokens)))


# ---------------------------------------------------------------------------------------------
# env


def section_env(device: torch.device, tmp: Path) -> list[Row]:
    from oreline.doctor.env import check_env

    rows = []
    for f in check_env(distributed=device.type == "cuda", run_dir=tmp):
        rows.append(("env", f.check, f"{f.status}: {f.evidence}"))
    if device.type == "cuda":
        rows.append(
            (
                "env",
                "device",
                f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}, "
                f"NCCL {nccl_version()}, {torch.cuda.device_count()} device(s)",
            )
        )
    return rows


def nccl_version() -> str:
    v = torch.cuda.nccl.version()  # a tuple in recent torch, an int (e.g. 21803) in older ones
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


# ---------------------------------------------------------------------------------------------
# throughput


@contextlib.contextmanager
def one_rank_group(device: torch.device):
    """A one-process group, so that dist.wrap_model applies FSDP2 as on every rank of a job."""
    import torch.distributed as tdist

    mine = not tdist.is_initialized()
    if mine:
        tdist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=tdist.HashStore(),
            rank=0,
            world_size=1,
            device_id=device if device.type == "cuda" else None,
        )
    try:
        yield
    finally:
        if mine and tdist.is_initialized():
            tdist.destroy_process_group()


def random_docs(batch: int, seq: int, device: torch.device) -> torch.Tensor:
    """(batch, seq) int32 document ids as the loader makes them (a running count of document
    starts), documents ~seq/8 tokens long on average."""
    starts = torch.rand(batch, seq, device=device) < 8 / seq
    return torch.cumsum(starts, dim=1, dtype=torch.int32)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class Trainer:
    """One model as oreline trains it (kernels, fp8, AC, compile, FSDP2, AdamW), stepped on random
    tokens (with `doc_mask`, in random documents of ~1/8 of the sequence)."""

    def __init__(
        self,
        args,
        device,
        precision,
        ac,
        compile_,
        build=None,
        kernels="auto",
        attention="sdpa",
        doc_mask=False,
    ):
        from oreline.config import TrainConfig
        from oreline.model.kernels.select import kernels_for, resolve_choice
        from oreline.model.llama import Llama
        from oreline.train import dist, float8
        from oreline.train.optim import build_optimizer
        from oreline.train.performance import compile_blocks, enable_activation_checkpointing

        self.args, self.device, self.doc_mask = args, device, doc_mask
        if precision == "fp8" and resolve_choice(kernels, device) == "cpu":
            kernels = "reference"  # the CPU set's stacked q/k/v product would bypass fp8 (as in training)
        self.tc = TrainConfig(
            precision=precision,
            parallel="fsdp",
            activation_checkpointing=ac,
            compile=compile_,
            kernels=kernels,
            # off a GPU with fp8 tensor cores the fp8 rows emulate (every projection: the debug
            # preset's are below torchao's size thresholds), so the code path runs on a CPU too
            fp8_emulate=device.type != "cuda",
            fp8_filter="auto" if device.type == "cuda" else "all",
        )
        torch.manual_seed(0)
        with torch.device(device):  # initialised where it trains: a 1B model's CPU init takes long
            if build is None:
                self.model = Llama(args, kernels_for(self.tc.kernels, device, attention=attention))
            else:
                self.model = build()
        self.fp8_layers: list[str] = []
        if precision == "fp8":  # before AC, compile and FSDP2, as oreline.train.session.build_model
            names = float8.BLOCK_PROJECTIONS if build is None else TITAN_PROJECTIONS
            self.fp8_layers = float8.convert(
                self.model,
                self.tc.fp8_recipe,
                self.tc.fp8_emulate,
                fsdp=self.tc.fp8_recipe == "tensorwise",
                size_filter=self.tc.fp8_filter == "auto",
                projections=names,
            )
        # FSDP2 + tensorwise fp8 all-gather: the weights' scales after each optimizer step
        self.after_step = partial(float8.precompute_scales, self.model) if self.fp8_layers else None
        if build is None:
            if ac:
                enable_activation_checkpointing(self.model)
            if compile_:
                compile_blocks(self.model)
        if build is None:
            info = dist.DistInfo(0, 1, 0, device, None, True, "fsdp")
            self.train_model = dist.wrap_model(self.model, self.tc, info)
        else:  # torchtitan's model: its blocks are model.layers, sharded with the same policy
            if compile_:
                compile_titan(self.model)
            self.train_model = shard_titan(self.model, device, precision)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.optimizer = build_optimizer(self.model, self.tc.optim, device)
        self.autocast_dtype = torch.bfloat16 if precision in ("bf16", "fp8") else None
        self.forward = None if build is None else self._titan_loss

    def _titan_loss(self, ids, labels):
        logits = self.train_model(ids)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")

    def step(self, batch: int, seq: int) -> None:
        ids = torch.randint(0, self.args.vocab_size, (batch, seq), device=self.device)
        labels = torch.roll(ids, -1, dims=1)
        doc_ids = random_docs(batch, seq, self.device) if self.doc_mask else None
        ctx = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype
            else contextlib.nullcontext()
        )
        with ctx:
            if self.forward is None:
                loss = self.train_model(ids, doc_ids, labels=labels).sum()
            else:
                loss = self.forward(ids, labels)
        (loss / labels.numel()).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        if self.after_step is not None:
            self.after_step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, batch: int, seq: int, warmup: int, steps: int) -> float:
        """Seconds per step, after `warmup` untimed steps."""
        for _ in range(warmup):
            self.step(batch, seq)
        self.sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(batch, seq)
        self.sync()
        return (time.perf_counter() - t0) / steps

    def largest_batch(self, seq: int, max_batch: int, budget: Budget) -> tuple[int | None, bool]:
        """(largest batch, whether a step ran out of memory): doubling from 1 until a step runs
        out of memory (or max_batch, or the time limit)."""
        best, b, oom = None, 1, False
        while b <= max_batch and budget.left() > 20:
            try:
                self.step(b, seq)
                self.sync()
                best = b
            except Exception as exc:
                if not is_oom(exc):
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                free(self.device)
                oom = True
                break
            b *= 2
        return best, oom


def throughput_rows(
    preset, device, budget, size, compiles=(False, True), batches=None, fused=False, measured=None
) -> list[Row]:
    """One preset's rows for the given compile settings, AC off then on. `batches` carries eager's
    largest micro-batch to the compiled rows (a new shape per probe would recompile). `fused` adds
    an eager AC-off row with `train.kernels = "cpu"` (oreline.model.kernels' fused RMSNorm, RoPE
    and output loss; its products are torch's own off the CPU) at eager's micro-batch: the
    measurement that decides whether "auto" should pick those kernels on CUDA too. `measured`
    ({Setting: result}) receives every result measured, for later sections to reuse."""
    from oreline.config import ModelConfig
    from oreline.model.presets import flops_per_token, resolve_model_args

    rows: list[Row] = []
    seq = size["seq"]
    args = resolve_model_args(ModelConfig(preset=preset))
    s = min(seq, args.max_seq_len)
    fpt = flops_per_token(args, s)
    batches = {} if batches is None else batches
    measured = {} if measured is None else measured

    def measure(setting: Setting) -> str:
        result = one_throughput(
            args, device, size, s, fpt, setting.ac, setting.compile, batches, budget, kernels=setting.kernels
        )
        measured[setting] = result
        return result

    for compile_ in compiles:
        for ac in (False, True):
            name = f"{preset} {'compile' if compile_ else 'eager'} AC {'on' if ac else 'off'}"
            setting = Setting(preset, size["precision"], compile_, ac, s)
            rows.append(measured_row("throughput", name, device, budget, partial(measure, setting)))
    if fused and False in compiles:
        setting = Setting(preset, size["precision"], False, False, s, kernels="cpu")
        rows.append(
            measured_row(
                "throughput",
                f"{preset} eager AC off, fused kernels",
                device,
                budget,
                partial(measure, setting),
            )
        )
    return rows


def measured_row(section: str, name: str, device: torch.device, budget: Budget, measure) -> Row:
    """One row: what `measure()` returns, or why it has none (the time limit, an error). The device's
    memory is freed and compiled graphs dropped after each measurement, whatever happened."""
    if budget.left() < 30:
        return (section, name, "skipped: time limit")
    try:
        return (section, name, measure())
    except Exception as exc:
        return (section, name, error(exc))
    finally:
        free(device)
        torch._dynamo.reset()


def one_throughput(
    args, device, size, seq, fpt, ac, compile_, batches, budget, build=None, kernels="auto", **settings
) -> str:
    """`settings`: more Trainer settings (precision, attention, doc_mask); the precision defaults to
    the size's. `batches` is keyed by AC setting (the caller gives each row family its own)."""
    precision = settings.pop("precision", size["precision"])

    def make() -> Trainer:
        return Trainer(args, device, precision, ac, compile_, build, kernels, **settings)

    trainer = make()
    try:
        if ac in batches:  # compile reuses eager's batch: a new shape per probe would recompile
            batch, how = batches[ac], "eager's largest"
        else:
            (batch, oom), how = trainer.largest_batch(seq, size["max_batch"], budget), "largest that fits"
            batches[ac] = batch
            if oom and batch is not None:  # a step that died half-way leaves FSDP's state behind: rebuild
                del trainer
                free(device)
                trainer = make()
        if batch is None:
            return "no micro-batch fits (batch 1 ran out of memory)"
        sec = trainer.timed(batch, seq, size["warmup"], size["steps"])
        n_fp8 = len(trainer.fp8_layers)
    finally:
        del trainer
    tps = batch * seq / sec
    # fp8's MFU is against the bf16 peak (torchtitan's convention), so its gain shows as MFU
    peak, source = peak_flops(device, "bf16" if precision == "fp8" else precision, args, batch * seq)
    mfu = f"MFU {100 * fpt * tps / peak:.1f}%" if peak else f"MFU n/a ({source})"
    mem = (
        f", peak mem {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
        if device.type == "cuda"
        else ""
    )
    fp8 = f", fp8 in {n_fp8} projections" if precision == "fp8" else ""
    return f"micro-batch {batch} ({how}) × seq {seq}: {tps:,.0f} tokens/s, {1000 * sec:.0f} ms/step, {mfu}{mem}{fp8}"


# ---------------------------------------------------------------------------------------------
# memory levers: selective vs full activation checkpointing, chunked vs full loss


def lever_rows(preset, device, budget, size, batches) -> list[Row]:
    """Two pairs at the eager AC-off row's micro-batch (it fits both sides of each pair), eager:
    `train.activation_checkpointing` full vs selective (tokens/s and peak memory of each, and
    selective's speed-up over full: the target is ≥ 1.08×), and `train.loss` full (the kernels'
    logits) vs chunked (oreline.model.kernels.chunked_cross_entropy, train.loss_chunk_tokens' default).
    The levers are applied to the wrapped model, as session.build_model's order gives the same thing
    (FSDP2's hooks run around a block's replaced forward either way)."""
    from oreline.config import ModelConfig, TrainConfig
    from oreline.model.kernels.select import with_chunked_loss
    from oreline.model.presets import resolve_model_args
    from oreline.train.performance import enable_activation_checkpointing

    args = resolve_model_args(ModelConfig(preset=preset))
    seq = min(size["seq"], args.max_seq_len)
    chunk = TrainConfig().loss_chunk_tokens

    def ac(mode):
        return lambda t: enable_activation_checkpointing(t.model, mode)

    def chunked(t):
        t.model.kernels = with_chunked_loss(t.model.kernels, chunk)

    pairs = (
        ("AC full vs selective", (("full", ac("full")), ("selective", ac("selective")))),
        ("loss full vs chunked", (("full", lambda t: None), (f"chunked {chunk}", chunked))),
    )
    return [
        measured_row(
            "levers",
            f"{preset} eager {name}",
            device,
            budget,
            lambda sides=sides: lever_pair(args, device, size, seq, batches.get(False), sides),
        )
        for name, sides in pairs
    ]


def lever_pair(args, device, size, seq, batch, sides) -> str:
    if batch is None:
        return "no micro-batch (the eager AC-off row found none)"
    out, speed = [], []
    for label, apply in sides:
        trainer = Trainer(args, device, size["precision"], False, False)
        try:
            apply(trainer)
            sec = trainer.timed(batch, seq, size["warmup"], size["steps"])
        finally:
            del trainer
            free(device)
        mem = (
            f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
            if device.type == "cuda"
            else ""
        )
        speed.append(batch * seq / sec)
        out.append(f"{label} {speed[-1]:,.0f} tokens/s{mem}")
    return (
        f"micro-batch {batch} × seq {seq}: " + "; ".join(out) + f"; {sides[1][0]} ×{speed[1] / speed[0]:.2f}"
    )


# ---------------------------------------------------------------------------------------------
# torchtitan


def torchtitan_rows(preset, device, budget, size) -> list[Row]:
    try:
        import torchtitan  # noqa: F401
    except ImportError:
        return [("torchtitan", preset, "not installed (pip install torchtitan)")]
    from oreline.config import ModelConfig
    from oreline.model.presets import PRESETS, flops_per_token, resolve_model_args

    if budget.left() < 30:
        return [("torchtitan", preset, "skipped: time limit")]
    try:
        args = resolve_model_args(ModelConfig(preset=preset))
        seq = min(size["seq"], args.max_seq_len)
        build = titan_builder(args, PRESETS[preset], seq)
    except Exception as exc:
        return [("torchtitan", preset, error(exc))]
    fpt = flops_per_token(args, seq)
    batches: dict = {}  # the compiled row reuses eager's largest micro-batch, as oreline's does
    return [
        measured_row(
            "torchtitan",
            f"{preset} {'compile' if compile_ else 'eager'} AC off",
            device,
            budget,
            lambda compile_=compile_: one_throughput(
                args, device, size, seq, fpt, False, compile_, batches, budget, build
            ),
        )
        for compile_ in (False, True)
    ]


def compile_titan(model) -> None:
    """torch.compile per transformer block, as torchtitan's own `apply_compile` does."""
    layers = model.layers
    for name, block in list(layers.named_children()):
        layers.register_module(name, torch.compile(block, fullgraph=True))


def shard_titan(model, device: torch.device, precision: str):
    """FSDP2 as oreline.train.dist.wrap_model applies it (each block, then the root; bf16 params
    with fp32 reduction on CUDA), over torchtitan's block container."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (1,))
    if device.type == "cuda" and precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    layers = model.layers.values() if hasattr(model.layers, "values") else model.layers
    for block in layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def titan_builder(args, spec: dict, seq: int):
    """torchtitan's Llama 3 Transformer with oreline's shape (its module paths moved between releases)."""
    try:  # 0.1 and later
        from torchtitan.models.llama3.model.args import TransformerModelArgs
        from torchtitan.models.llama3.model.model import Transformer
    except ImportError:
        try:
            from torchtitan.models.llama3 import Transformer, TransformerModelArgs
        except ImportError:  # the 2024 layout
            from torchtitan.models.llama.model import ModelArgs as TransformerModelArgs
            from torchtitan.models.llama.model import Transformer

    targs = TransformerModelArgs(
        dim=args.dim,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        vocab_size=args.vocab_size,
        multiple_of=int(spec.get("multiple_of", 256)),
        ffn_dim_multiplier=spec.get("ffn_multiplier"),
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        max_seq_len=seq,
    )

    def build():
        model = Transformer(targs)
        with torch.no_grad():  # as torchtitan's trainer calls it: its initialisers copy into leaves
            model.init_weights()
        return model

    return build


# ---------------------------------------------------------------------------------------------
# fp8

TITAN_PROJECTIONS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")  # torchtitan's names of oreline's 7


def fp8_rows(preset, device, budget, size, measured: dict[Setting, str] | None = None) -> list[Row]:
    """The baseline precision (bf16 on CUDA) beside fp8 (torchao tensorwise, torchao's size filter,
    FSDP2 fp8 all-gather, as `train.precision = "fp8"` trains) on `preset`, AC off: eager, then
    torchtitan's model converted by the same torchao call (its own float8 converter's), then compiled.
    On a CPU fp8 is emulated and converts every projection: the rows show the path runs, not speed.
    `measured`: the throughput section's results by `Setting`; a baseline row that is the same
    measurement (the same Setting: preset, precision, compile setting, AC off, seq, kernels; the
    micro-batch is the largest that fits either way: the CPU run, or `--fp8-preset` naming a
    throughput preset) shows that result instead of timing it again (a compiled one would
    compile the same graph once more)."""
    from oreline.config import ModelConfig
    from oreline.model.presets import PRESETS, flops_per_token, resolve_model_args

    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        cap = torch.cuda.get_device_capability(device)
        return [
            ("fp8", preset, f"skipped: compute capability {cap[0]}.{cap[1]} has no fp8 tensor cores (8.9+)")
        ]
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return [("fp8", preset, "skipped: torchao not installed (pip install 'oreline[fp8]')")]
    args = resolve_model_args(ModelConfig(preset=preset))
    seq = min(size["seq"], args.max_seq_len)
    fpt = flops_per_token(args, seq)
    base, tag = size["precision"], "" if device.type == "cuda" else " emulated"
    batches: dict[str, dict] = {"base": {}, "fp8": {}, "titan": {}}  # compiled rows reuse eager's batch
    try:
        import torchtitan  # noqa: F401

        titan = titan_builder(args, PRESETS[preset], seq)
    except ImportError:
        titan = None

    def row(name: str, compile_: bool, precision: str, key: str, build=None) -> Row:
        return measured_row(
            "fp8",
            name,
            device,
            budget,
            lambda: one_throughput(
                args,
                device,
                size,
                seq,
                fpt,
                False,
                compile_,
                batches[key],
                budget,
                build,
                precision=precision,
            ),
        )

    rows: list[Row] = []
    for compile_ in (False, True):
        mode = "compile" if compile_ else "eager"
        same = (measured or {}).get(Setting(preset, base, compile_, False, seq), "")
        if "tokens/s" in same:
            rows.append(
                ("fp8", f"{preset} {base} {mode} AC off", f"{same} (the throughput row's measurement)")
            )
        else:
            rows.append(row(f"{preset} {base} {mode} AC off", compile_, base, "base"))
        rows.append(row(f"{preset} fp8 tensorwise{tag} {mode} AC off", compile_, "fp8", "fp8"))
        if titan is not None:
            rows.append(row(f"{preset} torchtitan fp8{tag} {mode} AC off", compile_, "fp8", "titan", titan))
        elif not compile_:
            rows.append(
                ("fp8", f"{preset} torchtitan fp8", "torchtitan not installed (pip install torchtitan)")
            )
    return rows


# ---------------------------------------------------------------------------------------------
# FlexAttention with doc_mask


def flex_equality(args, device: torch.device) -> str:
    """FlexAttention's document mask against the dense SDPA mask: the same weights (a 2-block model
    of the preset's width), fp32, random documents; logits, and on CUDA every gradient too (a CPU
    has no FlexAttention backward in torch 2.13)."""
    import dataclasses

    from oreline.model.llama import REFERENCE, Llama

    small = dataclasses.replace(args, n_layers=2, max_seq_len=min(args.max_seq_len, 1024))
    seq, batch = small.max_seq_len, 2
    torch.manual_seed(0)
    with torch.device(device):
        dense = Llama(small)
        flex = Llama(small, dataclasses.replace(REFERENCE, attention="flex"))
    flex.load_state_dict(dense.state_dict())
    ids = torch.randint(0, small.vocab_size, (batch, seq), device=device)
    labels, docs = torch.roll(ids, -1, dims=1), random_docs(batch, seq, device)
    grads = device.type == "cuda"
    outs = []
    for model in (dense, flex):
        with torch.set_grad_enabled(grads):
            logits = model(ids, docs)
            if grads:
                model(ids, docs, labels=labels).mean().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    d_logits = (outs[0][0] - outs[1][0]).abs().max().item()
    ok = torch.allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-4)
    text = f"max abs Δ logits {d_logits:.2e}"
    if grads:
        worst = max(
            ((outs[0][1][n] - g).abs().max() / outs[0][1][n].abs().max().clamp_min(1e-12)).item()
            for n, g in outs[1][1].items()
        )
        ok = ok and worst < 1e-3
        text += f", max relative Δ grad {worst:.2e}"
    else:
        text += " (forward only: FlexAttention has no CPU backward)"
    n_docs = int(docs[:, -1].max()) + 1
    return f"{'equal' if ok else 'DIFFERENT'}: {text}; fp32, {batch} × {seq} tokens in ~{n_docs} documents per row"


def flex_rows(preset, device, budget, size) -> list[Row]:
    """train.doc_mask = true: FlexAttention equal to the dense mask, then (CUDA) throughput of both,
    eager then compiled, AC off. torchtitan's block-causal FlexAttention masks at its tokenizer's EOS
    ids inside its own model call, so it has no row beside these."""
    from oreline.config import ModelConfig
    from oreline.model.presets import flops_per_token, resolve_model_args

    args = resolve_model_args(ModelConfig(preset=preset))
    rows = [
        measured_row(
            "flex attention",
            f"{preset} flex vs dense mask",
            device,
            budget,
            lambda: flex_equality(args, device),
        )
    ]
    if device.type != "cuda":
        rows.append(
            (
                "flex attention",
                f"{preset} doc_mask throughput",
                "skipped: no CUDA (no FlexAttention backward on a CPU)",
            )
        )
        return rows
    seq = min(size["seq"], args.max_seq_len)
    fpt = flops_per_token(args, seq)
    batches: dict[str, dict] = {"sdpa": {}, "flex": {}}
    for compile_ in (False, True):
        for attention in ("sdpa", "flex"):
            rows.append(
                measured_row(
                    "flex attention",
                    f"{preset} doc_mask {'FlexAttention' if attention == 'flex' else 'dense SDPA mask'} "
                    f"{'compile' if compile_ else 'eager'} AC off",
                    device,
                    budget,
                    lambda compile_=compile_, attention=attention: one_throughput(
                        args, device, size, seq, fpt, False, compile_, batches[attention], budget,
                        attention=attention, doc_mask=True,
                    ),
                )
            )  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------
# eager RMSNorm / RoPE candidates: the measurement train.kernels = "auto" reads on CUDA


def section_kernels(device: torch.device) -> list[Row]:
    """Forward + backward of each RMSNorm and RoPE candidate (oreline.model.kernels.cuda_choice) at a
    1b training shape in bf16; on CUDA the decision is recorded for this GPU, and "auto" takes it."""
    from oreline.model.kernels import cuda_choice

    if device.type == "cuda":
        measured = cuda_choice.measure(device)
        picked, path = cuda_choice.record(torch.cuda.get_device_name(device), measured)
        where = f"recorded in {path}: train.kernels=auto takes it on this GPU"
    else:  # tiny shapes: the code runs; CPU timings decide nothing
        measured = cuda_choice.measure(
            device, tokens=256, dim=256, n_heads=4, head_dim=64, reps=2, dtype=torch.float32
        )
        picked, where = cuda_choice.decide(measured), "not recorded (a CPU: the decision is for CUDA)"
    rows = []
    for fn, times in measured.items():
        shown = ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items())
        rows.append(("kernels", f"{fn} fwd+bwd eager", f"{shown}; chosen: {picked[fn]}; {where}"))
    return rows


# ---------------------------------------------------------------------------------------------
# async checkpoint stall


def section_async(device: torch.device, budget: Budget, tmp: Path) -> list[Row]:
    from oreline.config import CheckpointConfig, ModelConfig
    from oreline.model.presets import resolve_model_args
    from oreline.train.checkpoint import async_save, save
    from oreline.train.checkpoint.load import load_model_state

    def host_copy(model) -> dict[str, torch.Tensor]:
        sd = model.state_dict()  # DTensors under FSDP2: one rank holds the whole of each
        return {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
            for k, v in sd.items()
        }

    preset = "125m" if device.type == "cuda" else "debug"
    args = resolve_model_args(ModelConfig(preset=preset))
    size = sizes(device)
    seq, batch = min(size["seq"], args.max_seq_len), 4 if device.type == "cuda" else 2
    before = async_save.ASYNC_ON_CPU
    async_save.ASYNC_ON_CPU = True  # on a CPU the same background path, staging CPU tensors
    rows: list[Row] = []
    with one_rank_group(device):
        trainer = Trainer(args, device, size["precision"], False, False)
        try:
            base = trainer.timed(batch, seq, 2, 3)
            # async twice: the first save makes the pinned staging buffers that later ones reuse
            for step, mode in enumerate(("blocking", "async, first save", "async, second save"), 1):
                trainer.step(batch, seq)
                trainer.sync()
                want = host_copy(trainer.model)  # what the checkpoint must hold: the next step changes it
                t0 = time.perf_counter()
                path = save.save_checkpoint(
                    tmp / ("ckpt-blocking" if mode == "blocking" else "ckpt-async"),
                    step,
                    trainer.model,
                    trainer.optimizer,
                    {"config": {}, "model_args": args.to_dict()},
                    cfg=CheckpointConfig(async_save=mode != "blocking", every=1),
                )
                stall = time.perf_counter() - t0
                after = trainer.timed(batch, seq, 0, 1)  # the step that overlaps the background write
                async_save.wait_for_pending_save()
                total = save.last_save_stats().get("total_s", stall)
                held, _, _ = load_model_state(path)
                same = set(held) == set(want) and all(torch.equal(held[k].cpu(), want[k]) for k in want)
                rows.append(
                    (
                        "async checkpoint",
                        f"{preset} {mode}",
                        f"step stalled {stall:.2f} s (save total {total:.2f} s); next step {1000 * after:.0f} ms "
                        f"vs {1000 * base:.0f} ms ordinary; the checkpoint "
                        + (
                            "holds the weights at the save"
                            if same
                            else "DIFFERS from the weights at the save"
                        ),
                    )
                )
        finally:
            async_save.wait_for_pending_save()
            async_save.ASYNC_ON_CPU = before
            del trainer
            free(device)
    return rows


# ---------------------------------------------------------------------------------------------
# train(): NaN recovery and host syncs on ordinary steps


def build_data(root: Path) -> tuple[Path, Path]:
    """The start of Austen's Emma from the samples → a 512-token BPE (the debug preset's) → token shards."""
    from oreline.config import TokenizeConfig, TokenizerConfig, samples_dir
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.tokens.train_bpe import train_tokenizer

    docs = root / "emma.jsonl"
    with zipfile.ZipFile(samples_dir() / "english-prose" / "nltk-gutenberg.zip") as zf, docs.open("w") as fh:
        text = zf.read("gutenberg/austen-emma.txt").decode("utf-8", "replace")[:200_000]  # ~60k tokens
        for i in range(0, len(text), 1500):
            fh.write(json.dumps({"id": f"emma-{i}", "text": text[i : i + 1500]}) + "\n")
    train_tokenizer([docs], root / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=10))
    tokenize_corpus([docs], root / "tokenizer", root / "tokens", TokenizeConfig(val_fraction=0.1, workers=1))
    return root / "tokens", root / "tokenizer"


def train_config(root: Path, data: tuple[Path, Path], name: str, device: torch.device, **dotted):
    from oreline.config import _set_dotted, config_from_dict, load_config, to_dict

    tree = to_dict(load_config())
    base = {
        "run.runs_dir": str(root / "runs"),
        "run.name": name,
        "model.preset": "debug",
        "train.tokens": str(data[0]),
        "train.tokenizer": str(data[1]),
        "train.seq_len": 64,
        "train.micro_batch": 4,
        "train.steps": 8,
        "train.log_every": 1000,
        "train.eval_every": 0,
        "train.eval_sequences": 4,
        "train.optim.warmup_steps": 1,
        "train.precision": "bf16" if device.type == "cuda" else "fp32",
        "checkpoint.every": 0,
        "eval.prompts": [],
        "train.eval_tasks": [],  # the demo's downstream tasks at the last step: not what these rows measure
    }
    base.update({k.replace("__", "."): v for k, v in dotted.items()})
    for key, value in base.items():
        _set_dotted(tree, key, value)
    return config_from_dict(tree)


def train_run(cfg) -> dict:
    from rich.console import Console

    from oreline.train.loop import train

    return train(cfg, resume="none", console=Console(file=io.StringIO()))


def run_train(cfg) -> list[dict]:
    out = train_run(cfg)
    lines = (Path(out["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def section_nan(device: torch.device, root: Path, data) -> list[Row]:
    recs = run_train(train_config(root, data, "nan", device, train__debug__inject_nan_at_step=3))
    events = [r for r in recs if r["type"] == "event" and r.get("step") == 3]
    trains = [r for r in recs if r["type"] == "train"]
    end = next((r for r in recs if r["type"] == "end"), {})
    last = trains[-1] if trains else {}
    ok = events and last.get("step") == 8 and math.isfinite(last.get("loss", math.nan))
    what = (
        ", ".join(f"{e.get('action')}: {e.get('message', '')[:80]}" for e in events) or "no event at step 3"
    )
    return [
        (
            "NaN injected",
            f"debug preset on {device.type}, step 3 of 8",
            f"{'recovered' if ok else 'NOT recovered'} ({what}); step {last.get('step')} loss "
            f"{last.get('loss', float('nan')):.3f}, skipped steps {end.get('skipped_steps', '?')}",
        )
    ]


def section_syncs(device: torch.device, root: Path, data) -> list[Row]:
    """Every synchronising CUDA call of a 20-step run, attributed to the step it happened in.

    The loop brackets each step with `StepReads.start()` / `.stop(step, why)` (`why` empty on an
    ordinary step: no log, eval or checkpoint); wrapping those two tells which step a sync fell in.
    `train.debug.count_host_reads` also counts, per step, the host reads seen at dispatch."""
    if device.type != "cuda":
        return [("syncs", "set_sync_debug_mode on ordinary steps", "skipped: no CUDA")]
    from oreline.train import host_reads

    steps, log_every = 20, 10
    cfg = train_config(
        root, data, "syncs", device, train__steps=steps, train__log_every=log_every,
        train__debug__count_host_reads=True,
    )  # fmt: skip
    src = str(Path(__file__).resolve().parents[1] / "src")
    running: list[str] | None = None  # the sites seen in the step running now (None: between steps)
    outside: Counter[str] = Counter()  # setup, the end of the run
    per_step: dict[int, tuple[list[str], list[str]]] = {}  # step -> (why, sites)

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(src)]
        site = (
            f"{Path(frames[-1].filename).name}:{frames[-1].lineno} ({frames[-1].name})" if frames else "torch"
        )
        if running is None:
            outside[site] += 1
        else:
            running.append(site)

    start, stop = host_reads.StepReads.start, host_reads.StepReads.stop

    def start_step(self):
        nonlocal running
        running = []
        start(self)

    def stop_step(self, step, why):
        nonlocal running
        per_step[step] = (list(why), running or [])
        running = None
        stop(self, step, why)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        saved, warnings.showwarning = warnings.showwarning, record
        host_reads.StepReads.start, host_reads.StepReads.stop = start_step, stop_step
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = train_run(cfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = saved
            host_reads.StepReads.start, host_reads.StepReads.stop = start, stop
    reads_file = Path(out["run_dir"]) / "debug" / "host-reads-rank00000.json"
    reads = {e["step"]: e["reads"] for e in json.loads(reads_file.read_text())} if reads_file.exists() else {}
    ordinary = [n for n, (why, _) in per_step.items() if not why]
    other = [n for n, (why, _) in per_step.items() if why]
    sync_ord = Counter(site for n in ordinary for site in per_step[n][1])
    sync_other = Counter(site for n in other for site in per_step[n][1])

    def sites(c: Counter) -> str:
        return "; ".join(f"{s} ×{k}" for s, k in c.most_common(4))

    text = (
        f"{len(ordinary)} ordinary steps: {sum(sync_ord.values())} syncs"
        + (f" ({sites(sync_ord)})" if sync_ord else "")
        + f", {sum(reads.get(n, 0) for n in ordinary)} host reads at dispatch; "
        f"{len(other)} logging steps ({', '.join(str(n) for n in sorted(other))}): "
        f"{sum(sync_other.values())} syncs"
        + (f" ({sites(sync_other)})" if sync_other else "")
        + f", {sum(reads.get(n, 0) for n in other)} host reads; outside steps: {sum(outside.values())} syncs"
    )
    return [("syncs", f"set_sync_debug_mode('warn'), {steps} steps, log every {log_every}", text)]


# ---------------------------------------------------------------------------------------------
# the table


def error(exc: BaseException) -> str:
    if isinstance(exc, TimeLimit):
        return f"stopped: {exc}"
    return f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def render(rows: list[Row], header: str) -> str:
    rows = [tuple(c.replace("|", "¦") for c in r) for r in rows]  # a "|" in a cell would split it
    widths = [max(len(r[i]) for r in [("section", "setting", "result"), *rows]) for i in range(2)]
    lines = [header, "", f"| {'section':<{widths[0]}} | {'setting':<{widths[1]}} | result |"]
    lines.append(f"|{'-' * (widths[0] + 2)}|{'-' * (widths[1] + 2)}|--------|")
    lines += [f"| {a:<{widths[0]}} | {b:<{widths[1]}} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


SECTIONS = ("env", "nan", "syncs", "async", "kernels", "throughput", "flex", "fp8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument(
        "--preset", default=None, help="comma-separated presets (default: 1b,125m on CUDA, debug on CPU)"
    )
    ap.add_argument(
        "--fp8-preset", default=None, help="preset of the fp8 rows (default: 3b on CUDA, debug on CPU)"
    )
    ap.add_argument("--time-limit", type=float, default=480.0, help="seconds for the whole run")
    ap.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    ap.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, from {','.join(SECTIONS)} (default: all)",
    )
    a = ap.parse_args(argv)
    chosen = {x.strip() for x in a.sections.split(",") if x.strip()}
    if chosen - set(SECTIONS):
        ap.error(
            f"--sections: unknown {', '.join(sorted(chosen - set(SECTIONS)))}; choose from {', '.join(SECTIONS)}"
        )
    budget = Budget(a.time_limit)
    # FSDP2 warns that the model returns a view (the (B, T) loss): nothing here writes into it
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    t_start = time.perf_counter()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # train() picks CUDA when it sees one
    if cuda:
        torch.cuda.set_device(device)
    presets = a.preset.split(",") if a.preset else (["1b", "125m"] if cuda else ["debug"])
    size = sizes(device)
    rows: list[Row] = []

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data: list = []

        def section(name: str, fn, min_left: float = 10.0, key: str = "") -> None:
            if (key or name) not in chosen:
                return
            if budget.left() < min_left:
                rows.append((name, "", "skipped: time limit"))
                return
            try:
                try:
                    rows.extend(fn())
                finally:
                    free(device)
            except Exception as exc:
                rows.append((name, "", error(exc)))

        section("env", lambda: section_env(device, tmp))
        measured: dict[Setting, str] = {}  # the throughput rows' results, for fp8's baselines

        def preset_rows(preset: str) -> list[Row]:
            """Eager, then the peer, then compiled: what matters most is measured first, so the
            time limit cuts the compiled rows (compilation takes the longest) before the peer."""
            batches: dict = {}
            with one_rank_group(device):
                out = throughput_rows(preset, device, budget, size, (False,), batches, True, measured)
                out += torchtitan_rows(preset, device, budget, size)
                out += lever_rows(preset, device, budget, size, batches)
                out += throughput_rows(preset, device, budget, size, (True,), batches, measured=measured)
            return out

        def nan() -> list[Row]:
            data[:] = data or [build_data(tmp)]
            return section_nan(device, tmp, data[0])

        def syncs() -> list[Row]:
            if device.type != "cuda":
                return section_syncs(device, tmp, None)
            data[:] = data or [build_data(tmp)]
            return section_syncs(device, tmp, data[0])

        # the small sections first (they need seconds), the long throughput ones with what is left
        later: list[Row] = []
        rows_before = len(rows)
        section("NaN injected", nan, key="nan")
        section("syncs", syncs)
        section("async checkpoint", lambda: section_async(device, budget, tmp), key="async")
        later, rows[rows_before:] = rows[rows_before:], []
        # the kernels measurement first: the throughput rows' train.kernels = "auto" reads it
        section("kernels", lambda: section_kernels(device))
        fp8_preset = a.fp8_preset or ("3b" if cuda else "debug")
        for i, preset in enumerate(presets):
            section("throughput", lambda preset=preset: preset_rows(preset), min_left=30)
            if i == 0:  # the new paths on the largest preset, before the smaller presets' rows
                with one_rank_group(device):
                    section("flex attention", lambda p=preset: flex_rows(p, device, budget, size), 30, "flex")
                    section("fp8", lambda: fp8_rows(fp8_preset, device, budget, size, measured), min_left=30)
        rows.extend(later)
        budget.stop()

    head = (
        f"oreline gpu_check on {torch.cuda.get_device_name(device) if cuda else 'CPU'}: torch {torch.__version__}, "
        f"presets {', '.join(presets)}, {size['precision']}, {time.perf_counter() - t_start:.0f} s of "
        f"{a.time_limit:.0f} s"
    )
    table = render(rows, head)
    print(table)
    if a.out:
        a.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
