"""`oreline ablate -c ABLATION.toml`: the same small model trained on competing data recipes, compared.

The method of FineWeb's and DCLM's data ablations: every arm differs only in its documents. One
tokenizer for all arms (losses in nats per token are only comparable under one vocabulary), the
same proxy model, seeds, batch and number of training tokens for every arm (a recipe with fewer
tokens repeats them, and the summary says how many times), and one validation set that no arm
trains on.

    OUT = out_dir/name/
      ablation.toml  lineage.json  tokenizer/  summary.json  report.html
      references/NAME/        reference LMs a recipe's perplexity filter names ({ablation}/references/NAME)
      classifiers/NAME/       fastText quality classifiers a recipe's quality step names ({ablation}/classifiers/NAME)
      recipes/NAME/           a run folder: data/ (oreline run's data stage) and tokens/ (shared tokenizer)
      arms/NAME-seedS/        a run folder: the proxy model's checkpoints/ and metrics.jsonl

Held-out set: every arm is tokenized with the same `validation.fraction`, and tokenize's split
is a pure function of a document's id (`oreline.tokens.tokenize.is_val`). So a document held out
of the validation recipe is held out of every arm that holds it (the same crawl record has the
same id in every recipe), and none is ever trained on. A quality classifier trained on a recipe's
documents (`recipe:NAME` in its positive or negative list) never sees them either: they are left
out of its training text, so nothing about the validation set steers what a filtered recipe keeps. The validation set is the val split of
the recipe `validation.recipe` names; each arm reads it as a mixture source of weight 0
(never drawn, validated at every evaluation: `val_loss_sources["heldout"]` in metrics.jsonl).

Caching reuses `oreline run`'s: each stage's key is `oreline.stages.stage_key` over its settings
and its inputs' fingerprints, recorded in lineage.json (`stages.cached_stage`); the data stage's
key is exactly `oreline run`'s, so a recipe built once is never rebuilt, and changing the proxy's
steps retrains the arms without touching data, tokenizer or tokens.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import time
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from rich.console import Console
from rich.table import Table

from oreline.config import (
    EXECUTION_KEYS,
    Config,
    ConfigError,
    DataConfig,
    Section,
    TokenizerConfig,
    config_from_dict,
    expand,
    resolve_config_path,
    to_dict,
)
from oreline.errors import InputError
from oreline.io import files_fingerprint, real_folder, write_atomic, write_json_atomic
from oreline.runs import RunDir

# a folder name (arms/NAME, references/NAME, out_dir/NAME): at least one character that is not a
# dot, since "." and ".." name the folder above it or the parent's (out_dir/.. is out_dir's parent)
NAME = r"^[A-Za-z0-9_.-]*[A-Za-z0-9_-][A-Za-z0-9_.-]*$"
NAME_LENGTH = 64
HELDOUT = "heldout"  # the validation set's source name in every arm's mixture
# every top-level name `oreline ablate` writes in its folder
ABLATION_NAMES = re.compile(
    r"ablation\.toml|lineage\.json|tokenizer|summary\.json|report\.html|references|classifiers|recipes|arms|jobs|"
    r"\.oreline-owner|\.oreline-lock.*"
)


# ---------------------------------------------------------------------------------------------
# the schema


class ReferenceSpec(Section):
    """A reference LM the ablation trains once (`oreline quality train-reference`), for recipes whose
    perplexity filter names it as `{ablation}/references/NAME`."""

    name: str = Field(..., pattern=NAME, max_length=NAME_LENGTH)
    docs: list[str] = Field(..., min_length=1, description="trusted text: .txt/.txt.gz/.zip/JSONL/Parquet")
    kind: Literal["ngram", "llama"] = "ngram"


RECIPE_SOURCE = "recipe:"  # a classifier's input naming a recipe: its documents, the held-out ones left out
CLASSIFIER_DIR = re.compile(r"\{ablation\}/classifiers/([^/\s\"']+)")  # how a recipe names one


class ClassifierSpec(Section):
    """A fastText quality classifier the ablation trains once (`oreline quality train-classifier`), for
    recipes whose quality step names it as `{ablation}/classifiers/NAME`. Each input is a file or
    folder (txt/zip/JSONL/Parquet, an `oreline data` output) or `recipe:NAME`: that recipe's
    documents without the ones held out as the validation set."""

    name: str = Field(..., pattern=NAME, max_length=NAME_LENGTH)
    positive: list[str] = Field(
        ..., min_length=1, description="text wanted more of: files, folders or recipe:NAME"
    )
    negative: list[str] = Field(..., min_length=1, description="ordinary text: files, folders or recipe:NAME")
    seed: int = Field(1, description="the document split's key and fastText's seed")
    heldout_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="documents per class held out for precision/recall/AUC"
    )
    fasttext: dict[str, Any] = Field(
        {}, description="fastText settings besides the defaults (dim, epoch, lr, ...)"
    )

    @model_validator(mode="after")
    def _known_settings(self) -> ClassifierSpec:
        from oreline.quality.classifier import FASTTEXT_DEFAULTS

        unknown = sorted(set(self.fasttext) - set(FASTTEXT_DEFAULTS))
        if unknown:
            raise ValueError(
                f"classifier {self.name!r}: unknown fastText settings {unknown}; use some of {sorted(FASTTEXT_DEFAULTS)}"
            )
        return self

    def recipes(self) -> list[str]:
        """The recipes whose documents it trains on."""
        return [n for n in map(recipe_input, (*self.positive, *self.negative)) if n is not None]


def recipe_input(src: str) -> str | None:
    """The recipe a classifier input names (`recipe:NAME`), or None for a file or folder."""
    return src[len(RECIPE_SOURCE) :] if src.startswith(RECIPE_SOURCE) else None


class RecipeSpec(Section):
    """One arm's documents: an `oreline data` config (a TOML file or an inline [recipes.data] table,
    the [data] section's keys) built with `oreline run`'s data stage, or an existing documents folder."""

    name: str = Field(..., pattern=NAME, max_length=NAME_LENGTH)
    data: str | dict[str, Any] | None = Field(
        None, description="an oreline config file (its [data] section is used), or the [data] keys inline"
    )
    docs: str | None = Field(None, description="a folder of document Parquet shards (oreline data --out)")

    @model_validator(mode="after")
    def _one_source(self) -> RecipeSpec:
        if (self.data is None) == (self.docs is None):
            raise ValueError(
                f"recipe {self.name!r} needs exactly one of data (an oreline data config) or docs (a "
                'documents folder): write data = "recipe.toml", an inline [recipes.data] table, or docs = "FOLDER"'
            )
        return self


class TokenizerSpec(TokenizerConfig):
    train_on: list[str] = Field(
        [],
        description="recipes whose documents train the shared tokenizer; empty: every recipe (their union)",
    )


class ValidationSpec(Section):
    recipe: str = Field(..., description="the recipe whose held-out documents are the common validation set")
    fraction: float = Field(
        0.05, gt=0.0, lt=1.0, description="share of documents (by id hash) held out of every arm"
    )
    sequences: int = Field(400, ge=1, description="validation sequences scored at each evaluation")


class ProxySpec(Section):
    preset: str = Field("debug", description="model preset of the proxy model (oreline model info)")
    seeds: list[int] = Field([1234], min_length=1, description="one training per seed and recipe")
    tokens: int = Field(
        ..., gt=0, description="training tokens of every arm (rounded up to whole optimizer steps)"
    )
    seq_len: int = Field(256, ge=8)
    micro_batch: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)
    evals: int = Field(5, ge=1, description="validation points along training (the loss curves)")
    tasks: list[str] = Field(
        ["core"],
        description="downstream tasks scored on each arm's final model (train.eval_tasks at the last step: "
        "core, task names or folders, as oreline eval --tasks); [] = none",
    )
    tasks_max_items: int = Field(
        200, ge=1, description="items per task (the first N of each, the same for every arm)"
    )
    model: dict[str, Any] = Field({}, description="[model] keys besides the preset (oreline config keys)")
    train: dict[str, Any] = Field({}, description="[train] keys besides the above (e.g. optim.lr)")

    @property
    def batch_tokens(self) -> int:
        return self.seq_len * self.micro_batch * self.grad_accum

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / self.batch_tokens)


class AblationConfig(Section):
    name: str = Field(..., pattern=NAME, max_length=NAME_LENGTH)
    out_dir: str = Field("runs", description="parent folder: the ablation writes out_dir/name")
    executor: Literal["local", "ray", "slurm"] = Field(
        "local",
        description="where the data and tokenize tasks run (the trainings run here, one after another)",
    )
    workers: int = Field(2, ge=1, description="processes of the data and tokenize tasks (executor = local)")
    references: list[ReferenceSpec] = []
    classifiers: list[ClassifierSpec] = []
    recipes: list[RecipeSpec]
    tokenizer: TokenizerSpec = TokenizerSpec()
    validation: ValidationSpec
    proxy: ProxySpec

    @model_validator(mode="after")
    def _names(self) -> AblationConfig:
        names = [r.name for r in self.recipes]
        if len(names) < 2:
            raise ValueError(
                f"an ablation compares at least two recipes, this one has {len(names)}; add a [[recipes]] "
                "(the unfiltered documents make the baseline)"
            )
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"recipe names repeat: {dup}; give every [[recipes]] its own name")
        refs = [r.name for r in self.references]
        if len(set(refs)) != len(refs):
            raise ValueError(f"reference names repeat: {refs}; give every [[references]] its own name")
        clfs = [c.name for c in self.classifiers]
        if len(set(clfs)) != len(clfs):
            raise ValueError(f"classifier names repeat: {clfs}; give every [[classifiers]] its own name")
        for c in self.classifiers:
            unknown = [n for n in c.recipes() if n not in names]
            if unknown:
                raise ValueError(
                    f"classifier {c.name!r} reads recipe:{unknown[0]}, which is not a recipe; name one of {names}"
                )
        if self.validation.recipe not in names:
            raise ValueError(
                f"validation.recipe = {self.validation.recipe!r} is not a recipe; name one of {names}"
            )
        unknown = [n for n in self.tokenizer.train_on if n not in names]
        if unknown:
            raise ValueError(
                f"tokenizer.train_on names {unknown}, which are not recipes; use some of {names}"
            )
        return self

    @property
    def root(self) -> Path:
        return Path(expand(self.out_dir)) / self.name


def load_ablation(path: str | Path, executor: str | None = None, sha256: str | None = None) -> AblationConfig:
    """Read and check ABLATION.toml; every error says what to change. `sha256`: the file must hold
    exactly those bytes (an arm's or the report's job: `oreline.job_inputs`)."""
    path = resolve_config_path(path)
    try:
        if sha256 is not None:
            from oreline.job_inputs import read_pinned

            text = read_pinned(path, sha256).decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
        tree = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc})", "pass an ablation TOML file with -c") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid TOML ({exc})", "fix the syntax at the position shown"
        ) from None
    if executor is not None:
        tree["executor"] = executor
    try:
        return AblationConfig.model_validate(tree)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            if err["type"] == "missing":
                lines.append(f"{key} is missing")
            elif err["type"] == "extra_forbidden":
                lines.append(f"unknown key {key!r}")
            elif key.endswith("name") and err["type"] in ("string_pattern_mismatch", "string_too_long"):
                lines.append(
                    f"{key} = {err.get('input')!r:.80} is not a folder name: use 1-{NAME_LENGTH} letters, "
                    "digits, '_', '-' or '.', not dots alone"
                )
            else:
                lines.append(f"{key}: {err['msg']}")
        raise ConfigError(
            f"{path}: " + "; ".join(lines),
            "fix those keys (configs/ablation-demo.toml is a complete example: name, [[recipes]] with "
            "data or docs, [validation] recipe, [proxy] tokens)",
        ) from None


def _substitute(node: Any, root: Path) -> Any:
    """`{ablation}` in any string of a recipe's data config is the ablation's folder."""
    if isinstance(node, str):
        return node.replace("{ablation}", str(root))
    if isinstance(node, dict):
        return {k: _substitute(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, root) for v in node]
    return node


def _raw_data(spec: RecipeSpec) -> tuple[dict[str, Any], str]:
    """The recipe's [data] keys as written ({ablation} not yet substituted) and where they are from."""
    if isinstance(spec.data, str):
        path = resolve_config_path(expand(spec.data))
        try:
            tree = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(
                f"recipe {spec.name!r}: {path} is not a readable TOML config ({exc})",
                "point data at an oreline config file (oreline data -c FILE) or write the [data] keys inline",
            ) from None
        data = tree.get("data", {})
        source = f"{path} (recipe {spec.name})"
    else:
        data, source = spec.data or {}, f"[recipes.data] of recipe {spec.name}"
    return data, source


