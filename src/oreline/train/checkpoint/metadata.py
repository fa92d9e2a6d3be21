"""DCP's `.metadata` read without unpickling arbitrary objects: `read_dcp_metadata(folder)`.

torch.distributed.checkpoint stores its index (tensor names, shapes, dtypes, where each chunk lies)
as a pickle, and its own reader `pickle.load`s it: a `.metadata` whose pickle calls `os.system`
runs the command, and checksums do not stop that, since anyone can recompute them. Here the
pickle is read by an unpickler that resolves only the globals DCP's metadata is made of:

- the dataclasses of `torch.distributed.checkpoint.metadata` (Metadata, MetadataIndex,
  StorageMeta, TensorProperties with its memory-format enum, TensorStorageMetadata,
  ChunkStorageMetadata, BytesStorageMetadata) and `filesystem._StorageInfo`;
- `torch.Size`, the `torch.<dtype>` objects, `torch.serialization._get_layout` (how a
  `torch.layout` pickles: a name looked up in a table);
- `pathlib`'s path classes (DCP records the folder it was saved to as a Path).

That set is what `.metadata` files written by torch 2.13 (RawTensorWriter and DCP's stock
FileSystemWriter alike) refer to, measured by logging every `find_class` while loading them.
Constructing any of these runs no code beyond building the value. Any other global (`posix.system`,
`builtins.eval`, ...) stops the read before it is imported, with a CheckpointError naming the file.
A pickle can also apply BUILD to an allowed class or function object itself (setattr on
`Metadata`, a new `_get_layout.cache`): their namespaces are compared before and after each read,
put back, and the file refused.

The result is then checked for shape: only those types where they belong, data files that are
plain names inside the checkpoint folder, chunk offsets and lengths that are non-negative ints.
A `BytesStorageMetadata` entry (a non-tensor value, which DCP would restore with
`torch.load(weights_only=False)`) is reported by `byte_items`, and refused by the reader
(`raw_tensors.RawTensorReader`): oreline saves only tensors through DCP.
"""

from __future__ import annotations

import pathlib
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import metadata as _dcp_metadata
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from oreline import compat
from oreline.errors import CheckpointError

METADATA = ".metadata"
# transform descriptor of a tensor item written as raw bytes by raw_tensors.RawTensorWriter
RAW_DESCRIPTOR = "oreline-raw/1"

# Two of these are private to torch (DCP's _StorageInfo and _MEM_FORMAT_ENCODING, and
# torch.serialization._get_layout): taken where this torch has them (oreline.compat), and simply not
# allowed where it does not, so a metadata file that needs them is refused, never misread.
_PRIVATE = (compat.dcp_storage_info(), getattr(_dcp_metadata, "_MEM_FORMAT_ENCODING", None))
_DCP_CLASSES = tuple(
    c
    for c in (
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
        ChunkStorageMetadata,
        BytesStorageMetadata,
        *_PRIVATE,
    )
    if c is not None
)
_ALLOWED: dict[tuple[str, str], object] = {(c.__module__, c.__qualname__): c for c in _DCP_CLASSES}
_ALLOWED[("torch", "Size")] = torch.Size
if hasattr(torch.serialization, "_get_layout"):
    _ALLOWED[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
for _name, _value in vars(torch).items():
    if isinstance(_value, torch.dtype):
        _ALLOWED[("torch", _name)] = _value
for _cls in (pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, pathlib.PureWindowsPath):
    for _module in ("pathlib", _cls.__module__):  # Python 3.13 pickles them from pathlib._local
        _ALLOWED[(_module, _cls.__name__)] = _cls

# Allowed globals a pickle could still alter in place: a BUILD opcode applied to a class or function
# object itself sets attributes on it (setattr). Their namespaces are compared before and after
# each read, restored, and the file refused if anything changed. (torch.Size and the dtypes are
# extension types and objects whose attributes cannot be set.)
_MUTABLE = [o for o in set(_ALLOWED.values()) if not isinstance(o, torch.dtype) and o is not torch.Size]

_HINT = (
    "this is not a checkpoint index oreline or torch wrote: do not load it; resume from another "
    "checkpoint (oreline checkpoint verify RUN_DIR) or start fresh with --resume none"
)


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, fh, where: Path):
        super().__init__(fh)
        self.where = where

    def find_class(self, module: str, name: str) -> object:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise CheckpointError(
                f"{self.where}: refused to unpickle {module}.{name} (not part of DCP "
                "checkpoint metadata; loading it could run code)",
                _HINT,
            ) from None

    def persistent_load(self, pid: object) -> object:
        raise CheckpointError(f"{self.where}: refused a persistent reference in the pickle", _HINT)


