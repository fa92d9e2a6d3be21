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

import dataclasses
import enum
import pathlib
import pickle
import pickletools
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
_PATHS = (pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, pathlib.PureWindowsPath)
for _cls in _PATHS:
    for _module in ("pathlib", _cls.__module__):  # Python 3.13 pickles them from pathlib._local
        _ALLOWED[(_module, _cls.__name__)] = _cls

# Every object a pickle can reach without constructing it: the allowed globals, and what calling
# them returns (enum members, torch.layout objects, dtypes). The opcode rules of _MetadataUnpickler
# let no pickle alter them; as a second line, their attributes (including those `vars()` does not
# show: a function's __qualname__, __module__, __code__, __defaults__; a class's __qualname__) and
# the contents of the tables they keep (_get_layout.cache, an enum's member maps) are compared
# before and after each read, put back, and the file refused if anything changed. (torch.Size, the
# dtypes and the layouts are extension types and objects whose attributes cannot be set.)
_ENUMS = [c for c in _DCP_CLASSES if issubclass(c, enum.Enum)]
_WATCHED: list[object] = [
    *(o for o in dict.fromkeys(_ALLOWED.values()) if not isinstance(o, torch.dtype) and o is not torch.Size),
    *(member for c in _ENUMS for member in c),
]
_HIDDEN = ("__name__", "__qualname__", "__module__", "__doc__", "__defaults__", "__kwdefaults__", "__code__")
if hasattr(torch.serialization, "_get_layout"):
    torch.serialization._get_layout("torch.strided")  # fills its lazy cache now, not during a read

# The dataclasses a pickle may BUILD (set the fields of), and only instances it made itself; with a
# dict of their own field names, or, for TensorProperties (its own __setstate__), a 5-tuple.
_BUILDABLE = {
    c: frozenset(f.name for f in dataclasses.fields(c)) for c in _DCP_CLASSES if dataclasses.is_dataclass(c)
}

_HINT = (
    "this is not a checkpoint index oreline or torch wrote: do not load it; resume from another "
    "checkpoint (oreline checkpoint verify RUN_DIR) or start fresh with --resume none"
)


def _plain(x: object, depth: int = 0) -> bool:
    """A plain value: None, bool, int, str, or a tuple or list of them (a shape, a path's parts)."""
    if x is None or type(x) in (bool, int, str):
        return True
    return type(x) in (tuple, list) and depth < 2 and all(_plain(v, depth + 1) for v in x)


def _call_allowed(func: object, args: object) -> bool:
    """The REDUCE calls DCP's metadata pickles hold: torch.Size(ints), _get_layout(name),
    _MEM_FORMAT_ENCODING(int), a pathlib class (strs). Nothing else is called."""
    if type(args) is not tuple or not _plain(args):
        return False
    if func is torch.Size:
        return len(args) == 1 and type(args[0]) in (tuple, list) and all(type(d) is int for d in args[0])
    if func in _ENUMS:
        return len(args) == 1 and type(args[0]) is int
    if func is _ALLOWED.get(("torch.serialization", "_get_layout")):
        return len(args) == 1 and type(args[0]) is str
    return func in _PATHS and all(type(a) is str for a in args)


