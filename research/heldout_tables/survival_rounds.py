"""Is the survival head at the SDK's defaults (``[federation] rounds = 10``) trained long enough?
(session 51)

On the held-out lymph-node table the survival head's federated validation loss was still falling
at round 10, and the kept round was the last one. This study runs the survival form at the SDK
defaults (only ``[target]`` and the seeds set) with ``rounds`` = 10 (the default) and 30 (the stop
rule, patience 5, may end it sooner) on three tables -- lymph_node (held out), gbsg2 and lung
(:mod:`clinograph.sdk.datasets.real_tables`, survival form) -- and records the kept round, the
rounds run, the federated validation loss of the kept model (the criterion) and, beside it, the
test C-index and horizon AUROC, with Cox PH standalone and pooled on the same splits.

    python -m research.heldout_tables.survival_rounds            # 3 seeds
    python -m research.heldout_tables.survival_rounds --quick    # lymph_node, 1 seed

Writes results/survival_rounds.json. Asserts nothing.
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
from research.real_tables.real_tables import SURVIVAL_METRICS, summarise  # noqa: E402

ROUNDS = (10, 30)


def _tables(name: str, folder: Path):
    """(tables, dictionary, target) of the survival form of ``name``."""
    from clinograph.sdk.datasets.real_tables import SURVIVAL_TARGETS
    from clinograph.sdk.federation.simulate import load_tables

    import clinograph as cg
    from research.heldout_tables.cohorts import lymph_node, write_cohort
    from research.real_tables.real_tables import load_survival

    if name == "lymph_node":
        c = lymph_node("survival")
        tables, dictionary = load_tables(cg.SimulationConfig.from_toml(write_cohort(c, folder)))
        return tables, dictionary, c.survival_target
    c, tables = load_survival(name)
    return tables, c.dictionary, dict(SURVIVAL_TARGETS[name])


def run(name: str, seeds: list[int], folder: Path) -> dict:
    from clinograph.sdk.federation.simulate import simulate

    import clinograph as cg
    from research.real_tables.survival_baselines import cox_pooled, cox_standalone

    tables, dictionary, target = _tables(name, folder)
    per: dict[str, list[dict]] = {}
    run_info: dict[str, dict[str, list]] = {}
    for seed in seeds:
        for rounds in ROUNDS:
            fed = {"id": f"{name}-surv-{seed}", "seed": seed}
            if rounds != 10:
                fed["rounds"] = rounds
            config = cg.SimulationConfig.model_validate({"federation": fed, "target": target})
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                res = simulate(tables, dictionary, config, audit_dir=Path(tmp) / "audit")
            key = f"sdk_default_rounds{rounds}"
            info = run_info.setdefault(
                key, {"kept_round": [], "rounds_run": [], "validation_loss": [], "seconds": []}
            )
            info["kept_round"].append(res.selection.get("round"))
            info["rounds_run"].append(len(res.rounds))
            info["validation_loss"].append(res.selection.get("validation_loss"))
            info["seconds"].append(round(time.perf_counter() - t0, 2))
            per.setdefault(key, []).append(res.final)
        splits = [cg.split_patients(t, config=config) for t in tables]
        per.setdefault("cox_standalone", []).append(
            cox_standalone(tables, splits, horizon=target["horizon"])
        )
        per.setdefault("cox_pooled", []).append(
            cox_pooled(tables, splits, horizon=target["horizon"])
        )
        print(
            f"{name} seed {seed}: "
            + ", ".join(
                f"{k} C {np.nanmean([x['cindex'] for x in v[-1].values()]):.3f}"
                for k, v in per.items()
            )
            + " | "
            + ", ".join(
                f"{k} kept {v['kept_round'][-1]}/{v['rounds_run'][-1]} val "
                f"{v['validation_loss'][-1]:.4f}"
                for k, v in run_info.items()
            ),
            flush=True,
        )
    for v in run_info.values():
        v["validation_loss_mean"] = float(np.mean(v["validation_loss"]))
    return {
        "target": target,
        "seeds": seeds,
        "methods": {k: summarise(v, SURVIVAL_METRICS) for k, v in per.items()},
        "runs": run_info,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cohorts", default="lymph_node,gbsg2,lung")
    add_convention(ap, quick_help="lymph_node, 1 seed")
    a = ap.parse_args()
    if a.quick:
        a.cohorts, a.seeds = "lymph_node", 1
    with tempfile.TemporaryDirectory() as tmp:
        payload = {
            "machine": machine(("lifelines",)),
            "rounds": ROUNDS,
            "cohorts": {
                c: run(c, list(range(a.seeds)), Path(tmp) / c) for c in a.cohorts.split(",") if c
            },
        }
    write(out_path(__file__, a), payload)


if __name__ == "__main__":
    main()
