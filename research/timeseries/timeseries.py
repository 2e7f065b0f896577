"""NS-FL static vs temporal, AGAT and the baselines on the time-series federation (issue 16 item 5).

    python -m research.timeseries.timeseries                 # 3 seeds, 12 rounds, full size
    python -m research.timeseries.timeseries --quick         # 1 seed, 3 rounds, 1/4 size; prints, writes nothing

Federation: sdk/datasets/timeseries.py ``DEFAULT_TS_HOSPITALS`` -- 12 hospitals (180-420
patients; ICU hourly, HDU 2-hourly, ward 4-hourly vitals; labs every 4-12 h, some panels
absent; own names, units and long layouts), outcome ``shock_4h`` (Sepsis-3 shock physiology
within 4 h of the prediction time), one table set per seed. Splits: the hospital split rule
(test 30 %, validation 20 % of the rest), the same test patients for every arm. Model
selection on validation patients only:

- ``nsfl_static``: NS-FL on each patient's star at the prediction time (last observation of
  every feature), stars only (k_similar = 0), masked secure aggregation, FedSGD; round kept by
  federated validation loss, Platt on validation.
- ``nsfl_temporal``: the same with ``[model] temporal = "attention"``, window 12 snapshots
  (sdk/model/temporal.py), everything else identical.
- ``agat_plaintext`` / ``agat_secure``: AGAT (sdk/agat; the temporal embedding of the previous
  snapshot, eqs. 7-8, is on for these long tables) with FedAtt at the server under
  ``insecure_plaintext``, or each hospital's own attention weight inside the masked sum; the
  paper's appendix B network (GATConv 128, 1 head, dropout 0.25), k = 5; same selection.
- ``fedavg_mlp_aligned``: FedAvg of an MLP on the features every hospital has (last values),
  rounds chosen on the pooled validation loss; ``standalone_mlp``: an MLP per hospital, epochs
  chosen on its validation loss (sdk/demo/baselines.py, as research/demo_quality/agat_vs_nsfl.py).
- ``standalone_lr`` / ``pooled_lr``: logistic regression alone / pooled (last values and
  observed indicators), C on validation; ``pooled_lr_trend``: pooled LR with each feature's
  change over the window added (a temporal linear reference).

Every federated arm: ``rounds`` rounds of 2 local epochs, Adam lr 0.003, batch 64, hidden 32.
Writes research/timeseries/results/timeseries.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, summarise_arms, write  # noqa: E402

FEDERATED = ("nsfl_static", "nsfl_temporal", "agat_plaintext", "agat_secure")
ARMS = FEDERATED + ("fedavg_mlp_aligned", "standalone_mlp", "standalone_lr", "pooled_lr", "pooled_lr_trend")


def federated_config(*, arm: str, rounds: int, seed: int):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.datasets.timeseries import DICTIONARY_PATH

    data = {
        "federation": {"id": f"ts-{arm}", "rounds": rounds, "secure_mode": "masked", "strategy": "fedsgd",
                       "server_lr": 1.0, "min_clients": 3, "local_epochs": 2, "seed": seed},
        "model": {"hidden": 32, "init_seed": seed},
        "training": {"lr": 0.003, "batch_size": 64, "seed": seed},
        "split": {"seed": seed},
        "graph": {"k_similar": 0},
        "dictionary": str(DICTIONARY_PATH),
    }
    if arm.startswith("nsfl_temporal"):
        data["model"].update(temporal="attention", temporal_window=12)
    if arm == "nsfl_temporal_no_trend":  # ablation: attention over the GNN's snapshot embeddings only
        data["model"].update(temporal_trend=False)
    if arm.startswith("agat"):
        data["task"] = "agat"
        data["agat"] = {"hidden": 128, "heads": 1, "dropout": 0.25, "k_neighbours": 5}
        if arm == "agat_plaintext":
            data["federation"].update(secure_mode="insecure_plaintext", strategy="insecure_attention",
                                      strategy_options={"server_lr": 1.0})
        else:
            data["federation"].update(strategy="agat_secure_attention", strategy_options={"server_lr": 1.0})
    return SimulationConfig.model_validate(data)


def run_federated(arm: str, tables, dictionary, *, rounds: int, seed: int) -> tuple[dict, dict]:
    from clinograph.sdk.agat.federation import run_agat_simulation
    from clinograph.sdk.federation.simulate import simulate
    from clinograph.secure.audit import verify_audit_dir

    config = federated_config(arm=arm, rounds=rounds, seed=seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        audit = Path(tmp) / "audit"
        run = run_agat_simulation if arm.startswith("agat") else simulate
        res = run(tables, dictionary, config, audit_dir=audit)
        ok = verify_audit_dir(audit).ok
    info = {"seconds": round(time.perf_counter() - t0, 1), "rounds_run": len(res.rounds),
            "selected_round": res.selection.get("round"), "audit_verifies": bool(ok),
            "secure_mode": config.federation.secure_mode, "strategy": config.federation.strategy}
    return {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in res.final.items()}, info


def _trend_inputs(table, nodes: np.ndarray, window: int = 12) -> np.ndarray:
    """[n, 3·|nodes|]: last values (0 where missing), observed indicators, and each feature's
    change from its earliest value in the window (0 where seen once)."""
    last, obs = table.dense()
    first_step = max(0, table.n_snapshots - window)
    earliest = np.full_like(last, np.nan)
    for t in range(table.n_snapshots - 1, first_step - 1, -1):  # fill from the latest back to the earliest
        v, o = table.dense(t)
        at_t = o & (table.time.size > 0)
        earliest = np.where(at_t, v, earliest)
    delta = np.where(obs & ~np.isnan(earliest), last - np.nan_to_num(earliest), 0.0)
    return np.concatenate([np.nan_to_num(last[:, nodes]).clip(-5, 5), obs[:, nodes].astype(float),
                           delta[:, nodes].clip(-5, 5)], axis=1)


def pooled_lr_trend(tables, splits) -> dict:
    from clinograph.sdk.demo.baselines import LR_GRID, _fit_lr, _val_loss
    from clinograph.sdk.training.metrics import binary_metrics

    nodes = np.unique(np.concatenate([t.observed_nodes() for t in tables]))
    xs, ys = [_trend_inputs(t, nodes) for t in tables], [t.labels for t in tables]
    cat = lambda part: (np.concatenate([x[getattr(s, part)] for x, s in zip(xs, splits, strict=True)]),  # noqa: E731
                        np.concatenate([y[getattr(s, part)] for y, s in zip(ys, splits, strict=True)]))
    (xt, yt), (xv, yv) = cat("train"), cat("validation")
    best = min((_fit_lr(xt, yt, c) for c in LR_GRID), key=lambda m: _val_loss(yv, m.predict_proba(xv)[:, 1]))
    return {t.site: binary_metrics(ys[i][s.test], best.predict_proba(xs[i][s.test])[:, 1])
            for i, (t, s) in enumerate(zip(tables, splits, strict=True))}


def run_baselines(tables, splits, *, rounds: int, seed: int) -> dict[str, tuple[dict, dict]]:
    from clinograph.sdk.demo.baselines import pooled_lr, standalone_lr

    from research.demo_quality.agat_vs_nsfl import run_baselines as mlp_baselines

    strip = lambda d: {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in d.items()}  # noqa: E731
    out = dict(mlp_baselines(tables, splits, rounds=rounds, seed=seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["standalone_lr"] = (strip(standalone_lr(tables, splits)), {})
        out["pooled_lr"] = (strip(pooled_lr(tables, splits)), {})
        out["pooled_lr_trend"] = (strip(pooled_lr_trend(tables, splits)), {})
    return out


def goals(summary: dict) -> dict:
    sites = [s for s in summary["nsfl_static"] if s != "mean_over_hospitals"]
    m = lambda arm, site: summary[arm][site]["auroc"]["mean"]  # noqa: E731
    mean = "mean_over_hospitals"
    best_nsfl = lambda s: max(m("nsfl_static", s), m("nsfl_temporal", s))  # noqa: E731
    return {
        "temporal_minus_static_mean_auroc": m("nsfl_temporal", mean) - m("nsfl_static", mean),
        "temporal_ge_static_plus_0.03": m("nsfl_temporal", mean) >= m("nsfl_static", mean) + 0.03,
        "nsfl_temporal_ge_agat_every_hospital": {s: m("nsfl_temporal", s) >= max(m("agat_plaintext", s),
                                                                                  m("agat_secure", s)) for s in sites},
        "nsfl_best_ge_agat_every_hospital": {s: best_nsfl(s) >= max(m("agat_plaintext", s), m("agat_secure", s))
                                             for s in sites},
        "agat_ge_fedavg_aligned": {s: m("agat_plaintext", s) >= m("fedavg_mlp_aligned", s) for s in sites},
        "agat_ge_fedavg_aligned_mean": m("agat_plaintext", mean) >= m("fedavg_mlp_aligned", mean),
        "secure_agat_minus_plaintext": {s: m("agat_secure", s) - m("agat_plaintext", s) for s in sites + [mean]},
        "secure_within_0.01_of_plaintext_mean": abs(m("agat_secure", mean) - m("agat_plaintext", mean)) <= 0.01,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="1 seed, 3 rounds, 1/4 size")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset (development)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    from clinograph.sdk.datasets.timeseries import (
        DEFAULT_TS_HOSPITALS,
        load_dictionary,
        make_timeseries_sites,
    )
    from clinograph.sdk.federation.split import hospital_split
    from clinograph.sdk.ingest import ingest

    arms = [a for a in args.arms.split(",") if a]
    seeds = [0] if args.quick else list(range(args.seeds))
    rounds = 3 if args.quick else args.rounds
    scale = 0.25 if args.quick else 1.0
    hospitals = tuple(replace(h, n_patients=max(60, int(h.n_patients * scale))) for h in DEFAULT_TS_HOSPITALS)
    dictionary = load_dictionary()
    per_seed, runs = [], []
    t0 = time.perf_counter()
    for seed in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tables = [ingest(s.table, schema=s.schema, dictionary=dictionary)
                      for s in make_timeseries_sites(seed=seed, hospitals=hospitals)]
        cfg = federated_config(arm="nsfl_static", rounds=rounds, seed=seed)
        splits = [hospital_split(t.labels, site=t.site, test_fraction=cfg.split.test_fraction,
                                 validation_fraction=cfg.split.validation_fraction, seed=cfg.split.seed)
                  for t in tables]
        results, info = {}, {}
        for arm in FEDERATED + ("nsfl_temporal_no_trend",):
            if arm not in arms:
                continue
            results[arm], info[arm] = run_federated(arm, tables, dictionary, rounds=rounds, seed=seed)
            print(f"seed {seed} {arm}: mean AUROC {np.nanmean([v['auroc'] for v in results[arm].values()]):.3f} "
                  f"({info[arm]['seconds']} s)", flush=True)
        if set(arms) - set(FEDERATED) - {"nsfl_temporal_no_trend"}:
            for arm, (res, extra) in run_baselines(tables, splits, rounds=rounds, seed=seed).items():
                results[arm], info[arm] = res, extra
                print(f"seed {seed} {arm}: mean AUROC {np.nanmean([v['auroc'] for v in res.values()]):.3f}",
                      flush=True)
        per_seed.append(results)
        runs.append({"seed": seed, "info": info,
                     "hospitals": {t.site: {"patients": t.n_patients, "snapshots": t.n_snapshots,
                                            "test": int(len(s.test)), "test_positives": int(t.labels[s.test].sum()),
                                            "validation": int(len(s.validation)),
                                            "features": len(t.observed_nodes())}
                                   for t, s in zip(tables, splits, strict=True)}})
    if arms == ["nsfl_temporal_no_trend"]:  # the ablation: its own file
        vals = [float(np.nanmean([v["auroc"] for v in s["nsfl_temporal_no_trend"].values()])) for s in per_seed]
        print("nsfl_temporal_no_trend mean AUROC", vals)
        write(out_path(__file__, args, name="timeseries_ablation"), {"setup": "research/timeseries/timeseries.py --arms nsfl_temporal_no_trend: "
                                                     "NS-FL temporal without the trend term (attention over the "
                                                     "GNN's snapshot embeddings + the static wide path)",
                                                     "seeds": seeds, "rounds": rounds, "per_seed": per_seed,
                                                     "mean_auroc_per_seed": vals, "runs": runs, "machine": machine()})
        return
    if set(ARMS) - set(per_seed[0]):
        print("subset of arms: no summary")
        return
    summary = summarise_arms(per_seed, ARMS)
    payload = {"setup": __doc__.split("Writes")[0].strip(), "seeds": seeds, "rounds": rounds, "local_epochs": 2,
               "summary": summary, "goals": goals(summary), "runs": runs, "per_seed": per_seed,
               "total_seconds": round(time.perf_counter() - t0, 1), "machine": machine()}
    for arm in ARMS:
        r = summary[arm]["mean_over_hospitals"]
        print(f"{arm:20s} AUROC {r['auroc']['mean']:.3f} ± {r['auroc']['sd']:.3f}  AUPRC {r['auprc']['mean']:.3f}")
    print(payload["goals"])
    write(out_path(__file__, args), payload)


if __name__ == "__main__":
    main()
