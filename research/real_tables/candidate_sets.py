"""What each default candidate adds to the per-federation choice, on the same runs.

Reads ``research/real_tables/results/real_tables_choice_<cohort>.json`` (``real_tables.py --choose``), where
every candidate of every seed ran and recorded its kept-round federated validation loss and its
(not used for choosing) mean per-hospital test AUROC, and replays the choice rule
(:func:`clinograph.sdk.federation.candidates.choose`, the same ``min_delta``) over every candidate
set that leaves one candidate out. The candidates train independently (same splits, same
seeds), so a smaller set's choice on these runs is exactly what that set would have chosen:
a paired comparison with no extra training.

    python -m research.real_tables.candidate_sets --cohorts gbsg2,lung,kidney,diabetes --runs real_tables_choice_wide_shared

(``--runs``: the result files' prefix, ``<prefix>_<cohort>.json``; session 9 ran
``real_tables.py --choose --seeds 10`` with a fifth default candidate ``wide_shared`` and renamed
its files so.) Writes research/real_tables/results/candidate_sets.json (``--out``). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, results_dir, write  # noqa: E402

RESULTS = results_dir(__file__)


def replay(run: dict, names: list[str], min_delta: float) -> list[float]:
    """Per seed, the test AUROC of the candidate ``choose`` keeps among ``names``."""
    from clinograph.sdk.federation.candidates import choose

    out = []
    for rows, aurocs in zip(run["candidates"], run["candidate_test_auroc"], strict=True):
        rows = [r for r in rows if r["name"] in names]
        k = choose([r["validation_loss"] for r in rows], min_delta=min_delta)
        out.append(float(aurocs[rows[k]["name"]]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default="gbsg2,lung,kidney,diabetes")
    ap.add_argument("--runs", default="real_tables_choice", help="result files <runs>_<cohort>.json")
    add_convention(ap, quick_help="the same analysis (it only reads committed results; seconds)")
    ap.add_argument("--min-delta", type=float, default=None, help="default: the SDK's [selection] min_delta")
    a = ap.parse_args()
    from clinograph.sdk.config import SelectionSection

    min_delta = SelectionSection().min_delta if a.min_delta is None else a.min_delta
    payload: dict = {"machine": machine(), "runs": a.runs, "min_delta": min_delta, "cohorts": {}}
    for cohort in a.cohorts.split(","):
        data = json.loads((RESULTS / f"{a.runs}_{cohort}.json").read_text())["cohorts"][cohort]
        run = data["nsfl_run"]
        names = [r["name"] for r in run["candidates"][0]]
        full = replay(run, names, min_delta)
        sets = {"all": full}
        for n in names:
            sets[f"without_{n}"] = replay(run, [x for x in names if x != n], min_delta)
        ref = {k: data["methods"][k]["mean_over_hospitals"]["auroc"]["mean"]
               for k in ("lr_standalone", "lr_fedavg_aligned", "lr_pooled", "gbm_pooled")}
        payload["cohorts"][cohort] = {
            "seeds": data["seeds"], "candidates": names,
            "chosen_counts": {n: sum(c == n for c in run["chosen"]) for n in names},
            "sets": {k: {"mean_auroc": float(np.mean(v)), "per_seed": v,
                         "paired_delta_vs_all": float(np.mean(np.subtract(v, full)))} for k, v in sets.items()},
            "references": ref}
        print(cohort, {k: round(float(np.mean(v)), 4) for k, v in sets.items()}, ref, flush=True)
    write(out_path(__file__, a), payload)


if __name__ == "__main__":
    main()
