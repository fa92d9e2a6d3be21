"""A tied table's gradient: one full-size matrix in backward, bitwise the sum of its two uses."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from oreline.model.kernels.select import cpu_kernels
from oreline.model.llama import Llama, ModelArgs

V, D = 97, 32  # a vocabulary no other matrix of the model shares a shape with


def pair(kernels: str) -> tuple[Llama, Llama]:
    """A tied model and an untied twin whose lm_head holds a copy of the same table."""
    args = ModelArgs(dim=D, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V, ffn_dim=64, max_seq_len=64)
    untied_args = ModelArgs(**(args.to_dict() | {"tie_embeddings": False}))
    make = (lambda a: Llama(a)) if kernels == "reference" else (lambda a: Llama(a, cpu_kernels("blas")))
    torch.manual_seed(0)
    tied, untied = make(args), make(untied_args)
    table = tied.model.embed_tokens.weight.detach()
    untied.load_state_dict(tied.state_dict() | {"lm_head.weight": table.clone()})
    return tied, untied


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (3, 40), generator=g)
    ids[:, :6] = 7  # one id many times: its row sums several tokens
    labels = torch.roll(ids, -1, 1)
    labels[0, -4:] = -100
    return ids, labels


class FullSizeAllocations(TorchDispatchMode):
    """Names the ops that create a new (V, D) tensor (not one written in place into an input's storage)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if (
                isinstance(t, torch.Tensor)
                and tuple(t.shape) == (V, D)
                and t.untyped_storage().data_ptr() not in inputs
            ):
                self.ops.append(str(func))
        return out


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_tied_gradient_is_bitwise_the_sum_of_both_uses(kernels: str) -> None:
    """What plain autograd computed for the tied table: the output projection's dW plus the
    embedding's dense gradient, added once per micro-batch into the accumulated .grad."""
    tied, untied = pair(kernels)
    want = None
    for seed in (1, 2):  # two micro-batches: the second accumulates into the first's .grad
        ids, labels = batch(seed)
        loss = tied(ids, labels=labels).sum()
        untied.zero_grad(set_to_none=True)
        ref = untied(ids, labels=labels).sum()
        assert torch.equal(loss, ref)
        loss.backward()
        ref.backward()
        this = untied.lm_head.weight.grad + untied.model.embed_tokens.weight.grad
        want = this if want is None else want + this
        got = tied.model.embed_tokens.weight.grad
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bitwise, not within a tolerance
        if seed == 1:
            for name, p in tied.named_parameters():
                if name != "model.embed_tokens.weight":
                    assert torch.equal(p.grad, untied.get_parameter(name).grad), name


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_backward_creates_one_full_size_table_gradient(kernels: str) -> None:
    """The output projection's dW is the only (vocab, dim) matrix backward creates: the embedding's
    rows are added into it in place. Before, autograd made three: dW, the embedding's dense
    gradient and their sum (98 MB each at 125m, on every FSDP2 rank whatever the world size)."""
    tied, _ = pair(kernels)
    ids, labels = batch(1)
    loss = tied(ids, labels=labels).sum()
    with FullSizeAllocations() as seen:
        loss.backward()
    assert len(seen.ops) == 1, seen.ops
    assert tied.model.embed_tokens.weight.grad.shape == (V, D)


def test_double_backward_and_no_grad_use_the_plain_path() -> None:
    tied, untied = pair("reference")
    ids, labels = batch(3)
    table = tied.model.embed_tokens.weight
    (g,) = torch.autograd.grad(tied(ids, labels=labels).sum(), table, create_graph=True)
    assert g.requires_grad
    untied(ids, labels=labels).sum().backward()
    want = untied.lm_head.weight.grad + untied.model.embed_tokens.weight.grad
    # within rounding: autograd's create_graph path sums differently, the plain tied model's too
    torch.testing.assert_close(g.detach(), want)
    with torch.no_grad():
        assert torch.equal(tied(ids), untied(ids))
