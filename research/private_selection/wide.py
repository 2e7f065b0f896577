"""Distributed DP on the wide path alone, at the DP-LR reference's settings (issue 30's Done-when).

The study (:mod:`.private_selection`) found central DP-LR on the pooled patients (full-batch DP
gradient descent, q = 1, per-patient clip 1, lr 1, 50 steps) within 0.01 of the non-DP SDK default
at ε = 3, and every federated DP arm far below. Distributed DP with full-batch FedSGD is nearly
that mechanism (one noisy sum of clipped per-patient gradients a round; K/h times the central
variance with h = ``min_honest``), so these arms run it with :data:`.private_selection.DP_LR`'s
settings, FIXED IN ADVANCE (nothing tuned, nothing chosen on test):

- ``distributed_wide_eps<e>``: ``[privacy] mode = "distributed"``, the wide path alone (the SDK's
  ``wide`` default candidate: ``[model] deep = false``, a federated logistic regression over every
  dictionary feature; its ``wide_lr_factor`` = 5 only acts on the local optimisers, not on
  distributed DP's FedSGD step), q = 1, C = 1, server lr 1 (``strategy = "fedsgd"``), 50 rounds,
  ``min_honest`` = 2, σ calibrated to ε as ``clinograph demo`` does
  (``distributed_noise_multiplier(..., rounds=distributed_rounds(cfg))``), selection off;
- ``distributed_wide_hK_eps3``: the same with ``min_honest`` = K (every hospital honest: each adds
  1/K of the noise, the central-DP limit of the mechanism), or the largest h the masked mode allows
  (:func:`largest_min_honest`: 3 of gbsg2's 4 hospitals, whose masking graph has 2 neighbours);
- ``local_dp_wide_eps<e>``: local DP-SGD on the same ``wide`` candidate, otherwise the SDK
  defaults (10 rounds, 2 local epochs, batch 64, C = 1).

The same cohorts, splits and seeds as the study; writes ``results/private_selection_wide.json``
after every cohort and seed, and with ``--round-cost`` one distributed-wide round against one
non-DP round of the same model (one local epoch), interleaved, median. Asserts nothing.

    python -m research.private_selection.wide --cohorts gbsg2,lung,kidney,diabetes,larynx --seeds 5
    python -m research.private_selection.wide --round-cost gbsg2,kidney
    python -m research.private_selection.wide --markdown
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, median, out_path, write  # noqa: E402
from research.private_selection.private_selection import (  # noqa: E402
    DELTA,
    DP_LR,
    EPSILONS,
    distributed_dp_config,
    interleaved_rounds,
    load_cohort,
    mean_auroc,
    measure_round_costs,
    run_arm,
    sdk_dp_config,
    stored,
)

#: the SDK's ``wide`` default candidate (sdk/federation/candidates.py, DEFAULT_BINARY_CANDIDATES)
WIDE = {"model": {"deep": False}, "training": {"wide_lr_factor": 5.0}}
#: the study's arms shown beside these (results/private_selection.json, the same cohorts, splits, seeds)
STUDY_ROWS = ("reference", "lr_standalone", "local_dp_eps3", "distributed_eps3", "dp_lr_pooled_eps1",
              "dp_lr_pooled_eps3", "dp_lr_pooled_eps8")


def _with(cfg, over: dict):  # noqa: ANN001, ANN202
    from clinograph.sdk.config import merge_sections

    return type(cfg).model_validate(merge_sections(cfg.model_dump(mode="python", by_alias=True, exclude_unset=True),
                                                   over))


def distributed_wide_config(cohort: str, seed: int, *, epsilon: float, min_honest: int, tables, dictionary,
                            work: Path):  # noqa: ANN001
    """Distributed DP on the wide path at :data:`DP_LR`'s settings (q = 1, C, server lr, rounds),
    ``min_honest`` = h (the masked threshold raised to h when above 2), σ calibrated to ``epsilon`` over :func:`distributed_rounds` as the demo does."""
    return distributed_dp_config(cohort, seed, epsilon=epsilon, tables=tables, dictionary=dictionary, work=work,
                                 rounds=DP_LR["steps"], clip=DP_LR["clip"], server_lr=DP_LR["lr"],
                                 min_honest=min_honest, over=WIDE)


def local_wide_config(cohort: str, seed: int, *, epsilon: float, work: Path):  # noqa: ANN201
    """Local DP-SGD at ``epsilon`` on the ``wide`` candidate, otherwise the study's local-DP arm."""
    return _with(sdk_dp_config(cohort, seed, epsilon=epsilon, selection=False, work=work), WIDE)


