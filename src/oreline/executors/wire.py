"""The Slurm executor's job and result files: JSON naming a task and carrying plain data, never code.

A Slurm array task runs in a fresh Python on some node, so the stage's jobs travel through a file in
the run's work folder, and each job's result comes back the same way. A pickle there would let
whoever can write that file run code as the user (loading a pickle calls what it names). So:

- the task function travels as "module:qualname" and must be one of `TASKS`, oreline's own task
  functions; the array task imports only those, and refuses any other name before it imports
  anything. A new task function mapped through an executor is added to `TASKS` (the driver says so);
- arguments and results are tagged JSON: str, int, float (NaN and ±inf too), bool, None, bytes,
  list, tuple, dict (any of these as keys), Path, numpy scalars, oreline's config sections
  (`oreline.config.Section`, rebuilt by `model_validate`, so a value a config file could not hold
  is refused) and the dataclasses in `DATACLASSES` (rebuilt by pydantic's validation of their fields).
  Every value decodes to the type it was encoded from, so a task and its result are equal,
  type for type, to what the local executor passes and returns, and the output is the same;
- anything else (an object with a tag this module does not write, a class outside those lists)
  is refused with the file named, and nothing is imported for it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from base64 import b64decode, b64encode
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

from oreline.errors import ClusterError

# Task functions the Slurm executor may run by name: every function a stage maps through an executor.
TASKS = frozenset(
    {
        "oreline.data.pipeline.tasks:run_phase1",
        "oreline.data.pipeline.tasks:run_phase3",
        "oreline.data.pipeline.chain:run_chain_stage",
        "oreline.data.pipeline.perplexity_cutoffs:task_sample",  # also the classifier's cut-off sample
        "oreline.data.dedup.staged.exact:scatter_job",
        "oreline.data.dedup.staged.exact:exact_job",
        "oreline.data.dedup.staged.buckets:bucket_job",
        "oreline.data.dedup.staged.candidates:request_job",
        "oreline.data.dedup.staged.candidates:fetch_job",
        "oreline.data.dedup.staged.candidates:candidates_job",
        "oreline.data.dedup.staged.candidates:ship_job",
        "oreline.data.dedup.staged.verify:verify_job",
        "oreline.data.dedup.staged.verify:similarity_job",
        "oreline.data.dedup.staged.components:components_job",
        "oreline.data.dedup.staged.components:star_init_job",
        "oreline.data.dedup.staged.components:large_star_job",
        "oreline.data.dedup.staged.components:small_star_job",
        "oreline.data.dedup.staged.components:label_fields_job",
        "oreline.data.dedup.staged.components:star_pick_job",
        "oreline.data.dedup.staged.assign:assign_job",
        "oreline.data.dedup.staged.assign:list_job",
        "oreline.tokens.tokenize:run_task",
    }
)

# Dataclasses that travel as arguments or results, rebuilt from their validated fields.
DATACLASSES = frozenset({"oreline.tokens.tokenize:Task"})

FORMAT = "oreline-slurm/1"
_NUMPY_KINDS = "biuf"  # bool, signed, unsigned, float scalars: a dtype name and a plain value


def _refused(where: Path | str, what: str) -> ClusterError:
    return ClusterError(
        f"{where}: {what}; it was not loaded",
        "check who can write to the run's work folder, delete the stage's folder under work/slurm/ "
        "and re-run the command",
    )


def task_name(fn: Callable[..., Any]) -> str:
    """ "module:qualname" of a task function the Slurm executor may run; ClusterError otherwise."""
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"
    if name not in TASKS:
        raise ClusterError(
            f"{name} is not one of the task functions the Slurm executor runs by name",
            "map a module-level oreline task function, and list it in oreline.executors.wire.TASKS",
        )
    return name


def _lookup(name: str, allowed: frozenset[str], where: Path | str, what: str) -> Any:
    if name not in allowed:  # checked before any import: the file cannot choose what is imported
        raise _refused(where, f"names {name!r}, which is not {what}")
    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def task_function(name: str, where: Path | str) -> Callable[..., Any]:
    """The task function `name` ("module:qualname"), when it is one of TASKS."""
    return _lookup(name, TASKS, where, "a task function oreline runs on Slurm")


# ---------------------------------------------------------------------------------------------
# values


def encode(value: Any) -> Any:
    """`value` as JSON-ready data; TypeError for a type that cannot travel."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if type(value) is list:
        return [encode(v) for v in value]
    if type(value) is tuple:
        return {"$tuple": [encode(v) for v in value]}
    if type(value) is dict:
        if all(type(k) is str for k in value):
            return {"$dict": {k: encode(v) for k, v in value.items()}}
        return {"$pairs": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, PurePath):
        return {"$path": str(value)}
    if type(value) is bytes:
        return {"$bytes": b64encode(value).decode("ascii")}
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        from oreline.config import Section

        cls = type(value)
        if not isinstance(value, Section) or cls.__module__ != "oreline.config":
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} is not an oreline config section")
        out = {
            "$config": cls.__qualname__,
            "fields": {k: encode(getattr(value, k)) for k in cls.model_fields},
        }
        # which keys the user's command line set (config.command_line_keys) travels with the values
        command_line = getattr(value, "__pydantic_private__", None) or {}
        if command_line.get("_command_line"):
            out["command_line"] = sorted(command_line["_command_line"])
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        name = f"{cls.__module__}:{cls.__qualname__}"
        if name not in DATACLASSES:
            raise TypeError(f"{name} is not in oreline.executors.wire.DATACLASSES")
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"$dataclass": name, "fields": fields}
    numpy = _numpy_scalar(value)
    if numpy is not None:
        return numpy
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__} cannot travel to a Slurm task")


