"""Strings from a run's artifacts reach report.html escaped, whatever field they are in (issue 45
item 5; `-m hostile`).

The run folder may be a colleague's: every artifact the report reads (metrics.jsonl,
data/stats.json, the tokenizer's stats, the token manifest, fingerprint.json, lineage.json, the
checkpoints' meta.json and checksums.json, eval/*.json, the export's configs, config.toml) gets a
`<script>` and two attribute-breaking strings planted into every string value and as an extra
key of every object, then, separately, into every number; no unescaped copy may reach the page.
Before this change the token manifest's `workers` and `seconds` were formatted into the page
with `str()` (a manifest saying `"workers": "<script>..."` ran its script), and the ablation
report did the same with its summary's `tasks_max_items`.
"""

from __future__ import annotations

import copy
import json
import tomllib
from importlib import import_module
from pathlib import Path

import pytest
import tomli_w

from oreline.doctor.artifacts import load_run
from oreline.report import html as report

run_factory = import_module("oreline_test_run_factory")

# What must never appear raw: a script element, and values that close an attribute (either quote)
# to add an event handler or a tag
RAW = (
    '<script>alert("{id}")</script>',
    "\" onmouseover=\"alert('{id}')",
    "'><img src=x onerror=alert('{id}')>",
)


def payload(where: str) -> str:
    return "".join(p.format(id=where) for p in RAW)


def assert_escaped(page: str, where: str) -> None:
    for raw in RAW:
        text = raw.format(id=where)
        assert text not in page, f"unescaped {text!r} from {where} in report.html"


def plant(obj, where: str, numbers: bool):
    """`obj` with the payload appended to every string value and added as a key (holding a copy of
    the first value, so the object keeps its shape) of every object; `numbers`: every number
    replaced by the payload instead. metrics.jsonl's record `type` stays, or no record is read."""
    if isinstance(obj, dict):
        out = {k: v if k == "type" else plant(v, where, numbers) for k, v in obj.items()}
        if obj and not numbers:
            out[payload(where)] = copy.deepcopy(next(iter(out.values())))
        return out
    if isinstance(obj, list):
        return [plant(v, where, numbers) for v in obj]
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int | float):
        return payload(where) if numbers else obj
    if isinstance(obj, str):
        return obj if numbers else obj + payload(where)
    return obj


# config.toml's paths the report follows to other artifacts stay, or those are never read
FOLLOWED = ("tokens", "tokenizer")


