"""oreline doctor env: real checks on this machine, and failures provoked through the environment."""

from __future__ import annotations

import os
import shutil
import socket

import psutil
import pytest
import torch
from rich.console import Console

from oreline.doctor.env import (
    STATUSES,
    Finding,
    check_clock,
    check_disk,
    check_env,
    check_port,
    check_rendezvous,
    check_shared_fs,
    clock_from_tracking,
    doctor_env_cli,
)


def by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def test_env_reports_every_check_with_real_values(tmp_path):
    findings = by_check(check_env(distributed=True, run_dir=tmp_path))
    expected = {
        "torch",
        "cuda_driver",
        "cuda_tensor",
        "devices",
        "disk",
        "port",
        "rendezvous",
        "backends",
        "nccl",
        "visible_devices",
        "clock",
        "shared_fs",
    }
    assert expected <= set(findings)
    assert torch.__version__ in findings["torch"].evidence
    if not torch.cuda.is_available():
        assert findings["cuda_tensor"].status == "skip"
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    shown = float(findings["disk"].evidence.split(" GB free")[0])
    assert abs(shown - free_gb) < 1.0
    assert findings["shared_fs"].status == "ok"
    assert not list(tmp_path.iterdir()), "the shared-FS probe must be deleted"
    assert findings["clock"].status in STATUSES  # chronyd may or may not run here: both are covered below


def test_cli_exit_code_follows_failures(tmp_path):
    console = Console(record=True, width=200)
    code = doctor_env_cli(distributed=False, run_dir=tmp_path, console=console)
    statuses = {f.status for f in check_env(False, tmp_path)}
    assert code == (1 if "fail" in statuses else 0)
    assert "disk" in console.export_text()


def test_unwritable_run_dir_fails_shared_fs(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the run directory should be")
    finding = check_shared_fs(blocker / "run")
    assert finding.status == "fail" and finding.fix


def test_unresolvable_master_addr_fails(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    monkeypatch.setenv("MASTER_PORT", "29511")
    finding = check_rendezvous(timeout=1.0)
    assert finding.status == "fail" and "does not resolve" in finding.evidence


def test_local_master_port_in_use_fails(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        assert check_rendezvous().status == "fail"
        assert check_port().status == "warn"


def test_local_master_addr_with_free_port_is_ok(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", str(port))
    assert check_rendezvous().status == "ok"


def test_disk_check_walks_up_to_an_existing_folder(tmp_path):
    finding = check_disk(tmp_path / "runs" / "not-yet")
    assert finding.status in ("ok", "warn", "fail") and str(tmp_path) in finding.evidence


def test_clock_without_chronyc_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without chronyc, whatever this one has
    finding = check_clock()
    assert finding.status == "skip" and "chronyc absent" in finding.evidence


# `chronyc tracking` as chrony 4.3 prints it (the offset line varies below)
TRACKING = """Reference ID    : A9FEA97B (169.254.169.123)
Stratum         : 4
Ref time (UTC)  : Sat Dec 05 19:20:11 2026
System time     : {offset} seconds {side} of NTP time
Last offset     : -0.000001234 seconds
RMS offset      : 0.000012345 seconds
Frequency       : 11.123 ppm slow
Leap status     : Normal
"""


@pytest.mark.parametrize(
    ("offset", "side", "status"),
    [("0.000004512", "fast", "ok"), ("0.250000000", "slow", "warn"), ("2.000000000", "fast", "fail")],
)
def test_clock_offset_from_chronyc_tracking(offset, side, status):
    finding = clock_from_tracking(TRACKING.format(offset=offset, side=side))
    assert finding.status == status and f"{float(offset):.6f} s {side}" in finding.evidence
    assert clock_from_tracking("506 Cannot talk to daemon\n").status == "warn"


def test_cli_doctor_env_distributed(tmp_path):
    from typer.testing import CliRunner

    from oreline.cli import app

    result = CliRunner().invoke(
        app, ["doctor", "env", "--distributed", "--run-dir", str(tmp_path)], env={"COLUMNS": "200"}
    )
    statuses = {f.status for f in check_env(True, tmp_path)}
    assert result.exit_code == (1 if "fail" in statuses else 0), result.output
    for check in ("rendezvous", "shared_fs", "clock", "nccl"):
        assert check in result.output


def test_malformed_master_port_is_named(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500x")
    for finding in (check_port(), check_rendezvous()):
        assert finding.status == "fail" and "'29500x'" in finding.evidence and finding.fix


def test_gloo_interface_is_checked(monkeypatch):
    from oreline.doctor.env import check_socket_interfaces

    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "SLURM_JOB_NUM_NODES"):
        monkeypatch.delenv(var, raising=False)
    assert {f.check for f in check_env(distributed=True)} >= {"gloo_interface", "nccl_interface"}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuchif0")
    bad = by_check(check_socket_interfaces())["gloo_interface"]
    assert (
        bad.status == "fail" and "no interface nosuchif0" in bad.evidence and "lo 127.0.0.1" in bad.evidence
    )
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert by_check(check_socket_interfaces())["gloo_interface"].status == "ok"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    found = by_check(check_socket_interfaces())["gloo_interface"]
    own = socket.gethostbyname(socket.gethostname())
    # several nodes and no interface named: loopback is refused as the listening address
    assert found.status == ("warn" if own.startswith("127.") else "ok"), found


def test_ranks_of_a_multi_node_launch_take_the_interface_routing_to_the_rendezvous(monkeypatch):
    from oreline.config import TrainConfig
    from oreline.train.dist import route_interface, set_socket_interface

    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        # setenv first: monkeypatch then restores the variable's original state (absent) at the
        # end, whatever set_socket_interface wrote into os.environ meanwhile (a leaked "eth7"
        # broke every later gloo test in the same session)
        monkeypatch.setenv(var, "set-by-test")
        monkeypatch.delenv(var)
    assert route_interface("127.0.0.1")[0] == "lo"
    name, local = route_interface(socket.gethostname())
    assert local is not None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert set_socket_interface(TrainConfig(), 4) is None  # a loopback route serves no other node
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    assert set_socket_interface(TrainConfig(), 2) is None  # one node: the defaults
    assert set_socket_interface(TrainConfig(socket_ifname="eth7"), 2) == "eth7"  # the config wins
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7" == os.environ["NCCL_SOCKET_IFNAME"]
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(var)
    others = [n for n in psutil.net_if_addrs() if n != "lo"]
    addrs = {
        n: [a.address for a in v if a.family == socket.AF_INET] for n, v in psutil.net_if_addrs().items()
    }
    remote = next((addrs[n][0] for n in others if addrs[n]), None)
    if remote is None:
        pytest.skip("no non-loopback IPv4 interface on this machine")
    monkeypatch.setenv("MASTER_ADDR", remote)
    chosen = set_socket_interface(TrainConfig(), 4)
    assert chosen is not None and chosen != "lo" and remote in addrs[chosen]
    assert os.environ["GLOO_SOCKET_IFNAME"] == chosen == os.environ["NCCL_SOCKET_IFNAME"]
