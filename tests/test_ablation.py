"""`oreline ablate`: the schema's errors name the fix; a tiny ablation end to end (two recipes,
two seeds, equal token budgets, one held-out set, report and summary); a second run rebuilds nothing."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from oreline.ablation import load_ablation, run_ablation
from oreline.config import ConfigError
from oreline.tokens.tokenize import is_val

MINIMAL = """
name = "t"
[[recipes]]
name = "a"
docs = "{docs}"
[[recipes]]
name = "b"
docs = "{docs}"
[validation]
recipe = "a"
[proxy]
tokens = 1000
"""


CLASSIFIER = """
[[classifiers]]
name = "c"
positive = ["x.txt"]
negative = ["{neg}"]
{ft}
"""


def _ablate(path: Path) -> tuple[dict, str]:
    """Run the ablation at `path`; its summary and what it printed."""
    out = io.StringIO()
    summary = run_ablation(load_ablation(path), console=Console(file=out, width=200))
    return summary, out.getvalue()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ablation.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_minimal_config_loads(tmp_path):
    abl = load_ablation(_write(tmp_path, MINIMAL))
    assert [r.name for r in abl.recipes] == ["a", "b"]
    assert abl.proxy.steps * abl.proxy.batch_tokens >= 1000  # rounded up to whole steps


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        # a recipe with both a data config and a docs folder: say to pick one
        (lambda t: t.replace('name = "a"\n', 'name = "a"\ndata = "x.toml"\n', 1), "exactly one of data"),
        # a recipe with neither
        (lambda t: t.replace('docs = "{docs}"\n', "", 1), 'docs = "FOLDER"'),
        (lambda t: t.replace('name = "b"', 'name = "a"'), "give every [[recipes]] its own name"),
        (lambda t: t.replace('recipe = "a"', 'recipe = "zz"'), "name one of ['a', 'b']"),
        (lambda t: t.replace("[proxy]\ntokens = 1000\n", "[proxy]\n"), "proxy.tokens is missing"),
        (lambda t: t.replace("tokens = 1000", "tokens = 1000\nstep = 3"), "unknown key 'proxy.step'"),
        (lambda t: t + '[tokenizer]\ntrain_on = ["c"]\n', "use some of ['a', 'b']"),
        (
            lambda t: (
                t.split('[[recipes]]\nname = "b"')[0] + '[validation]\nrecipe = "a"\n[proxy]\ntokens = 9\n'
            ),
            "add a [[recipes]]",
        ),
        # a classifier reading a recipe that is not there, with fastText settings it does not know
        (lambda t: t + CLASSIFIER.format(neg="recipe:zz", ft=""), "reads recipe:zz, which is not a recipe"),
        (
            lambda t: t + CLASSIFIER.format(neg="recipe:a", ft="fasttext = { epochs = 3 }"),
            "use some of ['bucket'",
        ),
        (
            lambda t: t + CLASSIFIER.format(neg="recipe:a", ft="") * 2,
            "give every [[classifiers]] its own name",
        ),
    ],
)
def test_schema_errors_name_the_fix(tmp_path, edit, says):
    with pytest.raises(ConfigError) as err:
        load_ablation(_write(tmp_path, edit(MINIMAL)))
    message = str(err.value)
    assert says in message
    assert "configs/ablation-demo.toml" in message  # and where a complete example is


@pytest.mark.hostile
@pytest.mark.parametrize("name", [".", "..", "...", "a" * 65])
@pytest.mark.parametrize(
    ("where", "edit"),
    [
        ("name", lambda t, n: t.replace('name = "t"', f'name = "{n}"', 1)),
        ("recipes.1.name", lambda t, n: t.replace('name = "b"', f'name = "{n}"', 1)),
        (
            "classifiers.0.name",
            lambda t, n: t + CLASSIFIER.format(neg="recipe:a", ft="").replace('name = "c"', f'name = "{n}"'),
        ),
        ("references.0.name", lambda t, n: t + f'[[references]]\nname = "{n}"\ndocs = ["x.txt"]\n'),
    ],
)
def test_names_that_are_not_folder_names_are_refused(tmp_path, where, edit, name):
    """Every name becomes a folder (out_dir/NAME, arms/NAME, classifiers/NAME, references/NAME):
    "." would be the folder above it and ".." its parent, where the ablation would then write."""
    with pytest.raises(ConfigError) as err:
        load_ablation(_write(tmp_path, edit(MINIMAL, name)))
    assert f"{where} = {name!r:.80}" in str(err.value) and "not dots alone" in str(err.value)


def test_names_with_dots_among_other_characters_load(tmp_path):
    text = MINIMAL.replace('name = "t"', 'name = "v1.2"', 1).replace('name = "b"', 'name = ".b"', 1)
    abl = load_ablation(_write(tmp_path, text))
    assert abl.name == "v1.2" and [r.name for r in abl.recipes] == ["a", ".b"]


def test_shipped_demo_loads():
    from oreline.ablation import build_order

    abl = load_ablation("ablation-demo")
    assert {r.name for r in abl.recipes} >= {"unfiltered", "perplexity", "classifier"}
    assert abl.validation.recipe == "unfiltered"
    # the classifier trains on the unfiltered documents and filters the classifier recipe
    order = build_order(abl)
    assert order.index(("recipe", "unfiltered")) < order.index(("classifier", "prose-vs-web"))
    assert order.index(("classifier", "prose-vs-web")) < order.index(("recipe", "classifier"))


def test_classifier_recipes_errors_name_the_fix(tmp_path):
    from oreline.ablation import build_order

    uses = (
        '[[recipes]]\nname = "f"\n[recipes.data]\ninputs = ["x"]\n'
        'quality = {{ classifier = "{{ablation}}/classifiers/{name}" }}\n'
    )
    # a recipe naming a classifier the ablation does not train
    abl = load_ablation(
        _write(tmp_path, MINIMAL.replace("[validation]", uses.format(name="nope") + "[validation]"))
    )
    with pytest.raises(ConfigError) as err:
        build_order(abl)
    assert "no [[classifiers]] named 'nope'" in str(err.value)
    assert 'add a [[classifiers]] with name = "nope"' in str(err.value)
    # a classifier trained on the recipe it filters
    text = MINIMAL.replace("[validation]", uses.format(name="c") + "[validation]")
    text += CLASSIFIER.format(neg="recipe:f", ft="")
    with pytest.raises(ConfigError) as err:
        build_order(load_ablation(_write(tmp_path, text)))
    assert "wait on each other: recipe f, classifier c" in str(err.value)
    assert "train the classifier on a recipe that does not use it" in str(err.value)


# ---------------------------------------------------------------------------------------------
# end to end


def _documents(samples: Path, n: int) -> list[dict]:
    """n English documents of ~1,500 characters (Shakespeare's plays, public domain) with stable ids."""
    text = gzip.decompress((samples / "english-prose" / "tinyshakespeare.txt.gz").read_bytes()).decode()
    size = 1500
    return [{"id": f"doc-{i}", "text": text[i * size : (i + 1) * size]} for i in range(n)]


def _jsonl(path: Path, docs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return path


def _tiny(tmp_path: Path, samples: Path) -> Path:
    docs = _documents(samples, 80)
    every = _jsonl(tmp_path / "all.jsonl", docs)
    half = _jsonl(tmp_path / "half.jsonl", docs[::2])  # the same ids: a filter's survivors
    # the data steps that need no model (langid, whose fastText model is a separate install, is off)
    data = "[data.langid]\nenabled = false\n[data.quality]\nenabled = false\n"
    (tmp_path / "recipe-all.toml").write_text(f'[data]\ninputs = ["{every}"]\n' + data, encoding="utf-8")
    return _write(
        tmp_path,
        f"""
name = "tiny"
out_dir = "{tmp_path / "out"}"
workers = 1
[[recipes]]
name = "all"
data = "{tmp_path / "recipe-all.toml"}"
[[recipes]]
name = "half"
[recipes.data]
inputs = ["{half}"]
langid = {{ enabled = false }}
quality = {{ enabled = false }}
[tokenizer]
vocab_size = 320
[validation]
recipe = "all"
fraction = 0.2
sequences = 16
[proxy]
preset = "debug"
seeds = [1, 2]
tokens = 3000
seq_len = 64
micro_batch = 4
evals = 2
tasks_max_items = 8
""",
    )


@pytest.mark.slow
def test_tiny_ablation_end_to_end_and_cached(tmp_path, samples):
    path = _tiny(tmp_path, samples)
    summary, _ = _ablate(path)
    root = tmp_path / "out" / "tiny"
    on_disk = json.loads((root / "summary.json").read_text())
    assert on_disk["recipes"] == summary["recipes"]

    # equal token budgets: every training of every recipe saw the same number of tokens
    budget = on_disk["proxy"]["train_tokens_per_arm"]
    assert budget == 12 * 256  # 3,000 tokens rounded up to whole steps of 4 × 64
    recipes = {r["name"]: r for r in on_disk["recipes"]}
    assert set(recipes) == {"all", "half"}
    for r in recipes.values():
        assert r["train_tokens_budget"] == budget
        assert r["tokens_seen"] == [budget, budget]
        assert r["final_val_loss"]["n"] == 2 and r["final_val_loss"]["std"] is not None
        assert all(run["curve"] and run["curve"][-1]["step"] == 12 for run in r["runs"])
    # each final model scored on the shipped downstream tasks, the same first 8 items for every arm
    for r in recipes.values():
        assert set(r["tasks"]) == {"arc_easy", "arc_challenge", "piqa", "copa", "winogrande", "lambada"}
        assert all(t["items"] == 8 and t["acc"]["n"] == 2 for t in r["tasks"].values())
        assert r["core"]["n"] == 2
        assert r["core"]["mean"] == pytest.approx(
            sum(t["centered"]["mean"] for t in r["tasks"].values()) / len(r["tasks"])
        )
    # the smaller recipe is repeated more, and the summary says so
    assert recipes["half"]["train_tokens"] < recipes["all"]["train_tokens"]
    assert recipes["half"]["epochs"] > recipes["all"]["epochs"]
    assert recipes["all"]["docs_kept"] == 80 and recipes["half"]["docs_kept"] == 40

    # the common validation set: the held-out documents of "all", none of which any arm trains on
    heldout = {f"doc-{i}" for i in range(80) if is_val(f"doc-{i}", 0.2)}
    assert on_disk["validation"]["documents"] == len(heldout) > 0
    assert recipes["half"]["heldout_docs"] == len({d for d in heldout if int(d[4:]) % 2 == 0})

    html = (root / "report.html").read_text()
    # multiple choice by length-normalised accuracy, the cloze task by its exact-match accuracy
    for name in ("piqa (acc_norm, 8 items)", "lambada (acc, 8 items)", "CORE (mean centred)"):
        assert name in html
    for name in ("all", "half", 'id="recipes"', 'id="curves"', 'id="tasks"', "data:image/png;base64,"):
        assert name in html

    # a second run rebuilds nothing: every stage is skipped by its key and no output is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file() and "summary" not in p.name}
    lineage = json.loads((root / "recipes" / "all" / "lineage.json").read_text())
    _, log = _ablate(path)
    for stage in ("all: data", "half: data", "shared tokenizer", "all: tokenize", "all-seed1: train"):
        assert f"{stage}: unchanged" in log or f"{stage} unchanged" in log, log
    assert json.loads((root / "recipes" / "all" / "lineage.json").read_text()) == lineage
    changed = [
        p
        for p, t in stamps.items()
        if p.exists() and p.stat().st_mtime_ns != t and p.name not in ("report.html", "ablation.toml")
    ]
    assert not changed

    # more proxy tokens retrain the arms and reuse the documents, the tokenizer and the tokens
    path.write_text(path.read_text().replace("tokens = 3000", "tokens = 4000"))
    _, log = _ablate(path)
    assert "all: data: unchanged" in log and "shared tokenizer: unchanged" in log
    assert "half: tokenize: unchanged" in log and "all-seed1: train unchanged" not in log
    final = json.loads((root / "summary.json").read_text())
    assert final["proxy"]["train_tokens_per_arm"] == 16 * 256


# every heuristic quality rule off: the classifier alone decides what the filtered recipe keeps
NO_RULES = (
    "gopher_quality = false, gopher_repetition = false, c4 = false, fineweb = false, entropy = false, "
    "ascii_ratio = false"
)


def _tiny_with_classifier(tmp_path: Path, samples: Path) -> Path:
    """The tiny ablation with one seed, its "half" recipe replaced by the top half of "all" by a
    classifier that the ablation trains (Austen's prose against the "all" recipe's documents)."""
    import zipfile

    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as z:
        name = next(n for n in z.namelist() if "austen-emma" in n)
        text = z.read(name).decode("utf-8", "replace")
    prose = _jsonl(
        tmp_path / "prose.jsonl",
        [{"id": f"p{i}", "text": text[i * 1500 : (i + 1) * 1500]} for i in range(40)],
    )
    path = _tiny(tmp_path, samples)
    config = path.read_text().replace("seeds = [1, 2]", "seeds = [1]")
    head, tail = config.split('[[recipes]]\nname = "half"')
    tail = tail[tail.index("[tokenizer]") :]
    path.write_text(
        head
        + f"""[[classifiers]]
name = "austen"
positive = ["{prose}"]
negative = ["recipe:all"]
fasttext = {{ dim = 16, bucket = 10000 }}
[[recipes]]
name = "top"
[recipes.data]
inputs = ["{tmp_path / "all.jsonl"}"]
langid = {{ enabled = false }}
quality = {{ {NO_RULES}, classifier = "{{ablation}}/classifiers/austen", classifier_keep_top_fraction = 0.5 }}
"""
        + tail
    )
    return path


@pytest.mark.slow
def test_a_classifier_recipe_end_to_end_trained_once(tmp_path, samples):
    path = _tiny_with_classifier(tmp_path, samples)
    summary, log = _ablate(path)
    root = tmp_path / "out" / "tiny"
    folder = root / "classifiers" / "austen"
    meta = json.loads((folder / "classifier.json").read_text())
    assert meta["auc"] is not None and meta["precision"] is not None

    # the classifier's negatives are the "all" recipe's documents less the validation set's, so it
    # never saw a document the arms are compared on
    negatives = [json.loads(line)["id"] for line in (folder / "inputs" / "recipe-all.jsonl").open()]
    heldout = {f"doc-{i}" for i in range(80) if is_val(f"doc-{i}", 0.2)}
    assert sorted(negatives) == sorted(f"doc-{i}" for i in range(80) if f"doc-{i}" not in heldout)
    assert meta["counts"]["negative"]["documents"] == 80 - len(heldout)

    # the filtered recipe keeps the classifier's top half of the 80 documents, at the same budget
    recipes = {r["name"]: r for r in summary["recipes"]}
    assert recipes["top"]["docs_in"] == 80
    assert 30 <= recipes["top"]["docs_kept"] <= 50
    assert (
        recipes["top"]["tokens_seen"]
        == recipes["all"]["tokens_seen"]
        == [summary["proxy"]["train_tokens_per_arm"]]
    )
    assert [c["name"] for c in summary["classifiers"]] == ["austen"]
    assert summary["classifiers"][0]["auc"] == meta["auc"]
    assert 'id="classifiers"' in (root / "report.html").read_text()
    # the training order: "all", then the classifier reading it, then the recipe filtering with it
    assert log.index("all: data") < log.index("classifier austen") < log.index("top: data")

    # a second run trains the classifier no more, and the filtered recipe is not rebuilt
    model = (folder / "model.bin").stat().st_mtime_ns
    _, log = _ablate(path)
    assert "classifier austen: unchanged" in log and "top: data: unchanged" in log, log
    assert (folder / "model.bin").stat().st_mtime_ns == model

    # other fastText settings retrain it; the documents it reads are not rebuilt
    path.write_text(path.read_text().replace("dim = 16", "dim = 16, epoch = 3"))
    _, log = _ablate(path)
    assert "classifier austen: unchanged" not in log and "all: data: unchanged" in log
    assert json.loads((folder / "classifier.json").read_text())["settings"]["fasttext"]["epoch"] == 3
    # and rebuild the recipe it filters (its old documents are moved aside, not written over)
    assert "top: data: unchanged" not in log
    assert list((root / "recipes" / "top" / "previous").glob("*/data/stats.json"))


def test_an_arm_job_refuses_to_run_before_the_shared_stages(tmp_path, samples):
    from oreline.errors import OrelineError

    abl = load_ablation(_tiny(tmp_path, samples))
    with pytest.raises(OrelineError) as err:
        run_ablation(abl, console=Console(file=io.StringIO()), arm="all-seed1")
    assert "all: data is not finished" in str(err.value)
    assert "without --arm" in str(err.value)  # the fix
    assert not (tmp_path / "out" / "tiny" / "arms").exists()  # nothing was trained


def _state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv).get("JobState", "?")


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_trains_each_arm_as_its_own_job_then_reports(slurm_cluster, samples, tmp_path):
    path = _tiny(tmp_path, samples)
    path.write_text(path.read_text().replace("seeds = [1, 2]", "seeds = [1]"))
    driver = subprocess.run(
        [sys.executable, "-m", "oreline", "ablate", "-c", str(path), "--executor", "slurm"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    root = tmp_path / "out" / "tiny"
    jobs = json.loads((root / "jobs" / "jobs.json").read_text())
    assert [j["arm"] for j in jobs] == ["all-seed1", "half-seed1", None]  # two trainings, then the report
    assert not (root / "summary.json").exists()  # the driver returned before the trainings
    deadline = time.monotonic() + 600
    while _state(jobs[-1]["job"]) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    logs = {p.name: p.read_text()[-1500:] for p in (root / "jobs").glob("*.out")}
    assert {_state(j["job"]) for j in jobs} == {"COMPLETED"}, logs
    summary = json.loads((root / "summary.json").read_text())
    assert [r["tokens_seen"] for r in summary["recipes"]] == [[3072], [3072]]
    assert (root / "report.html").is_file()
    assert list(
        (root / "recipes" / "all" / "data" / "work" / "slurm").glob("filter-*")
    )  # data tasks as arrays


def test_a_docs_recipe_reads_a_data_output_or_a_shard_folder(tmp_path):
    from oreline.ablation import RecipeSpec, _recipe_docs
    from oreline.errors import InputError
    from oreline.runs import RunDir

    rd = RunDir(tmp_path / "rd")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError) as err:
        _recipe_docs(RecipeSpec(name="x", docs=str(empty)), rd)
    assert "point docs at an `oreline data --out` folder" in str(err.value)
    (tmp_path / "out" / "docs").mkdir(parents=True)  # what `oreline data --out out` writes
    assert _recipe_docs(RecipeSpec(name="x", docs=str(tmp_path / "out")), rd) == [tmp_path / "out" / "docs"]
    (empty / "part-0.parquet").write_bytes(b"")
    assert _recipe_docs(RecipeSpec(name="x", docs=str(empty)), rd) == [empty]
