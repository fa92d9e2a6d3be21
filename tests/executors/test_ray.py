"""`oreline data` and `oreline tokenize` on a real 2-node Ray cluster give the local run's output,
byte for byte, also when a worker node dies mid-run, when the driver is SIGKILLed and the command is
run again, and when two attempts of one task run at once."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from oreline_test_helpers import drop_timings as untimed
from oreline_test_helpers import user_step_config

from oreline.config import TokenizerConfig, load_config
from oreline.data.pipeline.run import run_data
from oreline.data.pipeline.tasks import phase1_dir, phase1_marker, run_phase1, run_phase3
from oreline.executors import make_executor
from oreline.executors.interface import TaskCrashed
from oreline.executors.progress import LocalQueue, set_progress_queue

pytestmark = pytest.mark.ray

INPUTS = [
    "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
    "commoncrawl-samples/whirlwind.warc.gz",
    "dolma-wget-2024/sample-0000.warc.gz",
    "dolma-wget-2024/sample-0001.warc.gz",
    "ia-blackbook-2008/IAH-20080430204825-00000-blackbook.warc.gz",
    "warcio-edge-cases/example.warc.gz",
]


def _inputs(samples) -> list[str]:
    return [str(samples / "web-archives" / p) for p in INPUTS]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _rows_only_in_one(a: Path, b: Path) -> str:
    """What differs between two shards, row by row (id, step and reason where the shard has
    them), so that a failure says which documents changed instead of printing parquet bytes."""
    keys = [c for c in ("id", "step", "reason", "text_chars") if c in pq.read_schema(a).names]
    rows = [{tuple(r.values()) for r in pq.read_table(p, columns=keys).to_pylist()} for p in (a, b)]
    if rows[0] == rows[1]:
        return f"{a.name}: the same {keys} rows, other bytes"
    return f"{a.name}: {keys} only in the reference {sorted(rows[0] - rows[1])}, only here {sorted(rows[1] - rows[0])}"


def assert_same_data_output(ref: Path, out: Path) -> None:
    for sub in ("docs", "rejects"):
        a, b = _files(ref / sub), _files(out / sub)
        assert sorted(a) == sorted(b), sub
        differ = [_rows_only_in_one(ref / sub / n, out / sub / n) for n in sorted(a) if a[n] != b[n]]
        assert not differ, f"{sub} shards differ: " + "; ".join(differ)
    assert (out / "_SUCCESS").is_file()
    stats_ref = untimed(json.loads((ref / "stats.json").read_text()))
    stats_out = untimed(json.loads((out / "stats.json").read_text()))
    assert stats_out == stats_ref
    # one attempt folder per task is left: the committed one (killed attempts' folders are gone)
    work = out / "work"
    committed = {phase1_dir(work, i).name for i in range(len(INPUTS))}
    assert {p.name for p in (work / "phase1" / "attempts").iterdir()} == committed


@pytest.fixture(scope="module")
def local_run(samples, tmp_path_factory) -> Path:
    """The reference: the sample inputs through the local executor (a 2-process pool)."""
    out = tmp_path_factory.mktemp("local") / "out"
    run_data(_inputs(samples), out, load_config(), workers=2)
    return out


def test_data_on_ray_equals_the_local_run(samples, local_run, ray_overrides, tmp_path):
    out = tmp_path / "ray"
    stats = run_data(_inputs(samples), out, load_config(overrides=ray_overrides))
    assert stats["output"]["docs"] > 0
    assert_same_data_output(local_run, out)


def test_a_python_user_step_on_ray_equals_the_local_run(samples, ray_overrides, tmp_path):
    """A user's step from a Python file (module:function by path) imports on the Ray workers and
    filters, maps, counts and rejects there as in the local pool, byte for byte."""
    inputs = _inputs(samples)
    words = ("privacy", "search", "explode")
    local = run_data(inputs, tmp_path / "local", user_step_config(tmp_path, words=words), workers=2)
    on_ray = run_data(inputs, tmp_path / "ray", user_step_config(tmp_path, *ray_overrides, words=words))
    assert_same_data_output(tmp_path / "local", tmp_path / "ray")
    steps = {s["name"]: s for s in on_ray["steps"]}
    assert any(r.startswith("drop_keyword:keyword:") for r in steps["drop_keyword"]["dropped"])
    assert steps["shout"]["docs_out"] == steps["shout"]["docs_in"] > 0
    assert untimed(on_ray["steps"]) == untimed(local["steps"])


def test_tokenize_on_ray_equals_the_local_run(local_run, ray_overrides, tmp_path):
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.tokens.train_bpe import train_tokenizer

    tok = tmp_path / "tok"
    train_tokenizer([str(local_run / "docs")], tok, TokenizerConfig(vocab_size=512))
    ray_cfg = load_config(overrides=ray_overrides)
    results = {}
    for name, cfg in (("local", load_config()), ("ray", ray_cfg)):
        cfg.tokenize.max_shard_tokens = 20_000  # several shards per task, so the split is exercised
        results[name] = tokenize_corpus(
            [str(local_run / "docs")], tok, tmp_path / name, cfg.tokenize, workers=2, ray=cfg.data.ray
        )
    assert len(results["ray"]["shards"]) > 2
    assert untimed(results["ray"]) == untimed(results["local"])
    local_files, ray_files = _files(tmp_path / "local"), _files(tmp_path / "ray")
    for f in (local_files, ray_files):
        f.pop(".oreline-owner")  # the folder's owner record: its creation time and pid
    manifests = [untimed(json.loads(f.pop("manifest.json"))) for f in (local_files, ray_files)]
    assert manifests[0] == manifests[1]
    assert local_files == ray_files


@pytest.mark.slow
def test_quality_classifier_top_fraction_on_ray_equals_the_local_run(
    samples, local_run, ray_overrides, tmp_path
):
    """The classifier step and its run-wide top-fraction cut-off (a sample job per task on the
    executor) give the local run's shards, rejects and stats on Ray. Stand-in data: Gutenberg
    prose as positives against the local run's web documents."""
    import zipfile

    from oreline.quality.classifier import train_classifier

    prose = tmp_path / "prose"
    prose.mkdir()
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        for name in ("austen-persuasion.txt", "chesterton-ball.txt", "shakespeare-caesar.txt"):
            (prose / name).write_text(zf.read(f"gutenberg/{name}").decode("latin-1"), encoding="utf-8")
    train_classifier([str(prose)], [str(local_run)], tmp_path / "clf", bucket=20_000)
    quality = [f"data.quality.classifier={tmp_path / 'clf'}", "data.quality.classifier_keep_top_fraction=0.3"]
    ref = tmp_path / "local"
    run_data(_inputs(samples), ref, load_config(overrides=quality), workers=2)
    stats = run_data(_inputs(samples), tmp_path / "ray", load_config(overrides=[*ray_overrides, *quality]))
    top = next(s for s in stats["steps"] if s["name"] == "quality:classifier_top")
    assert top["dropped"] and stats["classifier"]["cutoff"] is not None
    assert_same_data_output(ref, tmp_path / "ray")


