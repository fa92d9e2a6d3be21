"""The fastText quality classifier: `oreline quality train-classifier` and the data step
`data.quality.classifier`.

Stand-in data (oreline ships no quality positives): Gutenberg prose from samples/english-prose as
positives against web pages (sample WARCs through `oreline data`) as negatives. The classifier is
trained here, then `oreline data` scores, thresholds and keeps the run-wide top fraction; the
output is compared across worker counts (tests/executors/test_ray.py and
tests/data/test_slurm_executor.py compare it across executors).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from oreline.cli import app
from oreline.config import Config
from oreline.data.filters.classifier import ClassifierScorer, normalize_text
from oreline.data.pipeline.classifier_cutoff import top_fraction_cutoff
from oreline.data.pipeline.run import data_fingerprint, print_funnel, run_data
from oreline.errors import FingerprintMismatch, InputError
from oreline.quality.classifier import auc_score, train_classifier

WARCS = [
    "dolma-wget-2024/sample-0000.warc.gz",
    "dolma-wget-2024/sample-0001.warc.gz",
    "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
]
BOOKS = ["austen-emma.txt", "austen-persuasion.txt", "chesterton-ball.txt", "melville-moby_dick.txt"]


def books(samples: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        for name in BOOKS:
            (folder / name).write_text(zf.read(f"gutenberg/{name}").decode("latin-1"), encoding="utf-8")
    return folder


def warcs(samples: Path) -> list[str]:
    return [str(samples / "web-archives" / w) for w in WARCS]


def rows(folder: Path) -> list[dict]:
    return [r for p in sorted(folder.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]


@pytest.fixture(scope="module")
def trained(samples, tmp_path_factory) -> dict[str, Path]:
    """Negatives: the sample WARCs through `oreline data`; the classifier trained by the CLI."""
    root = tmp_path_factory.mktemp("clf")
    web = root / "web"
    run_data(warcs(samples), web, Config(), workers=1, console=Console(file=io.StringIO()))
    prose = books(samples, root / "prose")
    result = CliRunner().invoke(
        app,
        [
            "quality",
            "train-classifier",
            "--positive",
            str(prose),
            "--negative",
            str(web),
            "--out",
            str(root / "model"),
            "--seed",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    return {"web": web, "prose": prose, "model": root / "model"}


def test_train_classifier_writes_heldout_metrics_and_is_deterministic(trained, tmp_path):
    meta = json.loads((trained["model"] / "classifier.json").read_text())
    # the interface outside checks rely on: the three metrics at the top level
    assert {"precision", "recall", "auc"} <= set(meta)
    assert meta["auc"] > 0.9 and meta["precision"] > 0.9 and meta["recall"] > 0.9
    counts = meta["counts"]
    assert counts["positive"]["documents"] == len(BOOKS)
    assert counts["negative"]["documents"] > 20  # the web run's documents, not its rejects
    for c in counts.values():  # held out by document: both sides of the split have each class
        assert 1 <= c["heldout_documents"] < c["documents"] and c["heldout_pieces"] >= 1
    assert meta["heldout"]["pieces"] == {
        "positive": counts["positive"]["heldout_pieces"],
        "negative": counts["negative"]["heldout_pieces"],
    }
    [pos] = meta["inputs"]["positive"]
    assert pos["files"] == len(BOOKS) and len(pos["sha256"]) == 64
    [neg] = meta["inputs"]["negative"]
    assert neg["path"].endswith("docs")  # an oreline data output stands for its docs/
    assert meta["settings"]["seed"] == 3 and meta["settings"]["thread"] == 1

    # the same inputs and seed: the same model, byte for byte; another seed: another split
    again = train_classifier([str(trained["prose"])], [str(trained["web"])], tmp_path / "again", seed=3)
    assert (tmp_path / "again" / "model.bin").read_bytes() == (trained["model"] / "model.bin").read_bytes()
    assert {k: v for k, v in again.items() if k != "seconds"} == {
        k: v for k, v in meta.items() if k != "seconds"
    }
    other = train_classifier([str(trained["prose"])], [str(trained["web"])], tmp_path / "other", seed=4)
    assert other["fingerprint"] != meta["fingerprint"]

    # scores: prose above web pages
    scorer = ClassifierScorer(trained["model"])
    prose = (trained["prose"] / "austen-emma.txt").read_text()[50_000:52_000]
    web = sorted(scorer.score(r["text"]) for r in rows(trained["web"] / "docs"))
    assert scorer.score(prose) > 0.5 > web[len(web) // 2]
    assert scorer.score(" \n\t ") is None


def test_trainings_in_one_process_give_one_model(trained, tmp_path):
    """fastText 0.9.3 reads memory of an earlier training in the same process: without a fresh
    process per training these gave different bytes or "Encountered NaN." (see _fit_in_fresh_process)."""
    models = set()
    for i in range(3):
        train_classifier(
            [str(trained["prose"])], [str(trained["web"])], tmp_path / str(i), seed=1, bucket=20_000
        )
        models.add((tmp_path / str(i) / "model.bin").read_bytes())
    assert len(models) == 1


@pytest.mark.hostile
def test_the_trained_model_passes_the_file_check_that_guards_loading(trained):
    """The walk of oreline.data.filters.fasttext_file accepts what fastText itself writes, to the
    byte: a model the classifier trains (dense, supervised, word bigrams) ends where its walk ends."""
    from oreline.data.filters.fasttext_file import check_model_file

    info = check_model_file(trained["model"] / "model.bin")
    assert (info["model"], info["loss"], info["labels"], info["quantized"]) == ("sup", "softmax", 2, False)
    assert info["input_rows"] == info["words"] + 100_000  # FASTTEXT_DEFAULTS' bucket
    assert ClassifierScorer(trained["model"]).score("a page of prose") is not None


def test_hostile_texts_are_scored_not_crashed_and_huge_ones_cut(trained):
    from oreline.data.filters.classifier import MAX_CHARS

    scorer = ClassifierScorer(trained["model"])
    huge = "the quick brown fox jumps over the lazy dog. " * 250_000  # 11 MB: only the head is read
    assert scorer.score(huge) == scorer.score(huge[:MAX_CHARS])
    for text in ("abc\x00def ghi", "lone \ud800 surrogate", "\u3000\u2028 x", "__label__hq __label__hq"):
        assert 0.0 <= scorer.score(text) <= 1.0


def test_normalisation_is_that_of_the_dclm_classifiers():
    assert normalize_text("Hello\n\nWORLD\t x\x00y  ") == "hello world x y"
    assert normalize_text("a\ud800b") == "a?b"  # a lone surrogate cannot reach the C++ binding
    assert "__label__" not in normalize_text("buy now __label__hq __LABEL__HQ")  # no label from the text


def test_auc_is_the_pairwise_ranking_probability():
    labels = [1, 0, 1, 1, 0, 0, 1, 0]
    scores = [0.9, 0.1, 0.4, 0.4, 0.4, 0.8, 0.7, 0.2]
    pairs = [(p, n) for p, n in itertools.product(range(8), range(8)) if labels[p] and not labels[n]]
    brute = sum(1.0 if scores[p] > scores[n] else 0.5 if scores[p] == scores[n] else 0.0 for p, n in pairs)
    assert auc_score(labels, scores) == pytest.approx(brute / len(pairs))
    assert auc_score([1, 1], [0.2, 0.3]) is None


def test_top_fraction_cutoff_keeps_the_ceiling_of_the_fraction():
    scores = [i / 30 for i in range(30)]
    cut = top_fraction_cutoff(scores, 0.1)  # 0.1 × 30 is 3.0000000000000004 in floats: 3 kept
    assert sum(s >= cut for s in scores) == 3
    assert sum(s >= top_fraction_cutoff(scores, 0.5) for s in scores) == 15
    assert top_fraction_cutoff(scores, 1.0) == 0.0 and top_fraction_cutoff([], 0.5) is None


def _run(samples: Path, out: Path, model: Path, workers: int = 1, **quality) -> dict:
    cfg = Config.model_validate({"data": {"quality": {"classifier": str(model), **quality}}})
    return run_data(warcs(samples), out, cfg, workers=workers, console=Console(file=io.StringIO()))


def test_the_data_step_scores_thresholds_and_keeps_the_runs_top_fraction(samples, trained, tmp_path):
    stats = _run(samples, tmp_path / "top", trained["model"], classifier_keep_top_fraction=0.4)
    names = [s["name"] for s in stats["steps"]]
    assert (
        names.index("quality:classifier") + 1 == names.index("quality:classifier_top") < names.index("dedup")
    )
    scored = next(s for s in stats["steps"] if s["name"] == "quality:classifier")
    top = next(s for s in stats["steps"] if s["name"] == "quality:classifier_top")
    assert scored["docs_in"] >= 20 and set(scored["dropped"]) <= {"classifier:no_text"}
    n = scored["docs_out"]
    info = stats["classifier"]
    assert info["scored_docs"] == info["sample_docs"] == n  # the sample is the whole run: exact
    assert (
        info["model_fingerprint"]
        == json.loads((trained["model"] / "classifier.json").read_text())["fingerprint"]
    )
    docs, rejects = rows(tmp_path / "top" / "docs"), rows(tmp_path / "top" / "rejects")
    below = [r for r in rejects if r["step"] == "quality:classifier_top"]
    assert all(r["reason"] == "classifier:below_top_0.4" for r in below) and below
    below_scores = [json.loads(r["metadata"])["quality_score"] for r in below]
    after = [d["quality_score"] for d in docs] + [
        json.loads(r["metadata"])["quality_score"] for r in rejects if r["step"] == "dedup"
    ]
    assert len(after) == top["docs_out"] == n - len(below)
    assert top["docs_out"] == math.ceil(0.4 * n) or min(after) == max(below_scores + [-1])  # ties kept
    assert min(after) >= info["cutoff"] > max(below_scores)
    assert all(0.0 <= s <= 1.0 for s in after + below_scores)
    printed = Console(file=io.StringIO(), width=300)
    print_funnel(stats, printed)
    assert f"top 0.4 of this run kept: score ≥ {info['cutoff']:.4f}" in printed.file.getvalue()

    # the same run on a 2-process pool (tasks finish in another order): the same output
    _run(samples, tmp_path / "pool", trained["model"], workers=2, classifier_keep_top_fraction=0.4)
    for sub in ("docs", "rejects"):
        a = {p.name: p.read_bytes() for p in sorted((tmp_path / "top" / sub).glob("*.parquet"))}
        b = {p.name: p.read_bytes() for p in sorted((tmp_path / "pool" / sub).glob("*.parquet"))}
        assert a == b, sub

    # a threshold: dropped in phase 1 with the score kept in the reject's metadata
    median = sorted(after + below_scores)[n // 2]
    stats = _run(samples, tmp_path / "thr", trained["model"], classifier_threshold=median)
    scored = next(s for s in stats["steps"] if s["name"] == "quality:classifier")
    cut = [r for r in rows(tmp_path / "thr" / "rejects") if r["step"] == "quality:classifier"]
    assert (
        scored["dropped"][f"classifier:<{median:g}"]
        == len(cut)
        == sum(s < median for s in after + below_scores)
    )
    assert all(json.loads(r["metadata"])["quality_score"] < median for r in cut)
    assert all(d["quality_score"] >= median for d in rows(tmp_path / "thr" / "docs"))
    assert "quality:classifier_top" not in [s["name"] for s in stats["steps"]]


def test_a_retrained_classifier_is_another_data_run(samples, trained, tmp_path):
    import shutil

    from oreline.stages import _stage_key

    model = tmp_path / "model"

    def retrain(seed: int) -> None:  # small fastText settings: only the model's bytes matter here
        shutil.rmtree(model, ignore_errors=True)
        train_classifier([str(trained["prose"])], [str(trained["web"])], model, seed=seed, bucket=5000)

    retrain(3)
    cfg = Config.model_validate({"data": {"quality": {"classifier": str(model)}}})
    files = [(Path(p), "warc") for p in warcs(samples)]
    before, key = data_fingerprint(cfg, files), _stage_key("data", cfg, {})
    _run(samples, tmp_path / "out", model)
    retrain(4)  # the same folder, another model
    # another `oreline data` run, and another key of `oreline run`'s data stage
    assert data_fingerprint(cfg, files) != before and _stage_key("data", cfg, {}) != key
    with pytest.raises(FingerprintMismatch):  # the old model's output folder is not reused
        _run(samples, tmp_path / "out", model)


def test_classifier_settings_without_a_classifier_are_refused():
    with pytest.raises(ValueError, match="need data.quality.classifier"):
        Config.model_validate({"data": {"quality": {"classifier_keep_top_fraction": 0.1}}})


def test_one_document_per_class_is_refused_with_what_to_do(trained, tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("a single positive document\n")
    with pytest.raises(InputError, match="held-out split needs two or more.*pass more positive documents"):
        train_classifier([str(one)], [str(trained["web"])], tmp_path / "model")


def test_several_values_after_one_flag_are_each_an_input(trained, tmp_path):
    """`--positive a b` (what --help's <list[str]> suggests) was refused with "unexpected extra
    argument"; each value is an input, as with the flag repeated."""
    import os
    import subprocess
    import sys

    import oreline

    first, *rest = sorted(str(p) for p in trained["prose"].iterdir())
    command = [sys.executable, "-m", "oreline", "quality", "train-classifier", "--positive", first, *rest]
    command += ["--negative", str(trained["web"]), "--out", str(tmp_path / "m"), "--seed", "3"]
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(oreline.__file__).parents[1])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((tmp_path / "m" / "classifier.json").read_text())
    assert [p["path"] for p in meta["inputs"]["positive"]] == [first, *rest]
    assert meta["counts"]["positive"]["documents"] == len(BOOKS)