def plant_everywhere(run: Path, numbers: bool) -> list[str]:
    """Plant into every artifact of the run folder; returns the artifacts' names (payload ids)."""
    tasks = {"step": 200, "core": 0.1, "tasks": {"arc_easy": {"items": 50, "acc": 0.3, "acc_norm": 0.31,
                                                              "chance": 0.25, "centered": 0.07}}}  # fmt: skip
    (run / "eval" / "tasks-final.json").write_text(json.dumps(tasks), encoding="utf-8")
    files = [
        *sorted(run.glob("checkpoints/*/meta.json")),
        *sorted(run.glob("checkpoints/*/checksums.json")),
        *sorted(run.glob("eval/*.json")),
        run / "data" / "stats.json",
        run / "tokenizer" / "tokenizer_stats.json",
        run / "tokens" / "manifest.json",
        run / "fingerprint.json",
        run / "lineage.json",
        run / "export" / "tokenizer_config.json",
        run / "export" / "config.json",
    ]
    names = []
    for path in files:
        where = str(path.relative_to(run))
        path.write_text(json.dumps(plant(json.loads(path.read_text()), where, numbers)), encoding="utf-8")
        names.append(where)
    run_factory.rewrite_metrics(run, lambda rec: plant(rec, "metrics.jsonl", numbers))
    names.append("metrics.jsonl")
    config = tomllib.loads((run / "config.toml").read_text())
    kept = {k: config["train"].get(k) for k in FOLLOWED if k in config.get("train", {})}
    config = plant(config, "config.toml", numbers)
    config["train"].update(kept)
    (run / "config.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
    names.append("config.toml")
    return names


# the artifacts whose strings the report shows (the others' are read for checks and sizes)
SHOWN = (
    "metrics.jsonl",
    "data/stats.json",
    "tokenizer/tokenizer_stats.json",
    "tokens/manifest.json",
    "fingerprint.json",
    "lineage.json",
    "eval/eval-00000200.json",
    "eval/tasks-final.json",
    "export/tokenizer_config.json",
    "config.toml",
)


@pytest.mark.hostile
@pytest.mark.slow  # two renders of the whole report (~12 s each on 2 busy cores)
@pytest.mark.parametrize("numbers", [False, True], ids=["strings", "numbers"])
def test_every_artifact_field_reaches_the_report_escaped(healthy_run, numbers):
    names = plant_everywhere(healthy_run, numbers)
    page = report.render_report(healthy_run)
    for where in names:
        assert_escaped(page, where)
    if not numbers:  # the planted values did reach the page (escaped), so the check above means something
        shown = [w for w in SHOWN if report.esc(payload(w)) in page]
        assert shown == list(SHOWN), f"never shown: {sorted(set(SHOWN) - set(shown))}"


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        yield path


def _set(obj, path, value):
    for part in path[:-1]:
        obj = obj[part]
    obj[path[-1]] = value


@pytest.mark.hostile
def test_a_string_in_any_one_numeric_field_reaches_the_sections_escaped(healthy_run):
    """One number at a time replaced by the payload (a number beside it may guard the line that
    shows it, so replacing all at once shows less), in the artifacts the text sections read from
    memory: the token manifest, the tokenizer's stats, fingerprint.json and lineage.json."""
    run = load_run(healthy_run)
    sections = [
        report.section_tokenizer,
        report.section_tokens,
        report.section_export,
        report.section_fingerprints,
    ]
    checked = 0
    for attr in ("manifest", "tokenizer_stats", "fingerprint", "lineage"):
        original = getattr(run, attr)
        for path in list(_leaves(original)):
            where = f"{attr}:{'.'.join(map(str, path))}"
            planted = copy.deepcopy(original)
            _set(planted, path, payload(where))
            setattr(run, attr, planted)
            for build in sections:
                try:
                    body = build(run)
                except Exception as exc:  # noqa: BLE001 (render_report shows it escaped: that is checked above)
                    body = report.esc(exc)
                assert_escaped(body, where)
            checked += 1
        setattr(run, attr, original)
    assert checked > 30  # every numeric field of the four artifacts, not none


def ablation_summary() -> dict:
    """A summary of `oreline ablate` (oreline.ablation.summarize's shape): two recipes, two seeds."""
    curve = [{"step": 10, "val_loss": 4.0, "val_bpb": 1.5}, {"step": 20, "val_loss": 3.5, "val_bpb": 1.3}]
    spread = {"mean": 3.5, "std": 0.01, "n": 2}
    task = {"items": 50, "chance": 0.25, "acc": spread, "acc_norm": spread}
    recipe = {
        "name": "web", "docs_in": 100, "docs_kept": 80, "train_docs": 70, "train_tokens": 5000,
        "heldout_docs": 10, "heldout_tokens": 700, "train_tokens_budget": 4000, "tokens_seen": [4000, 4000],
        "epochs": 0.8, "final_val_loss": spread, "final_val_bpb": spread, "final_train_loss": spread,
        "tasks": {"arc_easy": task}, "core": spread,
        "runs": [{"seed": s, "curve": curve, "final_val_loss": 3.5, "tokens_seen": 4000} for s in (1, 2)],
    }  # fmt: skip
    return {
        "format": "oreline-ablation", "version": 1, "name": "abl", "folder": "/runs/abl",
        "tokenizer": {"fingerprint": "ab" * 32, "trained_on": ["web", "books"], "vocab_size": 512},
        "validation": {"recipe": "web", "fraction": 0.1, "sequences": 16, "documents": 10, "tokens": 700},
        "proxy": {"preset": "debug", "seeds": [1, 2], "steps": 20, "batch_tokens": 200,
                  "train_tokens_per_arm": 4000, "tokens_asked": 4000, "tasks": ["arc_easy"],
                  "tasks_max_items": 50},
        "classifiers": [{"name": "q", "folder": "/runs/abl/classifiers/q", "positive": ["books"],
                         "negative": ["web"], "fingerprint": "cd" * 32, "documents": {"positive": 5, "negative": 5},
                         "heldout_documents": {"positive": 1, "negative": 1}, "precision": 0.9, "recall": 0.8,
                         "auc": 0.95}],
        "recipes": [recipe, {**copy.deepcopy(recipe), "name": "books"}],
    }  # fmt: skip


@pytest.mark.hostile
def test_the_ablation_report_escapes_every_summary_field():
    """summary.json's strings come from the arms' artifacts and the ablation config: each string
    planted (and each object given a planted key), then each number of its prose (the proxy's)."""
    from oreline.report.ablation import render

    page = render(plant(ablation_summary(), "summary", numbers=False))
    assert_escaped(page, "summary")
    assert report.esc(payload("summary")) in page
    summary = ablation_summary()
    summary["proxy"] = plant(summary["proxy"], "proxy", numbers=True)
    assert_escaped(render(summary), "proxy")


MATH = r"$\frac{x$"  # not valid mathtext: matplotlib raised ValueError drawing it


@pytest.mark.hostile
def test_a_dollar_in_an_artifact_name_does_not_cost_the_chart():
    """Names from artifacts are chart labels: a language, a step's reject reason, a source, a
    recipe. One holding `$...$` was parsed as mathtext, and the chart (its section) failed."""
    from oreline.report import plots
    from oreline.report.ablation import curve_chart

    steps = [{"name": f"extract {MATH}", "docs_in": 10, "docs_out": 8, "dropped": {MATH: 2}}]
    uris = [
        plots.funnel_chart(steps),
        plots.bar_chart(["en", MATH], [3, 1], f"languages {MATH}", "documents"),
        plots.line_chart({MATH: ([1, 2], [1.0, 0.5])}, "loss", "nats", points={f"val {MATH}": ([2], [0.6])}),
        plots.stacked_chart([1, 2], {MATH: [1.0, 2.0]}, "tokens by source", "tokens"),
        curve_chart(plant(ablation_summary(), MATH, numbers=False), "val_loss", "held-out loss", "loss"),
    ]
    assert all(u and u.startswith("data:image/png;base64,") for u in uris)