def _task_running_on(node, label: str) -> bool:
    """Whether one of `node`'s worker processes is running a task of the map labelled `label` now
    (the executor names its tasks by the label, and Ray titles the worker ray::LABEL meanwhile)."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for child in raylet.children(recursive=True):
        try:
            if child.cmdline() and child.cmdline()[0] == f"ray::{label}":
                return True
        except psutil.Error:
            continue
    return False


@pytest.mark.slow
def test_worker_node_killed_in_phase1_the_run_completes_with_identical_output(
    samples, local_run, ray_cluster, ray_overrides, tmp_path
):
    victim = ray_cluster.add_node(num_cpus=1)
    ray_cluster.wait_for_nodes()
    out = tmp_path / "ray"
    result: dict = {}

    def run() -> None:
        try:
            result["stats"] = run_data(_inputs(samples), out, load_config(overrides=ray_overrides))
        except BaseException as exc:  # reported by the main thread
            result["error"] = exc

    driver = threading.Thread(target=run)
    driver.start()
    phase1 = out / "work" / "phase1"
    deadline = time.monotonic() + 120
    killed_running = False
    while driver.is_alive() and time.monotonic() < deadline:
        committed = list(phase1.glob("task-*.json")) if phase1.is_dir() else []
        if 0 < len(committed) < len(INPUTS) and _task_running_on(victim, "filter"):
            ray_cluster.remove_node(victim, allow_graceful=False)  # SIGKILL of its raylet and workers
            killed_running = True
            break
        time.sleep(0.005)
    driver.join(timeout=300)
    assert not driver.is_alive()
    assert "error" not in result, result.get("error")
    assert killed_running, "the node could not be killed while it ran a phase-1 task"
    assert_same_data_output(local_run, out)


def _signature_files(folder: Path, docs: int) -> list[Path]:
    """benchmarks/dedup_scale.py's synthetic signature files (planted exact and near copies)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "dedup_scale.py"
    spec = importlib.util.spec_from_file_location("oreline_dedup_scale", path)
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    folder.mkdir()
    return scale.write_files(folder, docs)


