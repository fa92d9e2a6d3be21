"""One self-contained HTML report of a run: `write_report(run_dir) -> <run>/report.html`.

The report reads the run directory's artifacts (the same loader as `oreline doctor run`) and
writes one file that works offline: inline CSS, no scripts, charts embedded as base64 PNG
(matplotlib, Agg; see report/plots.py). Each section has a stable id so tools and tests can
find it (`<section id="funnel">`):

  overview · doctor · funnel · languages · lengths · tokenizer · tokens · loss · mixture · lr · grad-norm ·
  throughput · memory · checkpoints · events · generations · downstream · eval · export · fingerprints

A section whose artifact is absent or unreadable still appears and says "not available: <why>";
one bad artifact never stops the report. Every value that comes from an artifact is escaped
with html.escape where it enters the page (`esc`, which `table` and `kv_table` apply to every
cell), numbers included: a field the schema says is a number may hold a string in a colleague's
folder, and documents, generations and error messages are untrusted text. Every number
shown is read from an artifact or computed from one; nothing is estimated.

Document lengths and languages come from the data layer's Parquet shards, reading only the
`text` and `language` columns, row group by row group, up to MAX_DOCS_SCANNED documents (the
caption says when the figures are from a prefix of the corpus). Checkpoint validity here (and in
the report's doctor section) is the size-only check: every file checksums.json lists is present
with its size, which takes milliseconds at any model size; `oreline doctor run` hashes them.
"""

from __future__ import annotations

import html
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oreline.doctor.artifacts import (
    NotAvailable,
    RunArtifacts,
    is_finite,
    load_run,
    quick_verify_checkpoint,
    read_json,
    series,
)
from oreline.doctor.run import CHECKS, run_checks
from oreline.io import write_bytes_atomic
from oreline.report import plots

MAX_DOCS_SCANNED = 200_000
MAX_TABLE_ROWS = 60
MAX_GENERATIONS = 24

CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fff}
header{background:#1f3b57;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.85}nav{padding:8px 32px;background:#eef2f6;border-bottom:1px solid #d5dde5}
nav a{margin-right:12px;color:#1f3b57;text-decoration:none;font-size:13px}main{padding:0 32px 40px;max-width:1200px}
section{border-bottom:1px solid #e5e5e5;padding:14px 0}h2{font-size:18px;margin:6px 0 10px;color:#1f3b57}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}td,th{border:1px solid #d9d9d9;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f5f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;display:block;margin:6px 0}code{font:12px ui-monospace,Menlo,Consolas,monospace;word-break:break-all}
.na{color:#8a6d3b;background:#fcf8e3;padding:6px 10px;border-radius:4px;display:inline-block}
.fail{color:#b00020;font-weight:600}.warn{color:#9a6700;font-weight:600}.ok{color:#1a7f37}
.gen{background:#f7f7f9;border-left:3px solid #9ab;padding:6px 10px;margin:6px 0;white-space:pre-wrap}
.small{color:#666;font-size:12px}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A number as people read it: thousands separators for ints, 4 significant digits for floats."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric if numeric is not None else set()
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows[:MAX_TABLE_ROWS]:
        cells = "".join(
            f'<td class="n">{esc(fmt(v))}</td>' if i in numeric else f"<td>{esc(fmt(v))}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    more = (
        f'<p class="small">{len(rows) - MAX_TABLE_ROWS:,} more rows not shown</p>'
        if len(rows) > MAX_TABLE_ROWS
        else ""
    )
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def kv_table(pairs: list[tuple[str, Any]]) -> str:
    return (
        "<table>"
        + "".join(f"<tr><th>{esc(k)}</th><td>{esc(fmt(v))}</td></tr>" for k, v in pairs)
        + "</table>"
    )


def img(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{esc(alt)}">'


def flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts → dotted (key, scalar) pairs; lists of scalars joined."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += flatten(v, f"{prefix}{k}.")
    elif isinstance(obj, list) and not all(isinstance(x, dict | list) for x in obj):
        out.append((prefix[:-1], ", ".join(str(x) for x in obj)))
    elif isinstance(obj, list):
        out.append((prefix[:-1], f"[{len(obj)} items]"))
    else:
        out.append((prefix[:-1], obj))
    return out


def _xy(records: list[dict], key: str) -> plots.Series:
    pts = series(records, key)
    return [s for s, _ in pts], [v for _, v in pts]


# ---------------------------------------------------------------------------------------------
# sections


def section_overview(run: RunArtifacts) -> str:
    start, end = run.start, (run.records("end") or [{}])[-1]
    train = run.records("train")
    gb, model = run.start_dict("global_batch"), run.start_dict("model")
    pairs = [
        ("run directory", str(run.root)),
        ("config fingerprint", (run.fingerprint or {}).get("config") or start.get("config_fingerprint")),
        ("device", start.get("device")),
        ("model parameters", model.get("params")),
        ("non-embedding parameters", model.get("non_embedding_params")),
        ("FLOPs per token", model.get("flops_per_token")),
        ("global batch (tokens)", gb.get("tokens")),
        ("steps done", end.get("step", train[-1].get("step") if train else None)),
        ("tokens seen", end.get("tokens_seen", train[-1].get("tokens_seen") if train else None)),
        ("training seconds", end.get("seconds")),
        ("final validation loss", end.get("final_val_loss")),
        (
            "finished",
            "yes (end record)"
            if run.records("end")
            else "no end record (running, interrupted or not trained)",
        ),
    ]
    if run.config_problem:
        pairs.append(("config", run.config_problem))
    return kv_table([(k, v) for k, v in pairs if v is not None])


# the report section holding the evidence behind each doctor finding
FINDING_SECTIONS = {
    "nan_loss": "loss",
    "lr_constant": "lr",
    "loss_not_falling": "loss",
    "eos_missing": "tokens",
    "fingerprint_mismatch": "fingerprints",
    "seq_len_exceeds_max": "overview",
    "data_wait_high": "throughput",
    "throughput_falling": "throughput",
    "global_batch_mismatch": "overview",
    "grad_spikes": "grad-norm",
    "skipped_steps_high": "events",
    "checkpoint_unloadable": "checkpoints",
    "val_far_above_train": "loss",
    "metrics_unreadable": "events",
    "data_errors": "funnel",
    "export_format": "export",
}


def _finding_link(check: str) -> str:
    target = FINDING_SECTIONS.get(check)
    return f'<a href="#{target}">{esc(check)}</a>' if target else esc(check)


def section_doctor(run: RunArtifacts) -> str:
    run.hash_checkpoints = False  # sizes only: hashing a large model's checkpoints takes minutes
    findings = run_checks(run)
    problems = [f for f in findings if f.status in ("warn", "fail")]
    skipped = [f for f in findings if f.status == "skip"]
    out = ""
    if problems:
        rows = "".join(
            f'<tr><td>{_finding_link(f.check)}</td><td class="{f.status}">{esc(f.status)}</td>'
            f"<td>{esc(f.evidence)}</td><td>{esc(f.fix)}</td></tr>"
            for f in problems
        )
        out += f"<table><tr><th>check</th><th>status</th><th>evidence</th><th>fix</th></tr>{rows}</table>"
    else:
        out += f'<p class="ok">no known failure signature found ({len(CHECKS) - len(skipped)} of {len(CHECKS)} checks ran)</p>'
    if skipped:
        out += (
            '<p class="small">not checked: '
            + "; ".join(f"{esc(f.check)} ({esc(f.evidence.removeprefix('not checked: '))})" for f in skipped)
            + "</p>"
        )
    return out


def section_funnel(run: RunArtifacts) -> str:
    if run.data_stats is None:
        raise NotAvailable(read_json(run.root / "data" / "stats.json")[1] or "data/stats.json absent")
    steps = [s for s in run.data_stats.get("steps") or [] if isinstance(s, dict)]
    if not steps:
        raise NotAvailable("data/stats.json has no steps")
    rows = []
    for s in steps:
        a, b = s.get("docs_in"), s.get("docs_out")
        share = (a - b) / a if is_finite(a) and is_finite(b) and a else None
        dropped = sorted((s.get("dropped") or {}).items(), key=lambda kv: -kv[1])
        reasons = ", ".join(f"{r} {c:,}" for r, c in dropped[:4]) + (" …" if len(dropped) > 4 else "")
        secs = s.get("seconds")
        rate = a / secs if is_finite(a) and is_finite(secs) and secs else None
        rows.append(
            [
                s.get("name"),
                a,
                b,
                f"{100 * share:.1f}%" if share is not None else None,
                s.get("bytes_in"),
                s.get("bytes_out"),
                secs,
                rate,
                reasons,
            ]
        )
    out = img(plots.funnel_chart(steps), "data funnel")
    out += table(
        [
            "step",
            "docs in",
            "docs out",
            "dropped",
            "bytes in",
            "bytes out",
            "seconds",
            "docs/s",
            "top reasons",
        ],
        rows,
        numeric={1, 2, 3, 4, 5, 6, 7},
    )
    inputs = run.data_stats.get("inputs") or {}
    files = inputs.get("files")
    n_files = len(files) if isinstance(files, dict | list) else files
    facts = [
        f"{fmt(n_files)} input files" if n_files is not None else None,
        f"{fmt(inputs['records'])} records" if is_finite(inputs.get("records")) else None,
        f"{fmt(inputs['bytes'])} bytes" if is_finite(inputs.get("bytes")) else None,
        f"{len(inputs['unknown'])} files of unknown kind skipped" if inputs.get("unknown") else None,
    ]
    if any(facts):
        out += "<p>inputs: " + esc(", ".join(f for f in facts if f)) + ".</p>"
    first, last = steps[0].get("docs_in"), steps[-1].get("docs_out")
    if is_finite(first) and is_finite(last) and first:
        out += f"<p>{fmt(last)} of {fmt(first)} documents kept ({100 * last / first:.2f}%).</p>"
    errors = run.data_stats.get("errors") or []
    if errors:
        out += f"<p class='warn'>{len(errors):,} input errors:</p>" + table(
            ["file", "offset", "error"],
            [
                [e.get("file"), e.get("offset"), e.get("error")] if isinstance(e, dict) else [None, None, e]
                for e in errors
            ],
        )
    return out


def _doc_shards(run: RunArtifacts) -> list[Path]:
    """The kept documents: data/docs/ (the pipeline's output), never rejects/ or work/ (intermediate)."""
    data = run.root / "data"
    root = data / "docs" if (data / "docs").is_dir() else data
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.rglob("*.parquet")
        if not {"rejects", "work"} & set(p.relative_to(data).parts) and not p.name.startswith((".", "_"))
    )


def scan_documents(run: RunArtifacts) -> dict:
    """Character lengths (numpy array) and language counts from the Parquet shards: only the two
    columns are read, row group by row group, and counted inside Arrow (no Python string objects)."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    shards = _doc_shards(run)
    if not shards:
        raise NotAvailable("no Parquet shards under data/")
    chunks: list = []
    languages: Counter = Counter()
    scanned = total = 0
    for path in shards:
        pf = pq.ParquetFile(path)
        total += pf.metadata.num_rows
        names = set(pf.schema_arrow.names)
        cols = [c for c in ("text", "language") if c in names]
        for rg in range(pf.num_row_groups):
            if scanned >= MAX_DOCS_SCANNED or not cols:
                break
            batch = pf.read_row_group(rg, columns=cols)
            scanned += batch.num_rows
            if "text" in cols:
                chunks.append(pc.utf8_length(batch.column("text")).fill_null(0).to_numpy())
            if "language" in cols:
                counts = pc.value_counts(batch.column("language").fill_null("?"))
                languages.update(
                    dict(
                        zip(
                            counts.field("values").to_pylist(),
                            counts.field("counts").to_pylist(),
                            strict=True,
                        )
                    )
                )
    lengths = np.concatenate(chunks).astype(np.int64) if chunks else np.zeros(0, dtype=np.int64)
    return {
        "lengths": lengths,
        "languages": languages,
        "total": total,
        "scanned": scanned,
        "shards": len(shards),
    }


def _scan_note(scan: dict) -> str:
    scanned = scan["scanned"]
    note = f"{fmt(scanned)} documents from {scan['shards']} shard(s)"
    if scanned < scan["total"]:
        note += f" (the first {fmt(scanned)} of {fmt(scan['total'])})"
    return f'<p class="small">{note}</p>'


def section_languages(run: RunArtifacts, scan: dict) -> str:
    langs = scan["languages"]
    if not langs:
        raise NotAvailable("the Parquet shards have no language column")
    top = langs.most_common(15)
    rest = sum(langs.values()) - sum(c for _, c in top)
    labels, values = [lang for lang, _ in top], [c for _, c in top]
    if rest:
        labels.append(f"other ({len(langs) - len(top)} languages)")
        values.append(rest)
    return img(
        plots.bar_chart(labels, values, "documents per language", "documents"), "languages"
    ) + _scan_note(scan)


def section_lengths(run: RunArtifacts, scan: dict) -> str:
    import numpy as np

    lengths = scan["lengths"]
    if not len(lengths):
        raise NotAvailable("the Parquet shards have no text column")
    p10, median, p90 = (float(v) for v in np.percentile(lengths, [10, 50, 90]))
    stats = kv_table(
        [
            ("documents", len(lengths)),
            ("characters", int(lengths.sum())),
            ("mean", float(lengths.mean())),
            ("median", median),
            ("p10", p10),
            ("p90", p90),
            ("max", int(lengths.max())),
            ("empty (0 characters)", int((lengths == 0).sum())),
        ]
    )
    chart = plots.histogram(lengths, "document length", "characters (log scale)")
    return img(chart, "document length histogram") + stats + _scan_note(scan)


def section_tokenizer(run: RunArtifacts) -> str:
    stats = run.tokenizer_stats
    if stats is None:
        raise NotAvailable(
            read_json(run.tokenizer_dir / "tokenizer_stats.json")[1] or "tokenizer_stats.json absent"
        )
    held = stats.get("heldout") or {}
    pairs = [
        ("fingerprint", stats.get("fingerprint")),
        ("pre-tokenizer", stats.get("pre_tokenizer")),
        (
            "vocabulary (target / trained / padded)",
            f"{fmt(stats.get('target_vocab_size'))} / {fmt(stats.get('trained_vocab_size'))} / {fmt(stats.get('padded_vocab_size'))}",
        ),
        (
            "trained on",
            f"{fmt(stats.get('train_docs'))} docs, {fmt(stats.get('train_bytes'))} bytes, "
            f"{fmt(stats.get('train_seconds'))} s",
        ),
        ("held-out documents", held.get("docs")),
        ("tokens per word", held.get("tokens_per_word")),
        ("tokens per byte", held.get("tokens_per_byte")),
        ("bytes per token", held.get("bytes_per_token")),
        ("unknown-token rate", held.get("unk_rate")),
        ("round-trip exact", held.get("roundtrip_rate")),
        ("special tokens", ", ".join(f"{k}={v}" for k, v in (stats.get("special_tokens") or {}).items())),
    ]
    out = kv_table([(k, v) for k, v in pairs if v not in (None, "")])
    merges = stats.get("top_merges") or []
    if merges:
        out += "<p>first merges: " + ", ".join(f"<code>{esc(m)}</code>" for m in merges[:20]) + "</p>"
    failures = held.get("roundtrip_failures") or []
    if failures:
        out += "<p class='warn'>round-trip failures:</p>" + table(
            ["at char", "expected", "decoded"],
            [[f.get("at_char"), f.get("expected"), f.get("decoded")] for f in failures],
        )
    out += (
        "<details><summary>every value in tokenizer_stats.json</summary>"
        + kv_table(flatten(stats))
        + "</details>"
    )
    return out


def section_tokens(run: RunArtifacts) -> str:
    m = run.manifest
    if m is None:
        raise NotAvailable(read_json(run.tokens_dir / "manifest.json")[1] or "tokens/manifest.json absent")
    splits = m.get("splits") or {}
    out = table(
        ["split", "shards", "documents", "tokens"],
        [[k, v.get("shards"), v.get("documents"), v.get("tokens")] for k, v in splits.items()],
        numeric={1, 2, 3},
    )
    out += table(
        ["shard", "split", "documents", "tokens", "bytes", "sha256"],
        [
            [
                s.get("name"),
                s.get("split"),
                s.get("documents"),
                s.get("tokens"),
                s.get("bytes"),
                s.get("sha256"),
            ]
            for s in m.get("shards") or []
        ],
        numeric={2, 3, 4},
    )
    rate = m.get("tokens_per_second")
    if is_finite(rate):
        out += (
            f"<p>tokenized at {esc(fmt(rate))} tokens/s with {esc(fmt(m.get('workers')))} worker(s) in "
            f"{esc(fmt(m.get('seconds')))} s.</p>"
        )  # (workers and seconds are the manifest's word, numbers or not: escaped like every value)
    return out


def _needs_train(run: RunArtifacts) -> list[dict]:
    train = run.records("train")
    if not train:
        raise NotAvailable("no train records in metrics.jsonl")
    return train


def section_loss(run: RunArtifacts) -> str:
    train, evals = _needs_train(run), run.records("eval")
    out = img(
        plots.line_chart(
            {"train loss": _xy(train, "loss")},
            "loss",
            "nats/token",
            points={"validation loss": _xy(evals, "val_loss")},
        ),
        "loss curves",
    )
    parts = {f"train {k}": _xy(train, f"loss_{k}") for k in ("token", "eos", "bos")}
    parts = {k: v for k, v in parts.items() if v[0]}
    val_parts = {f"val {k}": _xy(evals, f"val_loss_{k}") for k in ("token", "eos", "bos")}
    val_parts = {k: v for k, v in val_parts.items() if v[0]}
    if parts or val_parts:
        out += img(
            plots.line_chart(
                parts,
                "loss by position: ordinary token / EOS / first token after BOS",
                "nats/token",
                points=val_parts,
            ),
            "loss breakdown",
        )
    else:
        out += '<p class="na">not available: no loss_token / loss_eos / loss_bos in the records</p>'
    if evals:
        out += table(
            ["step", "val loss", "val ppl", "val bits/byte", "train loss"],
            [
                [e.get("step"), e.get("val_loss"), e.get("val_ppl"), e.get("val_bpb"), e.get("train_loss")]
                for e in evals
            ],
            numeric={0, 1, 2, 3, 4},
        )
    return out


def section_mixture(run: RunArtifacts) -> str:
    """Tokens by source (stacked), validation loss per source, and each source's totals and phases."""
    train = [
        r for r in _needs_train(run) if isinstance(r.get("source_tokens"), dict) and is_finite(r.get("step"))
    ]
    if not train:
        raise NotAvailable("no source_tokens in the train records (a run of an oreline before mixtures)")
    names = list(dict.fromkeys(n for r in train for n in r["source_tokens"]))
    steps = [r["step"] for r in train]
    layers = {
        n: [
            float(r["source_tokens"].get(n, 0)) if is_finite(r["source_tokens"].get(n, 0)) else 0.0
            for r in train
        ]
        for n in names
    }
    out = img(
        plots.stacked_chart(steps, layers, "training tokens by source", "tokens (cumulative)"),
        "tokens by source",
    )
    evals = [r for r in run.records("eval") if is_finite(r.get("step"))]
    per_source = {
        n: (
            [e["step"] for e in evals if is_finite((e.get("val_loss_sources") or {}).get(n))],
            [e["val_loss_sources"][n] for e in evals if is_finite((e.get("val_loss_sources") or {}).get(n))],
        )
        for n in names
    }
    per_source = {f"val {n}": v for n, v in per_source.items() if v[0]}
    if not per_source and len(names) == 1:  # one source: its validation loss is the run's
        per_source = {f"val {names[0]}": _xy(evals, "val_loss")}
    if per_source and any(xs for xs, _ in per_source.values()):
        total = {"weighted total": _xy(evals, "val_loss")} if len(names) > 1 else None
        out += img(
            plots.line_chart(per_source, "validation loss per source", "nats/token", dashed=total),
            "validation loss per source",
        )
    else:
        out += '<p class="na">not available: no validation loss per source in the eval records</p>'
    unvalidated = run.start_dict("mixture").get("unvalidated")
    if isinstance(unvalidated, dict) and unvalidated:
        out += "".join(
            f'<p class="warn">source {esc(n)} has {esc(why)}: no validation loss of its own, the '
            "run's validation loss leaves it out (raise tokenize.val_sequences or val_fraction)</p>"
            for n, why in unvalidated.items()
        )
    last = train[-1]
    sequences, epochs, weights = (
        last.get(k) or {} for k in ("source_sequences", "source_epochs", "source_weights")
    )
    out += table(
        ["source", "tokens", "sequences", "epochs", "weight now"],
        [[n, last["source_tokens"].get(n), sequences.get(n), epochs.get(n), weights.get(n)] for n in names],
        numeric={1, 2, 3, 4},
    )
    phases = run.start_dict("mixture").get("phases")
    phases = phases if isinstance(phases, list) else []
    changed = [e for e in run.records("event") if e.get("kind") == "phase"]
    rows = [
        [
            p.get("start"),
            p.get("why"),
            ", ".join(f"{w[0]}: {w[1]}" for w in p.get("weights") or [] if len(w) == 2),
        ]
        for p in phases
        if isinstance(p, dict)
    ]
    if rows:
        out += table(["from sequence", "why", "weights"], rows, numeric={0})
    if changed:
        out += "".join(f"<p>step {esc(e.get('step'))}: {esc(e.get('message'))}</p>" for e in changed)
    return out


def section_lr(run: RunArtifacts) -> str:
    train = _needs_train(run)
    plan = [
        p
        for p in run.start_list("schedule")
        if isinstance(p, list | tuple) and len(p) == 2 and is_finite(p[0]) and is_finite(p[1])
    ]
    dashed = {"planned schedule": ([p[0] for p in plan], [p[1] for p in plan])} if plan else None
    return img(
        plots.line_chart({"logged lr": _xy(train, "lr")}, "learning rate", "lr", dashed=dashed),
        "learning rate",
    )


def _event_lines(run: RunArtifacts) -> list[tuple[float, str]]:
    return [(e["step"], str(e.get("kind", ""))) for e in run.records("event") if is_finite(e.get("step"))][
        :40
    ]


def section_grad_norm(run: RunArtifacts) -> str:
    train = _needs_train(run)
    out = img(
        plots.line_chart(
            {"grad norm (before clipping)": _xy(train, "grad_norm")},
            "gradient norm",
            "L2 norm",
            log_y=True,
            vlines=_event_lines(run),
        ),
        "grad norm",
    )
    clipped = [r for r in train if isinstance(r.get("clipped"), bool)]
    if clipped:
        n = sum(r["clipped"] for r in clipped)
        out += f"<p>clipped at {n:,} of {len(clipped):,} logged steps ({100 * n / len(clipped):.1f}%).</p>"
    return out


def section_throughput(run: RunArtifacts) -> str:
    train = _needs_train(run)
    mfu = _xy(train, "mfu")
    right = {"MFU (%)": (mfu[0], [100 * v for v in mfu[1]])} if mfu[0] else None
    out = img(
        plots.line_chart(
            {"tokens/s": _xy(train, "tokens_per_s")},
            "throughput",
            "tokens/s",
            right=right,
            right_label="MFU %",
        ),
        "throughput",
    )
    pairs = []
    for key, label, scale in (
        ("tokens_per_s", "median tokens/s", 1),
        ("mfu", "median MFU (%)", 100),
        ("step_ms", "median step ms", 1),
        ("data_wait_frac", "median data wait (%)", 100),
        ("comm_ms", "median communication ms", 1),
    ):
        vals = [v for _, v in series(train, key)]
        if vals:
            pairs.append((label, scale * statistics.median(vals)))
    peak = run.start.get("peak_flops")
    if is_finite(peak):
        pairs.append(
            (
                "peak FLOP/s used for MFU",
                f"{peak:.3e} ({run.start.get('peak_source', 'source not recorded')})",
            )
        )
    return out + kv_table(pairs)


def section_memory(run: RunArtifacts) -> str:
    train = _needs_train(run)
    lines = {
        label: _xy(train, key)
        for key, label in (
            ("rss_mb", "process RSS"),
            ("cuda_alloc_mb", "CUDA allocated"),
            ("cuda_reserved_mb", "CUDA reserved"),
            ("cuda_peak_mb", "CUDA peak"),
        )
    }
    lines = {k: v for k, v in lines.items() if v[0]}
    if not lines:
        raise NotAvailable("no rss_mb / cuda_*_mb values in the train records")
    peaks = [(f"max {k}", f"{max(v[1]):,.0f} MB") for k, v in lines.items()]
    return img(plots.line_chart(lines, "memory", "MB"), "memory") + kv_table(peaks)


def section_checkpoints(run: RunArtifacts) -> str:
    dirs = run.checkpoint_dirs()
    saves = {int(r["step"]): r for r in run.records("checkpoint") if is_finite(r.get("step"))}
    if not dirs and not saves:
        raise NotAvailable("no checkpoints/ folder and no checkpoint records")
    latest = run.root / "checkpoints" / "latest"
    latest_name = latest.read_text(errors="replace").strip() if latest.is_file() else None
    rows, present = [], set()
    for ckpt in dirs:
        meta = read_json(ckpt / "meta.json")[0] or {}
        present.add(meta.get("step"))
        size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
        ok, problems = quick_verify_checkpoint(ckpt)
        valid, why = ("yes (sizes)", "") if ok else ("no", "; ".join(problems))
        step = meta.get("step")
        rec = saves.get(step, {}) if isinstance(step, int) else {}
        rows.append(
            [
                ckpt.name + (" (latest)" if ckpt.name == latest_name else ""),
                step,
                meta.get("tokens_seen"),
                meta.get("kind"),
                size,
                rec.get("seconds"),
                valid,
                why,
            ]
        )
    out = (
        table(
            ["checkpoint", "step", "tokens seen", "kind", "bytes", "save seconds", "complete", "problem"],
            rows,
            numeric={1, 2, 4, 5},
        )
        if rows
        else ""
    )
    gone = sorted(set(saves) - present)
    if gone:
        out += f"<p class='small'>saved earlier and since removed by retention: steps {', '.join(map(str, gone[:30]))}</p>"
    return out


def section_events(run: RunArtifacts) -> str:
    events = run.records("event")
    if not run.metrics:
        raise NotAvailable("metrics.jsonl absent or empty")
    if not events:
        return '<p class="ok">no stability events: no non-finite loss, spike, rollback, skip or resume was recorded.</p>'
    return table(
        ["step", "kind", "action", "values", "message"],
        [
            [
                e.get("step"),
                e.get("kind"),
                e.get("action"),
                json.dumps(e.get("values"), default=str) if e.get("values") else None,
                e.get("message"),
            ]
            for e in events
        ],
        numeric={0},
    )


def _eval_files(run: RunArtifacts) -> list[tuple[Path, dict]]:
    folder = run.root / "eval"
    out = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        obj, _ = read_json(p)
        if isinstance(obj, dict):
            out.append((p, obj))
    return out


def section_generations(run: RunArtifacts) -> str:
    gens = [(g.get("step"), g.get("mode"), g.get("prompt"), g.get("text")) for g in run.records("generation")]
    for path, obj in _eval_files(run):
        gens += [
            (obj.get("step", path.stem), g.get("mode", "eval"), g.get("prompt"), g.get("text"))
            for g in obj.get("generations") or []
            if isinstance(g, dict)
        ]
    if not gens:
        raise NotAvailable("no generation records in metrics.jsonl and no generations in eval/*.json")
    shown = gens[-MAX_GENERATIONS:]
    out = "".join(
        f'<div class="gen"><span class="small">step {esc(fmt(step))} · {esc(mode)}</span>\n'
        f"<b>{esc(prompt)}</b>{esc(text)}</div>"
        for step, mode, prompt, text in shown
    )
    if len(gens) > len(shown):
        out = f'<p class="small">the last {len(shown)} of {len(gens)} samples</p>' + out
    return out


def section_eval(run: RunArtifacts) -> str:
    files = _eval_files(run)
    if not files:
        raise NotAvailable("no eval/*.json results")
    out = ""
    for path, obj in files:
        scalars = [(k, v) for k, v in flatten({k: v for k, v in obj.items() if k != "generations"})]
        out += f"<h3>{esc(path.name)}</h3>" + kv_table(scalars)
    return out


def section_downstream(run: RunArtifacts) -> str:
    """Downstream accuracy vs tokens seen per task (train.eval_tasks' `tasks` records) with each
    task's chance as a dashed line, the CORE-style mean, and the tables of the last in-loop record
    and of every `oreline eval --tasks` result in eval/ (the final model's, from `oreline run`)."""
    recs = [
        r for r in run.records("tasks") if isinstance(r.get("acc"), dict) and is_finite(r.get("tokens_seen"))
    ]
    finals = [(p, o) for p, o in _eval_files(run) if isinstance(o.get("tasks"), dict)]
    if not recs and not finals:
        raise NotAvailable("no tasks records in metrics.jsonl (train.eval_tasks) and no eval/tasks-*.json")
    out = ""
    if recs:
        names = list(dict.fromkeys(n for r in recs for n in r["acc"]))
        series = {
            n: ([r["tokens_seen"] for r in recs if is_finite(r["acc"].get(n))],
                [r["acc"][n] for r in recs if is_finite(r["acc"].get(n))])
            for n in names
        }  # fmt: skip
        chance = {
            f"chance {n}": ([recs[0]["tokens_seen"], recs[-1]["tokens_seen"]], [recs[-1]["chance"][n]] * 2)
            for n in names
            if is_finite((recs[-1].get("chance") or {}).get(n)) and recs[-1]["chance"][n] > 0
        }
        out += img(
            plots.line_chart({}, "downstream accuracy vs tokens seen", "accuracy", points=series, dashed=chance,
                             xlabel="tokens seen"),
            "downstream accuracy",
        )  # fmt: skip
        core = [(r["tokens_seen"], r["core"]) for r in recs if is_finite(r.get("core"))]
        if core:
            out += img(
                plots.line_chart({}, "CORE-style score (mean centred accuracy; 0 = chance)", "centred accuracy",
                                 points={"CORE": ([c[0] for c in core], [c[1] for c in core])},
                                 dashed={"chance": ([core[0][0], core[-1][0]], [0.0, 0.0])}, xlabel="tokens seen"),
                "CORE score",
            )  # fmt: skip
        last = recs[-1]
        out += f"<h3>in the loop, step {esc(fmt(last.get('step')))} (CORE {esc(fmt(last.get('core')))})</h3>"
        out += _tasks_table(
            {
                n: {k: (last.get(k) or {}).get(n) for k in ("items", "acc", "acc_norm", "chance", "centered")}
                for n in names
            }
        )
    for path, obj in finals:
        out += (
            f"<h3>{esc(path.name)} (step {esc(fmt(obj.get('step')))}, CORE {esc(fmt(obj.get('core')))})</h3>"
        )
        out += _tasks_table(obj["tasks"])
    return out


def _tasks_table(tasks: dict[str, dict]) -> str:
    cols = ("items", "acc", "acc_norm", "chance", "centered")
    return table(
        ["task", *cols],
        [[n, *[(m or {}).get(k) for k in cols]] for n, m in tasks.items()],
        numeric={1, 2, 3, 4, 5},
    )


def section_export(run: RunArtifacts) -> str:
    """The training format (where BOS/EOS go) and what the export tells its clients."""
    from oreline.tokens.format import convention, describe

    manifest = run.manifest or {}
    stated = [
        obj["training_format"] for _, obj in _eval_files(run) if isinstance(obj.get("training_format"), dict)
    ]
    if stated:
        conv = stated[-1]
    elif isinstance(manifest.get("bos_id"), int) and isinstance(manifest.get("eos_id"), int):
        conv = convention(manifest["bos_id"], manifest["eos_id"])
    else:
        raise NotAvailable("no eval/*.json with training_format and no bos_id/eos_id in the token manifest")
    out = f"<p>{esc(describe(conv))}; a literal “&lt;s&gt;” in text {esc(conv.get('literal_special_text', 'stays text'))}.</p>"
    export = run.root / "export"
    pairs: list[tuple[str, Any]] = []
    tok_cfg, _ = read_json(export / "tokenizer_config.json")
    if isinstance(tok_cfg, dict):
        pairs += [
            (f"export tokenizer {k}", tok_cfg.get(k))
            for k in (
                "add_bos_token",
                "add_eos_token",
                "model_max_length",
                "padding_side",
                "model_input_names",
            )
        ]
    hf_cfg, _ = read_json(export / "config.json")
    if isinstance(hf_cfg, dict):
        pairs.append(("export config max_position_embeddings", hf_cfg.get("max_position_embeddings")))
    pairs += [("GGUF file", p.name) for p in sorted(export.glob("*.gguf"))] if export.is_dir() else []
    pairs.append(("trained sequence length (train.seq_len)", run.cfg("train.seq_len")))
    return out + kv_table([(k, json.dumps(v) if isinstance(v, list | bool) else v) for k, v in pairs])


def section_fingerprints(run: RunArtifacts) -> str:
    pairs: list[tuple[str, Any]] = []
    pairs += [(f"fingerprint.json {k}", v) for k, v in flatten(run.fingerprint or {})]
    if run.data_stats and run.data_stats.get("fingerprint"):
        pairs.append(("data/stats.json fingerprint", run.data_stats["fingerprint"]))
    start = run.start
    pairs += [
        (f"training start {k}", start.get(k))
        for k in ("config_fingerprint", "tokenizer_fingerprint", "data_fingerprint")
        if start.get(k)
    ]
    m = run.manifest or {}
    pairs += [
        (f"token manifest {k}", m.get(k))
        for k in ("tokenizer_fingerprint", "data_fingerprint", "docs_fingerprint", "key")
        if m.get(k)
    ]
    if run.tokenizer_stats and run.tokenizer_stats.get("fingerprint"):
        pairs.append(("tokenizer_stats.json fingerprint", run.tokenizer_stats["fingerprint"]))
    for ckpt in run.checkpoint_dirs():
        meta = read_json(ckpt / "meta.json")[0] or {}
        pairs += [
            (f"{ckpt.name} {k}", meta.get(k))
            for k in ("config_fingerprint", "tokenizer_fingerprint", "data_fingerprint")
            if meta.get(k)
        ]
    for path, obj in _eval_files(run):
        pairs += [
            (f"eval/{path.name} {k}", obj.get(k))
            for k in ("tokenizer_fingerprint", "data_fingerprint")
            if obj.get(k)
        ]
    for stage, rec in (run.lineage or {}).items():
        if isinstance(rec, dict):
            pairs += [(f"lineage {stage}.{k}", rec.get(k)) for k in ("key", "output") if rec.get(k)]
    if not pairs:
        raise NotAvailable("no fingerprint.json, lineage.json, manifest, start record or checkpoint meta")
    return (
        "<table>"
        + "".join(f"<tr><th>{esc(k)}</th><td><code>{esc(v)}</code></td></tr>" for k, v in pairs)
        + "</table>"
    )


# ---------------------------------------------------------------------------------------------


def _sections(run: RunArtifacts) -> list[tuple[str, str, Callable[[], str]]]:
    scan_cache: dict[str, Any] = {}

    def scan() -> dict:
        if "scan" not in scan_cache:
            try:
                scan_cache["scan"] = scan_documents(run)
            except NotAvailable as exc:
                scan_cache["scan"] = exc
        if isinstance(scan_cache["scan"], NotAvailable):
            raise scan_cache["scan"]
        return scan_cache["scan"]

    return [
        ("overview", "Overview", lambda: section_overview(run)),
        ("doctor", "Doctor findings", lambda: section_doctor(run)),
        ("funnel", "Data funnel", lambda: section_funnel(run)),
        ("languages", "Languages", lambda: section_languages(run, scan())),
        ("lengths", "Document lengths", lambda: section_lengths(run, scan())),
        ("tokenizer", "Tokenizer", lambda: section_tokenizer(run)),
        ("tokens", "Token shards", lambda: section_tokens(run)),
        ("loss", "Loss", lambda: section_loss(run)),
        ("mixture", "Data mixture", lambda: section_mixture(run)),
        ("lr", "Learning rate", lambda: section_lr(run)),
        ("grad-norm", "Gradient norm", lambda: section_grad_norm(run)),
        ("throughput", "Throughput and MFU", lambda: section_throughput(run)),
        ("memory", "Memory", lambda: section_memory(run)),
        ("checkpoints", "Checkpoints", lambda: section_checkpoints(run)),
        ("events", "Stability events", lambda: section_events(run)),
        ("generations", "Generation samples", lambda: section_generations(run)),
        ("downstream", "Downstream tasks", lambda: section_downstream(run)),
        ("eval", "Evaluation results", lambda: section_eval(run)),
        ("export", "Training format and export", lambda: section_export(run)),
        ("fingerprints", "Fingerprints", lambda: section_fingerprints(run)),
    ]


SECTION_IDS = [
    "overview",
    "doctor",
    "funnel",
    "languages",
    "lengths",
    "tokenizer",
    "tokens",
    "loss",
    "mixture",
    "lr",
    "grad-norm",
    "throughput",
    "memory",
    "checkpoints",
    "events",
    "generations",
    "downstream",
    "eval",
    "export",
    "fingerprints",
]


def render_report(run_dir: str | Path) -> str:
    """The report's HTML text (write_report writes it)."""
    run = load_run(run_dir)
    t0 = time.perf_counter()
    parts, nav = [], []
    for sid, title, build in _sections(run):
        try:
            body = build()
        except NotAvailable as exc:
            body = f'<p class="na">not available: {esc(exc)}</p>'
        except Exception as exc:  # one unreadable artifact must not cost the whole report
            body = (
                f'<p class="na">not available: could not render ({esc(type(exc).__name__)}: {esc(exc)})</p>'
            )
        nav.append(f'<a href="#{sid}">{esc(title)}</a>')
        parts.append(f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>')
    name = run.cfg("run.name") if run.config else run.root.name
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>oreline report: {esc(name)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body>'
        f"<header><h1>oreline report: {esc(name)}</h1><p>{esc(run.root.resolve())} · generated {stamp} in "
        f"{time.perf_counter() - t0:.2f} s</p></header><nav>{''.join(nav)}</nav><main>{''.join(parts)}</main></body></html>\n"
    )


def write_report(run_dir: str | Path) -> Path:
    """Write <run_dir>/report.html (atomically) and return its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        from oreline.errors import InputError

        raise InputError(
            f"run directory {run_dir} not found", "pass the run folder (runs/NAME) that holds metrics.jsonl"
        )
    path = run_dir / "report.html"
    write_bytes_atomic(path, render_report(run_dir).encode("utf-8"))
    return path
