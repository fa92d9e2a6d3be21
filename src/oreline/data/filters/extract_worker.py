"""HTML extraction in a killable child process: the time limit and a memory cap hold inside C.

Why a child process (issue 21): resiliparse parses and extracts in C, where SIGALRM is only
seen when the call returns, so `data.extract.timeout_s` could not stop a page. Measured before:
a 48 MB page of `<p>x` took 36.8 s and 7.0 GB with timeout_s=5 (~560 bytes of memory per
element). No cheap pre-check bounds it either: lexbor's parser is quadratic in the distinct
attribute names of one element (measured: 10,000 in a 59 KB page 0.8 s, 40,000 in 269 KB 15 s,
with attribute names that may even start with `<`), so neither the page's bytes nor a count of
its `<` tags bounds the time.

How: one child per process (`python -m oreline.data.filters.extract_worker MAX_MEMORY_MB EXTRACTOR`), started on
first use and reused for every page. It sets RLIMIT_AS to `data.extract.max_memory_mb` on
itself, so a page that needs more fails there (lexbor then raises, Python MemoryError) and is
dropped as `extract:too_large`. The parent sends the page over a pipe and waits for the text
until the page has taken `timeout_s` of wall time and the child has spent `timeout_s` of CPU time
on it, or WALL_FACTOR x timeout_s of wall time; past that it kills the child (SIGKILL),
drops the page as `extract:timeout` and starts a new child for the next page (~0.3 s). A child
that dies on a page drops that page as `extract:error`. Memory of the pipeline process stays the
page itself; the child's is capped.

Why CPU time, and why the child's start-up is not counted: a wall-clock limit made the output
depend on the machine's load. A page of a few milliseconds was dropped as `extract:timeout` when
the child started (Python, then the extractors' imports, timed with the page) on a machine so
busy that it took seconds, or when the process was starved of CPU; the same inputs then gave
other rejects on Ray than locally (a CI run showed it). Now the child says when it is ready, the
page's time starts then, and what counts is the CPU time it spends (Linux `/proc`; elsewhere wall
time). A wall-clock cap of WALL_FACTOR x timeout_s still bounds a page on a starved machine. The
child's CPU time only needs reading once a page has taken timeout_s of wall time (a
single-threaded child spends no more CPU than wall time): each reply carries the child's CPU time
at its end, which is the next page's start (the child is idle between pages), so an ordinary page
costs no `/proc` read (~65 us each, ~2% of a page).

Protocol (native byte order is fine: both ends are this module on one machine): the child writes
READY and its CPU time (`<d`) once its imports are done; request = `<IQ` (meta length, html
length) + JSON [extractor, main_content] + UTF-8 html; reply = `<BQd` (status, length, the child's
CPU time) + the extraction path (ASCII), a NUL byte and the UTF-8 text, or an error message.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from oreline.errors import ConfigError

_REQUEST = struct.Struct("<IQ")
READY = b"R"
WALL_FACTOR = 4  # a page on a starved machine still ends within WALL_FACTOR x timeout_s of wall time
START_LIMIT_S = 300.0  # the child's start-up (interpreter and imports), however busy the machine
_REPLY = struct.Struct("<BQd")
_CPU = struct.Struct("<d")
OK, FAILED, TOO_LARGE, CONFIG = 0, 1, 2, 3
# lexbor reports a failed allocation as a failed parse
_OUT_OF_MEMORY = ("MemoryError", "HTMLParserException")


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (Linux /proc), None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may hold spaces and ")"
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime: fields 14 and 15


class _TimedOut(Exception):
    """The reply did not come within the time it was given."""


class _Child:
    """One extraction child process and its pipes."""

    def __init__(self, max_memory_mb: int, extractor: str):
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[3])  # the oreline this process runs
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.max_memory_mb = max_memory_mb
        self.owner = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oreline.data.filters.extract_worker", str(int(max_memory_mb)), extractor],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.ready = False
        self.cpu_idle = 0.0  # the child's CPU seconds when it last replied: the next page's start

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def kill(self) -> None:
        if self.owner != os.getpid():
            return
        with contextlib.suppress(OSError):
            self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.proc.wait()

    def _read_exact(self, n: int, time_left: Callable[[], float | None]) -> bytes | None:
        """n bytes of the reply; None when the child is gone. Raises _TimedOut once `time_left()`
        (seconds; None: no limit) is spent."""
        fd = self.proc.stdout.fileno()
        parts, got = [], 0
        while got < n:
            while (left := time_left()) is not None:
                if left <= 0:
                    raise _TimedOut
                if select.select([fd], [], [], max(left, 0.01))[0]:
                    break
            piece = os.read(fd, min(n - got, 1 << 20))
            if not piece:
                return None
            parts.append(piece)
            got += len(piece)
        return b"".join(parts)

    def _page_clock(self, timeout_s: float | None) -> Callable[[], float | None]:
        """Seconds left to the page from now (module docstring): timeout_s of wall time, then of
        the child's CPU time (where that cannot be read, wall time alone), at most WALL_FACTOR x
        timeout_s of wall time; None: no limit."""
        if not timeout_s or timeout_s <= 0:
            return lambda: None
        start = time.monotonic()
        wall_end = start + WALL_FACTOR * timeout_s

        def left() -> float:
            now = time.monotonic()
            if now - start < timeout_s:  # the child cannot have spent more CPU than that
                return timeout_s - (now - start)
            cpu = _cpu_seconds(self.proc.pid)
            used = now - start if cpu is None else cpu - self.cpu_idle
            return min(wall_end - now, timeout_s - used)

        return left

    def extract(
        self, html: str, extractor: str, main_content: bool, timeout_s: float | None
    ) -> tuple[str, str | None, str]:
        """(text, None, path) or ("", reason, path); the child is killed on a timeout or a broken pipe."""
        if not self.ready:  # its start-up is not the page's time (module docstring)
            start_end = time.monotonic() + START_LIMIT_S
            with contextlib.suppress(_TimedOut):
                ready = self._read_exact(len(READY) + _CPU.size, lambda: start_end - time.monotonic())
                if ready is not None and ready.startswith(READY):
                    self.ready, (self.cpu_idle,) = True, _CPU.unpack(ready[len(READY) :])
            if not self.ready:
                self.kill()
                return "", "extract:error", extractor
        data = html.encode("utf-8", "surrogatepass")
        meta = json.dumps([extractor, bool(main_content)]).encode()
        try:
            self.proc.stdin.write(_REQUEST.pack(len(meta), len(data)) + meta)
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return "", "extract:error", extractor
        del data
        clock = self._page_clock(timeout_s)
        body = None
        try:
            head = self._read_exact(_REPLY.size, clock)
            if head is not None:
                status, length, self.cpu_idle = _REPLY.unpack(head)
                body = self._read_exact(length, clock)
        except _TimedOut:
            self.kill()
            return "", "extract:timeout", extractor
        if body is None:
            self.kill()
            return "", "extract:error", extractor
        if status == OK:
            path, _, text = body.partition(b"\0")
            return text.decode("utf-8", "surrogatepass"), None, path.decode("ascii")
        if status == CONFIG:
            raise ConfigError(
                body.decode("utf-8", "replace"),
                "pip install 'oreline[extract]' or set data.extract.extractor=resiliparse",
            )
        return "", "extract:too_large" if status == TOO_LARGE else "extract:error", extractor


_child: _Child | None = None


def _shutdown() -> None:
    if _child is not None:
        _child.kill()


atexit.register(_shutdown)


def extract_isolated(
    html: str, extractor: str, main_content: bool, timeout_s: float | None, max_memory_mb: int
) -> tuple[str, str | None, str]:
    """(text, None, path) or ("", "extract:timeout" | "extract:too_large" | "extract:error", path),
    computed in this process's extraction child (started or restarted as needed); the path is the
    extractor's name when the page failed."""
    global _child
    if _child is None or not _child.alive() or _child.max_memory_mb != max_memory_mb:
        if _child is not None:
            _child.kill()
        _child = _Child(max_memory_mb, extractor)
    return _child.extract(html, extractor, main_content, timeout_s)


