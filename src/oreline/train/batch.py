"""The global batch: its arithmetic, the check that every step got it, and moving it to the device.

global batch = micro_batch × grad_accum × world × seq_len tokens. `global_batch` computes it and
refuses a config whose `train.global_batch_tokens` says otherwise (before anything is loaded);
`check_batch_tokens` stops a run whose loader returned short batches instead of training on a
smaller batch than the one stated; `to_device` moves a loader batch to the training device;
`next_global_batch` fetches one step's `GlobalBatch`: its micro-batches, checked, and the target
count of the whole global batch, which normalises the step's loss.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from oreline.config import Config
from oreline.errors import TrainingError
from oreline.train import comm_timing, dist


def to_device(batch: Any, device: torch.device) -> Any:
    """The loader's batch with long tensors on the training device (doc_ids may be None)."""

    def move(x: Any) -> torch.Tensor | None:
        if x is None:
            return None
        t = torch.as_tensor(x, dtype=torch.long)
        if device.type == "cuda":  # a copy from pageable memory may wait for the stream; from pinned, never
            t = t.pin_memory()
        return t.to(device=device, non_blocking=True)

    return _Batch(move(batch.input_ids), move(batch.labels), move(getattr(batch, "doc_ids", None)))


@dataclass
class _Batch:
    input_ids: torch.Tensor
    labels: torch.Tensor
    doc_ids: torch.Tensor | None


def global_batch(cfg: Config, world: int) -> dict[str, int | None]:
    """The global batch arithmetic; a TrainingError when it contradicts train.global_batch_tokens."""
    tc = cfg.train
    sequences = tc.micro_batch * tc.grad_accum * world
    tokens = sequences * tc.seq_len
    b = {
        "micro": tc.micro_batch,
        "accum": tc.grad_accum,
        "world": world,
        "seq_len": tc.seq_len,
        "sequences": sequences,
        "tokens": tokens,
        "configured_tokens": tc.global_batch_tokens,
    }
    if tc.global_batch_tokens is not None and tc.global_batch_tokens != tokens:
        need = tc.global_batch_tokens / (tc.micro_batch * world * tc.seq_len)
        raise TrainingError(
            f"global batch = micro {tc.micro_batch} × accum {tc.grad_accum} × world {world} × seq_len {tc.seq_len} "
            f"= {tokens:,} tokens, but train.global_batch_tokens = {tc.global_batch_tokens:,}",
            f"set train.grad_accum={need:g} (if whole), change train.micro_batch / seq_len / the number of "
            "processes, or unset train.global_batch_tokens",
        )
    return b


def describe_batch(b: dict[str, int | None]) -> str:
    return (
        f"global batch = micro {b['micro']} × accum {b['accum']} × world {b['world']} = "
        f"{b['sequences']:,} sequences = {b['tokens']:,} tokens"
    )


def check_batch_tokens(
    batches: list[_Batch], b: dict[str, int | None], info: dist.DistInfo, step: int
) -> int:
    """Tokens this rank consumed; a shortfall against the stated batch stops the run. Returns global tokens."""
    local = sum(int(x.input_ids.numel()) for x in batches)
    want = int(b["micro"]) * int(b["accum"]) * int(b["seq_len"])
    if local != want:
        shapes = ", ".join(str(tuple(x.input_ids.shape)) for x in batches)
        raise TrainingError(
            f"step {step}: rank {info.rank} got {local:,} tokens ({shapes}) instead of micro {b['micro']} × accum "
            f"{b['accum']} × seq_len {b['seq_len']} = {want:,}",
            "the token loader returned short batches: check the token shards (oreline tokenize) hold enough data",
        )
    return local * info.world_size


@dataclass
class GlobalBatch:
    """One step's data on this rank, fetched before any forward: `n_targets` (targets, labels ≠ -100,
    over every micro-batch and rank) divides the loss, so it is known before the first backward.

    n_targets stays a device tensor (reading it would wait for the device); `tokens` is global;
    `data_seconds` is the time spent waiting for the loader (the train record's data_ms).
    """

    micro_batches: list[_Batch]
    n_targets: torch.Tensor
    tokens: int
    data_seconds: float


def next_global_batch(
    loader: Any, device: torch.device, b: dict[str, int | None], info: dist.DistInfo, step: int
) -> GlobalBatch:
    """Step `step`'s `grad_accum` micro-batches from `loader`, on the device, checked against the stated batch."""
    t0 = time.perf_counter()
    micro = [to_device(loader.next_batch(), device) for _ in range(int(b["accum"]))]
    data_seconds = time.perf_counter() - t0
    tokens = check_batch_tokens(micro, b, info, step)
    counts = torch.stack([(x.labels != -100).sum() for x in micro]).sum().double().reshape(1)
    with comm_timing.COMM.span():
        n_targets = dist.all_reduce_sum(counts)[0]
    return GlobalBatch(micro, n_targets, tokens, data_seconds)
