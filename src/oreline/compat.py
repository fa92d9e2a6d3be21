"""Every private torch API oreline uses, in one place, each behind a version check with a public fallback.

oreline supports a tested range of torch releases (pyproject: `torch>=2.6,<2.14`; CI runs the
highest, the lowest was run by hand: CHANGELOG.md). Inside the range the private paths below are
used as measured. Outside it — or when one of them has moved — each accessor returns None, the
caller takes the public path, and one warning per feature says what was given up:

| private API | what it buys | public fallback |
|---|---|---|
| `torch.ops.mkldnn._linear_pointwise` | fp32 CPU products through oneDNN (~2x on AMD AVX-512) | `F.linear` / `torch.mm` (BLAS) |
| `torch.distributed.checkpoint.filesystem` internals (`_StorageInfo`, `_StoragePrefix`, `_split_by_size_and_type`, `DEFAULT_SUFFIX`) | raw tensor files under DCP (train/checkpoint/raw_tensors.py), ~3x faster saves | DCP's stock `FileSystemWriter` (torch.save per tensor; loads with weights_only=True) |
| `torch.distributed.fsdp._fully_shard._fsdp_collectives.DefaultReduceScatter` | FSDP2 gradient communication time in metrics, with `train.profile` only; on gloo, the reduce-scatter as an in-place all-reduce (train/gloo_reduce_scatter.py: one unit's gradients less per rank at the peak) | FSDP2's own reduce-scatter, `comm_ms` without the reduce-scatters; gloo's full-size copy of each unit's gradients |
| `torch.utils.serialization.config.save.compute_crc32` | skip torch.save's CRC32 (checksums.json covers it) | CRC32 stays on |
| `optimizer.found_inf` (the attribute GradScaler sets; fused Adam/AdamW's `step` reads it) | a rejected step is skipped inside the fused kernel: no host read per step | the verdict is read on the host every step (`optim.fused=false`'s path) |

One public API changed inside the range: DCP's `save`/`load` gained `no_dist` after 2.6
(`dcp_no_dist`); before it, DCP decides from whether a process group is initialised, which is what
oreline's single-process saves need anyway.

Reading any DCP `.metadata` needs its `_StorageInfo` record class whatever the version. Raw tensor
files need `_StorageInfo.transform_descriptors` (torch >= 2.7): on torch 2.6 checkpoints are written
with DCP's stock writer, and a raw-file checkpoint written by a newer torch cannot be read there
(the reader refuses it by name rather than misreading it).

torch is imported lazily: this module is in the core layer, which data workers import too.
"""

from __future__ import annotations

import functools
import re
import warnings
from types import SimpleNamespace
from typing import Any

TESTED_TORCH = ((2, 6), (2, 13))  # lowest and highest minor releases the suite has passed on
_forced_untested = False  # tests: behave as on a torch outside the range


def torch_version() -> tuple[int, int]:
    import torch

    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def torch_tested() -> bool:
    """Whether this torch is inside the range oreline was tested on."""
    lo, hi = TESTED_TORCH
    return not _forced_untested and lo <= torch_version() <= hi


@functools.cache
def _warn(feature: str, fallback: str) -> None:
    import torch

    warnings.warn(
        f"oreline: torch {torch.__version__} is outside the tested range "
        f"{'.'.join(map(str, TESTED_TORCH[0]))}–{'.'.join(map(str, TESTED_TORCH[1]))} (or lacks the private "
        f"API): {feature} is off, {fallback}. Install a torch in the range to get it back.",
        RuntimeWarning,
        stacklevel=3,
    )


def _private(feature: str, fallback: str, get: Any) -> Any:
    if not torch_tested():
        _warn(feature, fallback)
        return None
    try:
        return get()
    except (ImportError, AttributeError):
        _warn(feature, fallback)
        return None


def onednn_linear() -> Any:
    """`torch.ops.mkldnn._linear_pointwise` (fp32 products through oneDNN), or None."""

    def get() -> Any:
        import torch

        if not torch.backends.mkldnn.is_available():
            return None  # a build without oneDNN: nothing given up, nothing to warn about
        return torch.ops.mkldnn._linear_pointwise

    return _private("the oneDNN CPU matmul backend", "fp32 products use torch's BLAS", get)


