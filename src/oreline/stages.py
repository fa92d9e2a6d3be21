"""`oreline run`: crawl to exported model in one command, redoing only what changed.

Stages, in order: data → tokenizer → tokenize → train → eval → export → report.

Each stage has a *key*: the sha256 of its own settings and of the fingerprints of what it
consumes (the previous stages' outputs). `lineage.json` in the run directory records, per stage,
the key it ran with, whether it finished and the fingerprint of what it produced. A stage is
skipped when it finished with the same key and its outputs are still there; otherwise it and
every stage that consumes its output run again (`STAGE_INPUTS`). So changing a filter threshold
re-runs data and everything after it, changing the learning rate re-runs training and after, an
eval setting re-runs eval and the report (not the export), and `--from STAGE` forces a stage and
every stage after it.

Training is the one stage that may be interrupted and continued: a `train` record with the same
key that did not finish resumes from its newest valid checkpoint; a different key starts the
training from scratch (the old checkpoints and metrics are moved aside, never mixed).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from oreline.config import EXECUTION_KEYS, Config, expand, fingerprint, samples_dir, to_dict, write_resolved
from oreline.errors import InputError, OrelineError
from oreline.io import files_fingerprint, real_folder
from oreline.runs import RunDir

STAGES = ["data", "tokenizer", "tokenize", "train", "eval", "export", "report"]


# ---------------------------------------------------------------------------------------------
# fingerprints of stage outputs


def stage_key(*parts: Any) -> str:
    return fingerprint(
        {
            "parts": [
                p
                if isinstance(p, str | int | float | type(None))
                else to_dict(p)
                if hasattr(p, "model_dump")
                else p
                for p in parts
            ]
        }
    )


def _section(cfg: Config, *names: str, drop: tuple[str, ...] = ()) -> dict:
    """Named config sections as a dict, without settings that do not change results (workers)."""
    out = {}
    for name in names:
        node: Any = to_dict(cfg)
        for part in name.split("."):
            node = node[part]
        out[name] = {k: v for k, v in node.items() if k not in drop} if isinstance(node, dict) else node
    return out


# ---------------------------------------------------------------------------------------------
# the stages


def _docs_dirs(rd: RunDir) -> list[Path]:
    return [p for p in (rd.data / "docs", rd.root / "extra" / "docs") if p.is_dir()]


docs_dirs = _docs_dirs  # the document folders the data stage wrote (oreline ablate reads them too)


def cached_stage(
    stage: str,
    key: str,
    rd: RunDir,
    present: Callable[[], bool],
    build: Callable[[], str],
    console: Console,
    label: str | None = None,
    frozen: bool = False,
) -> str:
    """`oreline run`'s rule for one stage, for callers that run stages outside the chain
    (`oreline ablate`): skip when lineage.json records `stage` finished with `key` and `present()`
    (its outputs are still there), else run `build` and record its output's fingerprint.
    `frozen`: the stage must be finished and unchanged (a job that only reads it), else an error."""
    rec = rd.lineage().get(stage, {})
    label = label or stage
    if rec.get("key") == key and rec.get("finished") and present():
        console.print(f"[dim]· {label}: unchanged (key {key[:12]}), skipped[/]")
        return rec["output"]
    if frozen:
        raise OrelineError(
            f"{label} is not finished in {rd.root}, or its settings or inputs changed since the jobs were submitted",
            "run the command again without --arm: it rebuilds what changed and submits the trainings again",
        )
    console.rule(f"[bold]{label}")
    rd.record_stage(stage, {"key": key, "finished": False, "started": time.time()})
    t0 = time.perf_counter()
    out = build()
    rd.record_stage(
        stage,
        {
            "key": key,
            "finished": True,
            "output": out,
            "seconds": time.perf_counter() - t0,
            "finished_at": time.time(),
        },
    )
    return out


def _check_samples(cfg: Config) -> None:
    uses_samples = any("{samples}" in s for s in cfg.data.inputs + cfg.data.extra_inputs)
    if uses_samples and not samples_dir().is_dir():
        raise InputError(
            f"the sample data folder {samples_dir()} (ORELINE_SAMPLES) does not exist",
            "unset ORELINE_SAMPLES to use the embedded samples or point it at an existing folder, or point "
            "the run at your own WARC files with "
            'data.inputs=["/path/to/warcs"] (and data.extra_inputs=[] or your own clean text)',
        )


def _check_training_settings(cfg: Config) -> None:
    """The training settings train refuses by themselves (a warmup not shorter than the run, a
    min_lr above lr), checked before the first stage: found at the train stage, they cost the
    user the data, tokenizer and tokenize stages first."""
    from oreline.train.optim import warmup_steps

    warmup_steps(cfg.train)


def stage_data(cfg: Config, rd: RunDir, console: Console) -> str:
    from oreline.data.pipeline.run import check_kept_documents, print_funnel, run_data

    inputs = [expand(p) for p in cfg.data.inputs]
    # the stages after this one read its output: the run waits for the data, detached or not
    cfg = cfg.model_copy(
        update={
            "data": cfg.data.model_copy(update={"slurm": cfg.data.slurm.model_copy(update={"detach": False})})
        }
    )
    stats = run_data(inputs, rd.data, cfg, workers=cfg.data.workers)
    print_funnel(stats, console)
    check_kept_documents(stats, rd.data)  # not at tokenize or train, far from the cause
    _write_extra_documents(cfg, rd, console)
    return files_fingerprint([p for d in _docs_dirs(rd) for p in d.glob("*.parquet")])


def _write_extra_documents(cfg: Config, rd: RunDir, console: Console) -> None:
    """Clean text the user trusts (the demo: public-domain prose), split into ~4 KB documents at
    paragraph breaks so the train/validation split by id hash has enough units to split."""
    from oreline.data.filters.normalize import normalize_text
    from oreline.data.read.inputs import discover_inputs, iter_input_documents
    from oreline.data.read.shards import ShardWriter
    from oreline.document import Document
    from oreline.outdir import remove_tree

    extra = rd.root / "extra"
    if not remove_tree(rd.root, extra):  # a link (checked at the claim too) is never followed
        raise OrelineError(
            f"{extra} is a symbolic link or a file, not the folder oreline writes", f"remove {extra}"
        )
    if not cfg.data.extra_inputs:
        return
    files, unknown = discover_inputs([expand(p) for p in cfg.data.extra_inputs])
    for path in unknown:
        console.print(f"[yellow]extra text: {path} is of no known kind; skipped[/]")
    n_docs = n_chars = 0
    with ShardWriter(extra / "docs", "part", cfg.data.max_shard_bytes) as writer:
        for path, _kind in files:
            for doc in iter_input_documents(path, cfg):
                for k, piece in enumerate(split_paragraph_blocks(normalize_text(doc.text), 4000)):
                    writer.write_doc(
                        Document(id=f"{doc.id}#p{k}", text=piece, url=doc.url, metadata=dict(doc.metadata))
                    )
                    n_docs += 1
                    n_chars += len(piece)
    console.print(f"extra text: {n_docs:,} documents, {n_chars:,} characters from {len(files)} files")


def split_paragraph_blocks(text: str, target_chars: int) -> list[str]:
    """Group paragraphs (blank-line separated) into blocks of about target_chars characters."""
    blocks, current, size = [], [], 0
    for para in text.split("\n\n"):
        para = para.strip()
        if not para:
            continue
        current.append(para)
        size += len(para) + 2
        if size >= target_chars:
            blocks.append("\n\n".join(current))
            current, size = [], 0
    if current:
        blocks.append("\n\n".join(current))
    return blocks


def stage_tokenizer(cfg: Config, rd: RunDir, console: Console) -> str:
    from oreline.tokens.train_bpe import print_tokenizer_stats, train_tokenizer

    stats = train_tokenizer([str(d) for d in _docs_dirs(rd)], rd.tokenizer, cfg.tokenizer)
    print_tokenizer_stats(stats, console)
    from oreline.tokens.train_bpe import load_tokenizer

    return load_tokenizer(rd.tokenizer).fingerprint


def stage_tokenize(cfg: Config, rd: RunDir, console: Console) -> str:
    from oreline.tokens.tokenize import print_manifest_summary, tokenize_corpus, val_min_tokens

    # tokens/ holds every document (the report's, doctor's and final eval's view); a mixture's
    # sources get one token folder per document set besides it
    sets = [(rd.tokens, [str(d) for d in _docs_dirs(rd)], None)]
    sets += [(folder, [str(docs)], docs) for folder, docs in _source_token_sets(cfg, rd)]
    made = []
    for folder, inputs, docs in sets:
        if docs is not None:
            console.print(f"token source {folder.name}: the documents of {docs}")
        manifest = tokenize_corpus(
            inputs,
            rd.tokenizer,
            folder,
            cfg.tokenize,
            workers=cfg.tokenize.workers,
            ray=cfg.data.ray,
            slurm=cfg.data.slurm,
            console=console,
            val_min_tokens=val_min_tokens(cfg.tokenize.val_sequences, cfg.train.seq_len),
        )
        print_manifest_summary(manifest, console)
        made.append(folder / "manifest.json")
    return files_fingerprint(made)


# The run's document sets a [[train.sources]] may name as {run}/tokens-<set>: `oreline run` then
# tokenizes that set alone into it (tokens/ keeps every document: the report's and doctor's view).
DOCUMENT_SETS = {"tokens-web": ("data", "docs"), "tokens-extra": ("extra", "docs")}


def _source_token_sets(cfg: Config, rd: RunDir, check: bool = True) -> list[tuple[Path, Path]]:
    """(token folder, documents folder) of each train source that names one of the run's document sets."""
    out = []
    for source in [] if cfg.train.tokens else cfg.train.sources:
        for name, parts in DOCUMENT_SETS.items():
            if source.tokens.rstrip("/") == "{run}/" + name:
                docs = rd.root.joinpath(*parts)
                if check and not docs.is_dir():
                    raise InputError(
                        f"train source {source.name!r} names {source.tokens}, but {docs} holds no documents",
                        "give data.extra_inputs for tokens-extra, or point the source at a token folder",
                    )
                out.append((rd.root / name, docs))
    return out


