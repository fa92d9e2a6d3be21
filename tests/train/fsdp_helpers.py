"""A torchrun worker script for tests/train/test_meta_init.py: FSDP2/HSDP set-up on real components.

Run as `python -m torch.distributed.run --standalone --nproc_per_node=N fsdp_helpers.py PARALLEL`
(PARALLEL: fsdp, or hsdp with train.hsdp_shard_size=2). Rank 0 prints one `RESULT {json}` line
per scenario:

- init_tied / init_untied: the model `session.build_model` builds on the meta device, shards and
  initialises from train.seed, gathered whole (full_tensor), against `torch.manual_seed(seed);
  Llama(args)` in this process: every tensor bit-identical; plus its FSDP units (which modules
  are FSDP2 modules and whether each reshards after forward);
- grad_sync: after the first of two micro-batches, whether every parameter already holds its
  sharded gradient (train.fsdp_grad_sync="micro_batch": reduce-scattered, nothing unsharded kept)
  or none does ("step": the unsharded gradients wait for the last micro-batch); "cpu": the
  micro_batch run again with the CPU kernels (fused output loss);
- tied_grad: a tied model (one table for the embedding and the output projection, the root
  unit's) trained through two micro-batches per rank with both kernel sets: the largest
  gradient difference from one process's plain model over every rank's batches (relative to
  the largest gradient), and how often the root freed its gathered table during backward, right
  after the output layers' backward (model/tied.py), with the table sharded then;
- reduce_scatter: which reduce-scatter FSDP2 runs in every unit (on gloo the in-place all-reduce
  of oreline.train.gloo_reduce_scatter; with train.profile the timed one wrapping it), the order
  of the blocks' all-gathers and reduce-scatters in the first backward (on CPU without FSDP2's
  backward prefetch: a block is gathered after the one behind it has reduced, `no_backward_prefetch`),
  and whether a tied model's fp32 losses and gradients after two micro-batches are bitwise those
  of FSDP2's defaults (its reduce-scatter and its backward prefetch restored), with and without
  train.profile;
- generate: all-gathers counted (FSDP2's "FSDP::all_gather" profiler labels) while 6 tokens are generated through the
  loop's `generations`, and the tokens, equal to the plain model's.
"""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import torch

from oreline.config import Config, ModelConfig, TrainConfig
from oreline.model.kernels.select import cpu_kernels
from oreline.model.llama import REFERENCE, Llama, generate
from oreline.model.presets import resolve_model_args
from oreline.train import dist
from oreline.train.session import build_model


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in model.state_dict().items():
        out[name] = t.full_tensor() if hasattr(t, "full_tensor") else t
    return out


def units(model: torch.nn.Module) -> list[str]:
    from torch.distributed.fsdp import FSDPModule

    names = []
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group  # noqa: SLF001 (reading the layout)
            reshard = group is not None and group.post_forward_mesh_info is not None
            names.append(f"{name or '<root>'}:{'reshard' if reshard else 'keep'}")
    return names


def init_scenario(cfg: TrainConfig, info: dist.DistInfo, tied: bool) -> dict:
    args = resolve_model_args(ModelConfig(preset="debug", tie_embeddings=tied), 512)
    model, _ = build_model(args, Llama(args).kernels, cfg, info)
    got = full_state(model)
    torch.manual_seed(cfg.seed)
    want = Llama(args).state_dict()
    differ = [k for k in want if not torch.equal(want[k], got[k])]
    return {
        "differ": differ,
        "n": len(want),
        "units": units(model),
        "local_rows": int(model.model.layers[0].mlp.up_proj.weight.to_local().shape[0]),
        "rope_equal": bool(torch.equal(model.rope_cos, Llama(args).rope_cos)),
    }


