"""Environment doctor: will this machine run oreline (and a distributed job) correctly?

`check_env(distributed, run_dir)` returns one `Finding` per check; `doctor_env_cli` prints them
as a table and returns exit code 1 when any check failed. Checks never raise: an exception inside
a check becomes that check's `fail` finding with the exception as evidence.

Always:
- torch: version, build (CPU / CUDA x.y), and whether CUDA is claimed available.
- cuda_driver: the driver's supported CUDA version (`nvidia-smi` header) must be >= the CUDA that
  torch was built with; GPUs visible to `nvidia-smi` with a CPU-only torch is a warning.
- cuda_tensor: when CUDA is claimed, `torch.ones(1).cuda()` must work (catches a broken driver,
  a busy/exclusive GPU, a MIG slice without access).
- devices: device names and memory (CPU: logical cores).
- disk: free space on the run directory's filesystem; warn below 10 GB, fail below 1 GB.
- port: torchrun's default rendezvous port 29500 (or MASTER_PORT) can be bound locally.

With `--distributed`:
- rendezvous: MASTER_ADDR/MASTER_PORT when set: a local address must be bindable on that port;
  a remote one must resolve and answer (a refused connection means the host is up but nothing
  listens yet, which is normal before rank 0 starts: warn). Unset: a bind test on a free port.
- backends: gloo/NCCL availability; NCCL version (`torch.cuda.nccl.version()`) with CUDA.
- gloo_interface / nccl_interface: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, when set, name an
  interface with an IPv4 address (a warning when MASTER_ADDR is reached through another one);
  unset, the host's name must not resolve to loopback, where other nodes cannot connect (the
  interface that routes to MASTER_ADDR is suggested; oreline sets it itself on multi-node launches).
- visible_devices: CUDA_VISIBLE_DEVICES versus the devices torch sees versus LOCAL_WORLD_SIZE.
- clock: `chronyc tracking` offset; warn above 0.1 s, fail above 1 s (torch elastic timeouts and
  log ordering across nodes assume roughly synchronized clocks). Without chronyc: skip.
- shared_fs: write + fsync + read + delete a probe file in the run directory (what every rank
  does when it writes a checkpoint shard).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from oreline.io import write_new

STATUSES = ("ok", "warn", "fail", "skip")
DISK_WARN_GB = 10.0
DISK_FAIL_GB = 1.0
CLOCK_WARN_S = 0.1
CLOCK_FAIL_S = 1.0
DEFAULT_RDZV_PORT = 29500


@dataclass
class Finding:
    """One check's outcome. `check` is a stable id; `fix` says what to do when not ok."""

    check: str
    status: str  # ok | warn | fail | skip
    evidence: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding status {self.status!r} is not one of {STATUSES}")


