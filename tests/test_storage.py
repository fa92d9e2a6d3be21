"""The storage layer on a local folder and on an S3-compatible object store (moto's server on
loopback, through s3fs): exact-path reads and writes, listings, removal, and the first-writer-wins
marker that task commits rely on — also when eight writers race for it at once."""

from __future__ import annotations

import threading

import pytest

import oreline.storage as storage
from oreline.io import json_bytes


@pytest.fixture(scope="module")
def s3_bucket(tmp_path_factory):
    """An S3 bucket on a moto server bound to 127.0.0.1 (no network beyond loopback)."""
    moto_server = pytest.importorskip(
        "moto.server", reason="moto[server] is not installed (the dev extra includes it)"
    )
    pytest.importorskip("s3fs", reason="s3fs is not installed (the dev extra includes it)")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    patch = pytest.MonkeyPatch()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "oreline-test",
        "AWS_SECRET_ACCESS_KEY": "oreline-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }.items():
        patch.setenv(key, value)
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("oreline-test")
    fsspec.filesystem("s3").invalidate_cache()
    yield "s3://oreline-test"
    patch.undo()
    server.stop()


@pytest.fixture(params=["local", "s3"])
def base(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("s3_bucket") + "/" + tmp_path.name


def test_exact_path_operations(base):
    path = storage.join(base, "work", "phase1", "task-00000.json")
    assert not storage.exists(path) and storage.read_json(path) is None
    storage.write_json(path, {"attempt": "a", "files": {"x": 1}})
    assert storage.read_json(path) == {"attempt": "a", "files": {"x": 1}}
    assert storage.size(path) == len(json_bytes({"attempt": "a", "files": {"x": 1}}))
    other = storage.join(base, "work", "phase1", "notes.txt")
    storage.write_bytes(other, b"kept")
    assert storage.listdir(storage.join(base, "work", "phase1")) == ["notes.txt", "task-00000.json"]
    with storage.open_read(other) as fh:
        assert fh.read() == b"kept"
    storage.remove(path)
    assert storage.listdir(storage.join(base, "work", "phase1")) == ["notes.txt"]  # only that name


def test_the_first_marker_wins_and_is_never_replaced(base):
    path = storage.join(base, "task-00001.json")
    assert storage.publish_first(path, b'{"attempt": "first"}\n')
    assert not storage.publish_first(path, b'{"attempt": "second"}\n')
    assert storage.read_json(path) == {"attempt": "first"}


def test_racing_attempts_publish_exactly_one_whole_marker(base):
    path = storage.join(base, "task-00002.json")
    start = threading.Barrier(8)
    won: list[int] = []

    def attempt(i: int) -> None:
        start.wait()
        if storage.publish_first(path, json_bytes({"attempt": i, "pad": "x" * 100_000})):
            won.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert storage.read_json(path)["attempt"] == won[0]
    assert storage.listdir(base) == ["task-00002.json"]  # no temporary left beside it


def test_a_data_run_reads_its_inputs_from_the_object_store(s3_bucket, samples, tmp_path):
    """`oreline data s3://…/` finds the inputs under the prefix and reads them (a local copy per
    task): the same documents, rejects and funnel as the same files on disk, named by their URLs."""
    import fsspec
    import pyarrow.parquet as pq

    from oreline.config import load_config
    from oreline.data.pipeline.run import run_data

    names = [
        "commoncrawl-samples/whirlwind.warc.gz",
        "dolma-wget-2024/sample-0000.warc.gz",
        "warcio-edge-cases/example-trunc.warc",  # damaged: its error must name the URL
    ]
    local_dir = tmp_path / "inputs"
    prefix = f"{s3_bucket}/{tmp_path.name}/inputs"
    fs = fsspec.filesystem("s3")
    for name in names:
        (local_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (local_dir / name).write_bytes((samples / "web-archives" / name).read_bytes())
        fs.put_file(str(local_dir / name), f"{prefix}/{name}")
    on_disk = run_data([str(local_dir)], tmp_path / "disk", load_config(), workers=1)
    on_s3 = run_data([prefix + "/"], tmp_path / "s3", load_config(), workers=1)

    def untimed(steps):
        return [{k: v for k, v in s.items() if k != "seconds"} for s in steps]

    assert untimed(on_s3["steps"]) == untimed(on_disk["steps"])
    assert on_s3["output"]["docs"] == on_disk["output"]["docs"] > 0
    assert sorted(on_s3["inputs"]["files"]) == sorted(f"{prefix}/{n}" for n in names)
    assert [e["file"] for e in on_s3["errors"]] == [f"{prefix}/{names[2]}"]
    cols = ["id", "text", "source_file"]
    disk = pq.read_table(sorted((tmp_path / "disk" / "docs").glob("*.parquet")), columns=cols).to_pylist()
    s3 = pq.read_table(sorted((tmp_path / "s3" / "docs").glob("*.parquet")), columns=cols).to_pylist()
    assert [(r["id"], r["text"]) for r in s3] == [(r["id"], r["text"]) for r in disk]
    assert {r["source_file"].removeprefix(prefix) for r in s3} == {
        r["source_file"].removeprefix(str(local_dir)) for r in disk
    }
