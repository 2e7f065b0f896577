"""Does early elimination at the SDK's default run length lose the candidate the choice rule
itself prefers? (session 51; reads result files, trains nothing)

The SDK's defaults train four candidates for ``[federation] rounds = 10`` with successive
halving: rungs of 2, 5 and 10 rounds, so the first cut compares each candidate's initial model
and the model after ONE training round. The choice rule is the kept round's federated
validation loss. For every table and seed this script compares the chosen candidate's federated
validation loss with elimination (the default) and without (every candidate trained in full,
``elimination = "none"``), and reports the test AUROC of both choices beside it (read, never
used to decide). Validation loss is the criterion; note the comparison favours "none" slightly
(the minimum over more fully-trained candidates is optimistically biased).

Inputs: ``research/real_tables/results/heldout_elim_{successive_halving,none}_<cohort>.json``
(``real_tables --choose --seeds 5 --elimination ... --name heldout_elim_...``) for the five
earlier tables, and ``results/heldout_tables*.json`` (``--diagnose``) for the held-out ones.

    python -m research.heldout_tables.elimination_check

Writes results/elimination_check.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, out_path, write  # noqa: E402

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "real_tables" / "results"
OLD = ("larynx", "lung", "kidney", "gbsg2", "diabetes")


def _loss(candidates: list[dict], chosen: str) -> float:
    return next(c["validation_loss"] for c in candidates if c["name"] == chosen)


def _row(elim_loss, none_loss, elim_auc, none_auc, elim_chosen, none_chosen) -> dict:  # noqa: ANN001
    d = np.asarray(elim_loss) - np.asarray(none_loss)
    return {
        "seeds": len(d),
        "chosen_validation_loss_elimination": float(np.mean(elim_loss)),
        "chosen_validation_loss_none": float(np.mean(none_loss)),
        "loss_gap_mean": float(d.mean()),
        "seeds_elimination_worse_by_0.01": int((d > 0.01).sum()),
        "same_choice": int(sum(a == b for a, b in zip(elim_chosen, none_chosen, strict=True))),
        "test_auroc_elimination": float(np.mean(elim_auc)),
        "test_auroc_none": float(np.mean(none_auc)),
        "chosen_elimination": elim_chosen,
        "chosen_none": none_chosen,
        "per_seed_loss_gap": [round(float(x), 4) for x in d],
    }


def old_table(cohort: str) -> dict | None:
    files = {e: REAL / f"heldout_elim_{e}_{cohort}.json" for e in ("successive_halving", "none")}
    if not all(f.exists() for f in files.values()):
        return None
    runs = {e: json.loads(f.read_text())["cohorts"][cohort] for e, f in files.items()}
    out = {}
    for e, r in runs.items():
        run = r["nsfl_run"]
        out[e] = {
            "loss": [_loss(c, ch) for c, ch in zip(run["candidates"], run["chosen"], strict=True)],
            "auc": r["methods"]["nsfl_federated_chosen"]["mean_over_hospitals"]["auroc"][
                "per_seed"
            ],
            "chosen": run["chosen"],
        }
    e, n = out["successive_halving"], out["none"]
    return _row(e["loss"], n["loss"], e["auc"], n["auc"], e["chosen"], n["chosen"])


def heldout_table(res: dict) -> dict:
    run = res["nsfl_run"]
    elim = [_loss(c, ch) for c, ch in zip(run["candidates"], run["chosen"], strict=True)]
    none = [_loss(x["candidates"], x["chosen"]) for x in run["elimination_none"]]
    return _row(
        elim,
        none,
        res["methods"]["sdk_default_federated"]["mean_over_hospitals"]["auroc"]["per_seed"],
        res["methods"]["sdk_no_elimination"]["mean_over_hospitals"]["auroc"]["per_seed"],
        run["chosen"],
        [x["chosen"] for x in run["elimination_none"]],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="the same (it only reads result files)")
    a = ap.parse_args()
    tables = {c: r for c in OLD if (r := old_table(c)) is not None}
    for held in sorted((HERE / "results").glob("heldout_tables*.json")):
        if held.stem.endswith("_quick"):
            continue
        for c, res in json.loads(held.read_text())["cohorts"].items():
            if res["nsfl_run"].get("elimination_none"):
                tables[c] = heldout_table(res)
    for c, r in tables.items():
        print(
            f"{c:15s} val loss elim {r['chosen_validation_loss_elimination']:.4f} none "
            f"{r['chosen_validation_loss_none']:.4f} (elim worse by >0.01 on {r['seeds_elimination_worse_by_0.01']}"
            f"/{r['seeds']}, same choice {r['same_choice']}/{r['seeds']}); test AUROC elim "
            f"{r['test_auroc_elimination']:.3f} none {r['test_auroc_none']:.3f}"
        )
    write(out_path(__file__, a), {"tables": tables, "note": __doc__.split("\n\n")[1]})


if __name__ == "__main__":
    main()