def print_findings(findings: list[Finding], console: Console, title: str) -> None:
    colors = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    table = Table(title=title, show_lines=False)
    for col in ("check", "status", "evidence", "fix"):
        table.add_column(col, overflow="fold")
    for f in findings:
        table.add_row(f.check, f"[{colors[f.status]}]{f.status}[/]", f.evidence, f.fix)
    console.print(table)
    counts = {s: sum(f.status == s for f in findings) for s in STATUSES}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items() if n))


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    """stdout of a command, or None when it is absent or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


# ---------------------------------------------------------------------------------------------
# single-machine checks


def check_torch() -> list[Finding]:
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    claimed = torch.cuda.is_available()
    findings = [Finding("torch", "ok", f"torch {torch.__version__} ({build}); cuda available: {claimed}")]

    smi = _run(["nvidia-smi"])
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    driver_cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi or "")
    driver_version = (driver or "?").strip().splitlines()[0] if (driver or "").strip() else "?"
    if torch.version.cuda is None:
        if smi is not None:
            findings.append(
                Finding(
                    "cuda_driver",
                    "warn",
                    "nvidia-smi sees GPUs but torch is a CPU-only build",
                    "install a CUDA build of torch==" + torch.__version__.split("+")[0],
                )
            )
        else:
            findings.append(
                Finding("cuda_driver", "skip", "CPU-only torch and no nvidia-smi: training runs on CPU")
            )
    elif smi is None:
        findings.append(
            Finding(
                "cuda_driver",
                "fail" if not claimed else "warn",
                f"torch built with CUDA {torch.version.cuda} but nvidia-smi is absent or fails",
                "install the NVIDIA driver (or run on a GPU node)",
            )
        )
    elif driver_cuda and _version_tuple(driver_cuda.group(1)) < _version_tuple(torch.version.cuda):
        findings.append(
            Finding(
                "cuda_driver",
                "fail",
                f"driver {driver_version} supports CUDA {driver_cuda.group(1)}, "
                f"torch needs CUDA {torch.version.cuda}",
                "upgrade the NVIDIA driver or install a torch built for an older CUDA",
            )
        )
    else:
        supported = driver_cuda.group(1) if driver_cuda else "?"
        findings.append(
            Finding(
                "cuda_driver",
                "ok",
                f"driver {driver_version} (supports CUDA {supported}) >= torch CUDA {torch.version.cuda}",
            )
        )

    if claimed:
        try:
            value = torch.ones(1).cuda()
            torch.cuda.synchronize()
            findings.append(Finding("cuda_tensor", "ok", f"torch.ones(1).cuda() -> {value.device}"))
        except Exception as exc:  # any CUDA failure is the finding itself
            findings.append(
                Finding(
                    "cuda_tensor",
                    "fail",
                    f"torch.ones(1).cuda() raised {type(exc).__name__}: {exc}",
                    "check nvidia-smi for busy/exclusive GPUs and that the driver matches torch",
                )
            )
    else:
        findings.append(Finding("cuda_tensor", "skip", "CUDA not available to torch"))
    findings.append(check_devices())
    return findings


def check_devices() -> Finding:
    import torch

    if torch.cuda.is_available():
        names = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            names.append(f"cuda:{i} {props.name} {props.total_memory / 2**30:.0f} GiB")
        return Finding(
            "devices",
            "ok" if names else "fail",
            "; ".join(names) or "CUDA available but 0 devices",
            "" if names else "check CUDA_VISIBLE_DEVICES",
        )
    return Finding(
        "devices", "ok", f"cpu: {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}"
    )


def check_disk(path: Path) -> Finding:
    target = path
    while not target.exists() and target != target.parent:
        target = target.parent  # the run dir may not exist yet: measure the filesystem it will be on
    usage = shutil.disk_usage(target)
    free_gb = usage.free / 1e9
    evidence = f"{free_gb:.1f} GB free of {usage.total / 1e9:.1f} GB on the filesystem of {target}"
    if free_gb < DISK_FAIL_GB:
        return Finding("disk", "fail", evidence, "free space or point run.runs_dir at a larger filesystem")
    if free_gb < DISK_WARN_GB:
        return Finding("disk", "warn", evidence, "checkpoints of large models need tens of GB: free space")
    return Finding("disk", "ok", evidence)


def _bind(host: str, port: int) -> tuple[bool, str]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
            return True, f"bound {host}:{sock.getsockname()[1]}"
        except OSError as exc:
            return False, f"cannot bind {host}:{port}: {exc.strerror or exc}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _env_int(name: str) -> int | None:
    """An integer environment variable; a malformed one raises a ValueError naming it."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def check_port() -> Finding:
    try:
        port = _env_int("MASTER_PORT") or DEFAULT_RDZV_PORT
    except ValueError as exc:
        return Finding("port", "fail", str(exc), "set MASTER_PORT to a port number, e.g. 29500")
    ok, evidence = _bind("", port)
    if ok:
        return Finding("port", "ok", f"rendezvous port {port} is free ({evidence})")
    return Finding(
        "port",
        "warn",
        f"{evidence} (another job or a stale torchrun holds it)",
        f"pick another port: MASTER_PORT={free_port()} (or --rdzv-endpoint host:port)",
    )


