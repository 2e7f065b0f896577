"""Real-data benchmark: NS-FL (federated, masked; local-only) against logistic regression
(standalone, FedAvg on aligned features, pooled) and pooled gradient boosting on real clinical
tables cut into hospitals (:mod:`clinograph.sdk.datasets.real_tables`).

Per cohort, per seed (split, initialisation and training seed), per hospital: AUROC, AUPRC,
Brier, ECE on the hospital's test split. NS-FL settings are chosen on the federated
*validation* loss only: ``--ablation`` runs the one-factor-at-a-time study (linear path,
weight decay, width, value clipping, learning rate) on seeds 100.. (never the reported seeds)
and records each variant's validation loss beside its test AUROC.

Survival form (``--forms binary,survival``, the default runs both): the same cohorts with a
time-to-event label (every patient kept, censored ones included), NS-FL with the discrete-time
hazard head (``[target] kind = "survival"``, federated, masked, selected on the federated
validation hazard likelihood) against Cox PH per hospital and pooled (lifelines), and the
binary horizon form on the same test patients (LR standalone, FedAvg LR, pooled LR, pooled
GBM). Per hospital: C-index, horizon AUROC (known-status and IPCW), AUPRC, Brier.

    python -m research.real_tables.real_tables                # 5 seeds, both cohorts, both forms
    python -m research.real_tables.real_tables --ablation     # + the ablation study
    python -m research.real_tables.real_tables --forms survival --seeds 2 --quick   # a quick look
    python -m research.real_tables.real_tables --choose --cohorts gbsg2,lung,kidney   # issue 15, session 6

``--choose``: the binary form with the per-federation model choice
(:mod:`clinograph.sdk.federation.candidates`, the default candidates: linear wide path, shape
functions) at the SDK's defaults (``--settings sdk``, the default: a minimal config, as the
held-out tables are judged) or the benchmark's NS-FL settings (``--settings benchmark``), beside the LR/GBM references on the same splits;
each candidate's kept-round federated validation loss and (not used) test AUROC are recorded,
and the audit directory of every run is verified. Writes real_tables_choice[_<cohort>].json.
Writes research/real_tables/results/real_tables.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, results_dir, write  # noqa: E402

RESULTS = results_dir(__file__)

METRICS = ("auroc", "auprc", "brier", "ece")
SURVIVAL_METRICS = ("cindex", "auroc", "auroc_ipcw", "auprc", "brier")
SURVIVAL_ABLATIONS: dict[str, dict] = {
    "default": {},
    "no_linear_path": {"model": {"linear_path": False}},
    "personal_baseline_hazard": {"personal": {"modules": ["head/hazard_baseline"]}},
    "lr_0.03": {"training": {"lr": 0.03}},
    "weight_decay_1e-2": {"training": {"weight_decay": 1e-2}},
    "hidden_8": {"model": {"hidden": 8}},
    "hidden_32": {"model": {"hidden": 32}},
    "lr_0.003": {"training": {"lr": 0.003}},
    "no_value_clip": {"model": {"value_clip": 1e6}},
    "hidden_8_weight_decay_1e-2": {"model": {"hidden": 8}, "training": {"weight_decay": 1e-2}},
    "hidden_32_weight_decay_1e-2": {"model": {"hidden": 32}, "training": {"weight_decay": 1e-2}},
}
#: the survival form's settings over NSFL_DEFAULTS, chosen by the survival ablation (seeds 100-102,
#: relative to NSFL_DEFAULTS): the lowest federated validation loss averaged over both cohorts,
#: lower than the defaults' on each (research/real_tables/README.md)
SURVIVAL_SETTINGS: dict = {"model": {"hidden": 32}}
ABLATIONS: dict[str, dict] = {
    "default": {},
    "no_linear_path": {"model": {"linear_path": False}},
    "no_value_clip": {"model": {"value_clip": 1e6}},
    "weight_decay_0": {"training": {"weight_decay": 0.0}},
    "weight_decay_1e-2": {"training": {"weight_decay": 1e-2}},
    "hidden_8": {"model": {"hidden": 8}},
    "hidden_32": {"model": {"hidden": 32}},
    "lr_0.003": {"training": {"lr": 0.003}},
    "lr_0.03": {"training": {"lr": 0.03}},
    "no_selection_last_round": {"selection": {"enabled": False}},
    "gnn_only_no_clip_no_selection": {"model": {"linear_path": False, "value_clip": 1e6},
                                      "selection": {"enabled": False}},
    "linear_shape": {"model": {"linear_shape": True}},
}


def load(cohort: str):
    from clinograph.sdk.datasets.real_tables import cohort_tables
    from clinograph.sdk.ingest import ingest

    c = cohort_tables(cohort)
    return c, [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]


def pooled_ece(per_hospital: dict) -> float:
    """ECE weighted by test size (what one ECE over all test patients averages to per bin is not
    recoverable from per-hospital figures; this is the size-weighted mean)."""
    n = sum(v["n"] for v in per_hospital.values())
    return float(sum(v["ece"] * v["n"] for v in per_hospital.values()) / n)


def summarise(runs: list[dict], metrics: tuple[str, ...] = METRICS) -> dict:
    """Mean and std over seeds of each hospital's metrics and of the per-hospital mean (a metric
    a method does not report is NaN)."""
    sites = sorted(runs[0])
    out: dict = {"per_hospital": {}, "mean_over_hospitals": {}}
    get = lambda r, s, m: r[s].get(m, float("nan"))  # noqa: E731
    with np.errstate(all="ignore"):
        import warnings

        warnings.simplefilter("ignore", RuntimeWarning)
        for s in sites:
            out["per_hospital"][s] = {m: {"mean": float(np.nanmean([get(r, s, m) for r in runs])),
                                          "std": float(np.nanstd([get(r, s, m) for r in runs]))} for m in metrics}
        for m in metrics:
            per_seed = [float(np.nanmean([get(r, s, m) for s in sites])) for r in runs]
            out["mean_over_hospitals"][m] = {"mean": float(np.mean(per_seed)), "std": float(np.std(per_seed)),
                                             "per_seed": per_seed}
    if "ece" in metrics:
        out["mean_over_hospitals"]["ece_size_weighted"] = {"mean": float(np.mean([pooled_ece(r) for r in runs]))}
    return out


def run_cohort(cohort: str, seeds: list[int]) -> dict:
    from research.model_quality import (
        baselines,
        federated,
        local_only,
        nsfl_config,
        splits_for,
    )

    c, tables = load(cohort)
    per: dict[str, list[dict]] = {}
    extra: dict[str, list] = {"selected_round": [], "rounds_run": [], "selection_val_loss_round0_1_sel": [],
                              "uncalibrated_ece": [], "seconds": []}
    for seed in seeds:
        cfg = nsfl_config(seed=seed, dictionary_id=cohort)
        t0 = time.perf_counter()
        fed = federated(tables, c.dictionary, cfg)
        extra["seconds"].append(round(time.perf_counter() - t0, 2))
        per.setdefault("nsfl_federated_masked", []).append(fed["final"])
        sel = fed["selection"]
        extra["selected_round"].append(sel.get("round"))
        extra["rounds_run"].append(fed["rounds_run"])
        losses = sel.get("validation_losses", [])
        extra["selection_val_loss_round0_1_sel"].append([losses[0], losses[1], sel["validation_loss"]]
                                                       if len(losses) > 1 else None)
        extra["uncalibrated_ece"].append(float(np.mean([v["ece"] for v in sel.get("uncalibrated", {}).values()]))
                                         if sel.get("uncalibrated") else None)
        per.setdefault("nsfl_local_only", []).append(local_only(tables, c.dictionary, cfg))
        for k, v in baselines(tables, splits_for(tables, cfg), seed=seed).items():
            per.setdefault(k, []).append(v)
        print(f"{cohort} seed {seed}: " + ", ".join(
            f"{k} {np.nanmean([x['auroc'] for x in v[-1].values()]):.3f}" for k, v in per.items()), flush=True)
    return _cohort_result(c, tables, seeds, per, extra)


def run_cohort_choosing(cohort: str, seeds: list[int], settings: str = "sdk", restarts: int = 1,
                        candidates: list[dict] | None = None, elimination: str | None = None) -> dict:
    """The binary form with the per-federation model choice (module docstring, ``--choose``), at
    the SDK's defaults (``settings="sdk"``) or the benchmark's ``NSFL_DEFAULTS``; ``candidates``
    and ``elimination`` replace the ``[selection]`` defaults when given."""
    import tempfile

    from clinograph.sdk.federation.simulate import simulate as simulate_choosing
    from clinograph.secure.audit import verify_audit_dir

    from research.model_quality import baselines, nsfl_config, sdk_config, splits_for

    c, tables = load(cohort)
    per: dict[str, list[dict]] = {}
    extra: dict[str, list] = {"chosen": [], "candidates": [], "candidate_test_auroc": [], "selected_round": [],
                              "validation_loss_round1_selected": [], "audit_verified": [], "seconds": []}
    for seed in seeds:
        cfg = (sdk_config if settings == "sdk" else nsfl_config)(seed=seed, dictionary_id=cohort)
        if restarts > 1:  # [selection] restarts: every candidate from `restarts` initialisations
            cfg = cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"restarts": restarts})})
        # model_copy, not a dump and reload: the default candidates apply only to settings left unset
        if candidates is not None:
            cfg = cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"candidates": tuple(candidates)})})
        if elimination is not None:
            cfg = cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"elimination": elimination})})
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            res = simulate_choosing(tables, c.dictionary, cfg, audit_dir=Path(tmp) / "audit")
            extra["audit_verified"].append(bool(verify_audit_dir(Path(tmp) / "audit").ok))
        extra["seconds"].append(round(time.perf_counter() - t0, 2))
        per.setdefault("nsfl_federated_chosen", []).append(res.final)
        for name, fin in res.metrics_by_candidate.items():
            per.setdefault(f"nsfl_candidate_{name}", []).append(fin)
        extra["chosen"].append(res.choice["chosen"])
        extra["candidates"].append(res.choice["candidates"])
        extra["candidate_test_auroc"].append({k: _mean_auroc(v) for k, v in res.metrics_by_candidate.items()})
        sel = res.selection
        extra["selected_round"].append(sel.get("round"))
        losses = sel.get("validation_losses", [])
        extra["validation_loss_round1_selected"].append([losses[1], sel["validation_loss"]] if len(losses) > 1
                                                        else None)
        for k, v in baselines(tables, splits_for(tables, cfg), seed=seed).items():
            per.setdefault(k, []).append(v)
        print(f"{cohort} seed {seed}: chose {res.choice['chosen']} " + ", ".join(
            f"{k} {np.nanmean([x['auroc'] for x in v[-1].values()]):.3f}" for k, v in per.items()), flush=True)
    out = _cohort_result(c, tables, seeds, per, extra)
    return {**out, "goals": goals(out["methods"], "nsfl_federated_chosen")}


def _cohort_result(c, tables, seeds: list[int], per: dict[str, list[dict]], extra: dict) -> dict:  # noqa: ANN001
    """One cohort's JSON: the cohort, its hospitals, the seeds and every method's summary."""
    return {"task": c.task, "patients": c.patients, "positives": c.positives,
            "censored_before_horizon_dropped": c.censored_before_horizon,
            "hospitals": {t.site: {"patients": t.n_patients, "positives": int(t.labels.sum()),
                                   "features": len(t.observed_nodes())} for t in tables},
            "seeds": seeds, "methods": {k: summarise(v) for k, v in per.items()}, "nsfl_run": extra}


def goals(methods: dict, key: str) -> dict:
    """Issue 15's binary goals for ``key``: ≥ best standalone + 0.02, ≥ pooled LR − 0.01, no
    hospital below 0.5 (mean over seeds)."""
    m = lambda k: methods[k]["mean_over_hospitals"]["auroc"]["mean"]  # noqa: E731
    fed, best_alone, pooled = m(key), m("lr_standalone"), m("lr_pooled")
    lowest = min(v["auroc"]["mean"] for v in methods[key]["per_hospital"].values())
    return {"federated": fed, "best_standalone": best_alone, "pooled_lr": pooled,
            "standalone_plus_0.02": {"target": best_alone + 0.02, "met": fed >= best_alone + 0.02},
            "pooled_minus_0.01": {"target": pooled - 0.01, "met": fed >= pooled - 0.01},
            "lowest_hospital": {"value": lowest, "met": lowest >= 0.5}}


def load_survival(cohort: str):
    from clinograph.sdk.datasets.real_tables import cohort_tables
    from clinograph.sdk.ingest import ingest

    c = cohort_tables(cohort, form="survival")
    return c, [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]


def survival_config(cohort: str, seed: int, quick: bool = False, **overrides):
    from clinograph.sdk.config import merge_sections
    from clinograph.sdk.datasets.real_tables import SURVIVAL_TARGETS

    from research.model_quality import nsfl_config

    over = merge_sections({"target": SURVIVAL_TARGETS[cohort]}, overrides)
    if quick:
        over = merge_sections(over, {"federation": {"rounds": 8}, "selection": {"patience": 3}})
    return nsfl_config(seed=seed, dictionary_id=f"{cohort}-surv", **over)


def _mean_auroc(per: dict) -> float:
    return float(np.nanmean([v["auroc"] for v in per.values()]))


def run_survival(cohort: str, seeds: list[int], quick: bool = False) -> dict:
    """The survival form of ``cohort`` (module docstring)."""
    from clinograph.sdk.datasets.real_tables import SURVIVAL_TARGETS

    from research.model_quality import federated, splits_for
    from research.real_tables.survival_baselines import (
        cox_pooled,
        cox_standalone,
        horizon_baselines,
    )

    c, tables = load_survival(cohort)
    horizon = SURVIVAL_TARGETS[cohort]["horizon"]  # days
    per: dict[str, list[dict]] = {}
    extra: dict[str, list] = {"selected_round": [], "rounds_run": [], "round1_test_auroc": [],
                              "selected_test_auroc": [], "validation_loss_round0_1_selected": [], "seconds": []}
    for seed in seeds:
        cfg = survival_config(cohort, seed, quick, **SURVIVAL_SETTINGS)
        t0 = time.perf_counter()
        fed = federated(tables, c.dictionary, cfg)
        extra["seconds"].append(round(time.perf_counter() - t0, 2))
        per.setdefault("nsfl_survival_federated", []).append(fed["final"])
        sel = fed["selection"]
        extra["selected_round"].append(sel.get("round"))
        extra["rounds_run"].append(fed["rounds_run"])
        extra["round1_test_auroc"].append(_mean_auroc(fed["round1_test"]) if fed["round1_test"] else None)
        extra["selected_test_auroc"].append(_mean_auroc(fed["final"]))
        losses = sel.get("validation_losses", [])
        extra["validation_loss_round0_1_selected"].append([losses[0], losses[1], sel["validation_loss"]]
                                                          if len(losses) > 1 else None)
        splits = splits_for(tables, cfg)
        per.setdefault("cox_standalone", []).append(cox_standalone(tables, splits, horizon=horizon))
        per.setdefault("cox_pooled", []).append(cox_pooled(tables, splits, horizon=horizon))
        for k, v in horizon_baselines(tables, splits, horizon=horizon, seed=seed).items():
            per.setdefault(k, []).append(v)
        print(f"{cohort} survival seed {seed}: " + ", ".join(
            f"{k} {_mean_auroc(v[-1]):.3f}" for k, v in per.items()), flush=True)
    return {"task": c.task, "target": SURVIVAL_TARGETS[cohort], "patients": c.patients, "events": c.positives,
            "hospitals": {t.site: {"patients": t.n_patients, "events": int(t.survival.event.sum()),
                                   "features": len(t.observed_nodes())} for t in tables},
            "seeds": seeds, "quick": quick, "settings": SURVIVAL_SETTINGS, "methods": {k: summarise(v, SURVIVAL_METRICS) for k, v in per.items()},
            "nsfl_run": extra}


def run_survival_ablation(cohort: str, seeds: list[int], quick: bool = False) -> dict:
    """One factor at a time on the survival head, seeds 100.. (never the reported seeds)."""
    from research.model_quality import federated

    c, tables = load_survival(cohort)
    out = {}
    for name, over in SURVIVAL_ABLATIONS.items():
        vals, aucs, cidx = [], [], []
        for seed in seeds:
            fed = federated(tables, c.dictionary, survival_config(cohort, seed, quick, **over))
            vals.append(fed["selection"].get("validation_loss", float("nan")))
            aucs.append(_mean_auroc(fed["final"]))
            cidx.append(float(np.nanmean([v["cindex"] for v in fed["final"].values()])))
        out[name] = {"validation_loss": float(np.nanmean(vals)), "test_auroc": float(np.mean(aucs)),
                     "test_cindex": float(np.mean(cidx)), "overrides": over}
        print(f"survival ablation {cohort} {name}: val {out[name]['validation_loss']:.4f} test AUROC "
              f"{out[name]['test_auroc']:.3f} C {out[name]['test_cindex']:.3f}", flush=True)
    return out


def run_ablation(cohort: str, seeds: list[int]) -> dict:
    from research.model_quality import federated, mean_over_hospitals, nsfl_config

    c, tables = load(cohort)
    out = {}
    for name, over in ABLATIONS.items():
        vals, aucs = [], []
        for seed in seeds:
            fed = federated(tables, c.dictionary, nsfl_config(seed=seed, dictionary_id=cohort, **over))
            sel = fed["selection"]
            vals.append(sel.get("validation_loss", float("nan")))
            aucs.append(mean_over_hospitals(fed["final"], "auroc"))
        out[name] = {"validation_loss": float(np.nanmean(vals)) if not all(map(math.isnan, vals)) else None,
                     "test_auroc": float(np.mean(aucs)), "test_auroc_std": float(np.std(aucs)), "overrides": over}
        print(f"ablation {cohort} {name}: val {out[name]['validation_loss']} test AUROC {out[name]['test_auroc']:.3f}",
              flush=True)
    return out


SURVIVAL_LABELS = {
    "nsfl_survival_federated": "NS-FL survival head, federated (masked, selected)",
    "cox_standalone": "Cox PH standalone", "cox_pooled": "Cox PH pooled (ceiling ref.)",
    "lr_standalone_horizon": "LR standalone (horizon form)", "lr_fedavg_aligned_horizon": "LR FedAvg (horizon form)",
    "lr_pooled_horizon": "LR pooled (horizon form, ceiling ref.)",
    "gbm_pooled_horizon": "GBM pooled (horizon form, ceiling ref.)"}


def survival_markdown(payload: dict) -> str:
    """The survival section's tables of research/real_tables/README.md from a result file."""
    lines = []
    fmt = lambda v: "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"  # noqa: E731
    for cohort, res in payload.get("survival", {}).items():
        t = res["target"]
        lines += [f"### {cohort} (survival form): {res['task']}, {res['patients']} patients, {res['events']} events, "
                  f"horizon {t['horizon']:g} {t['time_unit']}, {len(t['breaks'])} intervals", "",
                  f"Mean over hospitals (mean ± std over seeds {', '.join(map(str, res['seeds']))}):", "",
                  "| method | C-index | horizon AUROC | AUROC (IPCW) | AUPRC | Brier |", "|---|---|---|---|---|---|"]
        for k, lab in SURVIVAL_LABELS.items():
            m = res["methods"][k]["mean_over_hospitals"]
            cells = [f"{fmt(m[x]['mean'])} ± {fmt(m[x]['std'])}" if not math.isnan(m[x]["mean"]) else "n/a"
                     for x in ("cindex", "auroc", "auroc_ipcw", "auprc", "brier")]
            lines.append(f"| {lab} | " + " | ".join(cells) + " |")
        sites = sorted(res["hospitals"])
        lines += ["", "Per hospital, horizon AUROC / C-index (mean over seeds):", "",
                  "| method | " + " | ".join(f"{s} ({res['hospitals'][s]['patients']})" for s in sites) + " |",
                  "|---|" + "---|" * len(sites)]
        for k, lab in SURVIVAL_LABELS.items():
            ph = res["methods"][k]["per_hospital"]
            lines.append(f"| {lab} | " + " | ".join(
                f"{fmt(ph[s]['auroc']['mean'])} / {fmt(ph[s]['cindex']['mean'])}" for s in sites) + " |")
        run = res["nsfl_run"]
        lines += ["", f"NS-FL run: selected rounds {run['selected_round']}, rounds run {run['rounds_run']}, mean test "
                  f"AUROC after round 1 {[round(x, 3) for x in run['round1_test_auroc']]} vs selected "
                  f"{[round(x, 3) for x in run['selected_test_auroc']]}", ""]
    abl = payload.get("survival_ablation")
    if abl:
        cohorts = list(abl["cohorts"])
        lines += [f"### Survival ablation (seeds {', '.join(map(str, abl['seeds']))}; chosen on validation loss)", "",
                  "| variant | " + " | ".join(f"{c} val loss | {c} AUROC | {c} C-index" for c in cohorts) + " |",
                  "|---|" + "---|---|---|" * len(cohorts)]
        for name in abl["cohorts"][cohorts[0]]:
            lines.append(f"| {name} | " + " | ".join(
                f"{abl['cohorts'][c][name]['validation_loss']:.4f} | {abl['cohorts'][c][name]['test_auroc']:.3f} | "
                f"{abl['cohorts'][c][name]['test_cindex']:.3f}" for c in cohorts) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cohorts", default="gbsg2,lung")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--forms", default="binary,survival", help="binary (horizon label), survival (time + event)")
    add_convention(ap, quick_help="the first cohort, 1 seed; survival form: 8 rounds, patience 3 (development only)")
    ap.add_argument("--markdown", action="store_true", help="print the survival tables of the result file and exit")
    ap.add_argument("--choose", action="store_true", help="binary form with the per-federation model choice "
                    "(writes real_tables_choice[_<cohort>].json; other forms are not run)")
    ap.add_argument("--settings", choices=("sdk", "benchmark"), default="sdk", help="--choose: the SDK's defaults "
                    "(what a minimal config runs; the default) or the benchmark's NSFL_DEFAULTS")
    ap.add_argument("--restarts", type=int, default=1, help="--choose: [selection] restarts (each candidate from "
                    "this many initialisations)")
    ap.add_argument("--plus-demo", action="store_true", help="--choose: the default candidates and the demo's "
                    "settings as a fifth (research/demo_quality/candidates_cost.py DEMO_CANDIDATE)")
    ap.add_argument("--elimination", choices=("none", "successive_halving"), default=None,
                    help="--choose: [selection] elimination (none: every candidate trains in full, so "
                    "candidate_sets.py can replay smaller sets on the same runs)")
    ap.add_argument("--name", default=None, help="--choose: the result file's name (default real_tables_choice...)")
    a = ap.parse_args()
    if a.quick:
        a.cohorts, a.seeds = a.cohorts.split(",")[0], 1
    out = out_path(__file__, a)
    if a.choose:
        cohorts = [x for x in a.cohorts.split(",") if x]
        out = out_path(__file__, a, name=(a.name or "real_tables_choice" + (f"_restarts{a.restarts}" if a.restarts > 1
                                                                             else ""))
                       + ("_" + cohorts[0] if len(cohorts) == 1 else ""))
        from clinograph.sdk.federation.candidates import DEFAULT_BINARY_CANDIDATES

        from research.demo_quality.candidates_cost import DEMO_CANDIDATE

        candidates = [*DEFAULT_BINARY_CANDIDATES, DEMO_CANDIDATE] if a.plus_demo else None

        from research.model_quality import NSFL_DEFAULTS, sdk_config

        settings = (sdk_config(seed=0).model_dump(mode="json", include={"federation", "model", "training", "graph",
                                                                       "selection", "split"})
                    if a.settings == "sdk" else NSFL_DEFAULTS)
        write(out, {"machine": machine(), "settings": a.settings, "nsfl_settings": settings,
                          "candidates": candidates or list(DEFAULT_BINARY_CANDIDATES), "restarts": a.restarts,
                          "elimination": a.elimination,
                          "cohorts": {k: run_cohort_choosing(k, list(range(a.seeds)), a.settings, a.restarts,
                                                             candidates, a.elimination)
                                      for k in cohorts}})
        return
    if a.markdown:
        print(survival_markdown(json.loads(out.read_text())))
        return
    from research.model_quality import NSFL_DEFAULTS

    cohorts = [x for x in a.cohorts.split(",") if x]
    forms = [x for x in a.forms.split(",") if x]
    old = json.loads(out.read_text()) if out.exists() else {}
    payload = {"machine": machine(), "nsfl_settings": NSFL_DEFAULTS,
               "cohorts": ({k: run_cohort(k, list(range(a.seeds))) for k in cohorts} if "binary" in forms
                           else old.get("cohorts", {}))}
    if "survival" in forms:
        payload["survival"] = {k: run_survival(k, list(range(a.seeds)), a.quick) for k in cohorts}
        if a.ablation:
            payload["survival_ablation"] = {"seeds": [100, 101, 102], "cohorts": {
                k: run_survival_ablation(k, [100, 101, 102], a.quick) for k in cohorts}}
        elif "survival_ablation" in old:
            payload["survival_ablation"] = old["survival_ablation"]
    else:  # keep the last survival results
        payload.update({k: old[k] for k in ("survival", "survival_ablation") if k in old})
    if a.ablation and "binary" in forms:
        payload["ablation"] = {"seeds": [100, 101, 102],
                               "cohorts": {k: run_ablation(k, [100, 101, 102]) for k in cohorts}}
    elif "ablation" in old:  # keep the last ablation study
        payload["ablation"] = old["ablation"]
    write(out, payload)


if __name__ == "__main__":
    main()
