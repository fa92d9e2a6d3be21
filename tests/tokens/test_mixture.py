"""The mixture's position → (source, index) function (oreline.tokens.mixture): shares, phases, purity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oreline.tokens.mixture import Mixture, Phase


def sources_of(mixture: Mixture, n: int) -> list[str]:
    return [mixture.locate(p)[0] for p in range(n)]


def worst_window_error(picks: list[str], weights: dict[str, float], window: int) -> float:
    """The largest |share - weight| of any source over every window of `window` consecutive positions."""
    worst = 0.0
    total = sum(weights.values())
    for name, w in weights.items():
        hits = np.concatenate([[0], np.cumsum([p == name for p in picks])])
        shares = (hits[window:] - hits[:-window]) / window
        worst = max(worst, float(np.abs(shares - w / total).max()))
    return worst


@pytest.mark.parametrize("batch", [1, 8])
def test_two_sources_0_7_0_3_within_1_percent_over_every_1000_batch_window(batch):
    mixture = Mixture([Phase(0, [("web", 0.7), ("prose", 0.3)])])
    picks = sources_of(mixture, 3000 * batch)
    assert worst_window_error(picks, {"web": 0.7, "prose": 0.3}, 1000 * batch) < 0.01
    # an i.i.d. draw with the same weights is not that tight (the rule is what makes it hold)
    rng = np.random.default_rng(0)
    drawn = list(rng.choice(["web", "prose"], size=3000, p=[0.7, 0.3]))
    assert worst_window_error(drawn, {"web": 0.7, "prose": 0.3}, 1000) > 0.01


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=1000), min_size=2, max_size=6).filter(lambda w: sum(w) > 0)
)
def test_every_source_count_is_within_k_over_2_of_its_weight_at_every_position(raw):
    weights = [(f"s{i}", w / 1000) for i, w in enumerate(raw)]
    mixture = Mixture([Phase(0, weights)])
    total = sum(w for _, w in weights)
    k = sum(1 for _, w in weights if w > 0)
    counts = dict.fromkeys((n for n, _ in weights), 0)
    for p in range(2500):
        name, index = mixture.locate(p)
        assert index == counts[name]  # the index in the source is its count before p
        at = mixture.counts(p)
        assert all(at.get(n, 0) == c for n, c in counts.items())  # the closed form agrees
        counts[name] += 1
        for n, w in weights:
            assert abs(counts[n] - w / total * (p + 1)) <= k / 2 + 1e-9, (n, p, counts)
    assert all(counts[n] == 0 for n, w in weights if w == 0)  # weight 0: never picked
    # 1,000-position windows (1,000 batches of one sequence): within 1% for these ≤ 6 sources
    picks = sources_of(mixture, 2500)
    assert worst_window_error(picks, dict(weights), 1000) <= k / 1000 + 1e-9


def test_one_source_is_the_identity():
    mixture = Mixture([Phase(0, [("main", 1.0)])])
    assert [mixture.locate(p) for p in range(100)] == [("main", p) for p in range(100)]


def test_phases_continue_each_source_from_its_count():
    phases = [Phase(0, [("a", 0.7), ("b", 0.3)]), Phase(1000, [("a", 0.2), ("b", 0.3), ("c", 0.5)])]
    mixture = Mixture(phases)
    at = mixture.counts(1000)
    assert at == {"a": 700, "b": 300, "c": 0}
    seen: dict[str, list[int]] = {}
    for p in range(3000):
        name, index = mixture.locate(p)
        seen.setdefault(name, []).append(index)
    for name, indices in seen.items():  # every source reads 0, 1, 2, ... across the phase change
        assert indices == list(range(len(indices))), name
    after = sources_of(mixture, 3000)[1000:]
    assert worst_window_error(after, {"a": 0.2, "b": 0.3, "c": 0.5}, 1000) < 0.01
    # a pure function: a fresh object computes the same at any position, in any order
    again = Mixture([Phase(0, [("a", 0.7), ("b", 0.3)]), Phase(1000, [("a", 0.2), ("b", 0.3), ("c", 0.5)])])
    assert [again.locate(p) for p in (2999, 5, 1000, 999)] == [
        mixture.locate(p) for p in (2999, 5, 1000, 999)
    ]


def test_weights_are_exact_decimals():
    # 0.1 + 0.2 ≠ 0.3 in binary; the exact fractions 1/10, 2/10 give exactly 1/3 and 2/3 of 3,000
    mixture = Mixture([Phase(0, [("a", 0.1), ("b", 0.2)])])
    assert mixture.counts(3000) == {"a": 1000, "b": 2000}
