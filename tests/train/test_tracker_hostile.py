"""Tracker destinations a config file chooses, and responses a tracking server sends (issue 45
items 1 and 8; `-m hostile`).

A config file is often somebody else's, and MLflow sends the user's credentials from the
environment (MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN), every param and the run's path to
whatever server `train.mlflow.tracking_uri` names. Before this change a shared config pointing it
at its own host got all of that on every request, with nothing printed first; now a server only a
config file names is refused before anything is built, with the two ways to allow it (the command
line, MLFLOW_TRACKING_URI), and every tracker's destination is printed at the start. A server that
answers with an endless body made the tracker's thread read it whole; now no response body over
MAX_RESPONSE_BYTES is read. The servers here are fake ones on 127.0.0.1 that record what reaches
them.
"""

from __future__ import annotations

import base64
import contextlib
import resource
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import import_module
from pathlib import Path

import pytest
import tomli_w

from oreline.config import load_config, to_toml
from oreline.errors import ConfigError

fixtures = import_module("oreline_test_train_fixtures")

CREDENTIALS = {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "s3cret-of-alice"}


@contextlib.contextmanager
def recording_server(body: bytes = b"{}", endless: bool = False):
    """An HTTP server on a free 127.0.0.1 port that records each request (method, path, headers)
    and answers `body`, or, `endless`, an unbounded body (no Content-Length) until the client
    hangs up. Yields (url, requests)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection does

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers)})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if not endless:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if not endless:
                    self.wfile.write(body)
                    return
                self.wfile.write(b'{"experiment": {"name": "')
                chunk = b"a" * (1 << 20)
                for _ in range(4096):  # 4 GiB at most, should a client never hang up
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: what a bounded client does

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The user's environment: MLflow credentials for their own server, W&B offline, one thread."""
    return {
        **CREDENTIALS,
        "MLFLOW_TRACKING_URI": "",
        "WANDB_MODE": "offline",
        "WANDB_API_KEY": "",
        "OMP_NUM_THREADS": "1",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-home"),
    }


def shared_config(tmp_path: Path, prose: dict[str, Path], uri: str) -> Path:
    """A colleague's config: a short MLflow-tracked training whose tracking URI is the colleague's host."""
    return fixtures.write_config(
        tmp_path / "shared.toml",
        tmp_path,
        prose,
        train__steps=6,
        train__log_every=3,
        train__eval_every=0,
        train__trackers=["mlflow"],
        train__mlflow__tracking_uri=uri,
        train__mlflow__experiment="[/]shared",  # a config string in the printed line: text, not rich markup
        train__tracker_flush_s=1.0,
    )


@pytest.mark.hostile
def test_a_config_file_cannot_send_the_run_and_credentials_to_its_own_server(
    tmp_path, prose_tokens, oreline_cli
):
    """Before: the training ran, and the config's server got every request with the user's
    credentials (Basic alice:...) and the run's params. Now: refused before anything is built,
    the message names the key and both ways to allow it; the server gets nothing."""
    with recording_server() as (url, seen):
        config = shared_config(tmp_path, prose_tokens, url)
        code, out = oreline_cli("train", "-c", str(config), env=cli_env(tmp_path), timeout=300)
        assert seen == [], f"the config's server got {len(seen)} request(s), e.g. {seen[:1]}"
    assert code != 0, out[-3000:]
    assert "train.mlflow.tracking_uri" in out and "comes from the config file" in out, out[-3000:]
    assert f"train.mlflow.tracking_uri={url}" in out and f"MLFLOW_TRACKING_URI={url}" in out, out[-3000:]
    assert not (tmp_path / "t" / "checkpoints").exists()  # refused before the run began