def stage_train(cfg: Config, rd: RunDir, console: Console, resume: str) -> str:
    from oreline.train.loop import train

    train(cfg, resume=resume, allow_config_change=[])
    return _latest_checkpoint_fingerprint(rd)


def _latest_checkpoint_fingerprint(rd: RunDir) -> str:
    """The newest checkpoint's meta.json and checksums.json (sha256 of every weight file) name the model."""
    latest = rd.checkpoints / "latest"
    if not latest.is_file():
        return ""
    ckpt = rd.checkpoints / latest.read_text().strip()
    return files_fingerprint(
        [latest] + [p for p in (ckpt / "meta.json", ckpt / "checksums.json") if p.is_file()]
    )


def stage_eval(cfg: Config, rd: RunDir, console: Console) -> str:
    from oreline.eval.evaluate import evaluate_cli

    out = rd.eval / "final.json"
    # a mixture trained on per-source folders; the final evaluation stays on every document (tokens/)
    data = rd.tokens if _source_token_sets(cfg, rd, check=False) else None
    evaluate_cli(rd.root, data=data, prompts=None, out=out, batches=cfg.eval.batches, console=console)
    if not cfg.eval.tasks:
        return files_fingerprint([out])
    from oreline.eval.downstream import downstream_cli

    # the final model on the shipped downstream tasks; the report shows them next to chance
    tasks_out = rd.eval / "tasks-final.json"
    downstream_cli(
        rd.root, ",".join(cfg.eval.tasks), out=tasks_out, max_items=cfg.eval.tasks_max_items, console=console
    )
    return files_fingerprint([out, tasks_out])


