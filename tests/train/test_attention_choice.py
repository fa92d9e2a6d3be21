"""train.attention: which document-masked attention a run trains with (FlexAttention on CUDA, the
dense SDPA mask on a CPU, where FlexAttention has no backward)."""

from __future__ import annotations

import pytest
from oreline_test_train_fixtures import read_metrics

from oreline.errors import ConfigError
from oreline.train.loop import train


def test_flex_attention_cannot_train_on_a_cpu(train_config):
    with pytest.raises(ConfigError, match="FlexAttention has no backward"):
        train(train_config(train__doc_mask=True, train__attention="flex", train__steps=8))


def test_auto_trains_a_doc_mask_run_on_the_dense_mask_on_a_cpu(tmp_path, train_config, one_thread):
    cfg = train_config(train__doc_mask=True, train__steps=2, train__optim__warmup_steps=1, eval__prompts=[])
    train(cfg)
    start = next(r for r in read_metrics(tmp_path / "t" / "metrics.jsonl") if r["type"] == "start")
    assert start["attention"] == "sdpa"
