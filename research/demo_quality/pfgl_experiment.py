"""PFGL-Net's setup on ALARM: does DQ weighting + personal layers help here?

    python -m research.demo_quality.pfgl_experiment            # 8 arms x 3 seeds, 10 rounds, 2000 patients (640 s here, load avg ~6)
    python -m research.demo_quality.pfgl_experiment --quick    # 2 arms x 1 seed, few rounds; prints, writes nothing

The seed paper's setup (PFGL-Net §4.1) on our data: 10 hospitals cut from forward samples
of ALARM (task: SHUNT = HIGH, ~10 % prevalence) with Dirichlet(α = 0.5) label skew (per
class, proportions over hospitals ~ Dir(0.5 · 1_10), as Hsu et al. 2019; resampled until
every hospital has at least ``min_size`` patients) and per-hospital MCAR missing rates 0.10,
0.15, ..., 0.55 (shuffled over hospitals per seed). Arms: FedAvg, FedProx (μ = 0.01), FedOpt
(FedAdam, η = 0.05, untuned), PFGL-Net = DQ weighting + personal head + local fine-tuning,
and the ablations (no fine-tuning, no DQ, performance-only β2 = 0, structure-only β1 = 0).
Baselines share the head (only the masks are personal, as in every NS-FL run).

Shrunk to fit 20 minutes on 2 cores (the paper: 200 rounds, 5 local epochs, 2-layer GCN):
``rounds`` rounds of 2 local epochs (batch 32, Adam lr 0.005), hidden 32, star graphs (k_similar = 0), ``n_patients``
ALARM samples. Every round runs the real protocol in ``masked`` mode (signed plans, pairwise
masks, DQ weights fixed in the plan with a one-round lag).

Reported per arm and seed, per round: test-split Micro-F1 (= accuracy for this binary task),
positive-class F1 and AUROC over all hospitals' test patients pooled (each hospital scored by
its own model; the paper aggregates the clients' confusion matrices), and the same metrics
averaged over hospitals (noisy: some hospitals have 1-2 test positives); the final value (mean of the last 3
rounds) and rounds to convergence: the first round from which the curve stays within
``tol`` of its final value. Across seeds: median, mean and sd. Also the weights each DQ round
used. Writes research/demo_quality/results/pfgl_experiment.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.datasets.alarm import load_dictionary, render_patients, sample_alarm
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.sdk.ingest import PatientTable, ingest
from clinograph.sdk.ontology.schema import ColumnMap, SiteSchema
from clinograph.sdk.training.metrics import binary_metrics
from clinograph.sdk.training.quality import f1_positive, micro_f1

from research._common import add_convention, machine, out_path, save

torch.set_num_threads(1)
MISSING_RATES = tuple(round(0.10 + 0.05 * k, 2) for k in range(10))
METRICS = ("micro_f1", "f1", "auroc")

ARMS: dict[str, tuple[str, dict, tuple[str, ...], int]] = {  # strategy, options, personal, fine-tune epochs
    "fedavg": ("fedavg", {}, (), 0),
    "fedprox": ("fedprox", {"mu": 0.01}, (), 0),
    "fedopt": ("fedopt", {"server_lr": 0.05}, (), 0),
    "pfgl_dq": ("dq_weighted", {}, ("head/task",), 1),
    "ablation_no_finetune": ("dq_weighted", {}, ("head/task",), 0),
    "ablation_no_dq": ("fedavg", {}, ("head/task",), 1),
    "ablation_performance_only": ("dq_weighted", {"beta2": 0.0}, ("head/task",), 1),
    "ablation_structure_only": ("dq_weighted", {"beta1": 0.0}, ("head/task",), 1),
}


def dirichlet_partition(labels: np.ndarray, *, n_clients: int, alpha: float, min_size: int,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Label-skewed partition (Hsu et al. 2019): each class split over clients by Dir(α)."""
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for cls in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == cls))
            props = rng.dirichlet(np.full(n_clients, alpha))
            cuts = (np.cumsum(props) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.array(p)) for p in parts]
    raise RuntimeError(f"no Dirichlet({alpha}) partition with >= {min_size} patients per hospital in 1000 draws")


