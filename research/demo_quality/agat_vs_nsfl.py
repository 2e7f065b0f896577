"""AGAT (Molaei et al., AISTATS 2024) against NS-FL on the demo's four hospitals.

    python -m research.demo_quality.agat_vs_nsfl                 # 3 seeds, 15 rounds, full demo size
    python -m research.demo_quality.agat_vs_nsfl --quick         # 1 seed, 3 rounds, 1/4 size; prints, writes nothing

Hospitals: sdk/datasets/alarm.py (north 2400, south 1600, east 1000 without blood gases,
west 600 without blood gases and SVR; task SHUNT = HIGH), one table set per seed. Splits: the
hospital split rule (sdk/federation/split.py: test 30 %, validation 20 % of the rest), the
same test patients for every arm. Model selection uses validation patients only:

- ``nsfl``: NS-FL, the demo's federation (sdk/demo/run.py ``demo_config``), masked,
  FedSGD; round kept by federated validation loss, Platt on validation.
- ``agat_plaintext``: AGAT, ``insecure_attention`` (FedAtt layer-wise at the server) under
  ``insecure_plaintext``; same selection and calibration.
- ``agat_secure``: AGAT, ``agat_secure_attention`` (each hospital weighs itself by
  exp(FedAtt logit) inside the masked sum) under ``masked``; same selection and calibration.
- ``fedavg_mlp_aligned``: FedAvg of an MLP on the features every hospital has
  (sdk/demo/baselines.py), the number of rounds chosen on the pooled validation loss.
- ``standalone_mlp``: an MLP per hospital on its own features, its epochs chosen on its own
  validation loss.

Every federated arm: ``rounds`` rounds of 2 local epochs, Adam lr 0.003, batch 64 (the demo's
[training]); AGAT with the paper's appendix B network (GATConv 128, 1 head, dropout 0.25) and
k = 5. Writes research/demo_quality/results/agat_vs_nsfl.json. Asserts nothing.
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

ARMS = ("nsfl", "agat_plaintext", "agat_secure", "fedavg_mlp_aligned", "standalone_mlp")


def federated_config(*, arm: str, rounds: int, seed: int):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.demo.run import demo_config

    base = demo_config(rounds=rounds, seed=seed, secure_mode="masked")
    if arm == "nsfl":
        return base
    data = base.model_dump(mode="json")
    data["release"] = {}
    data["task"] = "agat"
    data["agat"] = {"hidden": 128, "heads": 1, "dropout": 0.25, "k_neighbours": 5}
    data["selection"]["restarts"] = 1  # the demo's restarts (session 8) are for NS-FL only; refused for agat
    fed = data["federation"]
    fed["id"] = f"agat-{arm.split('_')[1]}"
    if arm == "agat_plaintext":
        fed.update(secure_mode="insecure_plaintext", strategy="insecure_attention", strategy_options={"server_lr": 1.0})
    else:
        fed.update(secure_mode="masked", strategy="agat_secure_attention", strategy_options={"server_lr": 1.0})
    return SimulationConfig.model_validate(data)


def run_federated(arm: str, tables, dictionary, *, rounds: int, seed: int) -> tuple[dict, dict]:
    from clinograph.sdk.agat.federation import run_agat_simulation
    from clinograph.sdk.federation.simulate import simulate_one as simulate
    from clinograph.secure.audit import verify_audit_dir

    config = federated_config(arm=arm, rounds=rounds, seed=seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        audit = Path(tmp) / "audit"
        run = simulate if arm == "nsfl" else run_agat_simulation
        res = run(tables, dictionary, config, audit_dir=audit)
        ok = verify_audit_dir(audit).ok
    info = {"seconds": round(time.perf_counter() - t0, 1), "rounds_run": len(res.rounds),
            "selected_round": res.selection.get("round"), "audit_verifies": bool(ok),
            "secure_mode": config.federation.secure_mode, "strategy": config.federation.strategy}
    return {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in res.final.items()}, info


def run_baselines(tables, splits, *, rounds: int, seed: int) -> dict[str, dict]:
    """FedAvg-aligned and standalone MLPs; rounds / epochs chosen on validation loss only."""
    from clinograph.sdk.config import TrainConfig
    from clinograph.sdk.demo.baselines import fedavg_aligned, standalone

    tc = TrainConfig(lr=0.003, batch_size=64, seed=seed)
    val = [(s.train, s.validation) for s in splits]
    test = [(s.train, s.test) for s in splits]
    nval = np.array([len(s.validation) for s in splits], float)
    candidates = sorted({max(1, rounds // 3), max(1, 2 * rounds // 3), rounds})
    best_r = min(candidates, key=lambda r: float(np.dot(nval, [m["loss"] for m in fedavg_aligned(
        tables, val, rounds=r, local_epochs=2, hidden=32, config=tc, seed=seed)[0].values()])))
    fedavg, aligned = fedavg_aligned(tables, test, rounds=best_r, local_epochs=2, hidden=32, config=tc, seed=seed)
    epochs = [2 * c for c in candidates]
    on_val = {e: standalone(tables, val, epochs=e, hidden=32, config=tc, seed=seed) for e in epochs}
    on_test = {e: standalone(tables, test, epochs=e, hidden=32, config=tc, seed=seed) for e in epochs}
    chosen = {t.site: min(epochs, key=lambda e, s=t.site: on_val[e][s]["loss"]) for t in tables}
    alone = {site: on_test[e][site] for site, e in chosen.items()}
    strip = lambda d: {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in d.items()}  # noqa: E731
    return {"fedavg_mlp_aligned": (strip(fedavg), {"rounds_selected": best_r, "aligned_features": aligned}),
            "standalone_mlp": (strip(alone), {"epochs_selected": chosen})}


def goals(summary: dict) -> dict:
    sites = [s for s in summary["nsfl"] if s != "mean_over_hospitals"]
    m = lambda arm, site: summary[arm][site]["auroc"]["mean"]  # noqa: E731
    return {
        "nsfl_ge_agat_every_hospital": {s: m("nsfl", s) >= max(m("agat_plaintext", s), m("agat_secure", s))
                                        for s in sites},
        "agat_ge_fedavg_aligned": {s: m("agat_plaintext", s) >= m("fedavg_mlp_aligned", s) for s in sites},
        "agat_ge_fedavg_aligned_mean": m("agat_plaintext", "mean_over_hospitals") >= m("fedavg_mlp_aligned",
                                                                                          "mean_over_hospitals"),
        "secure_within_0.01_of_plaintext": {s: abs(m("agat_secure", s) - m("agat_plaintext", s)) <= 0.01
                                            for s in sites + ["mean_over_hospitals"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="1 seed, 3 rounds, 1/4 size")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    from clinograph.sdk.datasets.alarm import (
        DEFAULT_HOSPITALS,
        load_dictionary,
        make_hospital_tables,
    )
    from clinograph.sdk.federation.split import hospital_split
    from clinograph.sdk.ingest import ingest

    seeds = [0] if args.quick else list(range(args.seeds))
    rounds = 3 if args.quick else args.rounds
    scale = 0.25 if args.quick else 1.0
    hospitals = tuple(replace(h, n_patients=max(60, int(h.n_patients * scale))) for h in DEFAULT_HOSPITALS)
    dictionary = load_dictionary()
    per_seed, runs = [], []
    t0 = time.perf_counter()
    for seed in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tables = [ingest(df, schema=s, dictionary=dictionary)
                      for df, s in make_hospital_tables(seed=seed, hospitals=hospitals)]
        cfg = federated_config(arm="nsfl", rounds=rounds, seed=seed)
        splits = [hospital_split(t.labels, site=t.site, test_fraction=cfg.split.test_fraction,
                                 validation_fraction=cfg.split.validation_fraction, seed=cfg.split.seed)
                  for t in tables]
        results, info = {}, {}
        for arm in ARMS[:3]:
            results[arm], info[arm] = run_federated(arm, tables, dictionary, rounds=rounds, seed=seed)
            print(f"seed {seed} {arm}: " + ", ".join(f"{k} {v['auroc']:.3f}" for k, v in sorted(results[arm].items()))
                  + f" ({info[arm]['seconds']} s)", flush=True)
        for arm, (res, extra) in run_baselines(tables, splits, rounds=rounds, seed=seed).items():
            results[arm], info[arm] = res, extra
            print(f"seed {seed} {arm}: " + ", ".join(f"{k} {v['auroc']:.3f}" for k, v in sorted(res.items())), flush=True)
        per_seed.append(results)
        runs.append({"seed": seed, "info": info,
                     "hospitals": {t.site: {"patients": t.n_patients, "test": int(len(s.test)),
                                            "test_positives": int(t.labels[s.test].sum()),
                                            "validation": int(len(s.validation)),
                                            "features": len(t.observed_nodes())} for t, s in zip(tables, splits, strict=True)}})
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
