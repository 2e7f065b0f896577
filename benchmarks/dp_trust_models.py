"""Three trust models for patient-level DP on the demo federation: where the noise is added.

    python benchmarks/dp_trust_models.py --quick      # small hospitals, 1 seed, few rounds; prints JSON only
    python benchmarks/dp_trust_models.py              # 4 demo hospitals, ε ∈ {1, 3, 10}, 3 seeds

- ``local``: today's local DP (each hospital runs DP-SGD alone with the whole noise;
  :func:`~clinograph.sdk.research.demo.demo_dp_config` settings), through ``simulate``.
- ``distributed``: ``[privacy] mode = "distributed"``, one DP-SGD step a round over all
  hospitals, Skellam shares inside the masked sum, through the real runtime
  (:func:`~clinograph.sdk.federation.dp_task.build_distributed_simulation`: signed plans, masked
  aggregation, audit); σ calibrated with the Skellam accountant (:mod:`clinograph.secure.dp`).
- ``central``: a reference no deployment may use -- the same star model and the same DP-SGD
  step on the pooled patients, Gaussian noise added once by a trusted curator, σ calibrated
  with Opacus's RDP accountant.
- ``none``: the same FedSGD run as ``distributed`` without clipping or noise (pooled, which is
  the same computation: FedSGD's weighted mean of per-hospital gradient sums is the pooled sum).

Hyper-parameters of the DP-SGD step (lr, q, rounds; C = 1) are chosen on the validation
split (seed 0, ε = 3, the grid below) for each trust model with its own accountant: ``central``
with Opacus's σ, ``distributed`` with the Skellam accountant's σ (selection runs the pooled
step with that σ: the same noise variance, without the runtime); each choice is then used for
every ε and seed. The non-DP run gets its own lr chosen on validation. δ = 1e-5; AUROC and
AUPRC on each hospital's test split, mean over hospitals. Writes
benchmarks/results/dp_trust_models.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clinograph.sdk.config import NSFLConfig, SimulationConfig  # noqa: E402
from clinograph.sdk.federation.dp_task import build_distributed_simulation  # noqa: E402
from clinograph.sdk.federation.simulate import simulate  # noqa: E402
from clinograph.sdk.federation.split import hospital_split  # noqa: E402
from clinograph.sdk.graph.star import star_batch  # noqa: E402
from clinograph.sdk.ingest import ingest  # noqa: E402
from clinograph.sdk.model.nsfl import NSFLModel  # noqa: E402
from clinograph.sdk.privacy.distributed import Columns, clip_rows, per_patient_gradients  # noqa: E402
from clinograph.sdk.research.alarm_demo import (  # noqa: E402
    DEFAULT_HOSPITALS,
    load_dictionary,
    make_hospital_tables,
)
from clinograph.sdk.research.demo import demo_dp_config  # noqa: E402
from clinograph.sdk.training.local import predict  # noqa: E402
from clinograph.sdk.training.metrics import binary_metrics  # noqa: E402
from clinograph.sdk.training.personal import personal_module_map  # noqa: E402
from clinograph.secure.dp import calibrate_noise_multiplier  # noqa: E402
from clinograph.secure.spec import ModuleKind  # noqa: E402

from benchmarks._common import RESULTS, machine  # noqa: E402

DELTA, CLIP, HIDDEN, VAL = 1e-5, 1.0, 8, 0.2
#: q = 0.05 (the earlier grid's best) and full-batch rounds (q = 1), where the distributed
#: accountant needs no amplification bound and equals the Gaussian's (secure/dp/skellam.py)
GRID = ([{"lr": lr, "sample_rate": 0.05, "rounds": 100} for lr in (1.0, 3.0)]
        + [{"lr": lr, "sample_rate": 1.0, "rounds": 15} for lr in (1.0, 3.0)]
        + [{"lr": 1.0, "sample_rate": 1.0, "rounds": 40}])


def tables_for(seed: int, scale: float):
    d = load_dictionary()
    specs = tuple(replace(h, n_patients=max(60, int(h.n_patients * scale))) for h in DEFAULT_HOSPITALS)
    return [ingest(df, schema=s, dictionary=d) for df, s in make_hospital_tables(seed=seed, hospitals=specs)], d


def splits(tables, seed):
    return {t.site: hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=VAL, seed=seed)
            for t in tables}


def _mean(per: dict, key: str) -> float:
    v = [m[key] for m in per.values() if not math.isnan(m[key])]
    return float(np.mean(v)) if v else float("nan")


def pooled(tables, dictionary, *, seed, lr, sample_rate, rounds, sigma, clip, split_name="test"):
    """FedSGD = DP-SGD on the pooled star patients; sigma None: no clip, no noise (non-DP)."""
    sp = splits(tables, seed)
    torch.manual_seed(seed)
    model = NSFLModel(len(dictionary.node_ids()), NSFLConfig(hidden=HIDDEN, init_seed=seed))
    mm = personal_module_map(model, dictionary.node_ids(), personal=())
    cols = Columns.of(model, mm, mm.names(ModuleKind.SHARED))
    stars = {t.site: star_batch(t, k_similar=0) for t in tables}
    k = max(stars[t.site].mask.shape[1] for t in tables)

    def cat(f):  # stars of different hospitals padded to one width (padding is masked out)
        parts = []
        for t in tables:
            v = getattr(stars[t.site], f)[torch.as_tensor(sp[t.site].train)]
            if v.dim() == 2 and v.shape[1] < k:
                v = torch.nn.functional.pad(v, (0, k - v.shape[1]))
            parts.append(v)
        return torch.cat(parts)

    fi, x, m, y = cat("feature_index"), cat("values"), cat("mask"), cat("labels")
    n = int(y.shape[0])
    gen = np.random.default_rng(seed + 99)  # benchmark only: the reference's sampling needs no CSPRNG
    for _ in range(rounds):
        idx = torch.as_tensor(np.flatnonzero(gen.random(n) < sample_rate), dtype=torch.long)
        g = per_patient_gradients(model, cols, feature_index=fi[idx], values=x[idx], mask=m[idx], labels=y[idx])
        if sigma is None:
            s = g.sum(0)
        else:
            s = clip_rows(g, clip).sum(0) + gen.normal(0, sigma * clip, cols.dim)
        for name, vec in cols.split(-lr * s / (sample_rate * n)).items():
            mm.set(name, mm.get(name) + vec)
    out = {}
    for t in tables:
        idx = getattr(sp[t.site], split_name)
        p = predict(model, stars[t.site])[idx]
        out[t.site] = binary_metrics(t.labels[idx], p) if np.all(np.isfinite(p)) else \
            {"auroc": float("nan"), "auprc": float("nan")}  # diverged (selection skips it)
    return out, cols.dim


def distributed(tables, dictionary, *, seed, lr, sample_rate, rounds, sigma, h, workdir):
    cfg = SimulationConfig.model_validate({
        "federation": {"id": "dp-trust", "rounds": rounds, "secure_mode": "masked", "strategy": "fedsgd",
                       "server_lr": lr, "min_clients": 3, "local_epochs": 1, "seed": seed},
        "model": {"hidden": HIDDEN, "init_seed": seed}, "graph": {"k_similar": 0},
        "split": {"seed": seed, "validation_fraction": VAL},
        "privacy": {"enabled": True, "mode": "distributed", "epsilon_budget": 100.0, "delta": DELTA,
                    "noise_multiplier": sigma, "clip_norm": CLIP, "sample_rate": sample_rate, "min_honest": h,
                    "state_dir": str(workdir / "state")},
        "output": str(workdir / "out")})
    sim = build_distributed_simulation(tables, dictionary, cfg, audit_dir=workdir / "audit")
    try:
        for _ in range(rounds):
            sim.run_round()
        eps = next(iter(sim.hospitals.values())).task.ledger.entries[-1]
        return sim.evaluate("test"), eps["epsilon"], eps["epsilon_alone"]
    finally:
        sim.audit.close()


def local(tables, dictionary, *, seed, epsilon, rounds, workdir):
    cfg = demo_dp_config(rounds=rounds, seed=seed, secure_mode="masked", epsilon=epsilon)
    cfg = cfg.model_copy(update={"output": workdir / "out", "split": cfg.split.model_copy(update={"validation_fraction": VAL}),
                                 "privacy": cfg.privacy.model_copy(update={"state_dir": workdir / "state"})})
    res = simulate(tables, dictionary, cfg, audit_dir=workdir / "audit")
    return res.final, max(v[-1] for v in res.epsilons.values())


def sigma_for(eps, *, q, rounds, scale, dim):
    return calibrate_noise_multiplier(target_epsilon=eps, delta=DELTA, rounds=rounds, sample_rate=q, clip=CLIP,
                                      scale=scale, dim=dim)


def _ring_scale(n: int) -> float:
    """The masked ring's fixed-point scale of the distributed run (its federation defaults)."""
    from clinograph.secure.runtime.build import masked_options

    fed = SimulationConfig.model_validate({"federation": {"min_clients": 3}}).federation
    return float(masked_options(fed, n=n, max_weight=fed.max_weight)["masked.scale"])


