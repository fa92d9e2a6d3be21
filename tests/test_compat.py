"""oreline.compat: private torch APIs inside the tested range, public fallbacks outside it.

"Outside the range" is produced by flipping compat's own switch, not by faking torch: every
fallback then runs for real (DCP's stock writer, torch's BLAS products, FSDP2's own
reduce-scatter), and the test checks that training state still round-trips through it.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from oreline import compat
from oreline.config import ModelConfig
from oreline.model.kernels import matmul
from oreline.model.llama import Llama
from oreline.model.presets import resolve_model_args
from oreline.train import comm_timing
from oreline.train.checkpoint.load import load_checkpoint
from oreline.train.checkpoint.metadata import RAW_DESCRIPTOR, read_dcp_metadata
from oreline.train.checkpoint.save import save_checkpoint
from oreline.train.checkpoint.verify import verify_checkpoint


@pytest.fixture
def untested_torch(monkeypatch):
    monkeypatch.setattr(compat, "_forced_untested", True)
    compat.reset_warnings()
    yield
    compat.reset_warnings()


def test_this_torch_is_in_the_tested_range_and_its_private_apis_are_found():
    lo, hi = compat.TESTED_TORCH
    assert lo <= compat.torch_version() <= hi, f"torch {torch.__version__}: update TESTED_TORCH and pyproject"
    assert compat.dcp_storage_info() is not None  # reading any .metadata needs it, on every tested version
    if compat.torch_version() == hi:  # the development version: every speed path is available
        assert compat.dcp_raw_writer_internals() is not None
        assert compat.fsdp_reduce_scatter_base() is not None
        assert compat.torch_save_config() is not None
        assert compat.fused_adamw_skip() is not None
        if torch.backends.mkldnn.is_available():
            assert compat.onednn_linear() is not None
    else:  # older releases in the range may lack one: then it is None (and warned about), never an error
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for accessor in (
                compat.dcp_raw_writer_internals,
                compat.fsdp_reduce_scatter_base,
                compat.torch_save_config,
                compat.fused_adamw_skip,
                compat.onednn_linear,
            ):
                accessor()


def test_pyproject_range_matches_the_tested_range():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    torch_req = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch"))
    lo, hi = compat.TESTED_TORCH
    assert torch_req == f"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}"


def test_outside_the_range_each_feature_falls_back_with_one_warning(untested_torch):
    with pytest.warns(RuntimeWarning, match="oneDNN CPU matmul backend is off"):
        assert compat.onednn_linear() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per feature and process, not on every product
        assert compat.onednn_linear() is None
    assert matmul.available_backends() == ["blas"]
    assert matmul.resolve_backend("auto")[0] == "blas"
    with pytest.warns(RuntimeWarning, match="FSDP2 communication timing"):
        assert comm_timing.timed_reduce_scatter() is None
    # reading a .metadata needs DCP's record class whatever the version: still found
    assert compat.dcp_storage_info() is not None


def test_outside_the_range_checkpoints_use_dcps_stock_writer_and_still_resume(tmp_path, untested_torch):
    args = resolve_model_args(ModelConfig(preset="debug"))
    torch.manual_seed(0)
    model = Llama(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, args.vocab_size, (2, 16))).sum().backward()
    opt.step()
    meta = {"tokens_seen": 0, "model_args": args.to_dict(), "config": {"train": {"steps": 1}}}
    with pytest.warns(RuntimeWarning, match="raw tensor checkpoint files"):
        path = save_checkpoint(tmp_path, 1, model, opt, meta)
    md = read_dcp_metadata(path)
    assert md.storage_data and not any(
        RAW_DESCRIPTOR in (getattr(i, "transform_descriptors", None) or ()) for i in md.storage_data.values()
    )
    ok, problems = verify_checkpoint(path)
    assert ok, problems

    torch.manual_seed(1)
    model2 = Llama(args)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    load_checkpoint(path, model2, opt2, restore_rng=False)
    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)