def make_tables(*, n_patients: int, seed: int, min_size: int) -> tuple[list[PatientTable], dict]:
    """10 hospitals: Dirichlet label skew, missing rates 0.10..0.55 (MCAR per cell)."""
    dictionary = load_dictionary()
    canon = render_patients(sample_alarm(n_patients, seed=seed), seed=seed + 1)
    rng = np.random.default_rng(seed + 2)
    labels = canon["shunt"].to_numpy()
    parts = dirichlet_partition(labels, n_clients=len(MISSING_RATES), alpha=0.5, min_size=min_size, rng=rng)
    rates = rng.permutation(MISSING_RATES)
    features = [c for c in canon.columns if c != "shunt"]
    tables, facts = [], {}
    for k, (idx, rate) in enumerate(zip(parts, rates, strict=True)):
        site = f"h{k:02d}"
        part = canon.iloc[idx].reset_index(drop=True)
        df = pd.DataFrame({"patient_id": [f"{site}-{i:05d}" for i in range(len(part))]})
        for f in features:
            v = part[f].to_numpy(dtype=float)
            df[f] = np.where(rng.random(len(v)) < rate, np.nan, np.round(v, 3))
        df["outcome"] = part["shunt"].to_numpy()
        schema = SiteSchema(site=site, patient_id="patient_id", label="outcome",
                            columns={f: ColumnMap(feature=f, unit=dictionary.get(f).unit) for f in features})
        tables.append(ingest(df, schema=schema, dictionary=dictionary))
        facts[site] = {"patients": len(idx), "positives": int(part["shunt"].sum()), "missing_rate": float(rate)}
    return tables, facts


def convergence_round(curve: list[float], *, tol: float) -> int:
    """First round (1-based) from which the curve stays within ``tol`` of its final value."""
    final = float(np.mean(curve[-3:]))
    for r in range(len(curve)):
        if all(abs(x - final) <= tol for x in curve[r:]):
            return r + 1
    return len(curve)