def recipe_config(spec: RecipeSpec, abl: AblationConfig) -> Config:
    """The oreline config whose data section builds this recipe (only [data] is read from a file)."""
    data, source = _raw_data(spec)
    data = _substitute(data, abl.root)
    data = {**data, "workers": abl.workers, "executor": abl.executor}
    return config_from_dict({"data": data}, source=source)


# ---------------------------------------------------------------------------------------------
# the stages, each cached by oreline run's keys


def _recipe_docs(spec: RecipeSpec, rd: RunDir) -> list[Path]:
    from oreline.stages import docs_dirs

    if spec.docs is not None:
        folder = Path(expand(spec.docs))
        inner = folder / "docs"
        if inner.is_dir():  # an `oreline data --out` folder
            return [inner]
        if not folder.is_dir() or not any(folder.glob("*.parquet")):
            raise InputError(
                f"recipe {spec.name!r}: {folder} holds no document Parquet shards",
                "point docs at an `oreline data --out` folder or a folder of its Parquet shards",
            )
        return [folder]
    return docs_dirs(rd)


def build_references(abl: AblationConfig, console: Console, frozen: bool = False) -> None:
    from oreline.quality.reference_lm import train_reference
    from oreline.stages import cached_stage, stage_key

    for ref in abl.references:
        folder = abl.root / "references" / ref.name
        files = sorted(p for d in ref.docs for p in _files(Path(expand(d))))
        if not files:
            raise InputError(
                f"reference {ref.name!r}: {ref.docs} name no files",
                "list trusted text files or folders in docs",
            )
        key = stage_key(ref.kind, files_fingerprint(files))
        cached_stage(
            f"reference:{ref.name}",
            key,
            RunDir(abl.root),
            present=lambda f=folder: (f / "reference.json").is_file(),
            build=lambda r=ref, f=folder: (
                train_reference([expand(d) for d in r.docs], f, kind=r.kind, console=console),
                files_fingerprint([f / "reference.json"]),
            )[1],
            console=console,
            frozen=frozen,
        )