def stage_export(cfg: Config, rd: RunDir, console: Console) -> str:
    from oreline.export.hf import export_hf

    export_hf(rd.root, rd.export, console=console)  # replaces an earlier export, and only that
    _tell_trackers(cfg, rd, {"export_path": str(rd.export.resolve())}, console)
    return files_fingerprint([p for p in rd.export.iterdir() if p.is_file() and not p.name.startswith(".")])


def _tell_trackers(cfg: Config, rd: RunDir, values: dict[str, Any], console: Console) -> None:
    """The experiment trackers' runs of the training (named in its last checkpoint) get `values`."""
    from oreline.config import command_line_keys
    from oreline.train.checkpoint.format import read_latest, read_meta
    from oreline.train.trackers import log_after_training

    name = read_latest(rd.checkpoints)  # (None for a missing, binary or misnamed `latest`)
    if name is None:
        return
    saved = (read_meta(rd.checkpoints / name) or {}).get("trackers") or {}
    for name, rep in log_after_training(rd.root, cfg.train, saved, values, command_line_keys(cfg)).items():
        if rep["failures"] or rep["dropped"]:
            console.print(
                f"[yellow]warning[/]: tracker {name} did not get {sorted(values)}: {rep['first_error']}"
            )


def stage_report(cfg: Config, rd: RunDir, console: Console) -> str:
    from oreline.report.html import write_report

    path = write_report(rd.root)
    console.print(f"report: {path}")
    return files_fingerprint([path])