# ---------------------------------------------------------------------------------------------
# distributed checks


def _is_local(addr: str) -> bool:
    if addr in ("localhost", "127.0.0.1", "::1", "0.0.0.0", socket.gethostname()):
        return True
    try:
        target = socket.gethostbyname(addr)
    except OSError:
        return False
    if target.startswith("127."):
        return True
    try:
        local = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        local = set()
    return target in local


def check_rendezvous(timeout: float = 3.0) -> Finding:
    addr, port_text = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port_text:
        port = free_port()
        ok, evidence = _bind("127.0.0.1", port)
        return Finding(
            "rendezvous",
            "ok" if ok else "fail",
            f"MASTER_ADDR/MASTER_PORT unset; local bind test: {evidence}",
            "" if ok else "the loopback interface is unusable: check the network namespace",
        )
    try:
        port = int(port_text)
    except ValueError:
        return Finding(
            "rendezvous",
            "fail",
            f"MASTER_PORT={port_text!r} is not an integer",
            "set MASTER_PORT to a port number, e.g. 29500",
        )
    if _is_local(addr):
        ok, evidence = _bind("", port)
        return Finding(
            "rendezvous",
            "ok" if ok else "fail",
            f"MASTER_ADDR={addr} is this host; {evidence}",
            "" if ok else f"the port is taken: set MASTER_PORT={free_port()}",
        )
    try:
        ip = socket.gethostbyname(addr)
    except OSError as exc:
        return Finding(
            "rendezvous",
            "fail",
            f"MASTER_ADDR={addr} does not resolve ({exc})",
            "set MASTER_ADDR to the first node's hostname or IP as seen from this node",
        )
    start = time.perf_counter()
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            ms = (time.perf_counter() - start) * 1000
        return Finding("rendezvous", "ok", f"connected to {addr} ({ip}):{port} in {ms:.1f} ms")
    except ConnectionRefusedError:
        return Finding(
            "rendezvous",
            "warn",
            f"{addr} ({ip}) answers but nothing listens on port {port}",
            "normal before rank 0 starts; otherwise check MASTER_PORT matches rank 0's",
        )
    except OSError as exc:
        return Finding(
            "rendezvous",
            "fail",
            f"no answer from {addr} ({ip}):{port} within {timeout:.0f} s ({exc})",
            "open the port between nodes (firewall / security group) or use the right interface",
        )


def check_backends() -> list[Finding]:
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return [
            Finding(
                "backends",
                "fail",
                "torch.distributed is not available in this build",
                "install a torch build with distributed support",
            )
        ]
    names = [n for n, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available())) if ok]
    findings = [
        Finding(
            "backends",
            "ok" if "gloo" in names or "nccl" in names else "fail",
            f"available backends: {', '.join(names) or 'none'}",
            "" if names else "install a torch build with gloo or NCCL",
        )
    ]
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            text = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            findings.append(Finding("nccl", "ok", f"NCCL {text} with torch CUDA {torch.version.cuda}"))
        except Exception as exc:  # a broken NCCL is the finding
            findings.append(
                Finding(
                    "nccl",
                    "fail",
                    f"torch.cuda.nccl.version() raised {exc}",
                    "reinstall torch (it bundles its NCCL); unset LD_LIBRARY_PATH overrides",
                )
            )
    else:
        findings.append(Finding("nccl", "skip", "CUDA not available: NCCL unused (gloo on CPU)"))
    return findings