@pytest.mark.hostile
@pytest.mark.slow  # one short training in a fresh process (~30 s on 2 busy cores)
def test_the_same_server_named_on_the_command_line_is_used_and_printed(tmp_path, prose_tokens, oreline_cli):
    """The user's own command line may name any server: the run goes there (credentials
    included: the user chose it), and the destination is printed before the first step."""
    with recording_server() as (url, seen):
        config = shared_config(tmp_path, prose_tokens, "http://203.0.113.7:5000")  # (not reached)
        override = f"train.mlflow.tracking_uri={url}"
        code, out = oreline_cli("train", "-c", str(config), override, env=cli_env(tmp_path), timeout=300)
        assert code == 0, out[-3000:]
        assert f"tracker mlflow: {url} (from the command line), experiment '[/]shared'" in out, out[-3000:]
        assert seen, "the server the user named got no request"
        basic = base64.b64encode(b"alice:s3cret-of-alice").decode()
        assert seen[0]["headers"].get("Authorization") == f"Basic {basic}"


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("uri", "env_uri", "allowed"),
    [
        ("https://mlflow.attacker.example", None, False),
        ("https://mlflow.attacker.example", "https://mlflow.corp.example", False),
        (
            "https://mlflow.corp.example:8443/ns",
            "https://mlflow.corp.example:8443",
            True,
        ),  # the user's server
        ("http://mlflow.corp.example:8443", "https://mlflow.corp.example:8443", False),  # not over TLS
        ("https://mlflow.corp.example:9000", "https://mlflow.corp.example:8443", False),  # another port
        ("http://127.0.0.1:5000", None, False),  # loopback too: another user's listener on a shared node
        ("postgresql://u:p@db.attacker.example/mlflow", None, False),
        ("databricks", None, False),
        ("sqlite:///{run}/elsewhere.db", None, True),
        ("file:///{run}/mlruns", None, True),
        ("{run}/mlruns", None, True),
    ],
)
def test_which_tracking_uris_a_config_file_may_name(tmp_path, monkeypatch, uri, env_uri, allowed):
    from oreline.train.trackers import destinations

    uri = uri.format(run=tmp_path)
    if env_uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env_uri)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(None)
    cfg.train.mlflow.tracking_uri = uri  # as a config file sets it: no command-line key
    if allowed:
        lines = destinations(["mlflow"], tmp_path, cfg.train, frozenset())
        assert lines["mlflow"].startswith(uri) and "from the config file" in lines["mlflow"]
    else:
        with pytest.raises(ConfigError, match="comes from the config file"):
            destinations(["mlflow"], tmp_path, cfg.train, frozenset())
        # named by the user, the same URI is used
        lines = destinations(["mlflow"], tmp_path, cfg.train, frozenset({"train.mlflow.tracking_uri"}))
        assert "from the command line" in lines["mlflow"]


@pytest.mark.hostile
def test_a_password_in_the_uri_is_never_printed(tmp_path, monkeypatch):
    from oreline.train.trackers import destinations

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(None, ["train.trackers=['mlflow']"])
    cfg.train.mlflow.tracking_uri = "https://bob:hunter2@mlflow.attacker.example"
    with pytest.raises(ConfigError) as refused:
        destinations(["mlflow"], tmp_path, cfg.train, frozenset())
    assert "hunter2" not in str(refused.value) and "bob:***@mlflow.attacker.example" in str(refused.value)
    lines = destinations(["mlflow"], tmp_path, cfg.train, frozenset({"train.mlflow.tracking_uri"}))
    assert "hunter2" not in lines["mlflow"]


