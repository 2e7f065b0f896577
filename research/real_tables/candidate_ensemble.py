"""Averaging the default candidates instead of choosing one, on the real tables (paired: the same
runs). For each cohort and seed the four default candidates train at the SDK's defaults
(masked; the one run of ``simulate``), and every hospital's per-patient risks of each
candidate's kept model are saved (uncalibrated and calibrated). Offline, on those same runs:

- ``chosen``: the SDK's rule (lowest kept-round federated validation loss),
- ``avg_all``: the mean of the four candidates' risks (raw or calibrated),
- ``avg_top2``: the mean of the two lowest-validation-loss candidates' raw risks,
- ``choose_incl_avg``: the average as a fifth candidate, kept when its federated validation
  loss (Σ loss / Σ n over the hospitals' validation patients, raw risks) is lower by > min_delta.

Mean over hospitals of test AUROC, mean over seeds. Test AUROC is reported, never used to choose.

    python -m research.real_tables.candidate_ensemble --cohorts gbsg2,lung,kidney,diabetes,larynx --seeds 10
    python -m research.real_tables.candidate_ensemble --raw-dir DIR   # analyse saved runs (DIR/ens_<cohort>.json) only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402

MIN_DELTA = 1e-4


def run_cohort(cohort: str, seeds: int) -> list[dict]:
    from clinograph.sdk.federation.simulate import simulate

    from research.model_quality import sdk_config
    from research.real_tables.real_tables import load

    c, tables = load(cohort)
    out = []
    for seed in range(seeds):
        cfg0 = sdk_config(seed=seed, dictionary_id=cohort)
        rec: dict = {"seed": seed, "cands": {}}
        with tempfile.TemporaryDirectory() as tmp:
            cfg0 = cfg0.model_copy(update={"output": Path(tmp) / "out"})
            res = simulate(tables, c.dictionary, cfg0, audit_dir=Path(tmp) / "audit")
            for row in res.choice["candidates"]:
                per = {}
                for n, m in sorted(res.hospitals.items()):
                    h = m.clients[row["name"]]
                    cal = h.task.predict()
                    saved, h.task.calibration = h.task.calibration, None
                    raw = h.task.predict()
                    h.task.calibration = saved
                    per[n] = {"cal": cal.tolist(), "raw": raw.tolist(), "y": h.task.table.labels.tolist(),
                              "val": h.task.split.validation.tolist(), "test": h.task.split.test.tolist()}
                rec["cands"][row["name"]] = {"val_loss": row["validation_loss"], "per": per}
        out.append(rec)
        print(cohort, seed, {k: round(v["val_loss"], 4) for k, v in rec["cands"].items()}, flush=True)
    return out


def _log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _risks(r: dict, names: list[str], kind: str, site: str) -> np.ndarray:
    return np.mean([np.array(r["cands"][n]["per"][site][kind]) for n in names], axis=0)


def _auroc(r: dict, names: list[str], kind: str) -> float:
    """Mean over hospitals of test AUROC of the mean of ``names``' risks (hospitals whose test
    split has one class are skipped: AUROC is undefined there)."""
    from sklearn.metrics import roc_auc_score

    vals = []
    for s, ref in r["cands"][names[0]]["per"].items():
        y, t = np.array(ref["y"]), np.array(ref["test"])
        if len(set(y[t])) == 2:
            vals.append(roc_auc_score(y[t], _risks(r, names, kind, s)[t]))
    return float(np.mean(vals))


def _one_run(r: dict) -> dict[str, float]:
    names = list(r["cands"])
    vl = {n: r["cands"][n]["val_loss"] for n in names}
    chosen = names[0]
    for n in names[1:]:  # the SDK's rule: a later candidate only if lower by more than min_delta
        if vl[n] < vl[chosen] - MIN_DELTA:
            chosen = n
    order = sorted(names, key=lambda n: vl[n])
    per = r["cands"][names[0]]["per"]
    ens_loss = (sum(_log_loss(np.array(ref["y"])[ref["val"]], _risks(r, names, "raw", s)[ref["val"]]) * len(ref["val"])
                    for s, ref in per.items()) / sum(len(ref["val"]) for ref in per.values()))
    row = {"chosen": _auroc(r, [chosen], "cal"), **{n: _auroc(r, [n], "cal") for n in names},
           "avg_all_raw": _auroc(r, names, "raw"), "avg_all_cal": _auroc(r, names, "cal"),
           "avg_top2_raw": _auroc(r, order[:2], "raw")}
    keep_avg = ens_loss < vl[chosen] - MIN_DELTA
    row["choose_incl_avg"] = row["avg_all_cal"] if keep_avg else row["chosen"]
    row["avg_kept_as_fifth"] = float(keep_avg)
    return row


def analyse(runs: list[dict]) -> dict:
    res: dict[str, list[float]] = {}
    for r in runs:
        for k, v in _one_run(r).items():
            res.setdefault(k, []).append(v)
    return {k: {"mean": float(np.mean(v)), "per_seed": v} for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cohorts", default="gbsg2,lung,kidney,diabetes,larynx")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--raw-dir", default=None, help="analyse DIR/ens_<cohort>.json (saved by a run) only")
    ap.add_argument("--save-raw", default=None, help="also save each cohort's runs to DIR/ens_<cohort>.json")
    add_convention(ap, quick_help="larynx only, 1 seed")
    a = ap.parse_args()
    if a.quick:
        a.cohorts, a.seeds = "larynx", 1
    out = {}
    for cohort in a.cohorts.split(","):
        if a.raw_dir:
            runs = json.loads((Path(a.raw_dir) / f"ens_{cohort}.json").read_text())
        else:
            runs = run_cohort(cohort, a.seeds)
            if a.save_raw:
                Path(a.save_raw).mkdir(parents=True, exist_ok=True)
                (Path(a.save_raw) / f"ens_{cohort}.json").write_text(json.dumps(runs))
        out[cohort] = {"seeds": len(runs), "test_auroc": analyse(runs)}
        print(cohort, {k: round(v["mean"], 3) for k, v in out[cohort]["test_auroc"].items()}, flush=True)
    write(out_path(__file__, a), {"benchmark": "candidate_ensemble", "machine": machine(),
                                  "settings": "SDK defaults, masked, seeds 0..n-1", "min_delta": MIN_DELTA,
                                  "cohorts": out})


if __name__ == "__main__":
    main()
