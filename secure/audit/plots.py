"""The report's figures: matplotlib (Agg) drawn to PNG and returned as base64 strings.

Figures are ``matplotlib.figure.Figure`` objects drawn on their own Agg canvas: no pyplot, no
``matplotlib.use``, so a host process's backend and open figures are left as they are.

Each function takes already-extracted, plain data (see report.py) and returns the PNG as
base64 text for a ``data:image/png`` URI, so the page needs nothing but itself. The report
puts a text version (a table) of every figure beside it; the figures are for seeing trends.

Legibility rules: whole counts get whole-number ticks and a discrete colour scale; series are
told apart by marker and line style as well as by colour (Okabe-Ito, safe for colour-blind
readers); reference lines (budgets) are neutral grey and labelled in text, never drawn in a
series' colour; polar tick labels sit away from the data labels.

Every string from the log (hospital, metric, module, concept and feature names) is drawn as
literal text: :func:`literal` escapes ``$`` so matplotlib's mathtext never parses it, and
figures are drawn with ``text.usetex`` off, so a name like ``$\\foo{$`` cannot break the report.
"""

from __future__ import annotations

import base64
import functools
import io
import math
from collections.abc import Callable
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

MAX_MODULES = 60
_RC = {"text.usetex": False}
#: Okabe & Ito (2008), distinguishable with the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", "--", "-.", ":"]
NEUTRAL = "#555555"


def literal(text: object) -> str:
    """``text`` as matplotlib draws it literally: every ``$`` escaped (no mathtext)."""
    return str(text).replace("$", r"\$")