def _dedup_outputs(out: Path, lists: list[Path]) -> tuple:
    return (
        pq.read_table(out / "removals.parquet"),
        json.loads((out / "dedup_stats.json").read_text()),
        [p.read_bytes() for p in lists],
    )


@pytest.mark.slow
def test_worker_node_killed_in_the_dedup_bucket_stage_the_plan_completes_with_identical_output(
    ray_cluster, tmp_path
):
    from oreline.config import DedupConfig, RayConfig
    from oreline.data.dedup.staged.layout import Partitions
    from oreline.data.dedup.staged.plan import staged_plan

    paths = _signature_files(tmp_path / "sig", 60_000)
    cfg = DedupConfig(verify="signature")  # synthetic signatures have no texts
    parts = Partitions(exact=2, ranges=2, ids=2)  # 14 bands x 2 key ranges: 28 bucket jobs
    lists = {
        name: [tmp_path / name / "lists" / f"{i}.json" for i in range(len(paths))] for name in ("a", "b")
    }
    local = make_executor("local", workers=1)  # the reference, inline: no pool start-up per stage
    staged_plan(paths, tmp_path / "a", cfg, local, list_paths=lists["a"], partitions=parts)

    victim = ray_cluster.add_node(num_cpus=1)
    ray_cluster.wait_for_nodes()
    ray_ex = make_executor("ray", ray=RayConfig(address=ray_cluster.address))
    result: dict = {}

    def run() -> None:
        try:
            result["stats"] = staged_plan(
                paths, tmp_path / "b", cfg, ray_ex, list_paths=lists["b"], partitions=parts
            )
        except BaseException as exc:  # reported by the main thread
            result["error"] = exc

    driver = threading.Thread(target=run)
    driver.start()
    deadline = time.monotonic() + 120
    killed_running = False
    while driver.is_alive() and time.monotonic() < deadline:
        if _task_running_on(victim, "dedup:buckets"):
            ray_cluster.remove_node(victim, allow_graceful=False)  # SIGKILL of its raylet and workers
            killed_running = True
            break
        time.sleep(0.005)
    driver.join(timeout=300)
    assert not driver.is_alive()
    assert "error" not in result, result.get("error")
    assert killed_running, "the node could not be killed while it ran a bucket-stage task"
    assert result["stats"]["near_duplicates"] > 0 and result["stats"]["candidate_pairs"] > 0
    ref, out = _dedup_outputs(tmp_path / "a", lists["a"]), _dedup_outputs(tmp_path / "b", lists["b"])
    assert out[0].equals(ref[0])  # the removals: same rows, same order
    assert out[1] == ref[1]  # the stats
    assert out[2] == ref[2]  # each input file's removal list, byte for byte


@pytest.mark.slow
def test_driver_sigkilled_mid_run_resumes_to_identical_output(
    samples, local_run, ray_overrides, tmp_path, kill_at
):
    out = tmp_path / "ray"
    cmd = [sys.executable, "-m", "oreline", "data", *_inputs(samples), "--out", str(out), *ray_overrides]
    env = dict(os.environ)
    phase1 = out / "work" / "phase1"
    killed = kill_at(
        cmd, lambda: phase1.is_dir() and 0 < len(list(phase1.glob("task-*.json"))) < len(INPUTS), env=env
    )
    assert killed, "the run finished before the driver could be killed in phase 1"
    assert not (out / "_SUCCESS").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_data_output(local_run, out)