def _outputs_present(stage: str, rd: RunDir, cfg: Config) -> bool:
    checks: dict[str, Callable[[], bool]] = {
        "data": lambda: (rd.data / "stats.json").is_file(),
        "tokenizer": lambda: (rd.tokenizer / "tokenizer.json").is_file(),
        "tokenize": lambda: (
            (rd.tokens / "manifest.json").is_file()
            and all(
                (folder / "manifest.json").is_file() for folder, _ in _source_token_sets(cfg, rd, check=False)
            )
        ),
        "train": lambda: (rd.checkpoints / "latest").is_file(),
        "eval": lambda: (rd.eval / "final.json").is_file(),
        "export": lambda: (rd.export / "config.json").is_file(),
        "report": lambda: rd.report.is_file(),
    }
    return checks[stage]()


def _move_training_aside(rd: RunDir) -> None:
    """A training run with different settings must not resume or append to the old one."""
    old = [p for p in (rd.checkpoints, rd.metrics, rd.tensorboard) if p.exists()]
    if not old:
        return
    dest = real_folder(rd.root / "previous" / time.strftime("%Y%m%d-%H%M%S"))
    for path in old:
        shutil.move(str(path), dest / path.name)


def stage_plan(cfg: Config, from_stage: str | None = None) -> list[tuple[str, str]]:
    """What `oreline run` would do now: [(stage, "skip" | "run" | "resume")], without doing it.

    Keys of later stages depend on the outputs of earlier ones (`STAGE_INPUTS`), so once one
    stage must run, every stage that consumes its output runs too; `from_stage` forces it and
    every stage after it.
    """
    if from_stage is not None and from_stage not in STAGES:
        raise OrelineError(f"unknown stage {from_stage!r}", f"use one of {', '.join(STAGES)}")
    rd = RunDir.for_config(cfg)
    lineage = rd.lineage()
    outputs: dict[str, str] = {}
    plan, forced, running = [], False, set()
    for stage in STAGES:
        forced = forced or stage == from_stage
        must_run = forced or any(dep in running for dep in STAGE_INPUTS[stage])
        rec = lineage.get(stage, {})
        key = None if must_run else _stage_key(stage, cfg, outputs)
        if (
            not must_run
            and rec.get("key") == key
            and rec.get("finished")
            and _outputs_present(stage, rd, cfg)
        ):
            plan.append((stage, "skip"))
            outputs[stage] = rec["output"]
            continue
        resume = stage == "train" and not must_run and rec.get("key") == key and not rec.get("finished")
        plan.append((stage, "resume" if resume else "run"))
        running.add(stage)
    return plan


# The stages whose outputs each stage's key holds (`_stage_key`): a stage runs again when one of
# them does, or when its own settings changed; an eval-only change leaves the export as it is.
STAGE_INPUTS = {
    "data": (),
    "tokenizer": ("data",),
    "tokenize": ("data", "tokenizer"),
    "train": ("tokenize",),
    "eval": ("train",),
    "export": ("train",),
    "report": ("eval", "export"),
}


