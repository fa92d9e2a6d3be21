"""`oreline data`: input files → clean, deduplicated Parquet shards, with a funnel of every step.

Steps, in order, each switchable by its config section:

    read → protocol → extract (HTML only) → normalize → langid → quality (one step per rule,
    then the perplexity filter when `data.quality.perplexity_model` is set) → dedup (exact +
    MinHash, global) → chunk (off by default) → Parquet shards

The run has three phases over tasks (one task per input file, in a deterministic order):

1. per task, in parallel: read → … → quality, writing the kept documents, rejects, stats and
   dedup signatures, then a completion marker (`tasks.run_phase1`);
2. global, as stages of jobs on the same executor: the dedup plan over all signature files
   (`dedup/staged/plan.py` `staged_plan`: exact, LSH buckets, verification, components; no job holds
   every document), ending in one removal list per task; with a perplexity model and no
   `perplexity_max`, the CCNet bucket cut-offs from per-task bottom-k samples of the run's own
   scored documents, merged here (`perplexity_cutoffs.perplexity_phase`, stats.json "perplexity");
3. per task, in parallel: drop the removals, chunk, write `docs/part-NNNNN-KKK.parquet` and
   `rejects/part-NNNNN-KKK.parquet`, then a marker (`tasks.run_phase3`).

With `data.executor = "slurm"` and `data.slurm.detach` (`--detach`) the driver submits the three
phases as a chain of Slurm jobs and returns (`oreline.data.pipeline.chain`).

Output folder: `docs/`, `rejects/` (every dropped document with step, reason, id, url, source
and truncated text), `stats.json` (the funnel), `config.toml` + `fingerprint.json`, `work/`
(per-task markers, stats and signatures; its intermediate documents are deleted at the end)
and `_SUCCESS`. Re-running the same command resumes: finished phases and tasks are skipped by
their markers and the output is exactly that of an uninterrupted run. A folder written with a
different data config or other inputs is refused (FingerprintMismatch).

Ownership and clean-up (`oreline.outdir`): the first file written into the output folder is
`.oreline-owner` (kind "data"); a non-empty folder without it is refused (a data run written by an
oreline version without the marker is recognised by its fingerprint.json, section "data"). With
`force=True` a non-empty folder is used as long as none of its top-level names is one this command
writes (`DATA_NAMES`). While it runs, the command holds the folder's lock `.oreline-lock`: a second
`oreline data` into the same folder is refused, naming the holder. The end-of-run clean-up deletes
only oreline's own temporary names (`.NAME.tmp-PID` of a shard, `.NAME.XXXXXXXX` of an atomic JSON
write) of the files this command writes, and the intermediate documents under `work/`; nothing
else in the folder is touched, hidden or not.

The funnel (`stats.json`): `steps` lists name, docs_in, docs_out, bytes_in, bytes_out, seconds
and dropped {reason: count} per step, with docs_out of step k equal to docs_in of step k+1;
`inputs` has per-file facts (records, record types, revisits, bytes) and the files of unknown
kind; `errors` lists each damaged span of an input (WARC damage is skipped to the next readable
record): `{file, offset (in the file), skipped_bytes, reason, error, record_id when known}`.
`line_filters` counts what the C4 line rules cut from the documents they kept (per rule: lines
and bytes; the documents' bytes before and after), which the document counts of the funnel do
not show.

A finished run that kept no document returns its stats from `run_data`; `oreline data` and
`oreline run` then fail with the top drop reasons (`check_kept_documents`) instead of exit 0.

The text key of JSONL/Parquet inputs (data.read.jsonl_text_key): each such file's facts hold
`text_field` (records, missing, empty, the fields the records without it held) and
`inputs.text_field` sums them. A run that keeps no document because none of those records had
text under the key fails with an InputError (exit 2) naming the fields that were there; one in
which most records lacked it succeeds with a line in `warnings`, printed under the funnel.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import oreline.storage as storage
from oreline.config import EXECUTION_KEYS, Config, expand, fingerprint, to_dict, write_resolved
from oreline.data.pipeline.chain import CHAIN, check_no_chain_running, submit_chain
from oreline.data.pipeline.phases import DATA_NAMES, PRELOAD, dedup_phase, finish, jobs_left
from oreline.data.pipeline.tasks import (
    dedup_enabled,
    phase1_dir,
    phase3_marker,
    remove_stale_attempts,
    run_phase1,
    run_phase3,
)
from oreline.data.read.inputs import KINDS, discover_inputs, input_kind
from oreline.errors import (
    ConfigError,
    DiskFull,
    FingerprintMismatch,
    InputError,
    disk_full_cause,
    free_space,
)
from oreline.executors import make_executor
from oreline.executors.interface import TaskCrashed
from oreline.io import write_json_atomic
from oreline.outdir import (
    FolderLock,
    claim_folder,
    is_data_run,
)


def data_fingerprint(cfg: Config, files: list[tuple[Path, str]]) -> str:
    """What decides the output: the data settings (not where or on how many workers tasks run)
    and the input files."""
    data = to_dict(cfg.data)
    for key in (*EXECUTION_KEYS, "inputs", "extra_inputs"):
        data.pop(key, None)
    listed = [[str(p), kind, storage.size(p)] for p, kind in files]
    if cfg.data.extract.enabled and cfg.data.extract.extractor in ("pruned", "pruned_headlines"):
        # retrained boilerplate selectors are another run
        from oreline.data.filters.boilerplate import selectors_sha256

        data["extract"]["selectors_sha256"] = selectors_sha256()
    data["quality"].update(model_fingerprints(cfg))
    return fingerprint({"data": data, "inputs": listed, "code": data_code_sha256()})


def data_code_sha256(data_root: Path | None = None) -> str:
    """The sha256 of the code that decides a data run's documents (the readers, the filters and
    the pipeline: every module under oreline/data, and the Document record). A data run resumed
    after an upgrade that changed a rule or the extractor would otherwise mix documents of the
    old code and the new under one fingerprint; with this, it is another run."""
    import oreline.document as document_mod

    data_root = data_root or Path(__file__).resolve().parents[1]
    document = Path(document_mod.__file__).resolve()
    sources = [(p.relative_to(data_root).as_posix(), p) for p in sorted(data_root.rglob("*.py"))]
    h = hashlib.sha256()
    for name, path in [*sources, ("../document.py", document)]:
        h.update(name.encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def model_fingerprints(cfg: Config) -> dict[str, str | None]:
    """The fingerprints of the models and user code the data settings name: a retrained reference
    LM or quality classifier in the same folder, or an edited python step, is another run (of
    `oreline data`, and of `oreline run`'s data stage). Empty without them, so such runs keep the
    fingerprint they had before."""
    out: dict[str, str | None] = {}
    if cfg.data.quality.perplexity_model:
        from oreline.data.filters.ngram_scorer import reference_fingerprint

        out["perplexity_model_fingerprint"] = reference_fingerprint(expand(cfg.data.quality.perplexity_model))
    if cfg.data.quality.classifier:  # the model file's own sha256
        from oreline.data.filters.classifier import classifier_fingerprint

        out["classifier_fingerprint"] = classifier_fingerprint(expand(cfg.data.quality.classifier))
    user = [s for s in cfg.data.step_list() if s.kind == "python"]
    if user:  # an edited user step is another run, as a retrained model is
        from oreline.data.pipeline.user_step import source_sha256

        out["python_step_sources"] = {s.step_name(): source_sha256(s.function) for s in user}
    return out


def _check_or_write_fingerprint(out: Path, cfg: Config, fp: str, files: list[tuple[Path, str]]) -> None:
    fp_path = out / "fingerprint.json"
    if fp_path.is_file():
        try:
            old = json.loads(fp_path.read_text()).get("data")
        except json.JSONDecodeError:
            old = None
        if old == fp:
            return
        raise FingerprintMismatch(
            f"{out} holds a data run with other settings or inputs (data fingerprint {str(old)[:12]}…, this run {fp[:12]}…)",
            f"use a new --out folder, or delete {out} to start over",
        )
    out.mkdir(parents=True, exist_ok=True)
    config_fp = write_resolved(cfg, out, section="data")
    write_json_atomic(
        fp_path, {"config": config_fp, "section": "data", "data": fp, "inputs": [str(p) for p, _ in files]}
    )


def run_data(
    inputs: list[str] | list[Path],
    out_dir: str | Path,
    cfg: Config,
    workers: int | None = None,
    console: Console | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Run the data pipeline over `inputs` into `out_dir`; returns the stats (also in stats.json).

    With workers > 1 the tasks run in forkserver processes, which import the caller's main
    module: a script that calls this must guard its top level with `if __name__ == "__main__":`.
    `force` writes into a non-empty folder oreline did not create (see the module docstring).
    """
    t_start = time.perf_counter()
    out = Path(out_dir)
    console = console or Console(stderr=True)
    if cfg.data.slurm.detach and cfg.data.executor != "slurm":
        raise ConfigError(
            f"data.slurm.detach (--detach) submits a chain of Slurm jobs, but data.executor is {cfg.data.executor!r}",
            "add --executor slurm (data.executor = 'slurm'), or drop --detach",
        )
    workers = max(1, int(workers or cfg.data.workers))
    announce_user_code(cfg, console)
    unreadable: list[dict[str, Any]] = []
    items = [expand(str(i)) for i in inputs]  # {samples} in config inputs
    paths = [i for i in items if not storage.is_url(i)]
    files, unknown = discover_inputs(paths, errors=unreadable) if paths else ([], [])
    url_files, url_unknown = _discover_urls([i for i in items if storage.is_url(i)])
    files, unknown = files + url_files, unknown + url_unknown
    if not files:
        raise InputError(
            f"no readable input among {len(unknown)} file(s) given ({', '.join(str(u) for u in unknown[:3])})",
            "pass files ending in " + " ".join(s for group in KINDS.values() for s in group),
        )
    try:
        claim_folder(
            out, "data", "oreline data", force=force, reserved=DATA_NAMES.fullmatch, legacy=is_data_run
        )
        with FolderLock(out, "oreline data"):
            stats = _run_data(files, unknown, unreadable, out, cfg, workers, console, t_start)
        if not stats.get("detached"):
            check_text_field(stats, cfg, out)
        return stats
    except Exception as exc:  # a full disk, wherever it struck (a worker's error arrives wrapped)
        full = disk_full_cause(exc)
        if full is None:
            raise
        raise _disk_full(out, full, sum(_size(f) for f, _ in files)) from None


def announce_user_code(cfg: Config, console: Console) -> None:
    """Say, before any task, which Python code the config's `python` steps run: a config that
    names one runs that code as the user (docs/security.md), so the user sees where it is."""
    user = [s for s in cfg.data.step_list() if s.kind == "python"]
    if not user:
        return
    from oreline.data.pipeline.user_step import describe

    for step in user:
        console.print(
            f"data.steps: {escape(step.step_name())} runs Python code: {escape(describe(step.function))}"
        )


def check_text_field(stats: dict[str, Any], cfg: Config, out: Path) -> None:
    """Fail a run that kept no document because its JSONL/Parquet records have no text under
    data.read.jsonl_text_key (a wrong key otherwise "succeeds" with 0 documents and exit 0), naming
    the fields the records held. The run's folder stays as written: its rejects hold the records."""
    from oreline.data.pipeline.phases import describe_missing_text

    tf = stats["inputs"].get("text_field")
    if stats["output"]["docs"] or not tf or not tf["missing"] or tf["with_text"]:
        return
    skip = {tf["key"], cfg.data.read.jsonl_id_key, "url", "metadata"}
    best = next((f for f in tf["fields"] if f not in skip), "FIELD")
    empty = f", and {tf['empty']:,} more have an empty one" if tf["empty"] else ""
    raise InputError(
        f"no document kept: {describe_missing_text(tf)}{empty}",
        f"name the field that holds the text: add data.read.jsonl_text_key={best} after the inputs "
        f"(or set jsonl_text_key in the config's data.read section) and write into a new --out folder, "
        f"or delete {out} first; the dropped records are kept in {out / 'rejects'}",
    )


def check_kept_documents(stats: dict[str, Any], out: Path, top: int = 3) -> None:
    """Fail a finished run that kept no document (`oreline data` and `oreline run`'s data stage):
    with exit 0 and `_SUCCESS` the next stage would fail far from the cause. The error names the
    reasons that dropped the most documents, and for plain-text inputs, which are read as one
    document per file, the ways to split them. The folder stays as written (its rejects hold every
    dropped document); the API's `run_data` returns the stats as they are."""
    if stats.get("detached") or stats["output"]["docs"]:
        return
    dropped: dict[str, int] = {}
    for step in stats["steps"]:
        for reason, n in step["dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + n
    reasons = sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{r} {n:,}" for r, n in reasons[:top]) + (
        f" and {len(reasons) - top} more" if len(reasons) > top else ""
    )
    files = stats["inputs"].get("files", {})
    read = stats["steps"][0]["docs_in"] if stats["steps"] else 0
    text = [f for f, facts in files.items() if isinstance(facts, dict) and facts.get("kind") == "txt"]
    fix = (
        f"a text file is read as one document ({', '.join(Path(f).name for f in text[:3])}): give clean "
        "text to `oreline run` as data.extra_inputs (split into ~4 KB documents at paragraph breaks, "
        "not filtered), or split it into one document per line of a JSONL file; "
        if text
        else ""
    )
    raise InputError(
        f"no document kept: the {read:,} document(s) read from {len(files):,} input file(s) were all "
        f"dropped ({shown or 'none was read'})",
        fix + f"see why in {out / 'rejects'} and {out / 'stats.json'}; loosen the step that dropped "
        "them (e.g. data.langid.languages, data.langid.threshold, data.quality.*) or add inputs, "
        f"and write into a new --out folder or delete {out} first",
    )


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # (an object-store URL)
        return 0


def _disk_full(out: Path, exc: OSError, input_bytes: int) -> DiskFull:
    """A full disk as one error (a worker's arrives wrapped in the pool's exceptions): the folder,
    the room there and the fix; the run resumes from its finished tasks when started again."""
    free = free_space(out)
    size = f"; the inputs total {input_bytes / 2**20:.1f} MB" if input_bytes else ""
    return DiskFull(
        f"no space left on the device of {out} while writing {exc.filename or 'the output'} ({free}{size})",
        "free space there or pass another --out, then run the same `oreline data` command again: it "
        "continues from the tasks that finished",
    )


def _discover_urls(urls: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Inputs on an object store (fsspec URLs): each URL, the files under it, or a glob's matches."""
    files: list[tuple[str, str]] = []
    unknown: list[str] = []
    seen: set[str] = set()
    for url in urls:
        found = storage.find(url)
        if not found:
            raise InputError(
                f"input {url!r} names no object",
                "check the URL (and the credentials of its store, e.g. AWS_* for s3://)",
            )
        for f in found:
            if f in seen:
                continue
            seen.add(f)
            kind = input_kind(f)
            if kind is None:
                unknown.append(f)
            else:
                files.append((f, kind))
    return files, unknown


def _run_data(
    files, unknown, unreadable, out: Path, cfg: Config, workers: int, console: Console, t_start: float
) -> dict[str, Any]:
    work = out / "work"
    fp = data_fingerprint(cfg, files)
    _check_or_write_fingerprint(out, cfg, fp, files)
    if (out / "_SUCCESS").is_file() and (out / "stats.json").is_file():
        return json.loads((out / "stats.json").read_text())
    tasks = [(i, p, kind) for i, (p, kind) in enumerate(files)]
    # a detached chain writes this folder from its jobs, after its driver has let go of the lock:
    # no run of any executor may write beside it
    if cfg.data.executor == "slurm" or (work / "slurm" / CHAIN).is_file():
        check_no_chain_running(out)
    if cfg.data.executor == "slurm" and cfg.data.slurm.detach:
        return submit_chain(tasks, unknown, unreadable, out, cfg, workers, console, fp)
    executor = make_executor(
        cfg.data.executor,
        workers=workers,
        preload=PRELOAD,
        console=console,
        ray=cfg.data.ray,
        slurm=cfg.data.slurm,
        work=work,
    )

    # phase 1: read → filters → signatures, one task per file
    left = jobs_left(tasks, lambda i: (phase1_dir(work, i) / "DONE").is_file())
    jobs = [(i, str(tasks[i][1]), tasks[i][2], str(work), cfg) for i in left]
    crashes = [r for r in executor.map(run_phase1, jobs, label="filter") if isinstance(r, TaskCrashed)]
    finished = [t for t in tasks if (phase1_dir(work, t[0]) / "DONE").is_file()]
    # folders of killed or beaten attempts of the finished tasks (their markers name another one)
    remove_stale_attempts(work, [i for i, _, _ in finished])

    # phase 2: the global dedup plan, split per task
    dedup_stats = dedup_phase(work, finished, cfg, executor) if dedup_enabled(cfg) else {}
    ppl_stats = None  # and the perplexity cut-offs from a sample of this run's own documents
    if cfg.data.quality.perplexity_model:
        from oreline.data.pipeline.perplexity_cutoffs import perplexity_phase

        ppl_stats = perplexity_phase(work, [phase1_dir(work, i) for i, _, _ in finished], cfg, executor)
    classifier_stats = None  # and the classifier's top-fraction cut-off, likewise
    if cfg.data.quality.classifier:
        from oreline.data.pipeline.classifier_cutoff import classifier_phase

        classifier_stats = classifier_phase(
            work, [phase1_dir(work, i) for i, _, _ in finished], cfg, executor
        )

    # phase 3: drop removals, chunk, write the shards
    left = jobs_left(finished, lambda i: phase3_marker(work, i).is_file())
    jobs = [(i, str(work), str(out), cfg) for i in left]
    crashes += [r for r in executor.map(run_phase3, jobs, label="write") if isinstance(r, TaskCrashed)]

    return finish(
        out,
        tasks,
        finished,
        unknown,
        unreadable,
        crashes,
        dedup_stats,
        ppl_stats,
        workers,
        fp,
        t_start,
        classifier_stats=classifier_stats,
    )


# ---------------------------------------------------------------------------------------------
# printing


def _pct(a: int, b: int) -> str:
    if not a:
        return "—"
    change = (b - a) / a * 100
    return f"{'−' if change < 0 else '+'}{abs(change):.1f}%"


def funnel_lines(stats: dict[str, Any], top: int = 4) -> list[str]:
    """One line per step: 'langid: −41.2% (lang:other 9,110 · lang:score<0.65 31,012)'."""
    lines = []
    for st in stats["steps"]:
        reasons = sorted(st["dropped"].items(), key=lambda kv: -kv[1])
        shown = " · ".join(f"{r} {n:,}" for r, n in reasons[:top])
        if len(reasons) > top:
            shown += f" · {len(reasons) - top} more"
        lines.append(
            f"{st['name']}: {_pct(st['docs_in'], st['docs_out'])}" + (f" ({shown})" if shown else "")
        )
    return lines


def _bytes(n: int) -> str:
    if n < 10_000:
        return f"{n:,} bytes"
    return f"{n / 1e3:,.1f} KB" if n < 1_000_000 else f"{n / 1e6:,.2f} MB"


def line_filter_lines(stats: dict[str, Any]) -> list[str]:
    """What the line rules removed from the documents they kept, which the funnel's document counts
    do not show: 'quality:c4 removed 1,234 lines (0.52 MB of 0.60 MB) from 80 of 95 kept documents:
    no_end_mark 1,000 lines (0.40 MB) · few_words 234 lines (98.1 KB) · newlines, blank lines, edge
    spaces and citations 21.3 KB'."""
    lines = []
    for step, c in stats.get("line_filters", {}).items():
        removed = c["bytes_before"] - c["bytes_after"]
        n_lines = sum(r["lines"] for r in c["rules"].values())
        rules = sorted(c["rules"].items(), key=lambda kv: -kv[1]["bytes"])
        parts = [f"{r} {v['lines']:,} lines ({_bytes(v['bytes'])})" for r, v in rules]
        rest = removed - sum(v["bytes"] for v in c["rules"].values())
        if rest:
            parts.append(f"newlines, blank lines, edge spaces and citations {_bytes(rest)}")
        lines.append(
            f"{step} removed {n_lines:,} lines ({_bytes(removed)} of {_bytes(c['bytes_before'])}) "
            f"from {c['docs_changed']:,} of {c['docs']:,} kept documents"
            + (": " + " · ".join(parts) if parts else "")
        )
    return lines


def print_funnel(stats: dict[str, Any], console: Console) -> None:
    """The funnel as a table: documents and bytes per step, change in percent and top drop reasons."""
    table = Table(title="oreline data: funnel", show_lines=False)
    for col, just in (
        ("step", "left"),
        ("docs in", "right"),
        ("docs out", "right"),
        ("change", "right"),
        ("MB out", "right"),
        ("s", "right"),
    ):
        table.add_column(col, justify=just, no_wrap=True)
    table.add_column("dropped (top reasons)", justify="left", overflow="fold", min_width=30)
    for st in stats["steps"]:
        reasons = sorted(st["dropped"].items(), key=lambda kv: -kv[1])
        shown = " · ".join(f"{r} {n:,}" for r, n in reasons[:4]) + (
            f" · +{len(reasons) - 4} more" if len(reasons) > 4 else ""
        )
        table.add_row(
            st["name"],
            f"{st['docs_in']:,}",
            f"{st['docs_out']:,}",
            _pct(st["docs_in"], st["docs_out"]),
            f"{st['bytes_out'] / 1e6:,.2f}",
            f"{st['seconds']:.2f}",
            shown,
        )
    # a pipe or log file gets a readable width instead of rich's 80-column default
    console.print(table, width=None if console.is_terminal else 160, crop=console.is_terminal)
    inp, out = stats["inputs"], stats["output"]
    secs = stats.get("seconds") or 0.0
    console.print(
        f"{inp['tasks']} input files ({inp['bytes'] / 1e6:,.1f} MB, {inp['records']:,} records, {inp['revisits']:,} revisits)"
        f" → {out['docs']:,} documents ({out['bytes'] / 1e6:,.2f} MB) in {len(out['shards'])} shard(s)"
        + (
            f" in {secs:.1f} s ({inp['records'] / secs:,.0f} records/s, {inp['bytes'] / secs / 1e6:,.2f} MB/s,"
            f" {stats.get('workers', 1)} worker(s))"
            if secs
            else ""
        )
    )
    if inp["unknown"]:
        names = ", ".join(Path(u["file"]).name for u in inp["unknown"][:5])
        console.print(
            f"[yellow]{len(inp['unknown'])} file(s) of unknown kind not read:[/] {names}"
            + (" …" if len(inp["unknown"]) > 5 else "")
        )
    if stats["errors"]:
        console.print(
            f"[yellow]{len(stats['errors'])} input error(s)[/] (damaged input skipped; see stats.json errors):"
        )
        for e in stats["errors"][:5]:
            console.print(f"  {Path(str(e['file'])).name} @ {e['offset']}: {str(e['error'])[:120]}")
    for line in line_filter_lines(stats):
        console.print(line)
    for warning in stats.get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {escape(warning)}")
    if stats.get("perplexity"):
        from oreline.data.pipeline.perplexity_cutoffs import cutoff_line

        console.print(cutoff_line(stats["perplexity"]))
    if stats.get("classifier"):
        from oreline.data.pipeline.classifier_cutoff import cutoff_line as classifier_line

        console.print(classifier_line(stats["classifier"]))
    if stats["normalize_removed"]:
        removed = " · ".join(
            f"{k} {v:,}" for k, v in sorted(stats["normalize_removed"].items(), key=lambda kv: -kv[1])
        )
        console.print(f"normalize changed: {removed}")
    if stats.get("extract_paths"):
        paths = " · ".join(
            f"{k} {v['docs']:,} ({v['seconds']:.2f} s)"
            for k, v in sorted(stats["extract_paths"].items(), key=lambda kv: -kv[1]["docs"])
        )
        console.print(f"extraction paths: {paths}")