def grad_sync_scenario(cfg: TrainConfig, info: dist.DistInfo) -> dict:
    args = resolve_model_args(ModelConfig(preset="debug"), 512)
    g = torch.Generator().manual_seed(info.rank)
    batches = []
    for _ in range(2):
        ids = torch.randint(0, 512, (2, 16), generator=g)
        batches.append(SimpleNamespace(input_ids=ids, doc_ids=None, labels=torch.roll(ids, -1, 1)))
    out = {}
    # the last run computes with the CPU kernels (the fused output loss): neither kernel set's loss
    # may reach FSDP2 as a view (the test reads the log for FSDP2's warning)
    for mode, kernels in (("micro_batch", REFERENCE), ("step", REFERENCE), ("cpu", cpu_kernels("blas"))):
        model, train_model = build_model(args, kernels, cfg, info)
        held = []
        for i, b in enumerate(batches):  # as forward_backward runs them (dist.sync_context)
            with dist.sync_context(train_model, i == 1, mode != "step"):
                train_model(b.input_ids, labels=b.labels).sum().backward()
            held.append(all(p.grad is not None for p in model.parameters()))
        out[mode] = held
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.full_tensor()
        out[mode + "_q_grad"] = grad.double().abs().sum().item()
    return out


def tied_grad_scenario(cfg: TrainConfig, info: dist.DistInfo) -> dict:
    from torch.distributed.tensor import DTensor

    args = resolve_model_args(ModelConfig(preset="debug", tie_embeddings=True), 512)

    def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(100 + rank)
        ids = [torch.randint(0, 512, (2, 16), generator=g) for _ in range(2)]
        return [(x, torch.roll(x, -1, 1)) for x in ids]

    out = {}
    for name, kernels in (("reference", REFERENCE), ("cpu", cpu_kernels("blas"))):
        model, train_model = build_model(args, kernels, cfg, info)
        freed = []
        reshard = model.after_tied_output_backward

        def spy(reshard=reshard, model=model, freed=freed) -> None:
            reshard()
            freed.append(isinstance(model.model.embed_tokens.weight, DTensor))

        model.after_tied_output_backward = spy
        for i, (ids, labels) in enumerate(batches(info.rank)):
            with dist.sync_context(train_model, i == 1):
                train_model(ids, labels=labels).sum().backward()
        torch.manual_seed(cfg.seed)
        plain = Llama(args, kernels)
        for rank in range(info.world_size):  # FSDP2 averages over the ranks
            for ids, labels in batches(rank):
                (plain(ids, labels=labels).sum() / info.world_size).backward()
        want = dict(plain.named_parameters())
        worst, top = 0.0, 0.0
        for pname, p in model.named_parameters():
            got = p.grad.full_tensor()
            worst = max(worst, (got - want[pname].grad).abs().max().item())
            top = max(top, want[pname].grad.abs().max().item())
        out[name] = {"rel_err": worst / top, "freed": freed}
    return out