def run_all(
    cfg: Config, from_stage: str | None = None, console: Console | None = None, only: str | None = None
) -> dict:
    """Run every stage whose key changed (or from `from_stage` on); return the summary.

    `only`: run that stage alone (if its plan says so) after checking that every stage before it
    is finished and unchanged — what each job of a Slurm stage chain does (`submit_stage_jobs`)."""
    from oreline.train.trackers import check_destinations

    console = console or Console(stderr=True)
    _check_samples(cfg)
    check_destinations(cfg)  # a tracker server only the config names: refused before the first stage
    _check_training_settings(cfg)
    rd = RunDir.for_config(cfg)
    from oreline.outdir import FolderLock

    created = not rd.root.exists()
    rd.claim("oreline run")  # a folder of the user's files is refused before anything is written
    try:
        with FolderLock(rd.root, "oreline run"):  # one writer per run folder (train re-enters it)
            plan = stage_plan(cfg, from_stage)
            if only is not None:
                plan = _only(plan, only)
            return _run_stages(cfg, rd, plan, console, summary=only is None or only == STAGES[-1])
    except BaseException:
        if created:  # a refused start leaves no empty folder holding the marker alone
            rd.remove_if_only_marker()
        raise


def _only(plan: list[tuple[str, str]], only: str) -> list[tuple[str, str]]:
    if only not in STAGES:
        raise OrelineError(f"unknown stage {only!r}", f"use one of {', '.join(STAGES)}")
    before = plan[: STAGES.index(only)]
    pending = [stage for stage, action in before if action != "skip"]
    if pending:
        raise OrelineError(
            f"stage {only} needs {', '.join(pending)} first, which did not finish (or changed since)",
            "run `oreline run` (or `oreline run --executor slurm` to submit the stage jobs again)",
        )
    return before + [plan[STAGES.index(only)]]


def _run_stages(
    cfg: Config, rd: RunDir, plan: list[tuple[str, str]], console: Console, summary: bool = True
) -> dict:
    write_resolved(cfg, rd.root, section="run")
    lineage = rd.lineage()

    outputs: dict[str, str] = {}
    timings: dict[str, float] = {}
    for stage, action in plan:
        if action == "skip":
            console.print(f"[dim]· {stage}: unchanged (key {lineage[stage]['key'][:12]}), skipped[/]")
            outputs[stage] = lineage[stage]["output"]
            continue
        key = _stage_key(stage, cfg, outputs)
        console.rule(f"[bold]{stage}" + (" (resuming)" if action == "resume" else ""))
        if stage == "train" and action == "run":
            _move_training_aside(rd)  # different settings: never resume or append to the old run
        rd.record_stage(stage, {"key": key, "finished": False, "started": time.time()})
        t0 = time.perf_counter()
        if stage == "train":
            out = stage_train(cfg, rd, console, resume="auto" if action == "resume" else "none")
        else:
            out = STAGE_FUNCS[stage](cfg, rd, console)
        timings[stage] = time.perf_counter() - t0
        outputs[stage] = out
        rd.record_stage(
            stage,
            {
                "key": key,
                "finished": True,
                "output": out,
                "seconds": timings[stage],
                "finished_at": time.time(),
            },
        )
    if not summary:  # one stage of a chain: the last stage's job prints the summary
        return {"plan": plan, "seconds": timings}
    result = summarize(rd)
    result["plan"] = plan
    result["seconds"] = timings
    print_summary(result, timings, console)
    return result


def _stage_key(stage: str, cfg: Config, outputs: dict[str, str]) -> str:
    if stage == "data":
        from oreline.data.pipeline.run import model_fingerprints

        models = model_fingerprints(cfg)  # a retrained model re-runs the stage; none: the key as before
        return stage_key(_section(cfg, "data", drop=EXECUTION_KEYS), *([models] if models else []))
    if stage == "tokenizer":
        return stage_key(_section(cfg, "tokenizer"), outputs["data"])
    if stage == "tokenize":
        return stage_key(
            _section(cfg, "tokenize", drop=EXECUTION_KEYS),
            # the validation split's minimum is counted in sequences of train.seq_len
            *([{"val_seq_len": cfg.train.seq_len}] if cfg.tokenize.val_sequences else []),
            *([_val_inputs_fingerprint(cfg)] if cfg.tokenize.val_inputs else []),  # their content
            outputs["data"],
            outputs["tokenizer"],
            *sorted({s.tokens for s in cfg.train.sources if s.tokens.startswith("{run}/")}),
        )
    if stage == "train":
        return stage_key(_section(cfg, "model", "train", "checkpoint", "run"), outputs["tokenize"])
    if stage == "eval":
        return stage_key(_section(cfg, "eval"), outputs["train"])
    if stage == "export":
        return stage_key(_section(cfg, "export"), outputs["train"])
    return stage_key(outputs["eval"], outputs["export"])