def check_socket_interfaces() -> list[Finding]:
    """The interface gloo and NCCL open their sockets on: a named one (GLOO_SOCKET_IFNAME,
    NCCL_SOCKET_IFNAME) must exist and hold an IPv4 address; unset, gloo takes the address this
    host's name resolves to, which must not be loopback when other nodes are to reach it."""
    import psutil

    from oreline.train.dist import route_interface

    addrs = {
        name: [a.address for a in infos if a.family == socket.AF_INET]
        for name, infos in psutil.net_if_addrs().items()
    }
    master = os.environ.get("MASTER_ADDR")
    route, _ = route_interface(master) if master else (None, None)
    findings = []
    for var, lib in (("GLOO_SOCKET_IFNAME", "gloo"), ("NCCL_SOCKET_IFNAME", "nccl")):
        value = os.environ.get(var)
        check = f"{lib}_interface"
        if value:
            # NCCL takes a comma list and prefixes (^ excludes, = exact); gloo takes one name
            names = [n.lstrip("=") for n in value.split(",") if n and not n.startswith("^")]
            missing = [n for n in names if n not in addrs and not any(k.startswith(n) for k in addrs)]
            bare = [n for n in names if n in addrs and not addrs[n]]
            if missing or bare:
                findings.append(
                    Finding(
                        check,
                        "fail",
                        f"{var}={value}: "
                        + (
                            f"no interface {', '.join(missing)}"
                            if missing
                            else f"{', '.join(bare)} has no IPv4 address"
                        )
                        + f" (this host has {', '.join(f'{k} {v[0]}' for k, v in addrs.items() if v)})",
                        f"set {var} (or train.socket_ifname) to an interface listed here"
                        + (f", e.g. {route}, which routes to MASTER_ADDR" if route else ""),
                    )
                )
                continue
            warn = master is not None and route is not None and route not in names and route != "lo"
            findings.append(
                Finding(
                    check,
                    "warn" if warn else "ok",
                    f"{var}={value}"
                    + (f"; MASTER_ADDR={master} is reached through {route}" if route else ""),
                    f"check that {value} reaches the other nodes (the route to MASTER_ADDR is {route})"
                    if warn
                    else "",
                )
            )
            continue
        if lib == "nccl":
            try:
                import torch

                cuda = torch.cuda.is_available()
            except Exception:  # the torch check reports a broken torch
                cuda = False
            if not cuda:
                findings.append(Finding(check, "skip", f"{var} unset; CUDA not available: NCCL unused"))
                continue
        try:
            own = socket.gethostbyname(socket.gethostname())
        except OSError:
            own = None
        nodes = _env_int("SLURM_JOB_NUM_NODES") or 1
        world, local_world = _env_int("WORLD_SIZE"), _env_int("LOCAL_WORLD_SIZE")
        several = (
            nodes > 1 or (world or 0) > (local_world or world or 0) or bool(master and not _is_local(master))
        )
        if (own is None or own.startswith("127.")) and several:
            findings.append(
                Finding(
                    check,
                    "warn",
                    f"{var} unset and this host's name resolves to {own or 'nothing'}: {lib} would listen "
                    "where other nodes cannot connect"
                    + (
                        f"; oreline sets it to {route} (the route to MASTER_ADDR) on multi-node launches"
                        if route
                        else ""
                    ),
                    f"set train.socket_ifname (or {var}) to the interface between the nodes"
                    + (f", e.g. {route}" if route and route != "lo" else ""),
                )
            )
        else:
            findings.append(
                Finding(
                    check,
                    "ok",
                    f"{var} unset; {lib} uses {own}, the address of this host's name"
                    + ("" if several else " (one node: enough)"),
                )
            )
    return findings


def check_visible_devices() -> Finding:
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        local_world = _env_int("LOCAL_WORLD_SIZE")
    except ValueError as exc:
        return Finding("visible_devices", "fail", str(exc), "unset LOCAL_WORLD_SIZE (torchrun sets it)")
    evidence = f"CUDA_VISIBLE_DEVICES={visible!r}, torch sees {count} CUDA device(s)"
    if visible is not None and visible.strip() in ("", "-1", "NoDevFiles"):
        return Finding(
            "visible_devices",
            "warn" if count == 0 else "ok",
            evidence + " (GPUs hidden on purpose?)",
            "unset CUDA_VISIBLE_DEVICES to use the GPUs",
        )
    if local_world and count and local_world > count:
        return Finding(
            "visible_devices",
            "fail",
            evidence + f", LOCAL_WORLD_SIZE={local_world}",
            "run at most one process per visible GPU (--nproc-per-node)",
        )
    return Finding("visible_devices", "ok", evidence)