def classifiers_used(spec: RecipeSpec) -> set[str]:
    """The ablation's classifiers a recipe's data config names ({ablation}/classifiers/NAME)."""
    if spec.data is None:
        return set()
    return set(CLASSIFIER_DIR.findall(json.dumps(_raw_data(spec)[0])))


def build_order(abl: AblationConfig) -> list[tuple[str, str]]:
    """[("recipe" | "classifier", name)] in an order that builds every recipe a classifier trains on
    before it, and every classifier before the recipes that filter with it (declared order otherwise)."""
    known = {c.name: c for c in abl.classifiers}
    needs: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for spec in abl.recipes:
        used = classifiers_used(spec)
        missing = sorted(used - set(known))
        if missing:
            raise ConfigError(
                f"recipe {spec.name!r} names {{ablation}}/classifiers/{missing[0]}, but the ablation has no "
                f"[[classifiers]] named {missing[0]!r}",
                f'add a [[classifiers]] with name = "{missing[0]}" (positive, negative), or name one of '
                f"{sorted(known) or 'them'}",
            )
        needs[("recipe", spec.name)] = {("classifier", n) for n in used}
    for c in abl.classifiers:
        needs[("classifier", c.name)] = {("recipe", n) for n in c.recipes()}
    order: list[tuple[str, str]] = []
    pending = list(needs)
    while pending:
        ready = [n for n in pending if needs[n] <= set(order)]
        if not ready:
            cycle = ", ".join(f"{kind} {name}" for kind, name in pending)
            raise ConfigError(
                f"these recipes and classifiers wait on each other: {cycle} (a classifier trains on a recipe "
                "that is filtered by it)",
                "train the classifier on a recipe that does not use it (e.g. the unfiltered one)",
            )
        order.extend(ready)
        pending = [n for n in pending if n not in ready]
    return order


