"""The report's charts: matplotlib figures rendered to base64 PNG data URIs.

Figures are built with `matplotlib.figure.Figure` and saved through the Agg canvas, never with
pyplot: no global state, no GUI backend, safe to call from any thread or process. Each function
takes plain Python data (already read from the run's artifacts) and returns a `data:image/png`
URI that the HTML embeds, so the report works offline as one file. Text is drawn as written
(`plain_text`): labels come from artifacts, and matplotlib would parse a `$...$` in one as math.
"""

from __future__ import annotations

import base64
import functools
import io
import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

WIDTH, HEIGHT, DPI = 9.0, 3.2, 96
MAX_POINTS = 2000
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]

Series = tuple[Sequence[float], Sequence[float]]


def thin(x: Sequence[float], y: Sequence[float], max_points: int = MAX_POINTS) -> Series:
    """At most ~max_points points: per bucket of consecutive points keep the min and the max, so
    spikes survive (a plain stride would drop them) while a 100k-step curve draws in milliseconds."""
    n = len(x)
    if n <= max_points:
        return x, y
    size = math.ceil(n / (max_points // 2))
    xs: list[float] = []
    ys: list[float] = []
    for start in range(0, n, size):
        idx = range(start, min(n, start + size))
        lo, hi = min(idx, key=lambda i: y[i]), max(idx, key=lambda i: y[i])
        for i in sorted({lo, hi}):
            xs.append(x[i])
            ys.append(y[i])
    return xs, ys


def plain_text(draw):
    """Draw a chart with matplotlib's math parsing off: a language, source, reason or recipe name
    holding `$` (a colleague's artifact) would be read as mathtext, and one that does not parse
    (`$\\frac{x$`) made the whole chart fail. rcParams is global: set only while the chart is built
    and saved (tick labels are made at save time), and the report draws on one thread."""

    @functools.wraps(draw)
    def plain(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return plain


def to_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)  # the constrained layout already fits the labels
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(height: float = HEIGHT) -> Figure:
    fig = Figure(figsize=(WIDTH, height), dpi=DPI)
    fig.set_layout_engine("constrained")
    return fig


@plain_text
def funnel_chart(steps: list[dict]) -> str:
    """Left: documents after each step. Right: documents dropped per reason, colored by step."""
    fig = _figure(max(HEIGHT, 0.45 * len(steps) + 1.2))
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.3])
    names = [str(s.get("name", "?")) for s in steps]
    outs = [int(s.get("docs_out") or 0) for s in steps]
    ins = [int(s.get("docs_in") or 0) for s in steps]
    y = list(range(len(steps)))[::-1]
    left.barh(y, ins, color="#dddddd", label="in")
    left.barh(y, outs, color=COLORS[0], label="out")
    for yi, a, b in zip(y, ins, outs, strict=True):
        share = (a - b) / a if a else 0.0
        label = f" {b:,}  (−{100 * share:.1f}%)" if a != b else f" {b:,}  (all kept)"
        left.text(b, yi, label, va="center", fontsize=8)
    left.set_yticks(y, names)
    left.set_xlabel("documents")
    left.set_title("documents after each step")
    left.set_xlim(0, max(ins + [1]) * 1.45)
    reasons = []
    for i, s in enumerate(steps):
        for reason, count in (s.get("dropped") or {}).items():
            reasons.append((int(count), str(reason), i))
    reasons.sort(reverse=True)
    reasons = reasons[:14]
    if reasons:
        ry = list(range(len(reasons)))[::-1]
        right.barh(ry, [c for c, _, _ in reasons], color=[COLORS[i % len(COLORS)] for _, _, i in reasons])
        right.set_yticks(ry, [f"{names[i]}: {r}" for _, r, i in reasons], fontsize=8)
        for yi, (c, _, _) in zip(ry, reasons, strict=True):
            right.text(c, yi, f" {c:,}", va="center", fontsize=8)
        right.set_xlim(0, reasons[0][0] * 1.3)
        right.set_xlabel("documents dropped")
        right.set_title("why documents were dropped")
    else:
        right.axis("off")
        right.text(0.5, 0.5, "no drop reasons recorded", ha="center", va="center")
    return to_data_uri(fig)