def _scores(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    out = binary_metrics(y, p)
    out["micro_f1"], out["f1"] = micro_f1(y, p), f1_positive(y, p)
    return out


def _run_pfgl(tables, dictionary, config, *, audit_dir: Path) -> SimpleNamespace:
    """The federation on the one runtime; after each round, each hospital's test split scored with
    its own model (global shared + personal), and all test predictions pooled (PFGL-Net 4.1.4)."""
    sim = build_simulation(tables, dictionary, config, audit_dir=audit_dir)
    res = SimpleNamespace(rounds=[], pooled=[], weights=[], released=[], round_seconds=[])
    try:
        for _ in range(config.federation.rounds):
            t = time.perf_counter()
            sim.run_round()
            res.round_seconds.append(time.perf_counter() - t)
            plan = next(iter(sim.hospitals.values())).plan
            res.weights.append({k.split("/", 1)[1]: float(v) for k, v in plan.options.items() if k.startswith("weight/")})
            res.released.append({n: h.task.quality() for n, h in sim.hospitals.items()}
                                if config.release.metrics == "quality" else {})
            ys, ps, per = [], [], {}
            for n, h in sorted(sim.hospitals.items()):
                test = h.task.split.test
                y, p = h.task.table.labels[test], h.task.predict()[test]
                per[n] = _scores(y, p)
                ys.append(y)
                ps.append(p)
            res.rounds.append(per)
            res.pooled.append(_scores(np.concatenate(ys), np.concatenate(ps)))
    finally:
        sim.audit.close()
    return res


def run_arm(arm: str, tables: list[PatientTable], dictionary, *, rounds: int, seed: int, tol: float,
            local_epochs: int, batch_size: int) -> dict:
    strategy, options, personal, ft = ARMS[arm]
    config = SimulationConfig.model_validate({
        "federation": {"id": f"pfgl-{arm}", "rounds": rounds, "secure_mode": "masked", "strategy": strategy,
                       "min_clients": len(tables), "local_epochs": local_epochs, "seed": seed},
        "model": {"hidden": 32}, "training": {"lr": 0.005, "batch_size": batch_size, "seed": seed},
        "graph": {"k_similar": 0}, "personal": {"modules": list(personal), "fine_tune_epochs": ft},
        "release": {"metrics": "quality" if strategy == "dq_weighted" else "none"},
        "split": {"validation_fraction": 0.2, "seed": seed}})
    config = config.model_copy(update={"federation": config.federation.model_copy(
        update={"strategy_options": dict(options)})})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = _run_pfgl(tables, dictionary, config, audit_dir=Path(tmp) / "audit")
    seconds = time.perf_counter() - t0
    curves = {m: [float(rnd[m]) for rnd in res.pooled] for m in METRICS}
    mean_curves = {m: [float(np.nanmean([h[m] for h in rnd.values()])) for rnd in res.rounds] for m in METRICS}
    return {
        "curves_pooled": curves,
        "curves_mean_over_hospitals": mean_curves,
        "final": {m: float(np.mean(c[-3:])) for m, c in curves.items()},
        "final_mean_over_hospitals": {m: float(np.mean(c[-3:])) for m, c in mean_curves.items()},
        "rounds_to_convergence": {m: convergence_round(c, tol=tol) for m, c in curves.items()},
        "final_per_hospital": {n: {m: h[m] for m in METRICS} for n, h in res.rounds[-1].items()},
        "weights_per_round": res.weights if strategy == "dq_weighted" else "sample counts (n_i)",
        "released_last_round": res.released[-1] if strategy == "dq_weighted" else None,
        "seconds": seconds, "median_round_seconds": statistics.median(res.round_seconds),
    }


def summarise(runs: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for key in ("final", "final_mean_over_hospitals", "rounds_to_convergence"):
        for m in METRICS:
            vals = [r[key][m] for r in runs]
            out.setdefault(key, {})[m] = {"median": float(np.median(vals)), "mean": float(np.mean(vals)),
                                          "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                                          "per_seed": vals}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="2 arms x 1 seed, 1200 patients")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--n-patients", type=int, default=2000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=list(ARMS))
    ap.add_argument("--tol", type=float, default=0.01)
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    a = ap.parse_args()
    if a.quick:
        a.n_patients, a.seeds = 1200, [0]
        a.arms = a.arms if a.arms != list(ARMS) else ["fedavg", "pfgl_dq"]
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    dictionary = load_dictionary()
    per_arm: dict[str, list[dict]] = {arm: [] for arm in a.arms}
    hospitals: dict[int, dict] = {}
    t0 = time.perf_counter()
    for seed in a.seeds:
        tables, facts = make_tables(n_patients=a.n_patients, seed=seed, min_size=max(20, a.n_patients // 50))
        hospitals[seed] = facts
        for arm in a.arms:  # interleaved: every arm sees the same hospitals
            r = run_arm(arm, tables, dictionary, rounds=a.rounds, seed=seed, tol=a.tol,
                        local_epochs=a.local_epochs, batch_size=a.batch_size)
            r["seed"] = seed
            per_arm[arm].append(r)
            print(f"seed {seed} {arm:28s} final " + " ".join(f"{m}={r['final'][m]:.4f}" for m in METRICS)
                  + f"  conv={r['rounds_to_convergence']}  {r['seconds']:.1f}s", flush=True)
    out = {
        "benchmark": "pfgl_experiment",
        "machine": {**machine(), "torch_threads": torch.get_num_threads()},
        "parameters": {"rounds": a.rounds, "n_patients": a.n_patients, "seeds": a.seeds, "n_hospitals": 10,
                       "dirichlet_alpha": 0.5, "missing_rates": list(MISSING_RATES), "local_epochs": a.local_epochs,
                       "batch_size": a.batch_size,
                       "hidden": 32, "lr": 0.005, "k_similar": 0, "secure_mode": "masked", "tol": a.tol, "test_fraction": 0.3,
                       "validation_fraction": 0.2, "quality_metric": "f1 (positive class)", "arms": {
                           k: {"strategy": v[0], "options": v[1], "personal": list(v[2]) + ["mask/*"],
                               "fine_tune_epochs": v[3]} for k, v in ARMS.items() if k in a.arms}},
        "hospitals": hospitals,
        "summary": {arm: summarise(runs) for arm, runs in per_arm.items()},
        "runs": per_arm,
        "total_seconds": time.perf_counter() - t0,
    }
    print(json.dumps(out["summary"], indent=1, default=float))
    save(out, out_path(__file__, a), sort_keys=False, indent=1)


if __name__ == "__main__":
    main()
