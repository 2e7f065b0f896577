"""Demo model quality: NS-FL (the demo's non-DP federation, masked, selected, calibrated) against
logistic regression (standalone, FedAvg on aligned features, pooled) and pooled gradient
boosting, on the demo's 4 ALARM hospitals (issue 15, demo goals).

Per seed (data, split, initialisation, training), per hospital: AUROC, AUPRC, Brier, ECE on the
hospital's test split; means over hospitals and over seeds. ``--ablation`` runs one-factor-at-
a-time variants of the demo's NS-FL settings (scaling incl. federated quantiles, dictionary
transforms, linear path, width, weight decay, rounds, learning rate, personal layers, similar_to)
and records each variant's *federated validation loss* (what the choice is made on) beside its
test AUROC (reported, never used to choose).

    python -m research.demo_quality.demo_quality                          # 3 seeds, demo settings
    python -m research.demo_quality.demo_quality --ablation               # + the ablation study
    python -m research.demo_quality.demo_quality --quick                  # 1 seed, quarter-size tables
Writes research/demo_quality/results/demo_quality.json (``--out`` to change). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402

METRICS = ("auroc", "auprc", "brier", "ece")
#: dictionary features whose demo values are log-normal (sdk/datasets/alarm.py render_patients)
LOG_FEATURES = ("creatinine", "urea", "glucose")
ABLATIONS: dict[str, dict] = {
    "default": {},
    "scaling_federated_iqr": {"scaling": {"source": "federated", "quantiles": "iqr"}},
    "scaling_federated_p05_p95": {"scaling": {"source": "federated", "quantiles": "p05_p95"}},
    "transform_log_labs": {"_transforms": LOG_FEATURES},
    "no_linear_path": {"model": {"linear_path": False}},
    "hidden_16": {"model": {"hidden": 16}},
    "hidden_64": {"model": {"hidden": 64}},
    "weight_decay_1e-4": {"training": {"weight_decay": 1e-4}},
    "weight_decay_1e-3": {"training": {"weight_decay": 1e-3}},
    "lr_0.001": {"training": {"lr": 0.001}},
    "lr_0.01": {"training": {"lr": 0.01}},
    "rounds_30": {"federation": {"rounds": 30}},
    "k_similar_0": {"graph": {"k_similar": 0}},
    "personal_head": {"personal": {"modules": ["head/task"]}},
    # every row is relative to demo_config (which since issue 15 plans linear_shape, wide_lr_factor 0.3);
    # demo_quality_ablation_{a,b,c}.json were measured before that, demo_quality_ablation_d.json too
    "no_linear_shape": {"model": {"linear_shape": False}, "training": {"wide_lr_factor": 1.0}},
    "linear_shape": {"model": {"linear_shape": True}, "training": {"wide_lr_factor": 1.0}},
    "linear_shape_lr_0.01": {"model": {"linear_shape": True}, "training": {"lr": 0.01, "wide_lr_factor": 1.0}},
    "linear_shape_patience_10": {"model": {"linear_shape": True}, "training": {"wide_lr_factor": 1.0},
                                 "selection": {"patience": 10}},
    "linear_shape_wide_lr_x3": {"model": {"linear_shape": True}, "training": {"wide_lr_factor": 3.0}},
    "linear_shape_wide_lr_x10": {"model": {"linear_shape": True}, "training": {"wide_lr_factor": 10.0}},
    "linear_shape_wide_lr_x0.3": {"model": {"linear_shape": True}, "training": {"wide_lr_factor": 0.3}},
    "patience_10": {"selection": {"patience": 10}},
    # issue 15, session 8: relative to the adopted demo_config (piecewise encoding, weight decay 1e-4, patience 10):
    # the two rows session 6 could not finish, and one between (demo_quality_ablation_s8.json)
    "s8_rounds_60": {"federation": {"rounds": 60}},
    "s8_weight_decay_3e-4": {"training": {"weight_decay": 3e-4}},
    "s8_weight_decay_1e-3": {"training": {"weight_decay": 1e-3}},
    "s8_restarts_3": {"selection": {"restarts": 3}},  # multi-start: 3 initialisations, lowest validation loss kept
    # session 9, relative to demo_config with restarts 3: the model reads only the features every hospital observes
    "s9_features_shared": {"model": {"features": "shared"}},
    # issue 15, session 6: value encoding inside the GNN messages (sdk/model/layers.py), then training length;
    # measured (demo_quality_ablation_{h..m}.json) relative to demo_config *before* it adopted value_encoding =
    # "piecewise" + weight_decay 1e-4, i.e. linear_shape, wide_lr_factor 0.3, patience 10
    "value_encoding_piecewise": {"model": {"value_encoding": "piecewise"}},
    "value_encoding_piecewise_lr_0.001": {"model": {"value_encoding": "piecewise"}, "training": {"lr": 0.001}},
    "value_encoding_piecewise_rounds_60": {"model": {"value_encoding": "piecewise"}, "federation": {"rounds": 60}},
    "value_encoding_piecewise_local_epochs_3": {"model": {"value_encoding": "piecewise"},
                                                "federation": {"local_epochs": 3}},
    "value_encoding_piecewise_hidden_16": {"model": {"value_encoding": "piecewise", "hidden": 16}},
    "value_encoding_piecewise_weight_decay_1e-4": {"model": {"value_encoding": "piecewise"},
                                                   "training": {"weight_decay": 1e-4}},
    "value_encoding_piecewise_weight_decay_1e-4_rounds_60": {"model": {"value_encoding": "piecewise"},
                                                             "training": {"weight_decay": 1e-4},
                                                             "federation": {"rounds": 60}},
    "value_encoding_piecewise_weight_decay_1e-3": {"model": {"value_encoding": "piecewise"},
                                                   "training": {"weight_decay": 1e-3}},
    "value_encoding_piecewise_gated": {"model": {"value_encoding": "piecewise_gated"}},
    "value_encoding_piecewise_gated_rounds_60": {"model": {"value_encoding": "piecewise_gated"},
                                                 "federation": {"rounds": 60}},
    "value_encoding_piecewise_gated_lr_0.01": {"model": {"value_encoding": "piecewise_gated"},
                                               "training": {"lr": 0.01}},
    "rounds_60": {"federation": {"rounds": 60}},
    "local_epochs_3": {"federation": {"local_epochs": 3}},
}


def demo_tables(seed: int, scale: float, transforms: tuple[str, ...] = ()):
    """The demo's hospital tables for ``seed`` (as `clinograph demo` writes and ingests them)."""
    from clinograph.sdk.datasets.alarm import load_dictionary
    from clinograph.sdk.demo.run import write_hospital_files
    from clinograph.sdk.ingest import ingest, read_table
    from clinograph.sdk.ontology import SiteSchema

    d = load_dictionary()
    if transforms:
        d = d.model_validate({**d.model_dump(), "features": [
            {**f.model_dump(), **({"transform": "log"} if f.id in transforms else {})} for f in d.features]})
    with tempfile.TemporaryDirectory() as tmp:
        files = write_hospital_files(Path(tmp), seed, scale)
        tables = [ingest(read_table(t), schema=SiteSchema.from_toml(s), dictionary=d) for t, s in files]
    return d, tables