@plain_text
def bar_chart(labels: list[str], values: list[float], title: str, xlabel: str) -> str:
    fig = _figure(max(2.2, 0.28 * len(labels) + 1.0))
    ax = fig.subplots()
    y = list(range(len(labels)))[::-1]
    ax.barh(y, values, color=COLORS[0])
    ax.set_yticks(y, labels)
    total = sum(values) or 1
    for yi, v in zip(y, values, strict=True):
        ax.text(v, yi, f" {v:,.0f} ({100 * v / total:.1f}%)", va="center", fontsize=8)
    ax.set_xlim(0, max(values + [1]) * 1.3)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return to_data_uri(fig)


@plain_text
def histogram(values, title: str, xlabel: str, log_x: bool = True) -> str:
    """Histogram of a numpy array (or sequence); log_x uses 40 log-spaced bins over the positive values."""
    import numpy as np

    fig = _figure()
    ax = fig.subplots()
    vals = np.asarray(values, dtype=np.float64)
    bins: Any = 40
    if log_x:
        vals = vals[vals > 0]
        if len(vals) and vals.max() > vals.min():
            bins = np.logspace(math.log10(vals.min()), math.log10(vals.max()), 41)
        ax.set_xscale("log")
    ax.hist(vals, bins=bins, color=COLORS[0], edgecolor="white", linewidth=0.4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("documents")
    ax.set_title(title)
    return to_data_uri(fig)


@plain_text
def line_chart(
    series: dict[str, Series],
    title: str,
    ylabel: str,
    *,
    points: dict[str, Series] | None = None,
    dashed: dict[str, Series] | None = None,
    log_y: bool = False,
    vlines: Sequence[tuple[float, str]] = (),
    right: dict[str, Series] | None = None,
    right_label: str = "",
    xlabel: str = "step",
) -> str:
    """Lines over training steps; `points` as markers (evaluations), `dashed` as plans, `vlines` for events,
    `right` on a second y axis."""
    fig = _figure()
    ax = fig.subplots()
    i = 0
    for label, (x, y) in series.items():
        x, y = thin(x, y)
        ax.plot(x, y, label=label, color=COLORS[i % len(COLORS)], linewidth=1.4)
        i += 1
    for label, (x, y) in (points or {}).items():
        ax.plot(x, y, "o-", label=label, color=COLORS[i % len(COLORS)], markersize=5, linewidth=1)
        i += 1
    for label, (x, y) in (dashed or {}).items():
        ax.plot(x, y, "--", label=label, color="#999999", linewidth=1)
    for x, label in vlines:
        ax.axvline(x, color="#d62728", alpha=0.35, linewidth=1)
        ax.text(
            x,
            1.0,
            label,
            transform=ax.get_xaxis_transform(),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="#d62728",
        )
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if right:
        ax2 = ax.twinx()
        for label, (x, y) in right.items():
            x, y = thin(x, y)
            ax2.plot(x, y, label=label, color=COLORS[i % len(COLORS)], linewidth=1.2, linestyle=":")
            i += 1
        ax2.set_ylabel(right_label)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="best")
    return to_data_uri(fig)


@plain_text
def stacked_chart(x: Sequence[float], layers: dict[str, Sequence[float]], title: str, ylabel: str) -> str:
    """Areas stacked over training steps (tokens by source): each layer's y at the same x."""
    fig = _figure()
    ax = fig.subplots()
    if len(x) > MAX_POINTS:  # cumulative counts are monotone: a stride loses nothing visible
        keep = list(range(0, len(x), math.ceil(len(x) / MAX_POINTS))) + [len(x) - 1]
        x = [x[i] for i in keep]
        layers = {k: [v[i] for i in keep] for k, v in layers.items()}
    ax.stackplot(
        x,
        *layers.values(),
        labels=list(layers),
        colors=[COLORS[i % len(COLORS)] for i in range(len(layers))],
        alpha=0.8,
    )
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if layers:
        ax.legend(fontsize=8, loc="upper left")
    return to_data_uri(fig)
