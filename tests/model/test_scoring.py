"""The loss breakdown by target class (tokens, EOS, the token after BOS)."""

from __future__ import annotations

import pytest
import torch

from oreline.model.scoring import BREAKDOWN_KEYS, breakdown_means, loss_breakdown

BOS, EOS = 1, 2


def test_loss_breakdown_sums_and_counts_by_class():
    # two packed rows: [BOS a b EOS BOS c] → targets [a b EOS (BOS→-100) c d]
    input_ids = torch.tensor([[BOS, 10, 11, EOS, BOS, 12], [13, 14, EOS, BOS, EOS, 15]])
    labels = torch.tensor([[10, 11, EOS, -100, 12, 16], [14, EOS, -100, EOS, 15, 17]])
    loss = torch.arange(12, dtype=torch.float32).view(2, 6) + 1.0  # 1..12, distinct per position
    sums = dict(zip(BREAKDOWN_KEYS, loss_breakdown(loss, input_ids, labels, BOS, EOS).tolist(), strict=True))
    # row 0: pos0 input BOS → bos (1); pos1 token (2); pos2 EOS target (3); pos3 ignored; pos4 input BOS → bos (5); pos5 token (6)
    # row 1: pos0 token (7); pos1 EOS (8); pos2 ignored; pos3 input BOS, target EOS → eos (10); pos4 token (11); pos5 token (12)
    assert sums["sum_bos"] == 1 + 5 and sums["n_bos"] == 2
    assert sums["sum_eos"] == 3 + 8 + 10 and sums["n_eos"] == 3
    assert sums["sum_token"] == 2 + 6 + 7 + 11 + 12 and sums["n_token"] == 5
    means = breakdown_means(loss_breakdown(loss, input_ids, labels, BOS, EOS))
    assert means["n_targets"] == 10
    assert means["loss"] == pytest.approx((6 + 21 + 38) / 10)
    assert means["loss_eos"] == pytest.approx(7.0)
    assert breakdown_means([0.0] * 6)["loss"] is None  # no targets: no made-up number