def config_for(seed: int, overrides: dict, rounds: int):
    from clinograph.sdk.config import SimulationConfig, merge_sections
    from clinograph.sdk.demo.run import demo_config
    
    base = demo_config(rounds=rounds, seed=seed, secure_mode="masked").model_dump(mode="json", exclude_none=True)
    base.pop("hospitals", None)
    base["release"] = {}  # the radar's release is not part of model quality
    over = {k: v for k, v in overrides.items() if not k.startswith("_")}
    return SimulationConfig.model_validate(merge_sections(base, over))


def summary(per_hospital: dict) -> dict:
    from research.model_quality import mean_over_hospitals

    return {m: mean_over_hospitals(per_hospital, m) for m in METRICS}


def run_nsfl(seed: int, *, overrides: dict, scale: float, rounds: int) -> dict:
    """The demo's non-DP federation as ``clinograph demo`` runs it (``simulate``: with its
    ``[selection]`` restarts or candidates, if any)."""
    from clinograph.sdk.federation.simulate import simulate

    d, tables = demo_tables(seed, scale, tuple(overrides.get("_transforms", ())))
    cfg = config_for(seed, overrides, rounds)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = simulate(tables, d, cfg.model_copy(update={"output": Path(tmp)}), audit_dir=Path(tmp) / "audit")
    sel = res.selection
    return {"per_hospital": res.final, "mean": summary(res.final), "seconds": time.perf_counter() - t0,
            "selected_round": sel.get("round"), "rounds_run": len(res.rounds),
            "validation_loss": sel.get("validation_loss"), "chosen": res.choice.get("chosen"),
            "uncalibrated_mean": summary(sel["uncalibrated"]) if sel.get("uncalibrated") else None}