# ---------------------------------------------------------------------------------------------
# the child


def _read(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def main(argv: list[str]) -> None:
    import resource

    limit = int(argv[0]) << 20 if argv else 0
    warm = argv[1] if len(argv) > 1 else "default"
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if limit > 0:  # never above a cap the parent already runs under (raising it is not allowed)
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints must not reach the reply pipe
    from oreline.data.filters.extract import EXTRACTORS

    # the extractor's lazy imports and selector files, before READY: not timed with a page
    with contextlib.suppress(Exception):
        EXTRACTORS[warm]("<html><body><p>ready</p></body></html>", True)
    out.write(READY + _CPU.pack(time.process_time()))
    out.flush()
    while True:
        head = _read(inp, _REQUEST.size)
        if head is None:
            return  # the parent closed the pipe (or exited)
        n_meta, n_html = _REQUEST.unpack(head)
        meta, raw = _read(inp, n_meta), _read(inp, n_html)
        if meta is None or raw is None:
            return
        extractor, main_content = json.loads(meta)
        try:
            html = raw.decode("utf-8", "surrogatepass")
            del raw
            text, path = EXTRACTORS[extractor](html, main_content)
            reply = path.encode("ascii") + b"\0" + text.encode("utf-8", "surrogatepass")
            del text
            status = OK
        except ConfigError as exc:
            status, reply = CONFIG, str(exc).encode()
        except Exception as exc:  # MemoryError included: the page fails, the child goes on
            status = TOO_LARGE if type(exc).__name__ in _OUT_OF_MEMORY else FAILED
            reply = f"{type(exc).__name__}: {exc}"[:500].encode("utf-8", "replace")
        html = raw = None
        out.write(_REPLY.pack(status, len(reply), time.process_time()) + reply)
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
