"""One model at the SDK's defaults plus named overrides, on the real-table cohorts (issue 15):
per cohort × seed × variant the kept round's federated validation loss (what a choice may use),
the kept round, rounds run and the selected model's mean per-hospital test AUROC (reported,
never used), and paired differences against a base variant (``--base``) over the same runs.

    python -m research.real_tables.real_tables_variants --set wide --out real_tables_variants_wide
    python -m research.real_tables.real_tables_variants --set encoding --out real_tables_variants_encoding
    python -m research.real_tables.real_tables_variants --set wide --quick    # 1 cohort, 2 seeds, prints

Sets: ``wide`` (the wide-only candidate: its learning-rate factor and its rounds), ``wd`` (weight
decay on the wide-only and the ``linear`` candidates), ``encoding``
(the GNN candidates with the piecewise value encoding and weight decay, as the demo uses).
Writes benchmarks/results/<out>.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402

_WIDE = {"model": {"deep": False}}
SETS: dict[str, tuple[str, dict[str, dict]]] = {
    "wide": ("w5_r10", {
        "w5_r10": {**_WIDE, "training": {"wide_lr_factor": 5.0}},  # the default candidate `wide`
        "w20_r10": {**_WIDE, "training": {"wide_lr_factor": 20.0}},
        "w5_r30": {**_WIDE, "training": {"wide_lr_factor": 5.0}, "federation": {"rounds": 30}},
    }),
    # session 9: L2 on the candidates (torch Adam's weight_decay), the regularisation FedAvg LR's grid picks
    "wd": ("w5_r10", {
        "w5_r10": {**_WIDE, "training": {"wide_lr_factor": 5.0}},
        "w5_wd1e-3": {**_WIDE, "training": {"wide_lr_factor": 5.0, "weight_decay": 1e-3}},
        "w5_wd1e-2": {**_WIDE, "training": {"wide_lr_factor": 5.0, "weight_decay": 1e-2}},
        "w5_wd3e-2": {**_WIDE, "training": {"wide_lr_factor": 5.0, "weight_decay": 3e-2}},
        "linear": {},
        "linear_wd1e-3": {"training": {"weight_decay": 1e-3}},
        "linear_wd1e-2": {"training": {"weight_decay": 1e-2}},
    }),
    "encoding": ("linear", {
        "linear": {},  # the default candidate `linear`
        "linear_pw": {"model": {"value_encoding": "piecewise"}},
        "linear_pw_wd": {"model": {"value_encoding": "piecewise"}, "training": {"weight_decay": 1e-4}},
        "shape": {"model": {"linear_shape": True}},  # the default candidate `shape`
        "shape_pw_wd": {"model": {"linear_shape": True, "value_encoding": "piecewise"},
                        "training": {"weight_decay": 1e-4}},
    }),
}
COHORTS = ("kidney", "lung", "diabetes", "gbsg2")
#: variants paired against another variant than their set's base
PAIR_WITH = {"linear_wd1e-3": "linear", "linear_wd1e-2": "linear"}


def run(cohort: str, seed: int, overrides: dict) -> dict:
    from clinograph.sdk.config import SimulationConfig, merge_sections
    from clinograph.sdk.federation.simulate import simulate_one

    from research.model_quality import sdk_config
    from research.real_tables.real_tables import load

    c, tables = load(cohort)
    base = sdk_config(seed=seed, dictionary_id=cohort).model_dump(mode="python", by_alias=True)
    cfg = SimulationConfig.model_validate(merge_sections(base, overrides))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = simulate_one(tables, c.dictionary, cfg, audit_dir=Path(tmp) / "audit")
    return {"validation_loss": res.selection.get("validation_loss"), "kept_round": res.selection.get("round"),
            "rounds_run": len(res.rounds), "seconds": round(time.perf_counter() - t0, 2),
            "test_auroc": float(np.nanmean([m["auroc"] for m in res.final.values()])),
            "test_auroc_by_hospital": {h: m["auroc"] for h, m in res.final.items()}}


def paired(rows: list[dict], base: str, variant: str) -> dict:
    """Δ = variant − base over the runs both have: mean, paired t, runs lower (validation loss)."""
    by = {(r["cohort"], r["seed"], r["variant"]): r for r in rows}
    pairs = [(r, by[(r["cohort"], r["seed"], base)]) for r in rows
             if r["variant"] == variant and (r["cohort"], r["seed"], base) in by]
    dv = np.array([a["validation_loss"] - b["validation_loss"] for a, b in pairs])
    da = np.array([a["test_auroc"] - b["test_auroc"] for a, b in pairs])
    sd = dv.std(ddof=1) if len(dv) > 1 else 0.0
    return {"runs": len(pairs), "delta_validation_loss": float(dv.mean()) if len(dv) else None,
            "t": float(dv.mean() / (sd / np.sqrt(len(dv)))) if sd > 0 else None,
            "runs_lower": int((dv < 0).sum()), "delta_test_auroc": float(da.mean()) if len(da) else None,
            "by_cohort": {c: {"validation_loss": float(np.mean([a["validation_loss"] for a, _ in pairs if a["cohort"] == c])),
                              "test_auroc": float(np.mean([a["test_auroc"] for a, _ in pairs if a["cohort"] == c])),
                              "kept_last_round": int(sum(a["kept_round"] == a["rounds_run"] for a, _ in pairs
                                                         if a["cohort"] == c))}
                          for c in sorted({a["cohort"] for a, _ in pairs})}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", choices=sorted(SETS), default=None, help="required, except with --quick (the first)")
    ap.add_argument("--cohorts", nargs="+", default=list(COHORTS))
    ap.add_argument("--seeds", type=int, default=10)
    add_convention(ap, quick_help="the first cohort, 2 seeds")
    a = ap.parse_args()
    if a.set is None:
        if not a.quick:
            ap.error(f"--set is required (one of {', '.join(sorted(SETS))})")
        a.set = sorted(SETS)[0]
    base, variants = SETS[a.set]
    cohorts, seeds = (a.cohorts[:1], [0, 1]) if a.quick else (a.cohorts, list(range(a.seeds)))
    rows = []
    for cohort in cohorts:
        for seed in seeds:
            for name, over in variants.items():
                rows.append({"cohort": cohort, "seed": seed, "variant": name, **run(cohort, seed, over)})
                r = rows[-1]
                print(f"{cohort} seed {seed} {name}: val {r['validation_loss']:.4f} kept {r['kept_round']}/"
                      f"{r['rounds_run']} test AUROC {r['test_auroc']:.3f}", flush=True)
    payload = {"benchmark": "real_tables_variants", "set": a.set, "base": base, "variants": variants,
               "cohorts": cohorts, "seeds": seeds, "machine": machine(), "command": " ".join(sys.argv),
               "paired": {v: {"against": PAIR_WITH.get(v, base), **paired(rows, PAIR_WITH.get(v, base), v)}
                          for v in variants if v not in (base, *PAIR_WITH.values())}, "runs": rows}
    print(payload["paired"])
    write(out_path(__file__, a, name=f"real_tables_variants_{a.set}"), payload)


if __name__ == "__main__":
    main()