def run_baselines(seed: int, *, scale: float, rounds: int) -> dict:
    from research.model_quality import baselines, splits_for

    _, tables = demo_tables(seed, scale)
    cfg = config_for(seed, {}, rounds)
    out = baselines(tables, splits_for(tables, cfg), seed=seed)
    return {k: {"per_hospital": v, "mean": summary(v)} for k, v in out.items()}


def pooled_references(seed: int, *, scale: float, rounds: int) -> dict:
    """Diagnosis: pooled (not federated) model families on the baselines' canonical features, each
    tuned on the pooled validation log loss -- separates a model-family gap from a federation gap."""
    from clinograph.sdk.demo.baselines import _nodes, _val_loss, _xs
    from clinograph.sdk.training.metrics import binary_metrics
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import SplineTransformer

    from research.model_quality import splits_for

    _, tables = demo_tables(seed, scale)
    splits = splits_for(tables, config_for(seed, {}, rounds))
    nodes = _nodes(tables, "union")
    k = len(nodes)
    xs, ys = _xs(tables, nodes), [t.labels for t in tables]

    def part(xs_, name):
        return (np.concatenate([x[getattr(s, name)] for x, s in zip(xs_, splits, strict=True)]),
                np.concatenate([y[getattr(s, name)] for y, s in zip(ys, splits, strict=True)]))

    def best(xs_, models):
        (xt, yt), (xv, yv) = part(xs_, "train"), part(xs_, "validation")
        m = min((m.fit(xt, yt) for m in models), key=lambda m: _val_loss(yv, m.predict_proba(xv)[:, 1]))
        return {t.site: binary_metrics(ys[i][s.test], m.predict_proba(xs_[i][s.test])[:, 1])
                for i, (t, s) in enumerate(zip(tables, splits, strict=True))}

    nan_xs = [x.copy() for x in xs]
    for x in nan_xs:
        x[:, :k][x[:, k:] == 0] = np.nan
    out = {}
    for knots in (4, 6):
        st = SplineTransformer(n_knots=knots, degree=3).fit(part(xs, "train")[0][:, :k])
        sx = [np.hstack([st.transform(x[:, :k]), x[:, k:]]) for x in xs]
        out[f"gam_spline{knots}_pooled"] = best(sx, [LogisticRegression(C=c, max_iter=3000) for c in (0.01, 0.1, 1.0)])
    out["gbm_additive_pooled"] = best(nan_xs, [HistGradientBoostingClassifier(
        learning_rate=lr, max_depth=1, max_iter=it, random_state=seed, early_stopping=False)
        for lr, it in ((0.05, 200), (0.1, 300), (0.05, 600))])
    out["mlp_pooled"] = best(xs, [MLPClassifier(hidden_layer_sizes=(h, h), alpha=a, max_iter=300, early_stopping=True,
                                                random_state=seed) for h in (32, 64) for a in (1e-3, 1e-1)])
    return {k_: {"per_hospital": v, "mean": summary(v)} for k_, v in out.items()}