def _numpy_scalar(value: Any) -> dict | None:
    import sys

    np = sys.modules.get("numpy")  # a numpy value implies numpy is imported
    if np is None or not isinstance(value, np.generic) or value.dtype.kind not in _NUMPY_KINDS:
        return None
    plain = value.item()
    return {"$numpy": value.dtype.name, "value": plain if math.isfinite(plain) else repr(plain)}


def decode(data: Any, where: Path | str) -> Any:
    """The value `encode` turned into `data`; ClusterError naming `where` for anything else."""
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, list):
        return [decode(v, where) for v in data]
    if not isinstance(data, dict) or len(data) not in (1, 2, 3):  # (3: a config's command-line keys)
        raise _refused(where, f"holds a value oreline does not write ({type(data).__name__})")
    tag = next(iter(data))
    body = data[tag]
    try:
        if tag == "$tuple" and len(data) == 1:
            return tuple(decode(v, where) for v in _of(body, list))
        if tag == "$dict" and len(data) == 1:
            return {k: decode(v, where) for k, v in _of(body, dict).items()}
        if tag == "$pairs" and len(data) == 1:
            return {decode(k, where): decode(v, where) for k, v in _of(body, list)}
        if tag == "$float" and len(data) == 1 and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "$path" and len(data) == 1:
            return Path(_of(body, str))
        if tag == "$bytes" and len(data) == 1:
            return b64decode(_of(body, str), validate=True)
        if tag == "$numpy" and set(data) == {"$numpy", "value"}:
            return _decode_numpy(_of(body, str), data["value"], where)
        if tag == "$config" and set(data) in ({"$config", "fields"}, {"$config", "fields", "command_line"}):
            return _decode_config(_of(body, str), _of(data["fields"], dict), where, data.get("command_line"))
        if tag == "$dataclass" and set(data) == {"$dataclass", "fields"}:
            cls = _lookup(_of(body, str), DATACLASSES, where, "a dataclass oreline sends to Slurm tasks")
            fields = {k: decode(v, where) for k, v in _of(data["fields"], dict).items()}
            from pydantic import TypeAdapter

            return TypeAdapter(cls).validate_python(fields)
    except ClusterError:
        raise
    except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise _refused(where, f"holds a {tag} value that does not validate ({str(exc)[:300]})") from None
    raise _refused(where, f"holds a value tagged {str(tag)[:40]!r}, which oreline does not write")


def _of(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected a {kind.__name__}, got {type(value).__name__}")
    return value


def _decode_numpy(dtype: str, value: Any, where: Path | str) -> Any:
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in _NUMPY_KINDS or dt.name != dtype:
        raise _refused(where, f"holds a numpy scalar of dtype {dtype[:40]!r}, which oreline does not write")
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        value = float(value)
    if not isinstance(value, (bool, int, float)):
        raise TypeError(f"a numpy {dtype} scalar holds a {type(value).__name__}")
    return dt.type(value)


def _decode_config(name: str, fields: dict, where: Path | str, command_line: Any = None) -> Any:
    import oreline.config as config

    cls = getattr(config, name, None) if name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, config.Section) and cls.__module__ == config.__name__):
        raise _refused(where, f"names {name[:60]!r}, which is not an oreline config section")
    out = cls.model_validate({k: decode(v, where) for k, v in fields.items()})
    if command_line:
        if not (isinstance(command_line, list) and all(isinstance(k, str) for k in command_line)):
            raise _refused(where, "holds a config whose command-line keys are not a list of names")
        out._command_line = frozenset(command_line)
    return out


# ---------------------------------------------------------------------------------------------
# files


def dumps(kind: str, **content: Any) -> bytes:
    """A job or result file's bytes: {"format", "kind", ...content encoded}."""
    return json.dumps(
        {"format": FORMAT, "kind": kind, **{k: encode(v) for k, v in content.items()}},
        ensure_ascii=True,
        allow_nan=False,
        separators=(",", ":"),
    ).encode("ascii")


def loads(data: bytes, kind: str, where: Path | str) -> dict[str, Any]:
    """The content `dumps(kind, ...)` wrote; ClusterError naming `where` for anything else."""
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise _refused(where, f"is not a {kind} file oreline wrote ({str(exc)[:200]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("kind") != kind:
        raise _refused(where, f"is not a {kind} file of this oreline version ({FORMAT})")
    return {k: decode(v, where) for k, v in doc.items() if k not in ("format", "kind")}


def _no_constant(name: str) -> Any:
    raise ValueError(f"bare {name} (oreline writes non-finite floats tagged)")
