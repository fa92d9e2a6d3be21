"""A torchrun worker script for tests/train/test_distributed.py: DDP failure modes on real components.

Run as `python -m torch.distributed.run --standalone --nproc_per_node=2 dist_helpers.py TOKENS_DIR`.
Each scenario builds a fresh debug-preset Llama (plus, where asked, a parameter the forward never
uses), wraps it with `oreline.train.dist.wrap_model` and runs two optimizer steps of the loop's
own `forward_backward` (2 micro-batches each, the first under no_sync) on batches of the prose
token shards. Rank 0 prints one `RESULT {json}` line per scenario:

- unused_detected: find_unused_parameters=false + an unused parameter → our DistributedError naming it
- unused_allowed: find_unused_parameters=true + the unused parameter → trains
- ours_checkpointing: find_unused_parameters=true + oreline's (non-reentrant) activation checkpointing
  → trains, gradients equal to the same model without checkpointing
- reentrant_no_unused: reentrant checkpointing, find_unused_parameters=false → works in torch 2.13
- reentrant_unused: reentrant checkpointing, find_unused_parameters=true → DDP's "mark a variable
  ready only once" error (last: DDP's reducer is left broken)
- TIMEOUT: the process group's collective timeout (train.dist_timeout_s=321)
- agree: `dist.agree_on_step` (device tensors) when only rank 1 sees a NaN grad norm, and when ranks
  differ in the last bits of a finite one: every rank gets the same values; `dist.any_rank` of a
  stop request rank 1 alone got (each rank prints its own line)
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import traceback

import torch
import torch.distributed as tdist
from torch import nn

from oreline.config import ModelConfig, TrainConfig
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.tokens.loader import TokenLoader
from oreline.train import dist
from oreline.train.batch import to_device
from oreline.train.performance import enable_activation_checkpointing
from oreline.train.session import _nullcontext
from oreline.train.step import forward_backward


def reentrant_checkpointing(model: Llama) -> None:
    from torch.utils.checkpoint import checkpoint

    for block in model.model.layers:
        inner = block.forward

        @functools.wraps(inner)
        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=True, **kwargs)

        block.forward = forward


def build(unused: bool, checkpointing: str | None) -> Llama:
    torch.manual_seed(0)
    model = Llama(resolve_model_args(ModelConfig(preset="debug"), 512))
    if unused:
        model.unused_head = nn.Linear(8, 8)  # registered, never called by forward
    if checkpointing == "ours":
        enable_activation_checkpointing(model)
    elif checkpointing == "reentrant":
        reentrant_checkpointing(model)
    return model


def two_steps(model: Llama, info: dist.DistInfo, find_unused: bool, tokens: str) -> dict:
    cfg = TrainConfig(parallel="ddp", find_unused_parameters=find_unused)
    ddp = dist.wrap_model(model, cfg, info)
    loader = TokenLoader(
        tokens, seq_len=32, micro_batch=2, seed=1, rank=info.rank, world_size=info.world_size
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        batches = [to_device(loader.next_batch(), info.device) for _ in range(2)]
        n = torch.tensor([float(sum(int((b.labels != -100).sum()) for b in batches))], dtype=torch.float64)
        forward_backward(
            ddp, batches, float(dist.all_reduce_sum(n)[0]), info, _nullcontext, loader.bos_id, loader.eos_id
        )
        if step == 0:
            dist.check_unused_parameters(model, ddp)
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"ok": True, "q_grad_sum": float(grad.double().sum())}


def scenario(
    name: str, info: dist.DistInfo, tokens: str, unused: bool, find_unused: bool, checkpointing: str | None
) -> dict:
    try:
        out = two_steps(build(unused, checkpointing), info, find_unused, tokens)
    except Exception as exc:  # the error IS the result of the failing scenarios
        out = {
            "ok": False,
            "error": type(exc).__name__,
            "message": str(exc)[:600],
            "where": traceback.format_exc(limit=2)[-300:],
        }
    if info.is_main:
        print("RESULT " + json.dumps({"scenario": name, **out}), flush=True)
    return out


def main() -> None:
    tokens = sys.argv[1]
    info = dist.init_distributed(TrainConfig(parallel="ddp", dist_timeout_s=321))
    backend = tdist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    if info.is_main:  # train.dist_timeout_s reached the collectives (gloo's options hold it)
        print("TIMEOUT " + json.dumps({"seconds": backend.options._timeout.total_seconds()}), flush=True)
    scenario("unused_detected", info, tokens, unused=True, find_unused=False, checkpointing=None)
    dist.barrier()  # the un-reduced bucket above leaves no collective in flight: ranks stay in step
    scenario("unused_allowed", info, tokens, unused=True, find_unused=True, checkpointing=None)
    scenario("ours_checkpointing", info, tokens, unused=True, find_unused=True, checkpointing="ours")
    scenario("reentrant_no_unused", info, tokens, unused=False, find_unused=False, checkpointing="reentrant")
    f64 = functools.partial(torch.tensor, dtype=torch.float64)
    nan_on_one = dist.agree_on_step(f64(2.5), f64(math.nan if info.rank == 1 else 1.0))
    differ = dist.agree_on_step(f64(2.5), f64(1.0 + 1e-12 * info.rank))
    stop = [dist.any_rank(info.rank == 1), dist.any_rank(False)]
    agree = {
        "rank": info.rank,
        "nan_on_one": [repr(float(v)) for v in nan_on_one],
        "differ": [repr(float(v)) for v in differ],
        "stop": stop,
    }
    # both ranks print into one log: one write() per line, which O_APPEND keeps whole (print writes
    # the text and its newline in two calls, and CI once read "AGREE {...}AGREE {...}\n\n")
    sys.stdout.flush()
    os.write(1, ("AGREE " + json.dumps(agree) + "\n").encode())
    scenario("reentrant_unused", info, tokens, unused=True, find_unused=True, checkpointing="reentrant")
    dist.cleanup()
    dist.leave(0)  # as `oreline train` ends a rank (oreline.train.dist.leave says why)


if __name__ == "__main__":
    main()