def test_two_concurrent_attempts_of_one_task_leave_one_valid_output(samples, ray_overrides, tmp_path):
    """Both nodes run the same phase-1 task at once, then the same phase-3 task at once (a zombie
    worker and its retry): one committed attempt, the loser's files gone, and shards equal to a
    local run's."""
    cfg = load_config(overrides=[*ray_overrides, "data.dedup.exact=false", "data.dedup.minhash=false"])
    big = str(samples / "web-archives" / INPUTS[4])  # the largest sample: the attempts overlap in time
    ref = tmp_path / "ref"
    run_data([big], ref, load_config(overrides=["data.dedup.exact=false", "data.dedup.minhash=false"]))

    # what one attempt reads, alone
    alone = LocalQueue()
    set_progress_queue(alone)
    try:
        run_phase1(0, big, "warc", str(tmp_path / "inline"), cfg)
    finally:
        set_progress_queue(None)
    records = sum(r for r, _ in alone.items)
    assert records > 0
    # Whether the two attempts overlap is up to the scheduler (on a loaded machine the second may
    # start after the first committed, find its marker and read nothing): up to three tries, each in
    # a fresh folder, until both read the whole file at once. Every try must leave one valid output.
    for attempt in range(3):
        out = tmp_path / f"out{attempt}"
        work = out / "work"
        executor = make_executor("ray", ray=cfg.data.ray)
        job = (0, big, "warc", str(work), cfg)
        first, second = executor.map(run_phase1, [job, job], label="filter")
        assert not isinstance(first, TaskCrashed) and not isinstance(second, TaskCrashed)
        assert untimed(first) == untimed(second)
        # the tasks' progress reached the driver through the cluster: both attempts read the whole file
        if executor.rates.records == 2 * records:
            break
        assert executor.rates.records == records, executor.rates.records  # one read, one found the marker
    else:
        pytest.fail(
            f"the two attempts never ran at once in 3 tries ({executor.rates.records} of {2 * records} records)"
        )
    assert executor.rates.bytes == 2 * sum(b for _, b in alone.items)
    assert executor.nodes == 2
    marker = json.loads(phase1_marker(work, 0).read_text())
    committed = phase1_dir(work, 0)
    assert committed.name == marker["attempt"]
    assert {p.name: p.stat().st_size for p in committed.iterdir() if p.name != "DONE"} == marker["files"]
    attempts = sorted(p.name for p in (work / "phase1" / "attempts").iterdir())
    assert attempts == [marker["attempt"]], "the losing attempt left its folder behind"

    a, b = executor.map(run_phase3, [(0, str(work), str(out), cfg)] * 2, label="write")
    assert a["output"] == b["output"]
    assert _files(out / "docs") == _files(ref / "docs")
    assert _files(out / "rejects") == _files(ref / "rejects")


