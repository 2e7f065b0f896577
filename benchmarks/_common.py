"""Shared benchmark plumbing: machine facts, versions, medians, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    """What the numbers were measured on."""
    versions = {}
    for pkg in ("torch", "torch_geometric", "opacus", "tenseal", "flwr", "cryptography", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average_at_start": load, "versions": versions}


def median(xs: list[float]) -> float:
    """Median of repetitions."""
    return float(statistics.median(xs))


def write(name: str, payload: dict) -> Path:
    """Write benchmarks/results/<name>.json."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return out