def _recipe_documents(name: str, docs: list[Path], fraction: float, dest: Path) -> Path:
    """A recipe's documents as JSONL without the validation set (`tokenize.is_val` at `fraction`, the
    split every arm uses): the input a classifier trains on when it names `recipe:NAME`."""
    import pyarrow.parquet as pq

    from oreline.io import write_bytes_atomic
    from oreline.tokens.tokenize import is_val

    lines = []
    for shard in sorted(p for d in docs for p in d.glob("*.parquet")):
        table = pq.read_table(shard, columns=["id", "text"])
        for doc_id, text in zip(
            table.column("id").to_pylist(), table.column("text").to_pylist(), strict=True
        ):
            if doc_id is not None and not is_val(doc_id, fraction):
                lines.append(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    path = dest / f"recipe-{name}.jsonl"
    write_bytes_atomic(path, "".join(lines).encode("utf-8"))
    return path


def build_classifier(
    spec: ClassifierSpec,
    abl: AblationConfig,
    recipes: dict[str, dict],
    console: Console,
    frozen: bool = False,
) -> str:
    """Train the classifier into {ablation}/classifiers/NAME, skipped when its key (settings, inputs'
    fingerprints, the validation fraction that decides what a recipe input leaves out) is unchanged."""
    from oreline.data.filters.classifier import META_FILE, MODEL_FILE
    from oreline.outdir import claim_folder
    from oreline.quality.classifier import train_classifier
    from oreline.stages import cached_stage, stage_key

    folder = abl.root / "classifiers" / spec.name
    sources = []
    for side in (spec.positive, spec.negative):
        for src in side:
            if (name := recipe_input(src)) is not None:
                sources.append(recipes[name]["output"])
                continue
            files = sorted(_files(Path(expand(src))))
            if not files:
                raise InputError(
                    f"classifier {spec.name!r}: {src} names no files",
                    "list document files or folders (or recipe:NAME) in positive and negative",
                )
            sources.append(files_fingerprint(files))
    settings = spec.model_dump(exclude={"name"})
    key = stage_key(settings, abl.validation.fraction, *sources)

    def build() -> str:
        claim_folder(folder, "classifier", "oreline ablate", legacy=lambda d: (d / META_FILE).is_file())
        inputs = folder / "inputs"
        inputs.mkdir(exist_ok=True)

        def paths(side: list[str]) -> list[str]:
            return [
                src
                if (name := recipe_input(src)) is None
                else str(_recipe_documents(name, recipes[name]["docs"], abl.validation.fraction, inputs))
                for src in side
            ]

        train_classifier(
            paths(spec.positive),
            paths(spec.negative),
            folder,
            seed=spec.seed,
            heldout_fraction=spec.heldout_fraction,
            console=console,
            **spec.fasttext,
        )
        return files_fingerprint([folder / MODEL_FILE])

    return cached_stage(
        f"classifier:{spec.name}",
        key,
        RunDir(abl.root),
        present=lambda: (folder / MODEL_FILE).is_file() and (folder / META_FILE).is_file(),
        build=build,
        console=console,
        label=f"classifier {spec.name}",
        frozen=frozen,
    )


def _files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path] if path.is_file() else []


def build_recipe_data(
    spec: RecipeSpec, abl: AblationConfig, console: Console, frozen: bool = False
) -> dict[str, Any]:
    """The recipe's documents: oreline run's data stage (skipped when its key is unchanged)."""
    from oreline.stages import _outputs_present, _stage_key, cached_stage, stage_data

    rd = RunDir(abl.root / "recipes" / spec.name).claim("oreline ablate")
    if spec.docs is not None:
        docs = _recipe_docs(spec, rd)
        out = files_fingerprint(sorted(p for d in docs for p in d.glob("*.parquet")))
        return {"rd": rd, "docs": docs, "output": out, "cfg": None}
    cfg = recipe_config(spec, abl)
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"name": spec.name})})
    key = _stage_key("data", cfg, {})
    before = rd.lineage().get("data", {}).get("key")

    def build() -> str:
        # other settings or a retrained model (a classifier, a reference): `oreline data` refuses to
        # write over a run with another fingerprint, so the old documents move to previous/ (an
        # interrupted build with the same key stays, and resumes)
        if before not in (None, key) and rd.data.exists():
            dest = real_folder(rd.root / "previous" / time.strftime("%Y%m%d-%H%M%S"))
            shutil.move(str(rd.data), dest / rd.data.name)
        return stage_data(cfg, rd, console)

    out = cached_stage(
        "data",
        key,
        rd,
        present=lambda: _outputs_present("data", rd, cfg),
        build=build,
        console=console,
        label=f"{spec.name}: data",
        frozen=frozen,
    )
    return {"rd": rd, "docs": _recipe_docs(spec, rd), "output": out, "cfg": cfg}