def parse_dcp_metadata(data: bytes, where: Path) -> Metadata:
    """`.metadata` bytes → DCP Metadata, through the allow-listed unpickler, then checked for shape."""
    import io

    before = [dict(vars(o)) for o in _MUTABLE]
    try:
        md = _MetadataUnpickler(io.BytesIO(data), where).load()
    except CheckpointError:
        raise
    except Exception as exc:  # truncated or not a pickle at all
        raise CheckpointError(
            f"{where} is not readable DCP metadata ({type(exc).__name__}: {exc})", _HINT
        ) from None
    finally:
        altered = _restore(before)
    if altered:
        raise CheckpointError(
            f"{where}: its pickle tried to modify {', '.join(altered)} (not DCP metadata)", _HINT
        )
    problem = _shape_problem(md)
    if problem:
        raise CheckpointError(f"{where} is not DCP checkpoint metadata: {problem}", _HINT)
    return md


def _restore(before: list[dict]) -> list[str]:
    """Put back any attribute of an allowed class or function that the pickle changed; their names."""
    altered = []
    for obj, old in zip(_MUTABLE, before, strict=True):
        now = vars(obj)
        changed = [k for k in now.keys() | old.keys() if k not in old or k not in now or now[k] is not old[k]]
        for key in changed:
            altered.append(f"{getattr(obj, '__qualname__', obj)}.{key}")
            if key in old:
                setattr(obj, key, old[key])
            else:
                delattr(obj, key)
    return altered


def read_dcp_metadata(folder: Path) -> Metadata:
    """The checkpoint folder's `.metadata`, read safely (see the module docstring)."""
    where = Path(folder) / METADATA
    try:
        data = where.read_bytes()
    except OSError as exc:
        raise CheckpointError(
            f"cannot read {where} ({exc.strerror or exc})",
            "check the path; oreline checkpoint ls RUN_DIR lists valid checkpoints",
        ) from None
    return parse_dcp_metadata(data, where)


def byte_items(md: Metadata) -> list[str]:
    """Keys stored as pickled non-tensor values (DCP's BYTE_IO items): oreline never loads them."""
    return sorted(k for k, v in md.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata))


def data_files(md: Metadata) -> set[str]:
    """The data files (relative names) the metadata points into."""
    return {info.relative_path for info in md.storage_data.values()}


def _is_size(x: object) -> bool:
    return isinstance(x, torch.Size) and all(type(d) is int and d >= 0 for d in x)


def _shape_problem(md: object) -> str | None:
    """None when `md` has the types and values DCP metadata has, else what is wrong."""
    if type(md) is not Metadata:
        return f"it holds a {type(md).__name__}, not a Metadata"
    if not isinstance(md.state_dict_metadata, dict):
        return "state_dict_metadata is not a dict"
    for key, item in md.state_dict_metadata.items():
        if not isinstance(key, str):
            return f"a key is a {type(key).__name__}"
        if type(item) is BytesStorageMetadata:
            continue
        if type(item) is not TensorStorageMetadata:
            return f"{key} is described by a {type(item).__name__}"
        props = item.properties
        if type(props) is not TensorProperties or not isinstance(props.dtype, torch.dtype):
            return f"{key} has no tensor dtype"
        if not _is_size(item.size) or not isinstance(item.chunks, list):
            return f"{key} has no valid size"
        for chunk in item.chunks:
            if type(chunk) is not ChunkStorageMetadata or not (
                _is_size(chunk.offsets) and _is_size(chunk.sizes)
            ):
                return f"{key} has an invalid chunk"
            if len(chunk.offsets) != len(item.size) or len(chunk.sizes) != len(item.size):
                return f"{key} has a chunk of another rank than the tensor"
    if not isinstance(md.storage_data, dict):
        return "storage_data is not a dict"
    for index, info in md.storage_data.items():
        if type(index) is not MetadataIndex or not isinstance(index.fqn, str):
            return "a storage key is not a MetadataIndex"
        if index.fqn not in md.state_dict_metadata:
            return f"storage entry {index.fqn} names no item"
        if type(info) is not _PRIVATE[0] or _PRIVATE[0] is None:
            return f"{index.fqn} is stored by a {type(info).__name__}"
        rel = info.relative_path
        if not isinstance(rel, str) or not rel or "/" in rel or "\\" in rel or rel.startswith("."):
            return f"{index.fqn} is stored in {rel!r}, which is not a file name inside the checkpoint folder"
        if not (
            type(info.offset) is int and type(info.length) is int and info.offset >= 0 and info.length >= 0
        ):
            return f"{index.fqn} has an invalid offset or length"
        descriptors = getattr(info, "transform_descriptors", None)  # absent before torch 2.7
        if descriptors is not None and not (
            isinstance(descriptors, (list, tuple)) and all(isinstance(d, str) for d in descriptors)
        ):
            return f"{index.fqn} has invalid transform descriptors"
    meta = md.storage_meta
    if meta is not None and type(meta) is not StorageMeta:
        return f"storage_meta is a {type(meta).__name__}"
    return None
