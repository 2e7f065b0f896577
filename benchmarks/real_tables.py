"""Real-data benchmark: NS-FL (federated, masked; local-only) against logistic regression
(standalone, FedAvg on aligned features, pooled) and pooled gradient boosting on real clinical
tables cut into hospitals (:mod:`clinograph.sdk.research.real_tables`).

Per cohort, per seed (split, initialisation and training seed), per hospital: AUROC, AUPRC,
Brier, ECE on the hospital's test split. NS-FL settings are chosen on the federated
*validation* loss only: ``--ablation`` runs the one-factor-at-a-time study (linear path,
weight decay, width, value clipping, learning rate) on seeds 100.. (never the reported seeds)
and records each variant's validation loss beside its test AUROC.

    python benchmarks/real_tables.py                # 5 seeds, both cohorts
    python benchmarks/real_tables.py --ablation     # + the ablation study
Writes benchmarks/results/real_tables.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import RESULTS, machine, write  # noqa: E402

METRICS = ("auroc", "auprc", "brier", "ece")
ABLATIONS: dict[str, dict] = {
    "default": {},
    "no_linear_path": {"model": {"linear_path": False}},
    "no_value_clip": {"model": {"value_clip": 1e6}},
    "weight_decay_0": {"training": {"weight_decay": 0.0}},
    "weight_decay_1e-2": {"training": {"weight_decay": 1e-2}},
    "hidden_8": {"model": {"hidden": 8}},
    "hidden_32": {"model": {"hidden": 32}},
    "lr_0.003": {"training": {"lr": 0.003}},
    "lr_0.03": {"training": {"lr": 0.03}},
    "no_selection_last_round": {"selection": {"enabled": False}},
    "gnn_only_no_clip_no_selection": {"model": {"linear_path": False, "value_clip": 1e6},
                                      "selection": {"enabled": False}},
}


def load(cohort: str):
    from clinograph.sdk.ingest import ingest
    from clinograph.sdk.research.real_tables import cohort_tables

    c = cohort_tables(cohort)
    return c, [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]


def pooled_ece(per_hospital: dict) -> float:
    """ECE weighted by test size (what one ECE over all test patients averages to per bin is not
    recoverable from per-hospital figures; this is the size-weighted mean)."""
    n = sum(v["n"] for v in per_hospital.values())
    return float(sum(v["ece"] * v["n"] for v in per_hospital.values()) / n)


def summarise(runs: list[dict]) -> dict:
    """Mean and std over seeds of each hospital's metrics and of the per-hospital mean."""
    sites = sorted(runs[0])
    out: dict = {"per_hospital": {}, "mean_over_hospitals": {}}
    for s in sites:
        out["per_hospital"][s] = {m: {"mean": float(np.nanmean([r[s][m] for r in runs])),
                                      "std": float(np.nanstd([r[s][m] for r in runs]))} for m in METRICS}
    for m in METRICS:
        per_seed = [float(np.nanmean([r[s][m] for s in sites])) for r in runs]
        out["mean_over_hospitals"][m] = {"mean": float(np.mean(per_seed)), "std": float(np.std(per_seed)),
                                         "per_seed": per_seed}
    out["mean_over_hospitals"]["ece_size_weighted"] = {"mean": float(np.mean([pooled_ece(r) for r in runs]))}
    return out


def run_cohort(cohort: str, seeds: list[int]) -> dict:
    from clinograph.sdk.research.model_quality import (
        baselines,
        federated,
        local_only,
        nsfl_config,
        splits_for,
    )

    c, tables = load(cohort)
    per: dict[str, list[dict]] = {}
    extra: dict[str, list] = {"selected_round": [], "rounds_run": [], "selection_val_loss_round0_1_sel": [],
                              "uncalibrated_ece": [], "seconds": []}
    for seed in seeds:
        cfg = nsfl_config(seed=seed, dictionary_id=cohort)
        t0 = time.perf_counter()
        fed = federated(tables, c.dictionary, cfg)
        extra["seconds"].append(round(time.perf_counter() - t0, 2))
        per.setdefault("nsfl_federated_masked", []).append(fed["final"])
        sel = fed["selection"]
        extra["selected_round"].append(sel.get("round"))
        extra["rounds_run"].append(fed["rounds_run"])
        losses = sel.get("validation_losses", [])
        extra["selection_val_loss_round0_1_sel"].append([losses[0], losses[1], sel["validation_loss"]]
                                                       if len(losses) > 1 else None)
        extra["uncalibrated_ece"].append(float(np.mean([v["ece"] for v in sel.get("uncalibrated", {}).values()]))
                                         if sel.get("uncalibrated") else None)
        per.setdefault("nsfl_local_only", []).append(local_only(tables, c.dictionary, cfg))
        for k, v in baselines(tables, splits_for(tables, cfg), seed=seed).items():
            per.setdefault(k, []).append(v)
        print(f"{cohort} seed {seed}: " + ", ".join(
            f"{k} {np.nanmean([x['auroc'] for x in v[-1].values()]):.3f}" for k, v in per.items()), flush=True)
    return {"task": c.task, "patients": c.patients, "positives": c.positives,
            "censored_before_horizon_dropped": c.censored_before_horizon,
            "hospitals": {t.site: {"patients": t.n_patients, "positives": int(t.labels.sum()),
                                   "features": len(t.observed_nodes())} for t in tables},
            "seeds": seeds, "methods": {k: summarise(v) for k, v in per.items()}, "nsfl_run": extra}


def run_ablation(cohort: str, seeds: list[int]) -> dict:
    from clinograph.sdk.research.model_quality import federated, mean_over_hospitals, nsfl_config

    c, tables = load(cohort)
    out = {}
    for name, over in ABLATIONS.items():
        vals, aucs = [], []
        for seed in seeds:
            fed = federated(tables, c.dictionary, nsfl_config(seed=seed, dictionary_id=cohort, **over))
            sel = fed["selection"]
            vals.append(sel.get("validation_loss", float("nan")))
            aucs.append(mean_over_hospitals(fed["final"], "auroc"))
        out[name] = {"validation_loss": float(np.nanmean(vals)) if not all(map(math.isnan, vals)) else None,
                     "test_auroc": float(np.mean(aucs)), "test_auroc_std": float(np.std(aucs)), "overrides": over}
        print(f"ablation {cohort} {name}: val {out[name]['validation_loss']} test AUROC {out[name]['test_auroc']:.3f}",
              flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cohorts", default="gbsg2,lung")
    ap.add_argument("--ablation", action="store_true")
    a = ap.parse_args()
    from clinograph.sdk.research.model_quality import NSFL_DEFAULTS

    cohorts = [x for x in a.cohorts.split(",") if x]
    payload = {"machine": machine(), "nsfl_settings": NSFL_DEFAULTS,
               "cohorts": {k: run_cohort(k, list(range(a.seeds))) for k in cohorts}}
    if a.ablation:
        payload["ablation"] = {"seeds": [100, 101, 102],
                               "cohorts": {k: run_ablation(k, [100, 101, 102]) for k in cohorts}}
    elif (RESULTS / "real_tables.json").exists():  # keep the last ablation study
        old = json.loads((RESULTS / "real_tables.json").read_text())
        if "ablation" in old:
            payload["ablation"] = old["ablation"]
    print(write("real_tables", payload))


if __name__ == "__main__":
    main()