def build_tokenizer(
    abl: AblationConfig, recipes: dict[str, dict], console: Console, frozen: bool = False
) -> str:
    from oreline.stages import cached_stage, stage_key
    from oreline.tokens.train_bpe import load_tokenizer, print_tokenizer_stats, train_tokenizer

    names = abl.tokenizer.train_on or list(recipes)
    settings = TokenizerConfig(**abl.tokenizer.model_dump(exclude={"train_on"}))
    folder = abl.root / "tokenizer"

    def build() -> str:
        docs = [str(d) for n in names for d in recipes[n]["docs"]]
        print_tokenizer_stats(train_tokenizer(docs, folder, settings), console)
        return load_tokenizer(folder).fingerprint

    return cached_stage(
        "tokenizer",
        stage_key(to_dict(settings), *[recipes[n]["output"] for n in names]),
        RunDir(abl.root),
        present=lambda: (folder / "tokenizer.json").is_file(),
        build=build,
        console=console,
        label="shared tokenizer",
        frozen=frozen,
    )


def tokenize_recipe(
    name: str, recipe: dict, abl: AblationConfig, tokenizer_fp: str, console: Console, frozen: bool = False
) -> dict[str, Any]:
    from oreline.config import TokenizeConfig
    from oreline.stages import cached_stage, stage_key
    from oreline.tokens.tokenize import print_manifest_summary, tokenize_corpus

    rd: RunDir = recipe["rd"]
    settings = TokenizeConfig(
        val_fraction=abl.validation.fraction, workers=abl.workers, executor=abl.executor
    )
    data_cfg = recipe["cfg"].data if recipe["cfg"] is not None else DataConfig()

    def build() -> str:
        manifest = tokenize_corpus(
            [str(d) for d in recipe["docs"]],
            abl.root / "tokenizer",
            rd.tokens,
            settings,
            workers=abl.workers,
            ray=data_cfg.ray,
            slurm=data_cfg.slurm,
            console=console,
        )
        print_manifest_summary(manifest, console)
        return files_fingerprint([rd.tokens / "manifest.json"])

    out = cached_stage(
        "tokenize",
        stage_key(
            {k: v for k, v in to_dict(settings).items() if k not in EXECUTION_KEYS},
            recipe["output"],
            tokenizer_fp,
        ),
        rd,
        present=lambda: (rd.tokens / "manifest.json").is_file(),
        build=build,
        console=console,
        label=f"{name}: tokenize",
        frozen=frozen,
    )
    return {"output": out, "tokens": rd.tokens}


