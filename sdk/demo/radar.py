"""Per-site feature relevance (the NS-FL masks m_f, paper Fig. 4) as a radar chart."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np


def feature_relevance_radar(relevance: Mapping[str, Mapping[str, float]], out: Path) -> Path:
    """One polygon per site over the union of features; a feature a site lacks is drawn at 0."""
    # no pyplot, no matplotlib.use: a host process's backend and figures stay its own
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    features = sorted({f for r in relevance.values() for f in r})
    angles = np.linspace(0, 2 * np.pi, len(features), endpoint=False).tolist()
    fig = Figure(figsize=(8, 8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111, polar=True)
    for site, r in sorted(relevance.items()):
        vals = [r.get(f, 0.0) for f in features]
        ax.plot(angles + angles[:1], vals + vals[:1], label=site)
        ax.fill(angles + angles[:1], vals + vals[:1], alpha=0.08)
    ax.set_xticks(angles)
    ax.set_xticklabels(features, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_title("Feature relevance m_f per site (NS-FL masks)")
    ax.legend(loc="upper right", bbox_to_anchor=(1.25, 1.1))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out