def gaussian_sigma(eps, *, q, rounds):
    from opacus.accountants.utils import get_noise_multiplier

    return float(get_noise_multiplier(target_epsilon=eps, target_delta=DELTA, sample_rate=q, steps=rounds,
                                      accountant="rdp", epsilon_tolerance=0.01))


def add_baselines(path: Path) -> None:
    """The simple baselines on the benchmark's own splits (seeds as recorded), merged into ``path``."""
    from clinograph.sdk.research.model_quality import baselines

    out = json.loads(path.read_text())
    rows = []
    for seed in out["seeds"]:
        tables, _ = tables_for(seed, 0.15 if out.get("quick") else 1.0)
        sp = splits(tables, seed)
        for name, per in baselines(tables, [sp[t.site] for t in tables], seed=seed).items():
            rows.append({"model": name, "seed": seed, "epsilon": None, "auroc": _mean(per, "auroc"),
                         "auprc": _mean(per, "auprc"), "per_hospital": per})
    out["baselines"] = rows
    for name in sorted({r["model"] for r in rows}):
        v = [r for r in rows if r["model"] == name]
        out["summary"][f"{name}@None"] = {m: {"mean": float(np.mean([r[m] for r in v])),
                                              "std": float(np.std([r[m] for r in v])), "n": len(v)}
                                          for m in ("auroc", "auprc")}
    path.write_text(json.dumps(out, indent=2, sort_keys=True, default=float))
    print(json.dumps({k: v for k, v in out["summary"].items() if k.endswith("@None")}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--min-honest", type=int, default=2)
    ap.add_argument("--skip-local", action="store_true")
    ap.add_argument("--out", default="dp_trust_models.json", help="file name under benchmarks/results/")
    ap.add_argument("--add-baselines", action="store_true",
                    help="add logistic regression standalone / pooled (and FedAvg LR, pooled GBM) on the same "
                         "splits to the existing results JSON, per seed, and exit")
    ap.add_argument("--select-per-epsilon", action="store_true",
                    help="choose (lr, q, rounds) on validation at every ε (default: at ε = 3 only); the non-DP "
                         "reference then also chooses (q, rounds) as well as its lr")
    a = ap.parse_args()
    if a.add_baselines:
        add_baselines(RESULTS / a.out)
        return
    scale = 0.15 if a.quick else 1.0
    seeds = [0] if a.quick else list(range(a.seeds))
    epsilons = [3.0] if a.quick else [1.0, 3.0, 10.0]
    grid = [dict(g, rounds=min(g["rounds"], 10)) for g in (GRID[0], GRID[2])] if a.quick else GRID
    t0 = time.time()
    tables, d = tables_for(0, scale)
    _, dim0 = pooled(tables, d, seed=0, sigma=None, clip=CLIP, lr=0.0, sample_rate=0.01, rounds=0)
    ring = _ring_scale(len(tables))
    # -- selection on validation (seed 0): per trust model with its own accountant's σ, at ε = 3
    # (or at every ε with --select-per-epsilon)
    sel_eps = epsilons if a.select_per_epsilon else [3.0]
    sel, hps = {}, {}
    for model in ("central", "distributed"):
        for se in sel_eps:
            key = f"{model}@{se}"
            sel[key] = []
            for g in grid:
                if model == "central":
                    sig = gaussian_sigma(se, q=g["sample_rate"], rounds=g["rounds"])
                else:
                    sig = sigma_for(se, q=g["sample_rate"], rounds=g["rounds"], scale=ring, dim=dim0)
                val, _ = pooled(tables, d, seed=0, sigma=sig, clip=CLIP, split_name="validation", **g)
                sel[key].append({**g, "sigma": sig, "val_auroc": _mean(val, "auroc")})
                print("select", key, sel[key][-1], flush=True)
            best = max(sel[key], key=lambda r: -1.0 if math.isnan(r["val_auroc"]) else r["val_auroc"])
            hps[key] = {k: best[k] for k in ("lr", "sample_rate", "rounds")}

    def hp_for(model: str, eps: float) -> dict:
        return hps[f"{model}@{eps if a.select_per_epsilon else 3.0}"]

    hp = hp_for("central", 3.0)
    if a.select_per_epsilon:
        shapes = sorted({(g["sample_rate"], g["rounds"]) for g in grid})
        none_grid = [{"lr": lr, "sample_rate": q, "rounds": t} for q, t in shapes for lr in (0.3, 1.0, 3.0)]
    else:
        none_grid = [dict(hp, lr=lr) for lr in (0.3, 1.0, 3.0)]
    sel_none = []
    for g in none_grid:
        val, _ = pooled(tables, d, seed=0, sigma=None, clip=CLIP, split_name="validation", **g)
        sel_none.append({**g, "val_auroc": _mean(val, "auroc")})
    best_none = max(sel_none, key=lambda r: -1.0 if math.isnan(r["val_auroc"]) else r["val_auroc"])
    hp_none = {k: best_none[k] for k in ("lr", "sample_rate", "rounds")}
    lr_none = hp_none["lr"]
    runs = []
    for seed in seeds:
        tables, d = tables_for(seed, scale)
        none, dim = pooled(tables, d, seed=seed, sigma=None, clip=CLIP, **hp_none)
        runs.append({"model": "none", "seed": seed, "epsilon": None, "auroc": _mean(none, "auroc"),
                     "auprc": _mean(none, "auprc"), "per_hospital": none})
        n = len(tables)
        for eps in epsilons:
            ring = _ring_scale(n)
            hd, hp = hp_for("distributed", eps), hp_for("central", eps)
            sig_d = sigma_for(eps, q=hd["sample_rate"], rounds=hd["rounds"], scale=ring, dim=dim)
            with tempfile.TemporaryDirectory() as tmp:
                res, e, e_alone = distributed(tables, d, seed=seed, sigma=sig_d, h=a.min_honest, workdir=Path(tmp), **hd)
            runs.append({"model": "distributed", "seed": seed, "epsilon": eps, "epsilon_spent": e,
                         "epsilon_alone": e_alone, "sigma": sig_d, "min_honest": a.min_honest, **hd,
                         "auroc": _mean(res, "auroc"), "auprc": _mean(res, "auprc"), "per_hospital": res})
            print({k: v for k, v in runs[-1].items() if k != "per_hospital"}, flush=True)
            sig_c = gaussian_sigma(eps, q=hp["sample_rate"], rounds=hp["rounds"])
            res, _ = pooled(tables, d, seed=seed, sigma=sig_c, clip=CLIP, **hp)
            runs.append({"model": "central", "seed": seed, "epsilon": eps, "sigma": sig_c, **hp,
                         "auroc": _mean(res, "auroc"), "auprc": _mean(res, "auprc"), "per_hospital": res})
            if not a.skip_local:
                with tempfile.TemporaryDirectory() as tmp:
                    res, e = local(tables, d, seed=seed, epsilon=eps, rounds=2 if a.quick else 8, workdir=Path(tmp))
                runs.append({"model": "local", "seed": seed, "epsilon": eps, "epsilon_spent": e,
                             "auroc": _mean(res, "auroc"), "auprc": _mean(res, "auprc"), "per_hospital": res})
            print({k: v for k, v in runs[-1].items() if k != "per_hospital"}, flush=True)
    table = {}
    for r in runs:
        key = f"{r['model']}@{r['epsilon']}"
        table.setdefault(key, {"auroc": [], "auprc": []})
        table[key]["auroc"].append(r["auroc"])
        table[key]["auprc"].append(r["auprc"])
    summary = {k: {m: {"mean": float(np.mean(v)), "std": float(np.std(v)), "n": len(v)} for m, v in x.items()}
               for k, x in table.items()}
    out = {"benchmark": "dp_trust_models", "delta": DELTA, "clip": CLIP, "hidden": HIDDEN, "seeds": seeds,
           "hyperparameters": hps, "non_dp_lr": lr_none, "non_dp_hyperparameters": hp_none,
           "select_per_epsilon": a.select_per_epsilon, "selection": sel, "selection_non_dp": sel_none,
           "min_honest": a.min_honest, "summary": summary, "runs": runs, "seconds": round(time.time() - t0, 1),
           "machine": machine(), "quick": a.quick}
    text = json.dumps(out, indent=2, sort_keys=True, default=float)
    if a.quick:
        print(json.dumps(summary, indent=2))
    else:
        (RESULTS / a.out).write_text(text)
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