@pytest.mark.hostile
def test_every_tracker_says_where_it_sends_the_run(tmp_path, monkeypatch):
    from oreline.train.trackers import destinations

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.corp.example")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.corp.example")
    cfg = load_config(None)
    lines = destinations(
        ["tensorboard", "wandb", "mlflow"], tmp_path, cfg.train, frozenset(), tmp_path / "tb"
    )
    assert lines["tensorboard"] == f"event files in {tmp_path / 'tb'}"
    assert lines["wandb"].startswith("online, https://wandb.corp.example (WANDB_BASE_URL)")
    assert lines["mlflow"].startswith("https://mlflow.corp.example (from MLFLOW_TRACKING_URI)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert destinations(["wandb"], tmp_path, cfg.train)["wandb"].startswith(f"offline, files in {tmp_path}")


@pytest.mark.hostile
def test_a_server_from_the_command_line_reaches_the_slurm_stage_jobs(tmp_path, monkeypatch):
    """`oreline run --executor slurm` writes the resolved config to RUN/jobs/config.toml, which
    each job reads as a file: the server the user named on the command line goes on the job's own
    command line (command_line_endpoints), while the file alone is refused."""
    from oreline.train.trackers import check_destinations, command_line_endpoints

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    url = "https://mlflow.corp.example"
    cfg = load_config(None, ["train.trackers=['mlflow']", f"train.mlflow.tracking_uri={url}"])
    check_destinations(cfg)
    job_config = tmp_path / "config.toml"
    job_config.write_text(to_toml(cfg), encoding="utf-8")
    with pytest.raises(ConfigError, match="comes from the config file"):
        check_destinations(load_config(job_config))
    extra = command_line_endpoints(cfg)
    assert extra == [f'train.mlflow.tracking_uri="{url}"']
    job = load_config(job_config, extra)
    check_destinations(job)
    assert job.train.mlflow.tracking_uri == url


CHILD = """
import resource, sys
from pathlib import Path
from oreline.config import MlflowConfig
from oreline.train.trackers.mlflow_tracker import MlflowTracker
tracker = MlflowTracker(Path(sys.argv[1]), MlflowConfig(), {})  # the server: MLFLOW_TRACKING_URI
try:
    tracker.open()
    print("OPENED")
except BaseException as e:
    print("ERROR", type(e).__name__, str(e)[:500])
# VmHWM, not ru_maxrss: a child forked from a large pytest process (preexec_fn forces fork, not
# vfork) carries the parent's peak across exec in ru_maxrss; VmHWM is this program's own memory
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("PEAK_RSS_MB", int(hwm.split()[1]) // 1024)
"""
CAP = int(1.5 * (1 << 30))


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


@pytest.mark.hostile
def test_an_endless_response_is_refused_in_bounded_memory(tmp_path, child_env):
    """A server that answers the tracker's first request with a body that never ends. Before: the
    tracker read it whole (under a 1.5 GiB cap: a MemoryError; the issue measured 2.16 GB RSS);
    now the read stops past MAX_RESPONSE_BYTES (64 MiB) and the call fails, to be retried."""
    with recording_server(endless=True) as (url, seen):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=300,
            env={**child_env, "MLFLOW_TRACKING_URI": url},
            preexec_fn=_cap,
        )
    out = proc.stdout + proc.stderr
    assert seen, out[-3000:]
    assert "ERROR" in out and "sent a response over 64 MiB" in out, out[-3000:]
    peak = int(out.split("PEAK_RSS_MB", 1)[1].split()[0])
    assert peak < 600, f"peak RSS {peak} MB"


@pytest.mark.hostile
def test_an_ablation_file_cannot_name_a_tracker_server(tmp_path, monkeypatch):
    """`oreline ablate` takes no overrides: its proxy trainings' tracking URI comes from the
    ablation file or MLFLOW_TRACKING_URI. A server only the file names is refused before the
    ablation folder is made, not when the first arm starts training after the data stages."""
    from oreline.ablation import load_ablation, run_ablation
    from oreline.config import resolve_config_path

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tree = tomllib.loads(resolve_config_path("ablation-demo").read_text(encoding="utf-8"))
    tree["proxy"]["train"] |= {
        "trackers": ["mlflow"],
        "mlflow": {"tracking_uri": "https://mlflow.attacker.example"},
    }
    tree["out_dir"] = str(tmp_path / "ablations")
    path = tmp_path / "shared-ablation.toml"
    path.write_text(tomli_w.dumps(tree), encoding="utf-8")
    abl = load_ablation(path)
    with pytest.raises(ConfigError, match="comes from the config file"):
        run_ablation(abl)
    assert not abl.root.exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.attacker.example")  # the user's own word
    from oreline.ablation import arm_config
    from oreline.train.trackers import check_destinations

    check_destinations(arm_config(abl, abl.recipes[0].name, 1, tmp_path, tmp_path))