def _dcp_internals() -> SimpleNamespace:
    import dataclasses

    from torch.distributed.checkpoint import filesystem as fs

    if "transform_descriptors" not in {f.name for f in dataclasses.fields(fs._StorageInfo)}:
        # torch 2.6's records cannot mark an item as raw bytes: raw files could not be told apart
        raise AttributeError("DCP's _StorageInfo has no transform_descriptors")
    return SimpleNamespace(
        DEFAULT_SUFFIX=fs.DEFAULT_SUFFIX,
        split_by_size_and_type=fs._split_by_size_and_type,
        StorageInfo=fs._StorageInfo,
        StoragePrefix=fs._StoragePrefix,
    )


def dcp_raw_writer_internals() -> SimpleNamespace | None:
    """What train/checkpoint/raw_tensors.RawTensorWriter builds on, or None (then saves use DCP's stock writer)."""
    return _private(
        "raw tensor checkpoint files", "checkpoints are saved with DCP's stock writer", _dcp_internals
    )


def dcp_storage_info() -> Any:
    """DCP's `_StorageInfo` record class, needed to read any `.metadata`; tried on every version."""
    try:
        from torch.distributed.checkpoint.filesystem import _StorageInfo
    except ImportError:
        return None
    return _StorageInfo


def fsdp_reduce_scatter_base(
    feature: str = "FSDP2 communication timing (comm_ms)",
    fallback: str = "FSDP2 uses its own reduce-scatter untimed",
) -> Any:
    """FSDP2's default reduce-scatter class (the base of oreline's own: timing, gloo's in-place
    reduce-scatter), or None; `feature` and `fallback` word the warning."""

    def get() -> Any:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

        return DefaultReduceScatter

    return _private(feature, fallback, get)


def torch_save_config() -> Any:
    """`torch.utils.serialization.config` (torch.save's CRC32 switch), or None."""

    def get() -> Any:
        from torch.utils.serialization import config

        config.save.compute_crc32  # noqa: B018 (the attribute this is for must exist)
        return config

    return _private("skipping torch.save's CRC32 in stock-writer saves", "the CRC32 is computed", get)


def fused_adamw_skip() -> Any:
    """`skip(optimizer, mask)`: makes the next step of a fused Adam/AdamW a no-op where `mask` (a
    0-dim bool tensor, on the device) is true — weights, moments and step count left as they are —
    through `optimizer.found_inf`, the private hook torch's GradScaler uses; or None."""

    def get() -> Any:
        import inspect

        import torch

        if "found_inf" not in inspect.getsource(torch.optim.AdamW.step):
            raise AttributeError("torch.optim.AdamW.step no longer reads optimizer.found_inf")
        return _set_found_inf

    return _private(
        "skipping a rejected step inside the fused AdamW kernel",
        "the loop reads each step's verdict on the host and skips optimizer.step() there",
        get,
    )


def _set_found_inf(optimizer: Any, mask: Any) -> None:
    optimizer.found_inf = mask.float()  # 1.0: the fused kernels skip the update


@functools.cache
def _dcp_takes_no_dist() -> bool:
    import inspect

    import torch.distributed.checkpoint as dcp

    return "no_dist" in inspect.signature(dcp.save).parameters


@functools.cache
def dcp_async_takes_stager() -> bool:
    """Whether this torch's dcp.async_save takes `async_stager=` (older releases stage only through
    the storage writer)."""
    import inspect

    import torch.distributed.checkpoint as dcp

    return "async_stager" in inspect.signature(dcp.async_save).parameters


def dcp_no_dist(no_dist: bool) -> dict[str, bool]:
    """Keyword arguments for dcp.save/async_save/load saying "this process alone" where DCP takes them."""
    return {"no_dist": no_dist} if _dcp_takes_no_dist() else {}


def reset_warnings() -> None:
    """Tests: warn again for features already warned about in this process."""
    _warn.cache_clear()