def arm_config(abl: AblationConfig, recipe: str, seed: int, tokens: Path, heldout: Path) -> Config:
    """The proxy model's run: the recipe's tokens (weight 1) and the held-out set (weight 0: only validated)."""
    p = abl.proxy
    every = max(1, p.steps // p.evals)
    train = {
        "sources": [
            {"name": "train", "tokens": str(tokens), "weight": 1.0},
            {"name": HELDOUT, "tokens": str(heldout), "weight": 0.0},
        ],
        "tokenizer": str(abl.root / "tokenizer"),
        "seq_len": p.seq_len,
        "micro_batch": p.micro_batch,
        "grad_accum": p.grad_accum,
        "steps": p.steps,
        "seed": seed,
        "eval_every": every,
        "eval_sequences": abl.validation.sequences,
        "log_every": max(1, min(20, every)),
        # downstream scores of the final model only: the curve is the held-out loss, and a proxy this
        # small moves little from chance, so scoring every evaluation would cost more than it shows
        "eval_tasks": p.tasks,
        "eval_tasks_every": 0,
        "eval_tasks_max_items": p.tasks_max_items,
        **p.train,
    }
    tree = {
        "run": {"name": f"{recipe}-seed{seed}", "runs_dir": str(abl.root / "arms"), "seed": seed},
        "model": {"preset": p.preset, **p.model},
        "train": train,
        "checkpoint": {"every": p.steps, "keep_last": 1},
        # the arms are compared by loss; generations at every evaluation would cost more than the steps
        "eval": {"prompts": []},
    }
    return config_from_dict(tree, source=f"[proxy] of the ablation {abl.name}")


def _train_key(cfg: Config, tokenize_outputs: list[str]) -> str:
    from oreline.stages import _section, stage_key

    return stage_key(_section(cfg, "model", "train", "checkpoint", "run"), *tokenize_outputs)


def arm_trained(cfg: Config, tokenize_outputs: list[str]) -> bool:
    rd = RunDir.for_config(cfg)
    rec = rd.lineage().get("train", {})
    return bool(
        rec.get("key") == _train_key(cfg, tokenize_outputs)
        and rec.get("finished")
        and (rd.checkpoints / "latest").is_file()
    )


def train_arm(cfg: Config, tokenize_outputs: list[str], console: Console) -> str:
    """Train one arm, skipped when finished with the same key; an interrupted one resumes (as oreline run)."""
    from oreline.stages import _latest_checkpoint_fingerprint, _move_training_aside
    from oreline.train.loop import train

    rd = RunDir.for_config(cfg).claim("oreline ablate")
    key = _train_key(cfg, tokenize_outputs)
    rec = rd.lineage().get("train", {})
    if arm_trained(cfg, tokenize_outputs):
        console.print(f"[dim]· {cfg.run.name}: train unchanged (key {key[:12]}), skipped[/]")
        return rec["output"]
    resume = rec.get("key") == key and not rec.get("finished")
    console.rule(f"[bold]{cfg.run.name}: train" + (" (resuming)" if resume else ""))
    if not resume:
        _move_training_aside(rd)
    from oreline.config import write_resolved

    write_resolved(cfg, rd.root, section="run")
    rd.record_stage("train", {"key": key, "finished": False})
    train(cfg, resume="auto" if resume else "none", allow_config_change=[])
    out = _latest_checkpoint_fingerprint(rd)
    rd.record_stage("train", {"key": key, "finished": True, "output": out})
    return out


# ---------------------------------------------------------------------------------------------
# reading the results


def _metrics(path: Path) -> list[dict]:
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def arm_result(rd: RunDir) -> dict[str, Any]:
    """One training's curve and final numbers on the held-out set, from its metrics.jsonl."""
    recs = _metrics(rd.metrics)
    curve = []
    for r in recs:
        if r.get("type") == "eval":
            v = (r.get("val_loss_sources") or {}).get(HELDOUT)
            if v is not None:
                bpb = (r.get("val_bpb_sources") or {}).get(HELDOUT)
                curve.append({"step": r.get("step"), "val_loss": v, "val_bpb": bpb})
    train = [r for r in recs if r.get("type") == "train"]
    last = curve[-1] if curve else {}
    # the final model's downstream scores: the last `tasks` record (train.eval_tasks at the last step)
    tasks = [r for r in recs if r.get("type") == "tasks" and isinstance(r.get("acc"), dict)]
    final_tasks = tasks[-1] if tasks else {}
    return {
        "run_dir": str(rd.root),
        "curve": curve,
        "final_val_loss": last.get("val_loss"),
        "final_val_bpb": last.get("val_bpb"),
        "final_train_loss": train[-1].get("loss") if train else None,
        "steps": train[-1].get("step") if train else None,
        "tokens_seen": train[-1].get("tokens_seen") if train else None,
        "tasks": {
            name: {key: (final_tasks.get(key) or {}).get(name) for key in TASK_KEYS}
            for name in (final_tasks.get("acc") or {})
        },
        "core": final_tasks.get("core"),
    }


# what a `tasks` record holds per task (train/loop.py's downstream_record)
TASK_KEYS = ("items", "acc", "acc_norm", "centered", "chance")


def _tasks_spread(runs: list[dict]) -> dict[str, dict[str, Any]]:
    """Per task, each score's spread over the seeds, and the items and chance (the same for every seed)."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(n for r in runs for n in r.get("tasks", {})):
        per = [r["tasks"][name] for r in runs if name in r.get("tasks", {})]
        out[name] = {
            "items": per[0].get("items"),
            "chance": per[0].get("chance"),
            **{key: _spread([m.get(key) for m in per]) for key in ("acc", "acc_norm", "centered")},
        }
    return out


def _spread(values: list[float | None]) -> dict[str, Any]:
    vals = [v for v in values if isinstance(v, int | float)]
    if not vals:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
    }


def _docs_counts(recipe: dict) -> dict[str, Any]:
    rd: RunDir = recipe["rd"]
    stats = rd.data / "stats.json"
    docs_in = docs_kept = None
    if recipe["cfg"] is not None and stats.is_file():
        steps = json.loads(stats.read_text(encoding="utf-8")).get("steps", [])
        if steps:
            docs_in, docs_kept = steps[0].get("docs_in"), steps[-1].get("docs_out")
    manifest = json.loads((rd.tokens / "manifest.json").read_text(encoding="utf-8"))
    splits = manifest.get("splits") or {}
    docs = {s: (splits.get(s) or {}).get("documents", 0) for s in ("train", "val")}
    tokens = {s: (splits.get(s) or {}).get("tokens", 0) for s in ("train", "val")}
    return {
        "docs_in": docs_in,
        "docs_kept": docs_kept if docs_kept is not None else docs["train"] + docs["val"],
        "train_docs": docs["train"],
        "heldout_docs": docs["val"],
        "train_tokens": tokens["train"],
        "heldout_tokens": tokens["val"],
    }


# ---------------------------------------------------------------------------------------------
# the command


def run_ablation(
    abl: AblationConfig, console: Console | None = None, arm: str | None = None
) -> dict[str, Any]:
    """Build every recipe, the shared tokenizer and the token sets, train every arm, write
    summary.json and report.html; return the summary.

    executor = slurm: the data and tokenize tasks run as Slurm array jobs (the driver waits), then
    every arm that is not trained yet is submitted as its own job (`oreline ablate --arm NAME-seedS`),
    and one last job after all of them writes the summary and the report; the driver returns.
    `arm`: train that arm alone, once every shared stage is finished and unchanged (what a job does)."""
    from oreline.config import to_toml
    from oreline.outdir import FolderLock, claim_folder
    from oreline.train.trackers import check_destinations

    console = console or Console(stderr=True)
    root = abl.root
    # a tracker server that only the ablation file names is refused now, not after the data stages
    check_destinations(arm_config(abl, abl.recipes[0].name, abl.proxy.seeds[0], root, root))
    frozen = arm is not None  # an arm's job reads the shared stages; it never rebuilds them
    if not frozen:
        claim_folder(
            root,
            "ablation",
            "oreline ablate",
            reserved=ABLATION_NAMES.fullmatch,
            choose="choose another name (or out_dir) in the ablation config",
        )
    with FolderLock(root, "oreline ablate") if not frozen else _no_lock():
        if not frozen:
            write_atomic(root / "ablation.toml", to_toml(abl))
        build_references(abl, console, frozen)
        specs = {spec.name: spec for spec in abl.recipes}
        classifiers = {c.name: c for c in abl.classifiers}
        built: dict[str, dict] = {}
        for kind, name in build_order(abl):
            if kind == "recipe":
                built[name] = build_recipe_data(specs[name], abl, console, frozen)
            else:
                build_classifier(classifiers[name], abl, built, console, frozen)
        recipes = {name: built[name] for name in specs}  # the declared order (table, report)
        tok_fp = build_tokenizer(abl, recipes, console, frozen)
        tokens = {name: tokenize_recipe(name, r, abl, tok_fp, console, frozen) for name, r in recipes.items()}
        val = tokens[abl.validation.recipe]
        counts = {name: _docs_counts(r) for name, r in recipes.items()}
        if counts[abl.validation.recipe]["heldout_tokens"] == 0:
            raise InputError(
                f"the validation recipe {abl.validation.recipe!r} has no held-out documents at "
                f"validation.fraction = {abl.validation.fraction}",
                "raise validation.fraction (or name a larger recipe in validation.recipe)",
            )
        plan = {
            f"{name}-seed{seed}": (
                name,
                seed,
                arm_config(abl, name, seed, tokens[name]["tokens"], val["tokens"]),
                [tokens[name]["output"], val["output"]],
            )
            for name in recipes
            for seed in abl.proxy.seeds
        }
        if arm is not None:
            if arm not in plan:
                raise InputError(f"--arm {arm} is not an arm of {abl.name}", f"use one of {', '.join(plan)}")
            _, _, cfg, inputs = plan[arm]
            train_arm(cfg, inputs, console)
            return {"arm": arm}
        if abl.executor == "slurm":
            pending = [n for n, (_, _, cfg, inputs) in plan.items() if not arm_trained(cfg, inputs)]
            if pending:
                return {"jobs": submit_arm_jobs(abl, pending, console)}
        return _finish(abl, plan, counts, tok_fp, console)


class _no_lock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _finish(abl: AblationConfig, plan: dict, counts: dict, tok_fp: str, console: Console) -> dict[str, Any]:
    """Train what is not trained (here, one after another), then the summary and the report."""
    from oreline.report.ablation import write_ablation_report

    arms: dict[str, list[dict]] = {}
    for name, seed, cfg, inputs in plan.values():
        train_arm(cfg, inputs, console)
        arms.setdefault(name, []).append({"seed": seed, **arm_result(RunDir.for_config(cfg))})
    summary = summarize(abl, counts, arms, tok_fp)
    write_json_atomic(abl.root / "summary.json", summary)
    report = write_ablation_report(abl.root, summary)
    summary["report"] = str(report)
    print_table(summary, console)
    console.print(f"report: {report}\nsummary: {abl.root / 'summary.json'}")
    return summary


def submit_arm_jobs(abl: AblationConfig, pending: list[str], console: Console) -> list[dict]:
    """One Slurm job per arm (`oreline ablate -c OUT/jobs/ablation.toml --arm ARM`), and a last job,
    after all of them succeed, that writes the summary and the report (every arm then skipped).
    Job settings: the first recipe's data.slurm (partition, stage_time_limit, stage_cpus, sbatch_args).

    The jobs read the ablation as it is now and nothing else: OUT/jobs/ is private, the config there
    holds every recipe's [data] keys inline (a recipe's own config file could be edited while the
    jobs wait), and each job's command pins its sha256 (`oreline.job_inputs`)."""
    import sys

    from oreline.config import to_toml
    from oreline.executors.slurm import submit
    from oreline.job_inputs import submitted_config, write_private
    from oreline.slurm_script import job_name, job_script, write_script

    inline = [
        r.model_copy(update={"data": _raw_data(r)[0]}) if isinstance(r.data, str) else r for r in abl.recipes
    ]
    jobs_dir = abl.root.resolve() / "jobs"  # a link at jobs/ itself is refused, not followed
    config, pin = submitted_config(
        jobs_dir, "ablation.toml", to_toml(abl.model_copy(update={"recipes": inline}))
    )
    s = (
        recipe_config(abl.recipes[0], abl).data.slurm
        if abl.recipes[0].data is not None
        else DataConfig().slurm
    )
    cpus = s.stage_cpus or abl.workers

    def script(name: str, extra: list[str]) -> str:
        text = job_script(
            s,
            name=job_name("oreline", abl.name, name),
            name_key="name",
            log=f"{jobs_dir}/{name}-%j.out",
            log_key="out_dir and name (the ablation folder)",
            cpus=cpus,
            cancels="a failed training cancels the report job",
            command=[sys.executable, "-m", "oreline", "ablate", "-c", str(config), *pin, *extra],
            command_key="the ablation command (paths of the ablation)",
        )
        write_script(jobs_dir / f"{name}.sbatch", text)
        return text

    submitted = []
    for name in pending:
        job = submit(script(name, ["--arm", name]))
        submitted.append({"arm": name, "job": job})
        console.print(f"{name}: Slurm job {job}; log {jobs_dir}/{name}-{job}.out")
    after = ":".join(j["job"] for j in submitted)
    job = submit(script("report", ["--executor", "slurm"]), [f"--dependency=afterok:{after}"])
    submitted.append({"arm": None, "job": job})
    write_private(jobs_dir / "jobs.json", (json.dumps(submitted, indent=2) + "\n").encode())
    console.print(
        f"{len(submitted) - 1} training job(s) and the report job {job} (after they succeed) submitted; follow them "
        f"with `squeue -j {','.join(j['job'] for j in submitted)}`. If one fails, the report job is cancelled: fix "
        "the cause and run `oreline ablate --executor slurm` again, which submits the trainings not finished."
    )
    return submitted