def test_without_ray_the_ray_executor_names_the_install_command(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"  # an interpreter where `import ray` fails
        "from oreline.errors import OrelineError\n"
        "from oreline.executors import make_executor\n"
        "try:\n    make_executor('ray')\nexcept OrelineError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'oreline[ray]'" in done.stdout


def test_a_task_that_kills_its_worker_every_time_comes_back_as_a_crash_result(ray_overrides):
    """os.abort kills the Ray worker running it: Ray retries it on a fresh worker (max_retries=1),
    then the map returns TaskCrashed naming the job instead of failing or hanging; a task that
    raises reaches the caller as its own exception, as in the local pool."""
    executor = make_executor("ray", ray=load_config(overrides=ray_overrides).data.ray)
    crashed, alive = executor.map(os.abort, [(), ()], label="crash")
    assert isinstance(crashed, TaskCrashed) and isinstance(alive, TaskCrashed)
    assert crashed.args == () and "WorkerCrashedError" in crashed.error
    assert executor.map(os.getpid, [()], label="after")[0] > 0  # the cluster is still fine
    with pytest.raises(ValueError, match="invalid literal"):
        executor.map(int, [("12",), ("not a number",)], label="raise")


def test_a_task_that_raises_leaves_no_progress_actor_on_the_cluster(ray_overrides):
    """The map's progress actor is killed when a task raises (a map that returns keeps it for the
    executor's next map): the driver lives on (it reports the error, a test goes on) and holds the
    exception, whose traceback holds the map's frame and its handle of the actor, which Ray would
    keep alive."""
    import ray
    from ray._private.state import actors  # Ray's GCS actor table (no dashboard on the test cluster)

    def live_sinks() -> set[str]:
        table = actors(actor_state_name="ALIVE")
        return {k for k, a in table.items() if a["ActorClassName"].endswith("_Sink")}

    executor = make_executor("ray", ray=load_config(overrides=ray_overrides).data.ray)
    executor.connect()
    before = live_sinks()  # earlier tests' executors' actors, if not ended yet: not this map's
    with pytest.raises(ValueError, match="invalid literal") as raised:
        executor.map(int, [("12",), ("not a number",)], label="raise")
    assert ray.is_initialized() and raised.value  # the driver goes on, the error in hand
    deadline = time.monotonic() + 30
    while live_sinks() - before and time.monotonic() < deadline:
        time.sleep(0.2)  # ray.kill is asynchronous
    assert not live_sinks() - before
    del raised


def test_the_maps_of_one_executor_share_one_progress_actor_until_it_is_dropped(ray_overrides):
    """An actor starts a worker process of its own (seconds per map on 2 cores): the executor keeps
    one for its maps in turn, and Ray ends it once the executor is gone."""
    import gc

    from ray._private.state import actors

    def live_sinks() -> set[str]:
        table = actors(actor_state_name="ALIVE")
        return {k for k, a in table.items() if a["ActorClassName"].endswith("_Sink")}

    executor = make_executor("ray", ray=load_config(overrides=ray_overrides).data.ray)
    executor.connect()
    before = live_sinks()  # earlier tests' executors' actors, if not ended yet
    assert executor.map(os.getpid, [(), ()], label="first")[0] > 0
    mine = live_sinks() - before
    assert len(mine) == 1
    assert executor.map(os.getpid, [(), ()], label="second")[0] > 0
    assert live_sinks() - before == mine
    del executor
    gc.collect()
    deadline = time.monotonic() + 30
    while live_sinks() & mine and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not live_sinks() & mine


_OWN_RAY_DRIVER = """
import ray

from oreline.config import RayConfig
from oreline.executors.ray import RayExecutor


def where(_):
    return ray.get_runtime_context().gcs_address


(gcs,) = RayExecutor(RayConfig()).map(where, [(0,)], label="where")
print("GCS", gcs, flush=True)
"""


def test_an_empty_address_starts_a_ray_of_its_own_beside_a_running_cluster(ray_cluster, tmp_path):
    """`data.ray.address = ""` starts a Ray for the run, as documented, also when another cluster
    runs on this machine: named by RAY_ADDRESS here (a user's shell may export it; Ray finds the
    last cluster started on the machine the same way). ray.init() without an address joined that
    cluster and then refused oreline's own settings ("_system_config must not be provided"): a
    user's Ray, or the test cluster beside the OOM test in CI, failed the run."""
    driver = tmp_path / "driver.py"
    driver.write_text(_OWN_RAY_DRIVER)
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.address, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (gcs,) = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("GCS ")]
    assert gcs != ray_cluster.address  # its own Ray, not the one RAY_ADDRESS names


_PRIVATE_RAY_DRIVER = """
import json
import os

os.umask(0o022)  # the usual umask: a file written without a mode of its own is world-readable

import ray

from oreline.config import RayConfig
from oreline.executors.ray import RayExecutor

RayExecutor(RayConfig()).connect()
print("SESSION", ray._private.worker._global_node.get_session_dir_path(), flush=True)
ray.shutdown()
"""


@pytest.mark.hostile
def test_a_ray_oreline_starts_keeps_its_auth_token_and_session_from_other_users(tmp_path):
    """Issue 45 item 8: Ray 2.60 turns token authentication on for a Ray that ray.init() starts and
    wrote the token to ~/.ray/auth_token with the umask (0644): every user of the machine could read
    it and run tasks as this user. Its session folder (logs, sockets) sat in /tmp/ray, open to all."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'oreline[ray]'")
    driver, home = tmp_path / "driver.py", tmp_path / "home"
    driver.write_text(_PRIVATE_RAY_DRIVER)
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env |= {"HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    token = home / ".ray" / "auth_token"
    assert token.is_file() and len(token.read_text().strip()) == 64, done.stderr[-2000:]
    assert token.stat().st_mode & 0o077 == 0, oct(token.stat().st_mode)
    assert home.joinpath(".ray").stat().st_mode & 0o077 == 0
    (session,) = [
        Path(line.split(None, 1)[1]) for line in done.stdout.splitlines() if line.startswith("SESSION ")
    ]
    # some folder above the session's files is this user's alone
    closed = [
        p
        for p in [session, *session.parents]
        if p.stat().st_uid == os.getuid() and p.stat().st_mode & 0o077 == 0
    ]
    assert closed, f"{session}: every folder above it is open to other users"
