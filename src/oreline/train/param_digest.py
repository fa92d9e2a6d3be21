"""A digest of the model's parameters, written by every rank (`train.debug.param_digest`).

Data-parallel ranks must hold identical weights after every step; tests compare the files the
ranks write at the end of a run (tests/train/test_distributed.py) to prove it, on any world size
and with sharded (FSDP2) parameters.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from oreline.io import write_atomic


def param_digest(model: nn.Module) -> str:
    """sha256 of every parameter's full value (FSDP shards gathered), by name; every rank must call it."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        h.update(name.encode())
        h.update(t.to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def write_param_digest(model: nn.Module, run_root: Path, rank: int) -> Path:
    """`<run>/debug/params-rankNNNNN.sha256` (train.debug.param_digest: ranks compared by tests)."""
    digest = param_digest(model)
    path = Path(run_root) / "debug" / f"params-rank{rank:05d}.sha256"
    write_atomic(path, digest + "\n")
    return path