def summarize(abl: AblationConfig, counts: dict, arms: dict[str, list[dict]], tokenizer_fp: str) -> dict:
    p = abl.proxy
    budget = p.steps * p.batch_tokens
    recipes = []
    for name, runs in arms.items():
        c = counts[name]
        recipes.append(
            {
                "name": name,
                **c,
                "train_tokens_budget": budget,
                "tokens_seen": [r["tokens_seen"] for r in runs],
                # a recipe with fewer tokens than the budget is read more than once
                "epochs": budget / c["train_tokens"] if c["train_tokens"] else None,
                "final_val_loss": _spread([r["final_val_loss"] for r in runs]),
                "final_val_bpb": _spread([r["final_val_bpb"] for r in runs]),
                "final_train_loss": _spread([r["final_train_loss"] for r in runs]),
                "tasks": _tasks_spread(runs),
                "core": _spread([r.get("core") for r in runs]),
                "runs": runs,
            }
        )
    return {
        "format": "oreline-ablation",
        "version": 1,
        "name": abl.name,
        "folder": str(abl.root),
        "tokenizer": {
            "fingerprint": tokenizer_fp,
            "trained_on": abl.tokenizer.train_on or [r.name for r in abl.recipes],
            "vocab_size": abl.tokenizer.vocab_size,
        },
        "validation": {
            "recipe": abl.validation.recipe,
            "fraction": abl.validation.fraction,
            "sequences": abl.validation.sequences,
            "documents": counts[abl.validation.recipe]["heldout_docs"],
            "tokens": counts[abl.validation.recipe]["heldout_tokens"],
        },
        "proxy": {
            "preset": p.preset,
            "seeds": p.seeds,
            "steps": p.steps,
            "batch_tokens": p.batch_tokens,
            "train_tokens_per_arm": budget,
            "tokens_asked": p.tokens,
            "tasks": p.tasks,
            "tasks_max_items": p.tasks_max_items,
        },
        "classifiers": [classifier_summary(abl, c) for c in abl.classifiers],
        "recipes": recipes,
    }