class _MetadataUnpickler(pickle._Unpickler):
    """Python's own unpickler (the pure-Python one, whose opcode table can be replaced), with an
    allow-list of globals (find_class) and of opcodes, each checked against what it acts on:

    - values, tuples, memo and framing opcodes: as they are;
    - NEWOBJ: only a DCP dataclass, with no arguments (a fresh, empty instance);
    - REDUCE: only the calls of `_call_allowed`;
    - BUILD: only on a dataclass instance this pickle made, with that class's fields;
    - SETITEM(S) / APPEND(S) / ADDITEMS: only on a dict, list or set this pickle made;
    - anything else (INST, OBJ, extension codes, out-of-band buffers, persistent ids): refused.

    So a pickle can build DCP metadata and nothing else: no code runs, and no object that outlives
    the read (a class, a function, an enum member, a layout) is touched."""

    dispatch: dict = {}

    def __init__(self, fh, where: Path):
        super().__init__(fh)
        self.where = where
        self._made: dict[int, object] = {}  # id -> object this pickle made (kept alive: ids stay unique)

    def _refuse(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: refused {what} (not part of DCP checkpoint metadata)", _HINT)

    def _mine(self, obj: object, types: tuple[type, ...]) -> bool:
        return type(obj) in types and self._made.get(id(obj)) is obj

    def _record(self) -> None:
        self._made[id(self.stack[-1])] = self.stack[-1]

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

    def load_newobj(self) -> None:
        args, cls = self.stack[-1], self.stack[-2]
        if cls not in _BUILDABLE or args != ():
            raise self._refuse(f"creating a {getattr(cls, '__qualname__', type(cls).__name__)} object")
        _BASE[pickle.NEWOBJ[0]](self)
        self._record()

    def load_reduce(self) -> None:
        args, func = self.stack[-1], self.stack[-2]
        if not _call_allowed(func, args):
            raise self._refuse(f"a call of {getattr(func, '__qualname__', type(func).__name__)}")
        _BASE[pickle.REDUCE[0]](self)

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        fields = _BUILDABLE.get(type(inst))
        if fields is None or not self._mine(inst, (type(inst),)):
            raise self._refuse(
                f"setting the state of {_label(inst)} (a {type(inst).__name__} it did not create)"
            )
        if "__setstate__" in vars(type(inst)):
            ok = type(state) is tuple and len(state) == len(fields)
        else:
            ok = type(state) is dict and all(type(k) is str and k in fields for k in state)
        if not ok:
            raise self._refuse(f"a {type(inst).__qualname__} state that is not its fields")
        _BASE[pickle.BUILD[0]](self)


def _on_made(opcode: bytes, types: tuple[type, ...], at: int | None) -> object:
    """The handler of an opcode that fills a container: only one this pickle made. `at`: where
    the container is on the stack (None: just below the opcode's MARK)."""

    def load(self: _MetadataUnpickler) -> None:
        target = (
            (self.metastack[-1][-1] if self.metastack and self.metastack[-1] else None)
            if at is None
            else (self.stack[at] if len(self.stack) >= -at else None)
        )
        if not self._mine(target, types):
            raise self._refuse(f"{_NAMES[opcode[0]]} on a {type(target).__name__} it did not create")
        _BASE[opcode[0]](self)

    return load


def _making(opcode: bytes) -> object:
    """The handler of an opcode that makes a new container: recorded as this pickle's own."""

    def load(self: _MetadataUnpickler) -> None:
        _BASE[opcode[0]](self)
        self._record()

    return load


def _refused(code: int) -> object:
    def load(self: _MetadataUnpickler) -> None:
        raise self._refuse(
            f"the pickle opcode {_NAMES[code]}" if code in _NAMES else f"byte {code:#x} (no opcode)"
        )

    return load


_BASE = pickle._Unpickler.dispatch
_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
# values, tuples, memo, framing, globals (through find_class), persistent ids (persistent_load refuses)
_AS_IS = (  # noqa: SIM905 (a list of 46 names reads better as words)
    "PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 "
    "LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES BINBYTES8 UNICODE "
    "BINUNICODE SHORT_BINUNICODE BINUNICODE8 EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 FROZENSET PUT BINPUT "
    "LONG_BINPUT MEMOIZE GET BINGET LONG_BINGET GLOBAL STACK_GLOBAL PERSID BINPERSID"
).split()
_MetadataUnpickler.dispatch = {code: _refused(code) for code in range(256)}
_MetadataUnpickler.dispatch.update({code: _BASE[code] for code, name in _NAMES.items() if name in _AS_IS})
_MetadataUnpickler.dispatch.update(
    {
        pickle.EMPTY_DICT[0]: _making(pickle.EMPTY_DICT),
        pickle.DICT[0]: _making(pickle.DICT),
        pickle.EMPTY_LIST[0]: _making(pickle.EMPTY_LIST),
        pickle.LIST[0]: _making(pickle.LIST),
        pickle.EMPTY_SET[0]: _making(pickle.EMPTY_SET),
        pickle.SETITEM[0]: _on_made(pickle.SETITEM, (dict,), -3),
        pickle.SETITEMS[0]: _on_made(pickle.SETITEMS, (dict,), None),
        pickle.APPEND[0]: _on_made(pickle.APPEND, (list,), -2),
        pickle.APPENDS[0]: _on_made(pickle.APPENDS, (list,), None),
        pickle.ADDITEMS[0]: _on_made(pickle.ADDITEMS, (set,), None),
        pickle.NEWOBJ[0]: _MetadataUnpickler.load_newobj,
        pickle.REDUCE[0]: _MetadataUnpickler.load_reduce,
        pickle.BUILD[0]: _MetadataUnpickler.load_build,
    }
)


def parse_dcp_metadata(data: bytes, where: Path) -> Metadata:
    """`.metadata` bytes → DCP Metadata, through the allow-listed unpickler, then checked for shape."""
    import io

    before = _snapshot()
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


def _attributes(obj: object) -> dict[str, object]:
    """What `obj` holds: its __dict__ and the attributes kept outside it (_HIDDEN)."""
    found = {k: getattr(obj, k) for k in _HIDDEN if hasattr(obj, k)}
    found.update(getattr(obj, "__dict__", {}))
    return found


def _snapshot() -> list[tuple[dict[str, object], dict[str, object]]]:
    """Per watched object: its attributes, and a copy of each dict or list among them."""
    out = []
    for obj in _WATCHED:
        attrs = _attributes(obj)
        tables = {k: v.copy() for k, v in attrs.items() if type(v) in (dict, list)}
        out.append((attrs, tables))
    return out


def _same(table: dict | list, now: dict | list) -> bool:
    if type(table) is dict:
        return table.keys() == now.keys() and all(table[k] is now[k] for k in table)
    return len(table) == len(now) and all(x is y for x, y in zip(table, now, strict=True))


def _label(obj: object, attrs: dict[str, object] | None = None) -> str:
    """How to name `obj` in a message (from `attrs`, its attributes before a read, when given)."""
    attrs = _attributes(obj) if attrs is None else attrs
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__qualname__}.{attrs.get('_name_')}"
    return str(attrs.get("__qualname__") or type(obj).__qualname__)


def _restore(before: list[tuple[dict[str, object], dict[str, object]]]) -> list[str]:
    """Put back any attribute, or entry of a table, of a watched object that the pickle changed;
    their names."""
    altered = []
    for obj, (old, tables) in zip(_WATCHED, before, strict=True):
        now, name = _attributes(obj), _label(obj, old)
        for key in sorted(now.keys() | old.keys()):
            if key in old and key in now and now[key] is old[key]:
                table = tables.get(key)
                if table is not None and not _same(table, now[key]):
                    altered.append(f"{name}.{key}")
                    now[key].clear()
                    now[key].update(table) if type(table) is dict else now[key].extend(table)
                continue
            altered.append(f"{name}.{key}")
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
            type(descriptors) in (list, tuple) and list(descriptors) in ([], [RAW_DESCRIPTOR])
        ):
            return (
                f"{index.fqn} is stored through transforms {str(descriptors)[:80]} (oreline writes no "
                f"transform but {RAW_DESCRIPTOR}, and reading a compressed item could decode without bound)"
            )
    meta = md.storage_meta
    if meta is not None and type(meta) is not StorageMeta:
        return f"storage_meta is a {type(meta).__name__}"
    return None
