"""The report of `oreline ablate`: the recipes side by side, one self-contained HTML file.

It reads nothing but the summary `oreline.ablation` wrote (summary.json: documents and tokens
of each recipe, each training's validation curve on the common held-out set, the final numbers
with their spread over seeds) and draws with the run report's helpers (same CSS, same escaping,
charts as embedded PNG), so it works offline like report.html.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from oreline.io import write_bytes_atomic
from oreline.report import plots
from oreline.report.html import CSS, esc, fmt, img, kv_table, table


def _pm(s: dict[str, Any]) -> str:
    if s.get("mean") is None:
        return "—"
    return fmt(s["mean"]) + (f" ± {fmt(s['std'])}" if s.get("std") is not None else "")


def _curves(summary: dict[str, Any], key: str) -> dict[str, plots.Series]:
    """One line per recipe and seed: the validation metric on the held-out set over steps."""
    out: dict[str, plots.Series] = {}
    for r in summary["recipes"]:
        for run in r["runs"]:
            pts = [(c["step"], c[key]) for c in run["curve"] if c.get(key) is not None]
            label = r["name"] + (f" (seed {run['seed']})" if len(r["runs"]) > 1 else "")
            out[label] = ([s for s, _ in pts], [v for _, v in pts])
    return out


def render(summary: dict[str, Any]) -> str:
    v, p, t = summary["validation"], summary["proxy"], summary["tokenizer"]
    rows = []
    for r in summary["recipes"]:
        rows.append(
            [
                r["name"],
                r.get("docs_in"),
                r["docs_kept"],
                r["train_docs"],
                r["train_tokens"],
                r["train_tokens_budget"],
                round(r["epochs"], 3) if r.get("epochs") is not None else None,
                _pm(r["final_val_loss"]),
                _pm(r["final_val_bpb"]),
                _pm(r["final_train_loss"]),
                r["final_val_loss"]["n"],
            ]
        )
    side = table(
        [
            "recipe",
            "documents in",
            "documents kept",
            "documents trained on",
            "tokens available",
            "tokens trained (budget)",
            "epochs",
            "held-out loss",
            "held-out bits/byte",
            "final train loss",
            "seeds",
        ],
        rows,
        numeric={1, 2, 3, 4, 5, 6, 10},
    )
    setup = kv_table(
        [
            ("proxy model preset", p["preset"]),
            ("seeds", ", ".join(str(s) for s in p["seeds"])),
            ("optimizer steps", p["steps"]),
            ("tokens per step", p["batch_tokens"]),
            ("training tokens per arm", p["train_tokens_per_arm"]),
            ("shared tokenizer trained on", ", ".join(t["trained_on"])),
            ("tokenizer fingerprint", t["fingerprint"]),
            ("validation set", f"held-out documents of {v['recipe']} (fraction {v['fraction']} by id hash)"),
            ("validation documents / tokens", f"{fmt(v['documents'])} / {fmt(v['tokens'])}"),
        ]
    )
    loss = _curves(summary, "val_loss")
    bpb = _curves(summary, "val_bpb")
    charts = ""
    if any(xs for xs, _ in loss.values()):
        charts += img(
            plots.line_chart({}, "held-out validation loss", "loss (nats/token)", points=loss),
            "held-out loss per recipe",
        )
    if any(xs for xs, _ in bpb.values()):
        charts += img(
            plots.line_chart({}, "held-out bits per byte", "bits/byte", points=bpb), "held-out bits per byte"
        )
    charts = charts or '<p class="na">not available: no validation records in the arms\' metrics.jsonl</p>'
    kept = [r for r in summary["recipes"] if r["train_tokens"]]
    bars = img(
        plots.bar_chart(
            [r["name"] for r in kept], [float(r["train_tokens"]) for r in kept], "tokens kept", "tokens"
        ),
        "tokens kept per recipe",
    )
    note = (
        '<p class="small">Every arm trains the same model for the same number of tokens; a recipe with '
        "fewer tokens repeats them (epochs &gt; 1). Losses are on one held-out set that no arm trains on, "
        "tokenized with the one shared tokenizer, so they compare across recipes. ± is the standard "
        "deviation over seeds.</p>"
    )
    sections = [
        ("recipes", "Recipes side by side", side + note),
        ("curves", "Held-out loss during training", charts),
        ("tokens", "Tokens kept", bars),
        ("setup", "Set-up", setup),
    ]
    nav = "".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title, _ in sections)
    body = "".join(
        f'<section id="{sid}"><h2>{esc(title)}</h2>{html}</section>' for sid, title, html in sections
    )
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    name = esc(summary["name"])
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>oreline ablation: {name}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body>'
        f"<header><h1>oreline ablation: {name}</h1><p>{esc(summary['folder'])} · generated {stamp}</p></header>"
        f"<nav>{nav}</nav><main>{body}</main></body></html>\n"
    )


def write_ablation_report(folder: str | Path, summary: dict[str, Any]) -> Path:
    path = Path(folder) / "report.html"
    write_bytes_atomic(path, render(summary).encode("utf-8"))
    return path
