"""The loader's global order: a seeded bijection of [0, n) computed per position."""

from __future__ import annotations

import time

import numpy as np
import pytest

from oreline.tokens.order import FeistelOrder


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 257, 1000, 4097, 65_535, 65_536, 100_003])
def test_every_position_maps_to_a_distinct_sequence(n):
    out = FeistelOrder(n, seed=3, epoch=0).permute(np.arange(n))
    assert out.dtype == np.int64 and np.array_equal(np.sort(out), np.arange(n))


def test_the_order_is_a_function_of_seed_epoch_and_size():
    n = 10_000
    base = FeistelOrder(n, seed=1, epoch=0).permute(np.arange(n))
    assert np.array_equal(base, FeistelOrder(n, seed=1, epoch=0).permute(np.arange(n)))
    for other in (FeistelOrder(n, 2, 0), FeistelOrder(n, 1, 1), FeistelOrder(n + 1, 1, 0)):
        assert (other.permute(np.arange(n)) != base).mean() > 0.99
    # seed + 1 is not the next epoch of seed (the old seed + epoch rule coupled them)
    assert not np.array_equal(
        FeistelOrder(n, 2, 0).permute(np.arange(n)), FeistelOrder(n, 1, 1).permute(np.arange(n))
    )


def test_positions_are_computed_alone_and_look_shuffled():
    n = 1_000_003
    order = FeistelOrder(n, seed=0, epoch=0)
    every = order.permute(np.arange(n))
    picks = np.array([0, 17, n // 2, n - 1])
    assert np.array_equal(order.permute(picks), every[picks])  # no state: any position, any order
    # neighbours land far apart (a uniform shuffle: mean gap n/3) and no sequence stays near home
    assert abs(np.abs(np.diff(every)).mean() / (n / 3) - 1) < 0.01
    assert abs(np.corrcoef(np.arange(n), every)[0, 1]) < 0.01
    assert np.mean(every == np.arange(n)) < 1e-4


def test_a_corpus_of_a_trillion_tokens_costs_no_memory_and_no_set_up():
    n = 10**12 // 2048  # sequences of 2048 tokens
    t0 = time.perf_counter()
    order = FeistelOrder(n, seed=7, epoch=3)
    out = order.permute(np.arange(n - 64, n))
    assert time.perf_counter() - t0 < 0.5
    assert len(set(out.tolist())) == 64 and out.min() >= 0 and out.max() < n