def reduce_scatter_scenario(cfg: TrainConfig, info: dist.DistInfo) -> dict:

    from torch.distributed.fsdp import FSDPModule

    from oreline import compat

    args = resolve_model_args(ModelConfig(preset="debug", tie_embeddings=True), 512)
    g = torch.Generator().manual_seed(200 + info.rank)
    batches = [torch.randint(0, 512, (2, 16), generator=g) for _ in range(2)]

    def comms(model: torch.nn.Module) -> list[str]:
        names = []
        for m in model.modules():
            if isinstance(m, FSDPModule):
                comm = m._get_fsdp_state()._fsdp_param_group._reduce_scatter_comm  # noqa: SLF001
                inner = getattr(comm, "inner", None)
                names.append(type(comm).__name__ + (f"({type(inner).__name__})" if inner is not None else ""))
        return sorted(set(names))

    def train(
        tc: TrainConfig, stock: bool
    ) -> tuple[list[float], dict[str, torch.Tensor], list[str], list[str]]:
        from torch.profiler import ProfilerActivity, profile

        model, train_model = build_model(args, REFERENCE, tc, info)
        if stock:  # FSDP2's default reduce-scatter and backward prefetch, as wrap_model left them before
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_custom_reduce_scatter(compat.fsdp_reduce_scatter_base()())
                    m._get_fsdp_state()._states_to_backward_prefetch = []  # noqa: SLF001 (FSDP2's default)
        losses, order = [], []
        for i, ids in enumerate(batches):
            with dist.sync_context(train_model, i == 1):
                loss = train_model(ids, labels=torch.roll(ids, -1, 1)).sum()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    loss.backward()
            losses.append(loss.item())
            if i == 0:  # the blocks' all-gathers and reduce-scatters in backward, in time order
                events = sorted(prof.events(), key=lambda e: e.time_range.start)
                for e in events:
                    m = re.fullmatch(
                        r"FSDP::(all_gather|post_backward_reduce) \(model\.layers\.(\d+)\)", e.name
                    )
                    if m:
                        order.append(("gather " if m[1] == "all_gather" else "reduce ") + m[2])
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        return losses, grads, comms(model), order

    out = {}
    for name, tc in (("plain", cfg), ("profile", cfg.model_copy(update={"profile": True}))):
        losses, grads, installed, order = train(tc, stock=False)
        ref_losses, ref_grads, stock, stock_order = train(tc, stock=True)
        out[name] = {
            "comm": installed,
            "stock_comm": stock,
            "order": order,
            "stock_order": stock_order,
            "losses_equal": losses == ref_losses,
            "grads_differ": [n for n in ref_grads if not torch.equal(grads[n], ref_grads[n])],
            "grad_norm": sum(v.double().square().sum().item() for v in grads.values()) ** 0.5,
        }
    return out


def generate_scenario(cfg: TrainConfig, info: dist.DistInfo) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from oreline.train.loop import generations

    class Tok:  # ids in, ids out: the prompt is its own token list
        bos_id, eos_id = 1, None

        def encode(self, text: str) -> list[int]:
            return [int(x) for x in text.split()]

        def decode(self, ids: list[int]) -> str:
            return " ".join(map(str, ids))

    args = resolve_model_args(ModelConfig(preset="debug"), 512)
    model, _ = build_model(args, Llama(args).kernels, cfg, info)
    torch.manual_seed(cfg.seed)
    plain = Llama(args)
    full = Config()
    full.eval.max_new_tokens = 6
    setup = SimpleNamespace(model=model, tokenizer=Tok())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        gens = generations(setup, full, ["5 9 13"])
    # FSDP2 labels each unit's parameter all-gather "FSDP::all_gather (<unit>)"
    gathers = [e.name for e in prof.events() if re.fullmatch(r"FSDP::all_gather( \(.*\))?", e.name)]
    want = generate(plain, [1, 5, 9, 13], 6)
    return {"all_gathers": len(gathers), "tokens": gens[0]["ids"], "plain": want, "units": len(units(model))}


def main() -> None:
    parallel = sys.argv[1]
    extra = {"hsdp_shard_size": 2} if parallel == "hsdp" else {}
    cfg = TrainConfig(parallel=parallel, seed=7, **extra)
    info = dist.init_distributed(cfg)
    results = {
        "init_untied": lambda: init_scenario(cfg, info, tied=False),
        "init_tied": lambda: init_scenario(cfg, info, tied=True),
        "grad_sync": lambda: grad_sync_scenario(cfg, info),
        "tied_grad": lambda: tied_grad_scenario(cfg, info),
        "reduce_scatter": lambda: reduce_scatter_scenario(cfg, info),
        "generate": lambda: generate_scenario(cfg, info),
    }
    for name, run in results.items():
        out = run()
        if info.is_main:
            print("RESULT " + json.dumps({"scenario": name, "world": info.world_size, **out}), flush=True)
    dist.cleanup()
    dist.leave(0)  # as `oreline train` ends a rank (oreline.train.dist.leave says why)


if __name__ == "__main__":
    main()