def classifier_summary(abl: AblationConfig, spec: ClassifierSpec) -> dict[str, Any]:
    """What a classifier was trained on and its held-out precision, recall and AUC (classifier.json)."""
    from oreline.data.filters.classifier import classifier_meta

    folder = abl.root / "classifiers" / spec.name
    meta = classifier_meta(folder)
    return {
        "name": spec.name,
        "folder": str(folder),
        "positive": spec.positive,
        "negative": spec.negative,
        "fingerprint": meta.get("fingerprint"),
        "documents": {k: v.get("documents") for k, v in (meta.get("counts") or {}).items()},
        "heldout_documents": {k: v.get("heldout_documents") for k, v in (meta.get("counts") or {}).items()},
        "precision": meta.get("precision"),
        "recall": meta.get("recall"),
        "auc": meta.get("auc"),
    }


def _pm(s: dict) -> str:
    if s["mean"] is None:
        return "?"
    return f"{s['mean']:.4f}" + (f" ± {s['std']:.4f}" if s.get("std") is not None else "")


def print_table(summary: dict, console: Console) -> None:
    v = summary["validation"]
    table = Table(
        title=f"oreline ablate {summary['name']}: {summary['proxy']['train_tokens_per_arm']:,} training tokens "
        f"per arm, validation = {v['documents']:,} held-out documents of {v['recipe']!r} ({v['tokens']:,} tokens)"
    )
    scored = any((r.get("core") or {}).get("n") for r in summary["recipes"])
    cols = ("recipe", "docs kept", "train tokens", "epochs", "val loss", "val bpb", "seeds")
    for col in cols + (("CORE (centred)",) if scored else ()):
        table.add_column(col, justify="left" if col == "recipe" else "right")
    for r in summary["recipes"]:
        kept = f"{r['docs_kept']:,}" + (f" of {r['docs_in']:,}" if isinstance(r.get("docs_in"), int) else "")
        table.add_row(
            r["name"],
            kept,
            f"{r['train_tokens']:,}",
            f"{r['epochs']:.2f}" if r["epochs"] is not None else "?",
            _pm(r["final_val_loss"]),
            _pm(r["final_val_bpb"]),
            str(r["final_val_loss"]["n"]),
            *((_pm(r["core"]),) if scored else ()),
        )
    console.print(table)
    for c in summary.get("classifiers", []):
        d, h = c["documents"], c["heldout_documents"]
        console.print(
            f"classifier {c['name']}: {d.get('positive')} positive and {d.get('negative')} negative documents; on its "
            f"held-out ones ({h.get('positive')} + {h.get('negative')}) precision {c['precision']}, recall "
            f"{c['recall']}, AUC {c['auc']}"
        )
