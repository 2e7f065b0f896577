"""What every study script shares: the ``--quick`` / ``--out`` convention, the machine and its
load, medians, JSON output.

The convention (``research/README.md``): every script under ``research/<study>/`` runs as
``python -m research.<study>.<script>`` from the repository root, accepts ``--quick`` (a small
setting that takes minutes) and ``--out PATH``, and writes one JSON file -- by default
``research/<study>/results/<script>.json``, or ``<script>_quick.json`` with ``--quick`` (those are
gitignored, so a quick run never overwrites a committed measurement). :func:`save` adds the
machine (CPU count and model, Python, platform, torch and other versions) and its load average
at the start (this module's import) and at the end. Timings are reported as medians of
repetitions (:func:`median`); studies assert nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent


def _load() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


#: the load average when the script started (this module is imported first thing)
LOAD_AT_START = _load()


def machine(extra_packages: tuple[str, ...] = ()) -> dict:
    """What the numbers were measured on (``extra_packages``: more versions to record)."""
    versions = {}
    for pkg in ("torch", "torch_geometric", "opacus", "tenseal", "flwr", "cryptography", "numpy", *extra_packages):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "cpu": _cpu_model(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_average_at_start": LOAD_AT_START, "versions": versions}


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def results_dir(script: str | Path) -> Path:
    """``research/<study>/results/`` of the study ``script`` (pass ``__file__``)."""
    return Path(script).resolve().parent / "results"


def add_convention(ap: argparse.ArgumentParser, *, quick_help: str = "a small setting (minutes)") -> None:
    """Add the two arguments every study script takes: ``--quick`` and ``--out PATH``."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default=None, metavar="PATH",
                    help="the JSON file to write (default: the study's results/<script>.json; "
                         "results/<script>_quick.json with --quick)")


def out_path(script: str | Path, args: argparse.Namespace, *, name: str | None = None) -> Path:
    """Where ``script`` writes: ``args.out``, else ``results/<name>[_quick].json`` beside it. A bare
    ``--out NAME`` or ``--out NAME.json`` (no folder) means ``results/NAME.json`` of the study, as
    the commands recorded in the studies' READMEs use it; ``./NAME.json`` is the current folder."""
    given = getattr(args, "out", None)
    if given is not None:
        text = str(given)
        if "/" not in text and "\\" not in text:
            return results_dir(script) / (text if text.endswith(".json") else f"{text}.json")
        return Path(given)
    stem = name or Path(script).stem
    return results_dir(script) / f"{stem}{'_quick' if getattr(args, 'quick', False) else ''}.json"


def save(payload: dict, out: Path, *, sort_keys: bool = True, indent: int = 2) -> Path:
    """Write ``payload`` as JSON to ``out`` (folders made) with the machine and its load at the end
    (``payload["machine"]``, added when missing); returns ``out``."""
    payload = dict(payload)
    info = payload.get("machine")
    info = dict(info) if isinstance(info, dict) else machine()
    info.setdefault("load_average_at_start", LOAD_AT_START)
    info["load_average_at_end"] = _load()
    payload["machine"] = info
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=indent, sort_keys=sort_keys, default=float) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")
    return out


def write(out: Path, payload: dict) -> Path:
    """:func:`save` with sorted keys (the studies' committed JSON)."""
    return save(payload, out)


def emit(result: dict, *, out: Path) -> Path:
    """Print ``result`` as JSON and :func:`save` it to ``out``."""
    print(json.dumps(result, indent=2, default=float))
    return save(result, out, sort_keys=False)


def median(xs: list[float]) -> float:
    """Median of repetitions."""
    return float(statistics.median(xs))


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