def _val_inputs_fingerprint(cfg: Config) -> str:
    from oreline.tokens.inputs import expand_inputs

    return files_fingerprint(expand_inputs([expand(p) for p in cfg.tokenize.val_inputs]))


STAGE_FUNCS = {
    "data": stage_data,
    "tokenizer": stage_tokenizer,
    "tokenize": stage_tokenize,
    "eval": stage_eval,
    "export": stage_export,
    "report": stage_report,
}


# ---------------------------------------------------------------------------------------------
# summary


def summarize(rd: RunDir) -> dict:
    import json

    summary: dict[str, Any] = {"run_dir": str(rd.root), "report": str(rd.report), "export": str(rd.export)}
    stats_path = rd.data / "stats.json"
    if stats_path.is_file():
        steps = json.loads(stats_path.read_text()).get("steps", [])
        if steps:
            summary["web_docs_in"] = steps[0].get("docs_in")
            summary["web_docs_kept"] = steps[-1].get("docs_out")
    manifest = rd.tokens / "manifest.json"
    if manifest.is_file():
        shards = json.loads(manifest.read_text()).get("shards", [])
        summary["train_tokens"] = sum(s.get("tokens", 0) for s in shards if s.get("split") == "train")
        summary["val_tokens"] = sum(s.get("tokens", 0) for s in shards if s.get("split") == "val")
    if rd.metrics.is_file():
        train_recs, eval_recs = [], []
        for line in rd.metrics.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("type") == "train":
                train_recs.append(rec)
            elif rec.get("type") == "eval":
                eval_recs.append(rec)
        if train_recs:
            tps = [r["tokens_per_s"] for r in train_recs if r.get("tokens_per_s")]
            summary["train_steps"] = train_recs[-1]["step"]
            summary["final_train_loss"] = train_recs[-1].get("loss")
            summary["tokens_per_s"] = sum(tps) / len(tps) if tps else None
        if eval_recs:
            summary["final_val_loss"] = eval_recs[-1].get("val_loss")
    final_eval = rd.eval / "final.json"
    if final_eval.is_file():
        ev = json.loads(final_eval.read_text())
        summary["final_val_loss"] = ev.get("val_loss", summary.get("final_val_loss"))
        gens = ev.get("generations") or []
        if gens:
            summary["sample"] = {"prompt": gens[0].get("prompt"), "text": gens[0].get("text")}
    return summary


def print_summary(summary: dict, timings: dict[str, float], console: Console) -> None:
    table = Table(title="oreline run", show_header=False)
    rows = [
        (
            "web documents kept",
            f"{summary.get('web_docs_kept', '?'):,} of {summary.get('web_docs_in', '?'):,}"
            if isinstance(summary.get("web_docs_kept"), int) and isinstance(summary.get("web_docs_in"), int)
            else "?",
        ),
        ("tokens (train / val)", f"{summary.get('train_tokens', 0):,} / {summary.get('val_tokens', 0):,}"),
        ("training steps", str(summary.get("train_steps", "?"))),
        (
            "final validation loss",
            f"{summary['final_val_loss']:.4f}" if summary.get("final_val_loss") is not None else "?",
        ),
        ("throughput", f"{summary['tokens_per_s']:,.0f} tokens/s" if summary.get("tokens_per_s") else "?"),
        ("report", summary["report"]),
        ("exported model", summary["export"]),
    ]
    if summary.get("sample"):
        rows.append(("sample", f"{summary['sample']['prompt']!s} → {summary['sample']['text']!s}"[:300]))
    for stage, secs in timings.items():
        rows.append((f"time: {stage}", f"{secs:,.1f} s"))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)


