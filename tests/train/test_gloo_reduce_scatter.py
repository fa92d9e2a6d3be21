"""oreline.train.gloo_reduce_scatter on a one-rank gloo group: this rank's chunk of the (in-place)
sum, divided for AVG, and the input's memory released by the op itself. Bitwise equality with
gloo's reduce_scatter on 2 and 4 ranks is tests/train/fsdp_helpers.py's `reduce_scatter`."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from oreline.train.gloo_reduce_scatter import gloo_reduce_scatter


@pytest.fixture
def group():
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        yield tdist.group.WORLD
    finally:
        tdist.destroy_process_group()


@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_one_rank_keeps_the_sum_and_frees_the_input(group, op):
    comm = gloo_reduce_scatter()
    if comm is None:
        pytest.skip("torch outside oreline.compat's tested range: FSDP2's own reduce-scatter is used")
    values = torch.arange(12, dtype=torch.float32)
    inp = comm.allocate((12,), dtype=torch.float32, device=torch.device("cpu"))
    inp.copy_(values)
    out = comm.allocate((12,), dtype=torch.float32, device=torch.device("cpu"))
    assert comm(out, inp, group, getattr(tdist.ReduceOp, op)) is None
    assert torch.equal(out, values)  # one rank: the sum is the input, and the average too
    # released by the op (FSDP2 keeps its reference until the next unit's reduce-scatter)
    assert inp.untyped_storage().nbytes() == 0