def style(i: int) -> dict[str, Any]:
    """Colour, marker and line style of series ``i`` (all three differ between neighbours)."""
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINESTYLES[(i // len(PALETTE)) % len(LINESTYLES)]}


def _literal_text(fn: Callable[..., str]) -> Callable[..., str]:
    """Draw the whole figure with usetex off (a user's matplotlibrc cannot turn it on)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        with matplotlib.rc_context(_RC):
            return fn(*args, **kwargs)

    return wrapper


def _figure(figsize: tuple[float, float]) -> Figure:
    """A figure on its own Agg canvas (pyplot's figure manager never sees it)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _round_axis(ax: Any, rounds: list[int]) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(rounds) <= 20:
        ax.set_xticks(rounds)


#: Participation categories, bottom to top: label, colour, hatch (the hatch tells them apart in grey).
PARTICIPATION = [("contributed", "#009E73", ""), ("rejected by the server", "#D55E00", "//"),
                 ("refused by the hospital", "#CC79A7", "xx"), ("dropped", "#E69F00", ".."),
                 ("invited, no answer", "#BBBBBB", "")]


@_literal_text
def participation(rounds: list[int], counts: dict[str, list[int]]) -> str:
    """Stacked bars per round, one block per category of :data:`PARTICIPATION` (whole hospitals)."""
    fig = _figure((7, 3))
    ax = fig.subplots()
    bottom = [0] * len(rounds)
    for label, color, hatch in PARTICIPATION:
        values = counts.get(label, [0] * len(rounds))
        ax.bar(rounds, values, bottom=bottom, color=color, hatch=hatch, edgecolor="#333333", linewidth=0.5,
               label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("hospitals")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(bottom + [1]) + 0.5)
    _round_axis(ax, rounds)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


@_literal_text
def coverage(rounds: list[int], modules: list[str], counts: list[list[int]]) -> str:
    """Heatmap: contributors per module (rows) per round (columns), a discrete colour per count,
    each cell labelled with its count."""
    top = max([max(row) for row in counts if row] + [1])
    fig = _figure((7, max(2.0, 0.22 * len(modules) + 1)))
    ax = fig.subplots()
    cmap = ListedColormap(matplotlib.colormaps["viridis"].resampled(top + 1)(range(top + 1)))
    norm = BoundaryNorm([v - 0.5 for v in range(top + 2)], cmap.N)
    im = ax.imshow(counts, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    ax.set_xticks(range(len(rounds)), [str(r) for r in rounds])
    ax.set_yticks(range(len(modules)), [literal(m) for m in modules], fontsize=7)
    ax.set_xlabel("round")
    if len(rounds) * len(modules) <= 400:
        for i, row in enumerate(counts):
            for j, v in enumerate(row):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                        color="white" if v < top * 0.6 else "black")
    bar = fig.colorbar(im, ax=ax, label="contributors", ticks=range(top + 1))
    bar.ax.tick_params(labelsize=7)
    return _png(fig)


@_literal_text
def privacy(series: dict[str, tuple[list[int], list[float], float]]) -> str:
    """Cumulative ε per hospital over rounds; budgets as grey dashed lines labelled in text."""
    fig = _figure((7, 3.2))
    ax = fig.subplots()
    budgets: dict[float, list[str]] = {}
    for i, (client, (rounds, eps, budget)) in enumerate(sorted(series.items())):
        ax.plot(rounds, eps, label=literal(client), **style(i))
        budgets.setdefault(budget, []).append(client)
    last = max((r for rounds, _, _ in series.values() for r in rounds), default=0)
    for budget, clients in sorted(budgets.items()):
        ax.axhline(budget, color=NEUTRAL, linestyle=(0, (4, 3)), linewidth=1)
        ax.annotate(literal(f"budget {budget:g}: {', '.join(clients)}"), xy=(1.0, budget),
                    xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=7, color=NEUTRAL)
    ax.set_ylabel("cumulative ε")
    _round_axis(ax, sorted({r for rounds, _, _ in series.values() for r in rounds}) or [last])
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, -0.18), fontsize=8, ncol=4)
    return _png(fig)


@_literal_text
def metrics(metric: str, series: dict[str, tuple[list[int], list[float]]], *, ylabel: str | None = None) -> str:
    """One metric per hospital over rounds."""
    fig = _figure((7, 3))
    ax = fig.subplots()
    for i, (client, (rounds, values)) in enumerate(sorted(series.items())):
        ax.plot(rounds, values, label=literal(client), **style(i))
    _round_axis(ax, sorted({r for rounds, _ in series.values() for r in rounds}))
    ax.set_ylabel(literal(ylabel or metric))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


@_literal_text
def dag(concepts: list[str], adjacency: list[list[int]], tallies: list[list[float]]) -> str:
    """The adopted DAG (concepts on a circle, adopted edges as arrows labelled with votes)."""
    n = len(concepts)
    fig = _figure((4.5, 4.5))
    ax = fig.subplots()
    pos = [(math.cos(2 * math.pi * i / max(n, 1)), math.sin(2 * math.pi * i / max(n, 1))) for i in range(n)]
    for i in range(n):
        for j in range(n):
            if adjacency[i][j]:
                (x0, y0), (x1, y1) = pos[i], pos[j]
                ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                            arrowprops={"arrowstyle": "-|>", "color": "#264653", "shrinkA": 16, "shrinkB": 16})
                ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"{tallies[i][j]:g}", fontsize=9, color="#A3320B")
    for (x, y), name in zip(pos, concepts, strict=True):
        ax.scatter([x], [y], s=900, color="#8ecae6", zorder=3)
        ax.text(x, y, literal(name), ha="center", va="center", fontsize=7, zorder=4)
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.set_axis_off()
    return _png(fig)


@_literal_text
def radar(per_client: dict[str, dict[str, float]]) -> str:
    """Feature-relevance radar: one polygon per site over the union of published features,
    each site's |relevance| scaled to its own maximum (profiles compare; scales may not).
    The radial scale (0.25 .. 1) is labelled between the first two spokes, away from the
    feature names, which sit outside the circle."""
    features = sorted({f for feats in per_client.values() for f in feats})
    angles = [2 * math.pi * i / len(features) for i in range(len(features))]
    fig = _figure((6, 6))
    ax = fig.add_subplot(projection="polar")
    for i, (client, feats) in enumerate(sorted(per_client.items())):
        top = max((abs(v) for v in feats.values()), default=0.0) or 1.0
        values = [abs(feats.get(f, 0.0)) / top for f in features]
        s = style(i)
        ax.plot(angles + angles[:1], values + values[:1], label=literal(client), **s)
        ax.fill(angles + angles[:1], values + values[:1], color=s["color"], alpha=0.08)
    ax.set_ylim(0, 1.0)
    ax.set_yticks([0.25, 0.5, 0.75, 1.0], ["0.25", "0.5", "0.75", "1"], fontsize=6, color=NEUTRAL)
    between = math.degrees(angles[1] / 2) if len(angles) > 1 else 45.0
    ax.set_rlabel_position(between)
    ax.set_xticks(angles, [literal(f) for f in features], fontsize=7)
    ax.tick_params(axis="x", pad=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.1, 1.05), fontsize=8)
    return _png(fig)