def largest_min_honest(n: int) -> int:
    """The largest h the masked mode can promise for ``n`` hospitals: K, or k + 1 when the masking
    graph has k < K - 1 neighbours (h needs a threshold t >= h, and t <= k + 1; 4 hospitals: k = 2, h = 3)."""
    from clinograph.secure.masking.params import neighbour_count

    return min(n, neighbour_count(n) + 1)


def arm_configs(cohort: str, seed: int, *, epsilons: tuple[float, ...], tables, dictionary, work: Path) -> dict:  # noqa: ANN001
    """Every wide arm's config for one seed, by arm name."""
    out = {}
    for e in epsilons:
        out[f"distributed_wide_eps{e:g}"] = distributed_wide_config(cohort, seed, epsilon=e, min_honest=2,
                                                                    tables=tables, dictionary=dictionary,
                                                                    work=work / f"d{e:g}")
    if 3.0 in epsilons:
        out["distributed_wide_hK_eps3"] = distributed_wide_config(cohort, seed, epsilon=3.0,
                                                                  min_honest=largest_min_honest(len(tables)),
                                                                  tables=tables, dictionary=dictionary,
                                                                  work=work / "dk")
    for e in epsilons:
        out[f"local_dp_wide_eps{e:g}"] = local_wide_config(cohort, seed, epsilon=e, work=work / f"l{e:g}")
    return out


def run_seed(cohort: str, seed: int, *, epsilons: tuple[float, ...], tables, dictionary) -> dict:  # noqa: ANN001
    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfgs = arm_configs(cohort, seed, epsilons=epsilons, tables=tables, dictionary=dictionary, work=Path(tmp))
        for name, cfg in cfgs.items():
            arms[name] = run_arm(tables, dictionary, cfg, choose=False)
            arms[name]["noise_multiplier"] = cfg.privacy.noise_multiplier
            arms[name]["min_honest"] = cfg.privacy.min_honest
            print(f"{cohort} seed {seed} {name}: AUROC {mean_auroc(arms[name]['final']):.3f} in "
                  f"{arms[name]['seconds']:.0f} s", flush=True)
    return arms


def round_cost(cohort: str, tables, dictionary, *, rounds: int, work: Path) -> dict:  # noqa: ANN001
    """One distributed-wide round (ε = 3, h = 2) against one non-DP round of the same model (the
    wide candidate, one local epoch, the SDK's default strategy), built first, then run
    interleaved; medians over ``rounds`` (no test evaluation in the timed part)."""
    cfgs = {"no_dp_wide_one_epoch": _with(sdk_dp_config(cohort, 0, epsilon=None, selection=False, work=work / "a"),
                                          WIDE | {"federation": {"local_epochs": 1}}),
            "distributed_wide_eps3": distributed_wide_config(cohort, 0, epsilon=3.0, min_honest=2, tables=tables,
                                                             dictionary=dictionary, work=work / "b")}
    times = interleaved_rounds(tables, dictionary, cfgs, rounds=rounds, work=work)
    med = {k: median(v) for k, v in times.items()}
    return {"rounds": rounds, "patients": int(sum(t.n_patients for t in tables)), "median_seconds": med,
            "seconds": times, "ratio": med["distributed_wide_eps3"] / med["no_dp_wide_one_epoch"]}


def summary(per_seed: list[dict]) -> dict:
    """Per arm: mean / sd / per-seed of the mean-over-hospitals test AUROC, σ, h, the ε composed
    (mean over hospitals of the last ledger entry) and the median round time."""
    out = {}
    for k in per_seed[0]:
        runs = [s[k] for s in per_seed]
        vals = [mean_auroc(r["final"]) for r in runs]
        eps = [v["epsilon"] for r in runs for v in r["ledger"].values() if v.get("epsilon") is not None]
        out[k] = {"auroc_mean": float(np.mean(vals)), "auroc_sd": float(np.std(vals)), "auroc_per_seed": vals,
                  "noise_multiplier": runs[0]["noise_multiplier"], "min_honest": runs[0]["min_honest"],
                  "epsilon_mean_over_hospitals": float(np.mean(eps)) if eps else None,
                  "round_seconds_median": median([x for r in runs for x in r["round_seconds"]]),
                  "rounds_run": runs[0]["rounds_run"]}
    return out


