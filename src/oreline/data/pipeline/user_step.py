"""A user's own document step: `{ kind = "python", function = "module:function" }` in [[data.steps]].

The function is imported where the task runs (a local worker process, a Ray worker, a Slurm
array task), by module name when the module is importable there, or from a file when the
part before the colon ends in ".py" (a path every worker must see, as the inputs). It is called
as `function(doc, **args)` and returns:

- None: keep the document (the function may have changed `doc.text` or `doc.metadata`);
- a string: drop it; the reason in stats.json and rejects/ is "<step name>:<string>" (the
  step's name is its `name`, else the function's name), so user reasons never mix with built-in ones;
- a Document: it replaces the document (a mapper);
- with `many = true`, a list of Documents that replace it (none: dropped as "<name>:empty").

The step runs inside the runner like any built-in step: counted, timed, its drops written to
rejects/. An exception in the function drops that document as "<name>:error:<ExceptionType>"
with the traceback's last line in the reject's metadata ("error"); the task goes on.

The function's source (the whole module file) is hashed into the data fingerprint
(`source_sha256`), so editing it reruns the data stage rather than reusing a stale output.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from oreline.data.pipeline.runner import Step
from oreline.document import Document
from oreline.errors import ConfigError


def _module(spec: str):
    """The module part of "module:function" or "/path/file.py:function", imported."""
    name = spec.rpartition(":")[0]
    if name.endswith(".py"):
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(
                f"data.steps: the python step's file {path} does not exist here",
                "give a path every worker can read (a shared filesystem), or an importable module name",
            )
        _refuse_foreign(path)
        key = f"oreline_user_step_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        if key in sys.modules:
            return sys.modules[key]
        loader = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[key] = module
        try:
            loader.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[key]
            raise ConfigError(
                f"data.steps: importing {path} failed: {type(exc).__name__}: {exc}",
                "fix the file and run again",
            ) from exc
        return module
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(
            f"data.steps: the python step's module {name!r} cannot be imported ({exc})",
            "install it where the tasks run, put it on PYTHONPATH, or give '/path/to/file.py:function'",
        ) from exc


def _refuse_foreign(path: Path) -> None:
    """A step's file runs as this user: one that another user owns or may change (group- or
    world-writable, or in such a folder) is refused, so that nobody else decides what runs."""
    import os

    for p in (path, path.parent):
        st = os.stat(p)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise ConfigError(
                f"data.steps: the python step's {'file' if p == path else 'folder'} {p} is "
                + ("owned by another user" if st.st_uid != os.getuid() else "writable by others")
                + ": its code would run as you, and someone else could change it",
                "copy the step's file into a folder of yours (chmod go-w), or install it as a module",
            )


def describe(spec: str) -> str:
    """Where the code of "module:function" is, with its source sha256 (what `oreline data` prints)."""
    module = _module(spec)
    path = getattr(module, "__file__", None) or "built in"
    return f"{spec} from {path} (sha256 {source_sha256(spec)[:16]}…)"


def load_function(spec: str):
    """The callable "module:function" names (ConfigError when it is missing or not callable)."""
    module = _module(spec)
    fn = getattr(module, spec.rpartition(":")[2], None)
    if not callable(fn):
        raise ConfigError(
            f"data.steps: {spec!r} names no function", f"define {spec.rpartition(':')[2]} in that module"
        )
    return fn


def source_sha256(spec: str) -> str:
    """sha256 of the source file of the function's module (what the data fingerprint holds)."""
    module = _module(spec)
    try:
        path = inspect.getsourcefile(module)
    except TypeError:  # a built-in module has no file
        path = None
    if path is None:
        return hashlib.sha256(spec.encode()).hexdigest()
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def python_step(settings, cfg=None, ctx=None) -> Step:
    """The runner Step of a [[data.steps]] entry of kind "python" (oreline.config.PythonStep)."""
    fn = load_function(settings.function)
    name = settings.step_name()
    args = dict(settings.args)

    if settings.many:

        def many(doc: Document) -> list[Document] | str:
            out = fn(doc, **args)
            if isinstance(out, str):
                return f"{name}:{out}"
            out = list(out or [])
            if not all(isinstance(d, Document) for d in out):
                raise TypeError(f"{settings.function} returned a list holding something other than Documents")
            return out

        return Step(name, many, many=True)

    def one(doc: Document) -> str | None:
        out = fn(doc, **args)
        if out is None:
            return None
        if isinstance(out, str):
            return f"{name}:{out}"
        if isinstance(out, Document):
            if out is not doc:  # a mapper: the runner carries the same object on
                doc.id, doc.text, doc.url, doc.metadata = out.id, out.text, out.url, out.metadata
            return None
        raise TypeError(
            f"{settings.function} returned {type(out).__name__}; expected None, a reason or a Document"
        )

    return Step(name, one)
