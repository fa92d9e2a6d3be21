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


@plots.plain_text
def curve_chart(summary: dict[str, Any], key: str, title: str, ylabel: str) -> str | None:
    """The held-out metric over steps: one color per recipe, a thin line per seed and, with more
    than one seed, their mean as a thick line (the seeds of one recipe evaluate at the same steps)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(plots.WIDTH, plots.HEIGHT + 0.6), dpi=plots.DPI)
    fig.set_layout_engine("constrained")
    ax = fig.subplots()
    drawn = False
    for i, r in enumerate(summary["recipes"]):
        color = plots.COLORS[i % len(plots.COLORS)]
        per_step: dict[int, list[float]] = {}
        for run in r["runs"]:
            pts = [(c["step"], c[key]) for c in run["curve"] if c.get(key) is not None]
            for step, value in pts:
                per_step.setdefault(step, []).append(value)
            if pts:
                drawn = True
                many = len(r["runs"]) > 1
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    "o-" if not many else ".-",
                    color=color,
                    linewidth=1.4 if not many else 0.7,
                    alpha=1.0 if not many else 0.45,
                    label=r["name"] if not many else None,
                )
        if len(r["runs"]) > 1 and per_step:
            steps = sorted(per_step)
            ax.plot(
                steps,
                [sum(per_step[s]) / len(per_step[s]) for s in steps],
                "o-",
                color=color,
                linewidth=2,
                label=f"{r['name']} (mean of {len(r['runs'])} seeds)",
            )
    if not drawn:
        return None
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return plots.to_data_uri(fig)


def classifiers_table(classifiers: list[dict[str, Any]]) -> str:
    """The classifiers the recipes filter with: their inputs and held-out precision, recall, AUC."""
    rows = [
        [
            c["name"],
            ", ".join(c["positive"]),
            ", ".join(c["negative"]),
            f"{fmt(c['documents'].get('positive'))} / {fmt(c['documents'].get('negative'))}",
            f"{fmt(c['heldout_documents'].get('positive'))} / {fmt(c['heldout_documents'].get('negative'))}",
            c.get("precision"),
            c.get("recall"),
            c.get("auc"),
        ]
        for c in classifiers
    ]
    return table(
        [
            "classifier",
            "positive",
            "negative",
            "documents (pos / neg)",
            "held out (pos / neg)",
            "precision",
            "recall",
            "AUC",
        ],
        rows,
        numeric={5, 6, 7},
    ) + (
        '<p class="small">Precision and recall (score &ge; 0.5) and AUC are on the classifier\'s own held-out '
        "documents, which measure how well it separates its two inputs, not whether the documents it keeps make "
        "a better model: the table above says that. recipe:NAME inputs leave out the validation set's documents.</p>"
    )


def tasks_table(summary: dict[str, Any]) -> str | None:
    """Each recipe's final models on the downstream tasks: accuracy per task (acc_norm where the
    task has it, as lm-eval reports multiple choice) with its spread over seeds, the CORE-style mean
    of the centred accuracies, and chance beside them; None when no arm scored a task."""
    recipes = [r for r in summary["recipes"] if r.get("tasks")]
    if not recipes:
        return None
    names = list(dict.fromkeys(n for r in recipes for n in r["tasks"]))

    def metric(m: dict[str, Any]) -> str:
        # a cloze task (LAMBADA) has chance 0 and no length normalisation (its acc_norm repeats acc)
        return "acc" if not m.get("chance") else "acc_norm"

    first = {n: next(r["tasks"][n] for r in recipes if n in r["tasks"]) for n in names}
    header = ["recipe", *[f"{n} ({metric(first[n])}, {fmt(first[n].get('items'))} items)" for n in names]]
    rows = [
        [r["name"], *[_pm(r["tasks"][n][metric(r["tasks"][n])]) if n in r["tasks"] else "—" for n in names]]
        + [_pm(r.get("core") or {})]
        for r in recipes
    ]
    rows.append(["chance", *[fmt(first[n].get("chance")) for n in names], fmt(0.0)])
    p = summary["proxy"]
    return table([*header, "CORE (mean centred)"], rows, numeric=set(range(1, len(names) + 2))) + (
        f'<p class="small">The final model of every arm on the first {esc(fmt(p.get("tasks_max_items")))} items of '
        "each task (the same items for every arm), scored as <code>oreline eval --tasks</code> scores them; "
        "± is the standard deviation over seeds. Centred accuracy is (acc − chance) / (1 − chance). A proxy "
        "model this small is close to chance on these tasks, and the binomial spread of a few hundred items "
        "is several points: the held-out loss above is the finer comparison at this scale.</p>"
    )


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
    charts = ""
    for key, title, ylabel in (
        ("val_loss", "held-out validation loss", "loss (nats/token)"),
        ("val_bpb", "held-out bits per byte", "bits/byte"),
    ):
        uri = curve_chart(summary, key, title, ylabel)
        charts += img(uri, f"{title} per recipe") if uri else ""
    charts = charts or '<p class="na">not available: no validation records in the arms\' metrics.jsonl</p>'
    note = (
        '<p class="small">Every arm trains the same model for the same number of tokens; a recipe with '
        "fewer tokens repeats them (epochs &gt; 1). Losses are on one held-out set that no arm trains on, "
        "tokenized with the one shared tokenizer, so they compare across recipes. ± is the standard "
        "deviation over seeds.</p>"
    )
    sections = [
        ("recipes", "Recipes side by side", side + note),
        ("curves", "Held-out loss during training", charts),
    ]
    downstream = tasks_table(summary)
    if downstream:
        sections.append(("tasks", "Downstream tasks of the final models", downstream))
    if summary.get("classifiers"):
        sections.append(("classifiers", "Quality classifiers", classifiers_table(summary["classifiers"])))
    sections.append(("setup", "Set-up", setup))
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
