"""Shared benchmark plumbing: machine facts, versions, medians, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
from importlib import metadata
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def machine(extra_packages: tuple[str, ...] = ()) -> dict:
    """What the numbers were measured on (``extra_packages``: more versions to record)."""
    versions = {}
    for pkg in ("torch", "torch_geometric", "opacus", "tenseal", "flwr", "cryptography", "numpy", *extra_packages):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "cpu": _cpu_model(), "load_average_at_start": load, "versions": versions}


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def emit(result: dict, *, out: Path | None) -> None:
    """Write ``result`` as JSON to ``out`` (folders made), or print it when ``out`` is None
    (``--quick`` runs print and write nothing)."""
    text = json.dumps(result, indent=2)
    if out is None:
        print(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


def median(xs: list[float]) -> float:
    """Median of repetitions."""
    return float(statistics.median(xs))


def write(name: str, payload: dict) -> Path:
    """Write benchmarks/results/<name>.json."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return out


def summarise_arms(per_seed: list[dict], arms, metrics=("auroc", "auprc")) -> dict:
    """Per arm and hospital: mean, sd and per-seed values over seeds of each metric, plus
    ``mean_over_hospitals`` (the per-seed mean over hospitals, NaN-skipping). ``per_seed[s][arm][site]``
    is a dict of metrics."""
    out: dict = {}
    for arm in arms:
        sites = sorted(per_seed[0][arm])
        out[arm] = {}
        for site in sites + ["mean_over_hospitals"]:
            out[arm][site] = {}
            for metric in metrics:
                if site == "mean_over_hospitals":
                    vals = [float(np.nanmean([s[arm][h][metric] for h in sites])) for s in per_seed]
                else:
                    vals = [s[arm][site][metric] for s in per_seed]
                out[arm][site][metric] = {"mean": float(np.nanmean(vals)),
                                          "sd": float(statistics.stdev(vals)) if len(vals) > 1 else 0.0,
                                          "per_seed": vals}
    return out