# ---------------------------------------------------------------------------------------------
# the stages as a chain of Slurm jobs


def submit_stage_jobs(
    cfg: Config, from_stage: str | None = None, console: Console | None = None
) -> list[dict]:
    """Submit every stage `oreline run` would run now as its own Slurm job, each `afterok` the one
    before, and return [{stage, job, script}]; the driver does not wait (nor need to stay alive).

    Each job runs `oreline run -c RUN/jobs/config.toml --config-sha256 HEX --only STAGE` (the resolved
    config, so every job sees the same settings): it checks that the stages before it finished, runs
    its own, and records it in lineage.json, as `oreline run` does. RUN/jobs/ is private and the
    digest pins the config as submitted: a job that starts after someone changed it refuses to run
    (`oreline.job_inputs`). A failed job cancels the jobs after it (--kill-on-invalid-dep);
    `oreline run --executor slurm` again submits from the first stage that did not finish. Job
    settings come from data.slurm (partition, stage_time_limit, sbatch_args)."""
    import sys

    from oreline.config import to_toml
    from oreline.executors.slurm import submit
    from oreline.job_inputs import submitted_config, write_private
    from oreline.slurm_script import job_name, job_script, write_script
    from oreline.train.trackers import check_destinations, command_line_endpoints

    console = console or Console(stderr=True)
    _check_samples(cfg)
    check_destinations(cfg)
    _check_training_settings(cfg)
    rd = RunDir.for_config(cfg)
    todo = [(stage, action) for stage, action in stage_plan(cfg, from_stage) if action != "skip"]
    if not todo:
        console.print("every stage is finished and unchanged: nothing to submit")
        return []
    rd.claim("oreline run")
    jobs_dir = rd.root.resolve() / "jobs"  # a link at jobs/ itself is refused, not followed
    config, pin = submitted_config(jobs_dir, "config.toml", to_toml(cfg))
    s = cfg.data.slurm
    cpus = s.stage_cpus or max(cfg.data.workers, cfg.tokenize.workers, 1)
    submitted: list[dict] = []
    for i, (stage, _action) in enumerate(todo):
        command = [sys.executable, "-m", "oreline", "run", "-c", str(config), *pin, "--only", stage]
        # a tracker server the user named on the command line stays the user's choice in the job
        # (the job reads the resolved config from a file, where a server alone is refused)
        command += command_line_endpoints(cfg)
        if i == 0 and from_stage is not None:
            command += ["--from", from_stage]
        # every value is checked: a plain token in an #SBATCH line, a quoted word in the command
        text = job_script(
            s,
            name=job_name("oreline", cfg.run.name, stage),
            name_key="run.name",
            log=f"{jobs_dir}/{stage}-%j.out",
            log_key="run.runs_dir and run.name (the run folder)",
            cpus=cpus,
            cancels="a failed stage cancels the stages after it",
            command=command,
            command_key="the stage command (paths of the run)",
        )
        script = jobs_dir / f"{stage}.sbatch"
        write_script(script, text)  # a record for the reader: sbatch reads the text on stdin
        options = [f"--dependency=afterok:{submitted[-1]['job']}"] if submitted else []
        job = submit(text, options)
        submitted.append({"stage": stage, "job": job, "script": str(script)})
        console.print(
            f"{stage}: Slurm job {job}"
            + (f" (after {submitted[-2]['job']} succeeds)" if len(submitted) > 1 else "")
            + f"; log {jobs_dir}/{stage}-{job}.out"
        )
    write_private(jobs_dir / "chain.json", (json.dumps(submitted, indent=2) + "\n").encode())
    console.print(
        f"{len(submitted)} stage job(s) submitted; follow them with `squeue -j {','.join(j['job'] for j in submitted)}`. "
        "If one fails, the jobs after it are cancelled: fix the cause and run `oreline run --executor slurm` "
        "again, which submits from the first stage that did not finish."
    )
    return submitted