def markdown(payload: dict, study: dict) -> str:
    """The README's tables: test AUROC per cohort (seed sd) and mean, σ, beside the study's
    (``study``: its result file) reference arms; and the Done-when against the study's non-DP
    default and LR standalone on the same cohorts."""
    cohorts = payload["cohorts"]
    ref = {k: [study["cohorts"][c]["summary"][k] for c in cohorts] for k in STUDY_ROWS}
    reference = float(np.mean([x["auroc_mean"] for x in ref["reference"]]))
    lr_standalone = float(np.mean([x["auroc_mean"] for x in ref["lr_standalone"]]))
    keys = list(next(iter(cohorts.values()))["summary"])
    lines = ["| arm | σ | " + " | ".join(f"{c} ({len(r['seeds'])} seeds)" for c, r in cohorts.items())
             + " | **mean** | ε ledger |", "|---|---|" + "---|" * (len(cohorts) + 2)]
    means = {}
    for k in keys:
        rows = [r["summary"][k] for r in cohorts.values()]
        means[k] = float(np.mean([x["auroc_mean"] for x in rows]))
        # local DP: each hospital's own σ (calibrated inside the SDK), mean over hospitals and seeds
        sigmas = [x["noise_multiplier"] or float(np.mean([s[k]["ledger"]["noise_multiplier"] for s in r["per_seed"]]))
                  for x, r in zip(rows, cohorts.values(), strict=True)]
        sig = "–".join(f"{v:.2f}" for v in sorted({min(sigmas), max(sigmas)}))
        eps = max(x["epsilon_mean_over_hospitals"] for x in rows)
        lines.append(f"| {k} | {sig} | " + " | ".join(f"{x['auroc_mean']:.3f} ± {x['auroc_sd']:.3f}" for x in rows)
                     + f" | **{means[k]:.3f}** | {eps:.3f} |")
    for k, rows in ref.items():
        lines.append(f"| {k} (study) | - | " + " | ".join(f"{x['auroc_mean']:.3f} ± {x['auroc_sd']:.3f}" for x in rows)
                     + f" | **{np.mean([x['auroc_mean'] for x in rows]):.3f}** | - |")
    lines += ["", "| target (mean over the tables) | arm | measured | met |", "|---|---|---|---|"]
    for k, v in means.items():
        e = float(k.rsplit("eps", 1)[1])
        tol = 0.03 if e >= 3 else 0.06
        if e not in (1.0, 3.0):
            continue
        ok = v >= reference - tol and (e < 3 or v >= lr_standalone)
        what = f"within {tol} of {reference:.3f}" + (f", ≥ LR standalone {lr_standalone:.3f}" if e >= 3 else "")
        lines.append(f"| ε = {e:g}: {what} | {k} | {v:.3f} ({v - reference:+.3f}) | {'met' if ok else 'not met'} |")
    if payload.get("round_cost"):
        lines += ["", "| cohort (patients) | no DP wide, 1 epoch | distributed wide ε = 3 | ratio |", "|---|---|---|---|"]
        for c, r in payload["round_cost"].items():
            m = r["median_seconds"]
            lines.append(f"| {c} ({r['patients']}) | {m['no_dp_wide_one_epoch']:.3f} | "
                         f"{m['distributed_wide_eps3']:.3f} | {r['ratio']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default="gbsg2,lung,kidney,diabetes,larynx")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    add_convention(ap, quick_help="lung, 1 seed, ε = 3")
    ap.add_argument("--round-cost", default="", help="cohorts whose distributed-wide and non-DP wide rounds are "
                    "timed interleaved (comma-separated; other results kept)")
    ap.add_argument("--markdown", action="store_true", help="print the README's tables of the result file and exit")
    a = ap.parse_args()
    out = out_path(__file__, a, name="private_selection_wide")
    if a.markdown:
        study = json.loads((out.parent / "private_selection.json").read_text())
        print(markdown(json.loads(out.read_text()), study))
        return
    if a.quick:
        a.cohorts, a.seeds, a.epsilons = "lung", 1, "3"
    eps = tuple(float(x) for x in a.epsilons.split(","))
    old = json.loads(out.read_text()) if out.exists() and not a.quick else {}
    payload = {**old, "machine": machine(), "epsilons": list(eps), "delta": DELTA, "dp_lr": DP_LR,
               "cohorts": dict(old.get("cohorts", {}))}
    if a.round_cost:
        payload["round_cost"] = dict(old.get("round_cost", {}))
        measure_round_costs(a.round_cost, payload["round_cost"], round_cost, save=lambda: write(out, payload))
        return
    for cohort in (x for x in a.cohorts.split(",") if x):
        c, tables = load_cohort(cohort)
        per_seed: list[dict] = []
        for seed in range(a.seeds):
            per_seed.append(run_seed(cohort, seed, epsilons=eps, tables=tables, dictionary=c.dictionary))
            payload["cohorts"][cohort] = {
                "hospitals": {t.site: t.n_patients for t in tables}, "seeds": list(range(len(per_seed))),
                "summary": summary(per_seed),
                "per_seed": [{k: stored(v) | {"noise_multiplier": v["noise_multiplier"]} for k, v in s.items()}
                             for s in per_seed]}
            write(out, payload)


if __name__ == "__main__":
    main()