def agg(values: list[float]) -> dict:
    v = np.array([x for x in values if x is not None and np.isfinite(x)], float)
    return {"mean": float(v.mean()) if v.size else float("nan"), "std": float(v.std()) if v.size else float("nan"),
            "per_seed": [float(x) for x in values]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=None, help="default: the demo's (run_demo's default)")
    ap.add_argument("--scale", type=float, default=1.0, help="hospital sizes x scale")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--variants", nargs="*", default=None, help="ablation variants to run (default: all)")
    ap.add_argument("--no-main", action="store_true", help="skip the main comparison (ablation only)")
    ap.add_argument("--pooled-references", action="store_true", help="diagnosis only: pooled GAM, additive "
                    "GBM and MLP (not federated) per seed; writes <out>_pooled.json")
    add_convention(ap, quick_help="1 seed, quarter-size tables, 5 rounds")
    ap.add_argument("--jobs", type=int, default=1, help="processes (one seed each)")
    a = ap.parse_args()
    out = out_path(__file__, a)
    from clinograph.sdk.demo.run import DEMO_ROUNDS

    rounds = a.rounds or DEMO_ROUNDS
    if a.quick:
        a.seeds, a.scale, rounds = a.seeds[:1], 0.25, 5
    payload: dict = {"benchmark": "demo_quality", "seeds": a.seeds, "scale": a.scale, "rounds": rounds,
                     "machine": machine(), "command": " ".join(sys.argv)}
    pool = ProcessPoolExecutor(max_workers=a.jobs) if a.jobs > 1 else None

    def nsfl_runs(overrides: dict) -> list[dict]:
        if pool is None:
            return [run_nsfl(seed, overrides=overrides, scale=a.scale, rounds=rounds) for seed in a.seeds]
        return list(pool.map(partial(run_nsfl, overrides=overrides, scale=a.scale, rounds=rounds), a.seeds))

    if a.pooled_references:
        refs: dict[str, list[dict]] = {}
        for seed in a.seeds:
            for k, v in pooled_references(seed, scale=a.scale, rounds=rounds).items():
                refs.setdefault(k, []).append(v)
            print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]['mean']['auroc']:.3f}" for k, v in refs.items()), flush=True)
        payload["pooled_references"] = {k: {"mean_over_hospitals": {m: agg([r["mean"][m] for r in runs]) for m in METRICS},
                                             "per_hospital": {s: {m: agg([r["per_hospital"][s][m] for r in runs])
                                                                  for m in METRICS} for s in sorted(runs[0]["per_hospital"])}}
                                         for k, runs in refs.items()}
        write(out.with_name(out.stem + "_pooled.json"), payload)
        return
    if not a.no_main:
        methods: dict[str, list[dict]] = {"clinograph_nsfl": nsfl_runs({})}
        for i, seed in enumerate(a.seeds):
            for k, v in run_baselines(seed, scale=a.scale, rounds=rounds).items():
                methods.setdefault(k, []).append(v)
            print(f"seed {seed}: " + ", ".join(f"{k} {v[i]['mean']['auroc']:.3f}" for k, v in methods.items()),
                  flush=True)
        table = {}
        for k, runs in methods.items():
            sites = sorted(runs[0]["per_hospital"])
            table[k] = {"mean_over_hospitals": {m: agg([r["mean"][m] for r in runs]) for m in METRICS},
                        "per_hospital": {s: {m: agg([r["per_hospital"][s][m] for r in runs]) for m in METRICS}
                                         for s in sites}}
            if k == "clinograph_nsfl":
                table[k]["selected_round"] = [r["selected_round"] for r in runs]
                table[k]["rounds_run"] = [r["rounds_run"] for r in runs]
                table[k]["validation_loss"] = agg([r["validation_loss"] for r in runs])
                table[k]["uncalibrated_mean_ece"] = [r["uncalibrated_mean"]["ece"] if r["uncalibrated_mean"]
                                                     else None for r in runs]
        payload["methods"] = table
        nsfl = table["clinograph_nsfl"]["mean_over_hospitals"]
        gbm = table["gbm_pooled"]["mean_over_hospitals"]
        payload["goals"] = {
            "nsfl_auroc_ge_pooled_gbm": bool(nsfl["auroc"]["mean"] >= gbm["auroc"]["mean"]),
            "nsfl_auroc_minus_pooled_gbm": nsfl["auroc"]["mean"] - gbm["auroc"]["mean"],
            "nsfl_ece_le_0.05": bool(nsfl["ece"]["mean"] <= 0.05), "nsfl_ece": nsfl["ece"]["mean"]}
        write(out, payload)
    if a.ablation:
        names = a.variants or list(ABLATIONS)
        study: dict = {}
        payload["ablation"] = study
        for name in names:
            runs = nsfl_runs(ABLATIONS[name])
            study[name] = {"overrides": ABLATIONS[name],
                           "validation_loss": agg([r["validation_loss"] for r in runs]),
                           "test_auroc": agg([r["mean"]["auroc"] for r in runs]),
                           "test_auprc": agg([r["mean"]["auprc"] for r in runs]),
                           "test_ece": agg([r["mean"]["ece"] for r in runs]),
                           "selected_round": [r["selected_round"] for r in runs],
                           "rounds_run": [r["rounds_run"] for r in runs],
                           "chosen": [r["chosen"] for r in runs],
                           "test_auroc_by_hospital": {s: agg([r["per_hospital"][s]["auroc"] for r in runs])
                                                      for s in sorted(runs[0]["per_hospital"])},
                           "seconds": agg([r["seconds"] for r in runs])}
            payload["ablation_chosen_by_validation"] = min(study, key=lambda k: study[k]["validation_loss"]["mean"])
            write(out, payload)  # after every variant: a stopped study keeps what it measured
            print(f"{name}: val loss {study[name]['validation_loss']['mean']:.4f} "
                  f"test AUROC {study[name]['test_auroc']['mean']:.3f}", flush=True)
    write(out, payload)
    if "methods" in payload:
        print(json.dumps({k: round(v["mean_over_hospitals"]["auroc"]["mean"], 4)
                          for k, v in payload["methods"].items()}))


if __name__ == "__main__":
    main()