def check_clock() -> Finding:
    out = _run(["chronyc", "tracking"], timeout=5.0)
    if out is None:
        reason = "chronyc absent" if shutil.which("chronyc") is None else "chronyc tracking failed"
        return Finding("clock", "skip", f"not checked: {reason}", "compare `date +%s.%N` across nodes")
    return clock_from_tracking(out)


def clock_from_tracking(out: str) -> Finding:
    """The clock finding from the text `chronyc tracking` printed."""
    match = re.search(r"System time\s*:\s*([\d.]+) seconds (fast|slow)", out)
    if not match:
        return Finding(
            "clock", "warn", "chronyc tracking gave no 'System time' line", "check chronyd is running"
        )
    offset = float(match.group(1))
    evidence = f"system clock {offset:.6f} s {match.group(2)} of NTP time"
    if offset > CLOCK_FAIL_S:
        return Finding("clock", "fail", evidence, "synchronize clocks (chronyd / NTP) on every node")
    if offset > CLOCK_WARN_S:
        return Finding("clock", "warn", evidence, "synchronize clocks (chronyd / NTP) on every node")
    return Finding("clock", "ok", evidence)


def check_shared_fs(run_dir: Path) -> Finding:
    """Write, fsync, read back and delete a probe file where checkpoints will be written."""
    probe = Path(run_dir) / f".oreline-probe-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    payload = os.urandom(4096)
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        write_new(probe, payload, sync=True)
        back = probe.read_bytes()
        probe.unlink()
        ms = (time.perf_counter() - start) * 1000
    except OSError as exc:
        return Finding(
            "shared_fs",
            "fail",
            f"probe in {run_dir} failed: {exc}",
            "make the run directory writable from every node (a shared filesystem)",
        )
    if back != payload:
        return Finding(
            "shared_fs",
            "fail",
            f"probe in {run_dir} read back different bytes",
            "the filesystem does not give read-after-write consistency: use another one",
        )
    return Finding(
        "shared_fs",
        "ok",
        f"write+fsync+read+delete of 4 KiB in {run_dir} took {ms:.1f} ms "
        "(run this on every node to confirm the path is shared)",
    )


# ---------------------------------------------------------------------------------------------


def _guarded(name: str, fn, *args) -> list[Finding]:
    try:
        out = fn(*args)
    except Exception as exc:  # a check that crashes is a failed check, never a crashed doctor
        return [
            Finding(
                name, "fail", f"check raised {type(exc).__name__}: {exc}", "report this as an oreline bug"
            )
        ]
    return out if isinstance(out, list) else [out]


def check_env(distributed: bool = False, run_dir: Path | None = None) -> list[Finding]:
    run_dir = Path(run_dir) if run_dir is not None else Path.cwd()
    findings = _guarded("torch", check_torch)
    findings += _guarded("disk", check_disk, run_dir)
    findings += _guarded("port", check_port)
    if distributed:
        findings += _guarded("rendezvous", check_rendezvous)
        findings += _guarded("backends", check_backends)
        findings += _guarded("socket_interfaces", check_socket_interfaces)
        findings += _guarded("visible_devices", check_visible_devices)
        findings += _guarded("clock", check_clock)
        findings += _guarded("shared_fs", check_shared_fs, run_dir)
    return findings


def doctor_env_cli(
    distributed: bool = False, run_dir: Path | None = None, console: Console | None = None
) -> int:
    findings = check_env(distributed=distributed, run_dir=run_dir)
    print_findings(
        findings, console or Console(), "oreline doctor env" + (" --distributed" if distributed else "")
    )
    return 1 if any(f.status == "fail" for f in findings) else 0
