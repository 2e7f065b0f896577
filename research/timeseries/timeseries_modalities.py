"""NS-FL with and without the waveform modality on the modality-gap hospital set (issue 16 item 3).

    python -m research.timeseries.timeseries_modalities            # 3 seeds, 12 rounds
    python -m research.timeseries.timeseries_modalities --quick    # 1 seed, 3 rounds, 1/4 size; prints, writes nothing

Hospitals: sdk/datasets/timeseries.py ``MODALITY_GAP_HOSPITALS`` (as NS-FL's MC-MED experiment):
two with static variables + vital-sign series + a PPG waveform segment, two with static + vitals,
two with static variables and one spot check only; outcome ``shock_4h``. Same splits for all
arms (test 30 %, validation 20 % of the rest); model selection on validation only.

- ``nsfl_static``: NS-FL on the latest star (no waveform), stars only, masked, FedSGD.
- ``nsfl_modalities``: the same plus the waveform as a modality node after a 1-D CNN encoder
  (sdk/model/modalities.py), federated only among the two hospitals that record it.
- ``standalone_lr`` / ``pooled_lr``: logistic regression references on the table features.

Every federated arm: ``rounds`` rounds of 2 local epochs, Adam lr 0.003, batch 64, hidden 32.
Writes research/timeseries/results/timeseries_modalities.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402

ARMS = ("nsfl_static", "nsfl_modalities", "standalone_lr", "pooled_lr")


def config(*, arm: str, rounds: int, seed: int):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.datasets.timeseries import DICTIONARY_PATH

    model = {"hidden": 32, "init_seed": seed}
    if arm == "nsfl_modalities":
        model["modalities"] = ["waveform"]
    return SimulationConfig.model_validate({
        "federation": {"id": f"ts-{arm.replace('_', '-')}", "rounds": rounds, "secure_mode": "masked",
                       "strategy": "fedsgd", "server_lr": 1.0, "min_clients": 3, "local_epochs": 2, "seed": seed},
        "model": model, "training": {"lr": 0.003, "batch_size": 64, "seed": seed}, "split": {"seed": seed},
        "graph": {"k_similar": 0}, "dictionary": str(DICTIONARY_PATH)})


def modality_factory(signals_by_site):
    """Each hospital's modality task over its own signals (``simulate(task_factory=...)``)."""
    from clinograph.sdk.federation.modality_task import build_modality_task

    def factory(table, hconf):
        return build_modality_task(table, dictionary=table.dictionary, config=hconf, signals=signals_by_site[table.site])

    return factory


def run_arm(arm: str, tables, signals, *, rounds: int, seed: int) -> tuple[dict, dict]:
    from clinograph.sdk.federation.simulate import simulate
    from clinograph.secure.audit import verify_audit_dir

    cfg = config(arm=arm, rounds=rounds, seed=seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        audit = Path(tmp) / "audit"
        if arm == "nsfl_modalities":
            factory = modality_factory({t.site: s for t, s in zip(tables, signals, strict=True)})
            res = simulate(tables, tables[0].dictionary, cfg, audit_dir=audit, task_factory=factory)
        else:
            res = simulate(tables, tables[0].dictionary, cfg, audit_dir=audit)
        ok = verify_audit_dir(audit).ok
    info = {"seconds": round(time.perf_counter() - t0, 1), "selected_round": res.selection.get("round"),
            "audit_verifies": bool(ok)}
    return {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in res.final.items()}, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="1 seed, 3 rounds, 1/4 size")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    from clinograph.sdk.datasets.timeseries import (
        MODALITY_GAP_HOSPITALS,
        load_dictionary,
        make_timeseries_sites,
        waveform_matrix,
    )
    from clinograph.sdk.demo.baselines import pooled_lr, standalone_lr
    from clinograph.sdk.federation.split import hospital_split
    from clinograph.sdk.ingest import ingest

    seeds = [0] if args.quick else list(range(args.seeds))
    rounds = 3 if args.quick else args.rounds
    scale = 0.25 if args.quick else 1.0
    hospitals = tuple(replace(h, n_patients=max(60, int(h.n_patients * scale))) for h in MODALITY_GAP_HOSPITALS)
    dictionary = load_dictionary()
    per_seed, runs = [], []
    t0 = time.perf_counter()
    for seed in seeds:
        sites = make_timeseries_sites(seed=seed, hospitals=hospitals)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tables = [ingest(s.table, schema=s.schema, dictionary=dictionary) for s in sites]
        signals = []
        for s, t in zip(sites, tables, strict=True):
            w, has = waveform_matrix(s, t.patient_ids)
            signals.append({"waveform": (w, has)} if has.any() else {})
        cfg = config(arm="nsfl_static", rounds=rounds, seed=seed)
        splits = [hospital_split(t.labels, site=t.site, test_fraction=cfg.split.test_fraction,
                                 validation_fraction=cfg.split.validation_fraction, seed=cfg.split.seed)
                  for t in tables]
        results, info = {}, {}
        for arm in ARMS[:2]:
            results[arm], info[arm] = run_arm(arm, tables, signals, rounds=rounds, seed=seed)
            print(f"seed {seed} {arm}: " + ", ".join(f"{k} {v['auroc']:.3f}" for k, v in sorted(results[arm].items()))
                  + f" ({info[arm]['seconds']} s)", flush=True)
        strip = lambda d: {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in d.items()}  # noqa: E731
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results["standalone_lr"] = strip(standalone_lr(tables, splits))
            results["pooled_lr"] = strip(pooled_lr(tables, splits))
        per_seed.append(results)
        runs.append({"seed": seed, "info": info,
                     "hospitals": {t.site: {"patients": t.n_patients, "modalities": list(h.modalities),
                                            "test_positives": int(t.labels[s.test].sum())}
                                   for t, s, h in zip(tables, splits, hospitals, strict=True)}})
    sites_ = sorted(per_seed[0]["nsfl_static"])
    summary = {arm: {site: {m: {"mean": float(np.mean(v := [s[arm][site][m] for s in per_seed])),
                                "sd": float(statistics.stdev(v)) if len(v) > 1 else 0.0, "per_seed": v}
                            for m in ("auroc", "auprc")} for site in sites_} for arm in ARMS}
    for arm in ARMS:
        print(f"{arm:16s} " + "  ".join(f"{s} {summary[arm][s]['auroc']['mean']:.3f}" for s in sites_))
    payload = {"setup": __doc__.split("Writes")[0].strip(), "seeds": seeds, "rounds": rounds, "summary": summary,
               "runs": runs, "per_seed": per_seed, "total_seconds": round(time.perf_counter() - t0, 1),
               "machine": machine()}
    write(out_path(__file__, args), payload)


if __name__ == "__main__":
    main()
