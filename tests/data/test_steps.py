"""The phase-1 steps as data ([[data.steps]]): the data.quality switches expand to the same list,
every rule threshold is a setting, the list's order is the pipeline's, and a user's own step
(kind "python") runs inside the runner with the same counting, reasons and rejects."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from oreline_test_helpers import user_step_config
from typer.testing import CliRunner

from oreline.cli import app
from oreline.config import SHORTHAND_KEYS, config_from_dict, load_config, to_dict
from oreline.data.pipeline.run import data_fingerprint, run_data
from oreline.data.pipeline.runner import StepStats, run_steps
from oreline.data.pipeline.steps import filter_steps
from oreline.document import Document
from oreline.errors import ConfigError

INPUTS = ["commoncrawl-samples", "warcio-edge-cases"]


def _digest(out: Path) -> dict[str, bytes]:
    return {
        f"{sub}/{p.name}": p.read_bytes()
        for sub in ("docs", "rejects")
        for p in sorted((out / sub).glob("*.parquet"))
    }


def _with_steps(cfg, steps: list[dict]):
    """cfg with this step list, and without the section switches the list replaces (as a user
    converting a config writes it)."""
    tree = to_dict(cfg)
    for section, keys in SHORTHAND_KEYS.items():
        for key in keys:
            tree["data"][section].pop(key, None)
    tree["data"]["steps"] = steps
    return config_from_dict(tree)


def _rejects(out: Path) -> list[dict]:
    return [row for p in sorted((out / "rejects").glob("*.parquet")) for row in pq.read_table(p).to_pylist()]


@pytest.mark.parametrize("name", ["demo", "seed-recipe"])
def test_a_shipped_config_gives_the_same_output_through_its_expanded_step_list(name, samples, tmp_path):
    """The data.quality switches are a shorthand: written out as [[data.steps]], the same config
    writes the same shards and rejects, byte for byte."""
    inputs = [str(samples / "web-archives" / s) for s in INPUTS]
    cfg = load_config(name)
    explicit = _with_steps(cfg, [to_dict(s) for s in cfg.data.step_list()])
    assert [s.step_name() for s in explicit.data.step_list()] == [s.step_name() for s in cfg.data.step_list()]
    a = run_data(inputs, tmp_path / "switches", cfg, workers=1)
    b = run_data(inputs, tmp_path / "steps", explicit, workers=1)
    assert _digest(tmp_path / "switches") == _digest(tmp_path / "steps")
    assert len(_digest(tmp_path / "steps")) > 0
    untimed = lambda s: [{k: v for k, v in st.items() if k != "seconds"} for st in s["steps"]]  # noqa: E731
    assert untimed(a) == untimed(b)


def _run(cfg, docs: list[Document]) -> tuple[list[Document], list[tuple[str, str]], list[StepStats]]:
    steps = filter_steps(cfg, Counter())
    stats = [StepStats(s.name) for s in steps]
    dropped: list[tuple[str, str]] = []
    kept = list(run_steps(docs, steps, stats, lambda d, step, reason: dropped.append((step, reason))))
    return kept, dropped, stats


def _prose(words: int) -> Document:
    """English prose of `words` words, ten to a line, each line a sentence."""
    base = "the cat sat on the mat and looked at the birds with great interest that day".split()  # noqa: SIM905
    lines = [" ".join(base[(k + i) % len(base)] for i in range(10)) + "." for k in range(0, words, 10)]
    return Document("p", "\n".join(lines), metadata={"language": "en"})


def test_rule_thresholds_are_settings_of_their_steps(tmp_path):
    """`{ kind = "gopher_quality", min_words = 30 }` keeps a 40-word document the published 50 drop."""
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[[data.steps]]\nkind = "gopher_quality"\nmin_words = 30\n\n'
        '[[data.steps]]\nkind = "fineweb"\nline_punct_ratio = 0.12\n'
    )
    cfg = load_config(toml)
    assert [s.kind for s in cfg.data.step_list()] == ["gopher_quality", "fineweb"]
    kept, dropped, _ = _run(cfg, [_prose(40)])
    assert len(kept) == 1 and dropped == []
    published = _with_steps(cfg, [{"kind": "gopher_quality"}])
    kept, dropped, _ = _run(published, [_prose(40)])
    assert kept == [] and dropped == [("quality:gopher_quality", "gopher:short_doc")]
    # a threshold outside its range is refused with the key, not silently clamped
    with pytest.raises(ConfigError, match="line_punct_ratio"):
        _with_steps(cfg, [{"kind": "fineweb", "line_punct_ratio": 1.5}])
    with pytest.raises(ConfigError, match="min_wrods"):
        _with_steps(cfg, [{"kind": "gopher_quality", "min_wrods": 30}])


def test_the_step_lists_order_is_the_pipelines_and_a_kind_twice_needs_names():
    doc = Document("s", "short\nlines\nonly", metadata={"language": "en"})
    cfg = load_config(None)
    _, dropped, _ = _run(_with_steps(cfg, [{"kind": "gopher_quality"}, {"kind": "fineweb"}]), [doc])
    assert dropped == [("quality:gopher_quality", "gopher:short_doc")]
    doc = Document("s", "short\nlines\nonly", metadata={"language": "en"})
    _, dropped, stats = _run(_with_steps(cfg, [{"kind": "fineweb"}, {"kind": "gopher_quality"}]), [doc])
    assert dropped == [("quality:fineweb", "fineweb:line_punct_ratio")]
    assert [s.name for s in stats] == ["quality:fineweb", "quality:gopher_quality"]
    with pytest.raises(ConfigError, match="more than once"):
        _with_steps(cfg, [{"kind": "fineweb"}, {"kind": "fineweb", "line_punct_ratio": 0.2}])
    two = _with_steps(
        cfg, [{"kind": "fineweb"}, {"kind": "fineweb", "name": "fineweb-strict", "line_punct_ratio": 0.2}]
    )
    assert [s.step_name() for s in two.data.step_list()] == ["quality:fineweb", "fineweb-strict"]


def test_config_keys_lists_every_step_parameter_with_its_default_and_source():
    result = CliRunner().invoke(app, ["config", "keys"])
    assert result.exit_code == 0, result.output
    line = next(
        x for x in result.output.splitlines() if x.startswith("data.steps[kind=gopher_quality].min_words ")
    )
    assert " 50 " in line and "Rae et al. 2021" in line
    line = next(x for x in result.output.splitlines() if x.startswith("data.steps[kind=c4].min_sentences "))
    assert " 3 " in line and "Raffel et al. 2020" in line
    assert "data.steps[kind=python].function" in result.output


def _jsonl(tmp_path: Path) -> Path:
    rows = [
        {"id": "a", "text": "A fine page about gardens and the weather."},
        {"id": "b", "text": "Win big at the CASINO tonight, the best odds."},
        {"id": "c", "text": "This one will explode the filter."},
        {"id": "d", "text": "Another calm page about rivers."},
    ]
    path = tmp_path / "in" / "docs.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _user_config(folder: Path):
    """Two user steps only: no built-in filter, no dedup."""
    cfg = user_step_config(folder, "data.dedup.exact=false", "data.dedup.minhash=false")
    return _with_steps(cfg, [s for s in to_dict(cfg.data)["steps"] if s["kind"] == "python"])


def test_a_python_step_filters_maps_and_is_counted_like_a_built_in_one(tmp_path):
    src = _jsonl(tmp_path)
    cfg = _user_config(tmp_path)
    stats = run_data([str(src)], tmp_path / "out", cfg, workers=1)
    steps = {s["name"]: s for s in stats["steps"]}
    assert steps["drop_keyword"]["docs_in"] == 4 and steps["drop_keyword"]["docs_out"] == 2
    assert steps["drop_keyword"]["dropped"] == {
        "drop_keyword:keyword:casino": 1,
        "drop_keyword:error:ValueError": 1,
    }
    assert steps["shout"]["docs_in"] == 2 and steps["shout"]["docs_out"] == 2 and "seconds" in steps["shout"]
    docs = [
        r for p in sorted((tmp_path / "out" / "docs").glob("*.parquet")) for r in pq.read_table(p).to_pylist()
    ]
    assert sorted(d["text"] for d in docs) == [
        "A FINE PAGE ABOUT GARDENS AND THE WEATHER.",
        "ANOTHER CALM PAGE ABOUT RIVERS.",
    ]
    rejects = {r["id"]: r for r in _rejects(tmp_path / "out")}
    assert rejects["b"]["step"] == "drop_keyword" and rejects["b"]["reason"] == "drop_keyword:keyword:casino"
    # the exception is that document's reject, with the traceback's last line; the task went on
    assert rejects["c"]["reason"] == "drop_keyword:error:ValueError"
    assert "this document breaks the filter" in rejects["c"]["metadata"]


def test_a_changed_user_step_or_parameter_is_another_data_run(tmp_path):
    src = _jsonl(tmp_path)
    files = [(src, "jsonl")]
    before = data_fingerprint(_user_config(tmp_path), files)
    assert data_fingerprint(_user_config(tmp_path), files) == before
    path = tmp_path / "user_steps.py"
    path.write_text(path.read_text().replace("doc.text.upper()", "doc.text.title()"))
    assert data_fingerprint(_user_config(tmp_path), files) != before
    tuned = _with_steps(load_config(None), [{"kind": "gopher_quality", "min_words": 30}])
    assert data_fingerprint(tuned, files) != data_fingerprint(
        _with_steps(load_config(None), [{"kind": "gopher_quality"}]), files
    )


def test_a_python_step_that_cannot_be_imported_fails_the_run_before_any_task(tmp_path):
    cfg = _with_steps(load_config(None), [{"kind": "python", "function": "no_such_module_here:f"}])
    with pytest.raises(ConfigError, match="no_such_module_here"):
        run_data([str(_jsonl(tmp_path))], tmp_path / "out", cfg, workers=1)
    with pytest.raises(ConfigError, match="module:function"):
        _with_steps(load_config(None), [{"kind": "python", "function": "nocolon"}])


def test_a_switch_the_step_list_replaces_is_refused_rather_than_ignored():
    """With data.steps given, data.quality.fineweb = false (or a threshold there) would do nothing:
    the config is refused, naming the key."""
    tree = to_dict(load_config(None, ["data.quality.min_entropy=3.0"]))
    tree["data"]["steps"] = [{"kind": "entropy"}]
    with pytest.raises(ConfigError, match=r"data\.quality\.min_entropy would be ignored"):
        config_from_dict(tree)
    tree = to_dict(load_config(None, ["data.langid.enabled=false"]))
    tree["data"]["steps"] = [{"kind": "fineweb"}]
    with pytest.raises(ConfigError, match=r"data\.langid\.enabled"):
        config_from_dict(tree)


def test_a_one_to_many_python_step_from_an_importable_module(tmp_path, monkeypatch):
    """`function = "module:function"` on the workers' import path; with many = true the function's
    documents replace the one it was given, counted out one by one."""
    pkg = tmp_path / "lib"
    pkg.mkdir()
    (pkg / "my_splitter.py").write_text(
        "def halves(doc):\n"
        "    from oreline.document import Document\n"
        "    w = doc.text.split()\n"
        "    parts = [' '.join(w[: len(w) // 2]), ' '.join(w[len(w) // 2 :])]\n"
        "    return [Document(f'{doc.id}#{k}', p, doc.url, dict(doc.metadata)) for k, p in enumerate(parts)]\n"
    )
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setenv("PYTHONPATH", str(pkg))  # the worker processes import it too
    cfg = load_config(None, ["data.dedup.exact=false", "data.dedup.minhash=false"])
    cfg = _with_steps(cfg, [{"kind": "python", "function": "my_splitter:halves", "many": True}])
    stats = run_data([str(_jsonl(tmp_path))], tmp_path / "out", cfg, workers=1)
    step = next(s for s in stats["steps"] if s["name"] == "halves")
    assert (step["docs_in"], step["docs_out"]) == (4, 8)
    docs = [
        r for p in sorted((tmp_path / "out" / "docs").glob("*.parquet")) for r in pq.read_table(p).to_pylist()
    ]
    assert "b#1" in {d["id"] for d in docs} and len(docs) == 8


@pytest.mark.hostile
def test_a_python_step_others_may_change_is_refused_and_the_code_a_run_runs_is_said(tmp_path):
    """A python step runs its code as the user: the run says which code (file and sha256) before
    any task, and a file another user could change (a group- or world-writable file or folder,
    e.g. a step left in /tmp) is refused rather than run."""
    import io

    from rich.console import Console

    src = _jsonl(tmp_path)
    buf = io.StringIO()
    run_data(
        [str(src)], tmp_path / "out", _user_config(tmp_path), workers=1, console=Console(file=buf, width=400)
    )
    said = buf.getvalue()
    assert f"drop_keyword runs Python code: {tmp_path / 'user_steps.py'}:drop_keyword from" in said
    assert "sha256" in said

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by others"):
        run_data([str(src)], tmp_path / "out2", _user_config(shared), workers=1)
    (tmp_path / "user_steps.py").chmod(0o666)
    with pytest.raises(ConfigError, match="writable by others"):
        run_data([str(src)], tmp_path / "out3", _user_config(tmp_path), workers=1)
