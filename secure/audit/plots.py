"""The report's figures: matplotlib (Agg) drawn to PNG and returned as base64 strings.

Each function takes already-extracted, plain data (see report.py) and returns the PNG as
base64 text for a ``data:image/png`` URI, so the page needs nothing but itself.

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

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

MAX_MODULES = 60
_RC = {"text.usetex": False}


def literal(text: object) -> str:
    """``text`` as matplotlib draws it literally: every ``$`` escaped (no mathtext)."""
    return str(text).replace("$", r"\$")


def _literal_text(fn: Callable[..., str]) -> Callable[..., str]:
    """Draw the whole figure with usetex off (a user's matplotlibrc cannot turn it on)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        with matplotlib.rc_context(_RC):
            return fn(*args, **kwargs)

    return wrapper


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    finally:
        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


@_literal_text
def participation(rounds: list[int], accepted: list[int], rejected: list[int], absent: list[int]) -> str:
    """Stacked bars per round: accepted, rejected, invited but silent."""
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(rounds, accepted, color="#2a9d8f", label="accepted")
    ax.bar(rounds, rejected, bottom=accepted, color="#e76f51", label="rejected")
    ax.bar(rounds, absent, bottom=[a + r for a, r in zip(accepted, rejected, strict=True)],
           color="#cccccc", label="invited, no update")
    ax.set_xlabel("round")
    ax.set_ylabel("hospitals")
    ax.set_xticks(rounds)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


@_literal_text
def coverage(rounds: list[int], modules: list[str], counts: list[list[int]]) -> str:
    """Heatmap: contributors per module (rows) per round (columns)."""
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.22 * len(modules) + 1)))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xticks(range(len(rounds)), [str(r) for r in rounds])
    ax.set_yticks(range(len(modules)), [literal(m) for m in modules], fontsize=7)
    ax.set_xlabel("round")
    fig.colorbar(im, ax=ax, label="contributors")
    return _png(fig)


@_literal_text
def privacy(series: dict[str, tuple[list[int], list[float], float]]) -> str:
    """Cumulative epsilon per hospital over rounds, with its budget as a dashed line."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for i, (client, (rounds, eps, budget)) in enumerate(sorted(series.items())):
        color = f"C{i % 10}"
        ax.plot(rounds, eps, marker="o", color=color, label=literal(f"{client} (budget {budget:g})"))
        ax.axhline(budget, color=color, linestyle="--", linewidth=1)
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative ε")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


@_literal_text
def metrics(metric: str, series: dict[str, tuple[list[int], list[float]]]) -> str:
    """One metric per hospital over rounds."""
    fig, ax = plt.subplots(figsize=(7, 3))
    for i, (client, (rounds, values)) in enumerate(sorted(series.items())):
        ax.plot(rounds, values, marker="o", color=f"C{i % 10}", label=literal(client))
    ax.set_xlabel("round")
    ax.set_ylabel(literal(metric))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


@_literal_text
def dag(concepts: list[str], adjacency: list[list[int]], tallies: list[list[float]]) -> str:
    """The adopted DAG (concepts on a circle, adopted edges as arrows labelled with votes)."""
    n = len(concepts)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    pos = [(math.cos(2 * math.pi * i / max(n, 1)), math.sin(2 * math.pi * i / max(n, 1))) for i in range(n)]
    for i in range(n):
        for j in range(n):
            if adjacency[i][j]:
                (x0, y0), (x1, y1) = pos[i], pos[j]
                ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                            arrowprops={"arrowstyle": "-|>", "color": "#264653", "shrinkA": 16, "shrinkB": 16})
                ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"{tallies[i][j]:g}", fontsize=9, color="#e76f51")
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
    each site's |relevance| scaled to its own maximum (profiles compare; scales may not)."""
    features = sorted({f for feats in per_client.values() for f in feats})
    angles = [2 * math.pi * i / len(features) for i in range(len(features))]
    fig = plt.figure(figsize=(6, 6))
    ax = fig.add_subplot(projection="polar")
    for i, (client, feats) in enumerate(sorted(per_client.items())):
        top = max((abs(v) for v in feats.values()), default=0.0) or 1.0
        values = [abs(feats.get(f, 0.0)) / top for f in features]
        ax.plot(angles + angles[:1], values + values[:1], color=f"C{i % 10}", label=literal(client))
        ax.fill(angles + angles[:1], values + values[:1], color=f"C{i % 10}", alpha=0.08)
    ax.set_xticks(angles, [literal(f) for f in features], fontsize=7)
    ax.legend(loc="upper left", bbox_to_anchor=(1.05, 1.05), fontsize=8)
    return _png(fig)
