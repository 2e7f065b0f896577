"""Held-out real tables at the SDK's defaults, used as a new integrator would (session 51).

For each cohort of :mod:`.cohorts` (WDBC breast cancer, GBSG2's full lymph-node export, the
Stanford heart transplant programme): write the integrator's files (dictionary.toml, each
hospital's CSV and site schema, simulation.toml with nothing but ``[federation] id/seed``), run
``clinograph check`` on every hospital and ``clinograph simulate`` once (seed 0) as subprocesses
(exit code, seconds), then the Python API (``cg.simulate_from_config``) for every seed, beside the
repository's references on the same splits (``cg.split_patients``): LR standalone, FedAvg LR on
aligned features, LR pooled and GBM pooled (:func:`clinograph.sdk.demo.baselines.reference_baselines`).
Every audit directory is verified.

``--diagnose`` adds, per seed, the same federation with ``[selection] elimination = "none"``
(every candidate trained in full), to see whether early elimination or the validation choice
loses a candidate that does better. ``--survival`` adds the lymph-node cohort's time-to-event
form (NS-FL's hazard head at the defaults, against Cox PH standalone and pooled).

    python -m research.heldout_tables.heldout_tables                  # 3 seeds, every cohort
    python -m research.heldout_tables.heldout_tables --quick          # 1 seed, stanford_heart only

Writes research/heldout_tables/results/heldout_tables.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402
from research.heldout_tables.cohorts import BUILDERS, COHORTS, lymph_node, write_cohort  # noqa: E402
from research.real_tables.real_tables import SURVIVAL_METRICS, summarise  # noqa: E402

CLI = str(Path(sys.executable).with_name("clinograph"))


def _mean(per: dict, key: str = "auroc") -> float:
    return float(np.nanmean([v[key] for v in per.values()]))


def run_cli(args: list[str], cwd: Path) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([CLI, *args], cwd=cwd, capture_output=True, text=True)  # noqa: S603
    out = (p.stdout + p.stderr).strip().splitlines()
    return {
        "args": args,
        "returncode": p.returncode,
        "seconds": round(time.perf_counter() - t0, 2),
        "traceback": any("Traceback" in line for line in out),
        "tail": out[-6:],
    }


def _defaults_run(cohort, folder: Path, seed: int, run: dict):  # noqa: ANN001, ANN202 - a Cohort; (config, result)
    """One run of the SDK defaults on ``cohort``'s files for ``seed``: its time, whether its audit
    directory verifies and the candidate chosen are appended to ``run``."""
    import clinograph as cg

    config = cg.SimulationConfig.from_toml(write_cohort(cohort, folder, seed=seed))
    t0 = time.perf_counter()
    res = cg.simulate_from_config(config)
    run["seconds"].append(round(time.perf_counter() - t0, 2))
    run["audit_verified"].append(bool(cg.verify_audit_dir(res.audit_dir).ok))
    run["chosen"].append(res.choice.get("chosen"))
    return config, res


def run_cohort(name: str, seeds: list[int], folder: Path, diagnose: bool) -> dict:
    from clinograph.sdk.demo.baselines import reference_baselines
    from clinograph.sdk.federation.simulate import load_tables

    import clinograph as cg

    cohort = BUILDERS[name]()
    write_cohort(cohort, folder, seed=seeds[0])
    checks = {
        h.site: run_cli(
            ["check", f"{h.site}_schema.toml", f"{h.site}.csv", "--dictionary", "dictionary.toml"],
            folder,
        )
        for h in cohort.hospitals
    }
    cli_path = write_cohort(cohort, folder / "cli", seed=seeds[0])
    cli = run_cli(["simulate", cli_path.name], cli_path.parent)
    per: dict[str, list[dict]] = {}
    run: dict[str, list] = {
        "chosen": [],
        "candidates": [],
        "candidate_test_auroc": [],
        "seconds": [],
        "audit_verified": [],
        "elimination_none": [],
    }
    for seed in seeds:
        config, res = _defaults_run(cohort, folder, seed, run)
        per.setdefault("sdk_default_federated", []).append(res.final)
        run["candidates"].append(res.choice.get("candidates"))
        run["candidate_test_auroc"].append(
            {k: _mean(v) for k, v in res.metrics_by_candidate.items()}
        )
        tables, _ = load_tables(config)
        splits = [cg.split_patients(t, config=config) for t in tables]
        for k, v in reference_baselines(tables, splits, seed=seed).items():
            per.setdefault(k, []).append(v)
        if diagnose:
            full = cg.SimulationConfig.from_toml(
                write_cohort(
                    cohort, folder / "full", seed=seed, extra={"selection": {"elimination": "none"}}
                )
            )
            t0 = time.perf_counter()
            rf = cg.simulate_from_config(full)
            per.setdefault("sdk_no_elimination", []).append(rf.final)
            run["elimination_none"].append(
                {
                    "seconds": round(time.perf_counter() - t0, 2),
                    "chosen": rf.choice.get("chosen"),
                    "candidates": rf.choice.get("candidates"),
                    "candidate_test_auroc": {
                        k: _mean(v) for k, v in rf.metrics_by_candidate.items()
                    },
                }
            )
        print(
            f"{name} seed {seed}: chose {res.choice.get('chosen')} in {run['seconds'][-1]} s; "
            + ", ".join(f"{k} {_mean(v[-1]):.3f}" for k, v in per.items()),
            flush=True,
        )
    methods = {k: summarise(v) for k, v in per.items()}
    fed = methods["sdk_default_federated"]["mean_over_hospitals"]["auroc"]["mean"]
    return {
        "task": cohort.task,
        "patients": cohort.patients,
        "positives": cohort.positives,
        "censored_before_horizon_dropped": cohort.dropped_censored,
        "hospitals": {
            t.site: {
                "patients": t.n_patients,
                "positives": int(t.labels.sum()),
                "features": len(t.observed_nodes()),
            }
            for t in tables
        },
        "seeds": seeds,
        "check": checks,
        "cli_simulate_seed0": cli,
        "methods": methods,
        "nsfl_run": run,
        "federated_minus_lr_standalone": fed
        - methods["lr_standalone"]["mean_over_hospitals"]["auroc"]["mean"],
        "federated_minus_lr_pooled": fed
        - methods["lr_pooled"]["mean_over_hospitals"]["auroc"]["mean"],
    }


def run_survival(seeds: list[int], folder: Path) -> dict:
    from clinograph.sdk.federation.simulate import load_tables

    import clinograph as cg
    from research.real_tables.survival_baselines import cox_pooled, cox_standalone

    cohort = lymph_node("survival")
    horizon = cohort.survival_target["horizon"]
    per: dict[str, list[dict]] = {}
    run: dict[str, list] = {"seconds": [], "audit_verified": [], "chosen": []}
    for seed in seeds:
        config, res = _defaults_run(cohort, folder, seed, run)
        per.setdefault("sdk_default_survival_federated", []).append(res.final)
        tables, _ = load_tables(config)
        splits = [cg.split_patients(t, config=config) for t in tables]
        per.setdefault("cox_standalone", []).append(cox_standalone(tables, splits, horizon=horizon))
        per.setdefault("cox_pooled", []).append(cox_pooled(tables, splits, horizon=horizon))
        print(
            f"lymph_node survival seed {seed}: "
            + ", ".join(
                f"{k} C {_mean(v[-1], 'cindex'):.3f} AUROC {_mean(v[-1]):.3f}"
                for k, v in per.items()
            ),
            flush=True,
        )
    return {
        "task": cohort.task,
        "target": cohort.survival_target,
        "patients": cohort.patients,
        "events": cohort.positives,
        "seeds": seeds,
        "methods": {k: summarise(v, SURVIVAL_METRICS) for k, v in per.items()},
        "nsfl_run": run,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cohorts", default=",".join(COHORTS))
    ap.add_argument(
        "--diagnose", action="store_true", help="also every candidate in full (elimination none)"
    )
    ap.add_argument(
        "--survival", action="store_true", help="also the lymph-node cohort's survival form"
    )
    ap.add_argument(
        "--workdir",
        default=None,
        help="keep the integrator's files here (default: a temporary folder)",
    )
    add_convention(ap, quick_help="stanford_heart only, 1 seed")
    a = ap.parse_args()
    if a.quick:
        a.cohorts, a.seeds = "stanford_heart", 1
    out = out_path(__file__, a)
    seeds = list(range(a.seeds))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.workdir or tmp)
        payload = {
            "machine": machine(("lifelines", "scikit-learn")),
            "settings": "SDK defaults (simulation.toml sets [federation] id and seed only)",
            "diagnose": a.diagnose,
            "cohorts": {
                c: run_cohort(c, seeds, root / c, a.diagnose) for c in a.cohorts.split(",") if c
            },
        }
        if a.survival:
            payload["survival"] = {"lymph_node": run_survival(seeds, root / "lymph_node_survival")}
    write(out, payload)


if __name__ == "__main__":
    main()
