"""Three trust models for patient-level DP on the demo federation: where the noise is added.

    python -m research.dp_trust_models.dp_trust_models --quick      # small hospitals, 1 seed, few rounds; prints JSON only
    python -m research.dp_trust_models.dp_trust_models              # 4 demo hospitals, ε ∈ {1, 3, 10}, 3 seeds

- ``local``: today's local DP (each hospital runs DP-SGD alone with the whole noise;
  :func:`~clinograph.sdk.demo.run.demo_dp_config` settings), through ``simulate``.
- ``distributed``: ``[privacy] mode = "distributed"``, one DP-SGD step a round over all
  hospitals, Skellam shares inside the masked sum, through the real runtime
  (:func:`~clinograph.sdk.federation.simulate.build_simulation`: signed plans, masked
  aggregation, audit); σ calibrated with the Skellam accountant (:mod:`clinograph.secure.dp`).
- ``central``: a reference no deployment may use -- the same star model and the same DP-SGD
  step on the pooled patients, Gaussian noise added once by a trusted curator, σ calibrated
  with Opacus's RDP accountant.
- ``none``: the same FedSGD run as ``distributed`` without clipping or noise (pooled, which is
  the same computation: FedSGD's weighted mean of per-hospital gradient sums is the pooled sum).

Hyper-parameters of the DP-SGD step (lr, rounds, clip C; q = 1, full-batch rounds) are chosen
on VALIDATION only: score = mean over the seeds of the mean-over-hospitals validation AUROC
(each seed's own tables, split and init; never a test split), at each ε of ``--select-eps``
(default 1, 3, 10; any other ε takes the choice at the largest selected ε not above it, the
rule of sdk/privacy/schedule.py). Rounds are capped at MAX_ROUNDS = 60 for cost. The
selection runs the pooled step with the
distributed accountant's σ (the same noise variance, without the runtime); at q = 1 the
central Gaussian σ is the same to within 1 % (secure/dp/skellam.py), so one selection serves
both DP trust models. The non-DP run chooses (rounds, lr) on validation the same way. The
grid fixes C in advance ({1, 3}: about 0.15x and 0.5x the median per-patient gradient norm of
the initial model, 6.6, measured once on seed 0 to place the grid and not re-used per run) and
the clip-relative step lr·C = 3. δ = 1e-5; AUROC and AUPRC on each
hospital's test split, mean over hospitals. Writes research/dp_trust_models/results/dp_trust_models.json.
Asserts nothing.

Server momentum and server Adam on the noisy aggregate (post-processing, free in ε) were
measured on validation with the pooled step (15 rounds, ε = 3) and lost to plain FedSGD at
every setting tried (``--optimizers``; dp_trust_models_selection_eps3.json; docs/privacy.md),
so the runtime keeps FedSGD.

The run recorded in dp_trust_models.json: ``--skip-local --select-eps 1,3 --selection-from
research/dp_trust_models/results/dp_trust_models_selection_eps3.json --seed-list <s>`` for s = 0, 1, 2 in
three processes, ``--merge`` of the three, then ``--add-baselines``.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from research._common import add_convention, machine, out_path, results_dir, save  # noqa: E402

RESULTS = results_dir(__file__)
from clinograph.sdk.config import NSFLConfig, SimulationConfig  # noqa: E402
from clinograph.sdk.datasets.alarm import (  # noqa: E402
    DEFAULT_HOSPITALS,
    load_dictionary,
    make_hospital_tables,
)
from clinograph.sdk.demo.run import demo_dp_config  # noqa: E402
from clinograph.sdk.federation.simulate import build_simulation, simulate  # noqa: E402
from clinograph.sdk.federation.split import hospital_split  # noqa: E402
from clinograph.sdk.graph.star import star_batch  # noqa: E402
from clinograph.sdk.ingest import ingest  # noqa: E402
from clinograph.sdk.model.nsfl import NSFLModel  # noqa: E402
from clinograph.sdk.privacy.distributed import Columns, clip_rows, per_patient_gradients  # noqa: E402
from clinograph.sdk.training.local import predict  # noqa: E402
from clinograph.sdk.training.metrics import binary_metrics  # noqa: E402
from clinograph.sdk.training.personal import personal_module_map  # noqa: E402
from clinograph.secure.dp import calibrate_noise_multiplier  # noqa: E402

from clinograph.core.spec import ModuleKind  # noqa: E402

DELTA, CLIP, HIDDEN, VAL = 1e-5, 1.0, 8, 0.2
#: full-batch rounds (q = 1: no amplification bound, the distributed accountant equals the
#: Gaussian's); rounds x (clip C, clip-relative step lr·C) (the earlier grids' q = 0.05 lost at every ε).
#: Rounds are capped at MAX_ROUNDS for cost (the demo runs the chosen schedule; 100 rounds scored
#: higher on validation at ε = 3, for DP and non-DP alike: dp_trust_models_selection_eps3.json)
MAX_ROUNDS = 60
GRID = [{"lr": step / clip, "sample_rate": 1.0, "rounds": rounds, "clip": clip}
        for rounds in (15, 30, 60) for clip, step in ((1.0, 3.0), (3.0, 3.0))]
#: the non-DP run: the same shapes, no clip, its own lr (the gradients are ~6.6 in norm at the start)
NONE_GRID = [{"lr": lr, "sample_rate": 1.0, "rounds": rounds, "clip": CLIP}
             for rounds in (15, 30, 60) for lr in (0.3, 0.6)]


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


def pooled(tables, dictionary, *, seed, lr, sample_rate, rounds, sigma, clip, split_name="test",
           server="sgd", beta=0.9):
    """FedSGD = DP-SGD on the pooled star patients; sigma None: no clip, no noise (non-DP).

    ``server``: the server's rule on the noisy mean gradient ḡ (post-processing of the DP
    release, so free in ε): ``sgd`` θ −= lr·ḡ (NS-FL eq. 6); ``momentum`` m = β·m + ḡ,
    θ −= lr·m (FedAvgM, Hsu et al. 2019; DP-FedAvg with server momentum, McMahan et al. 2018);
    ``adam`` Reddi et al. 2020 Algorithm 2 (β1 0.9, β2 0.99, τ 1e-3, as secure/strategies/fedopt.py).
    ``split_name``: one split or a tuple of splits (one metrics dict each).
    """
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
    mom, second = np.zeros(cols.dim), np.full(cols.dim, 1e-6)
    for _ in range(rounds):
        idx = torch.as_tensor(np.flatnonzero(gen.random(n) < sample_rate), dtype=torch.long)
        g = per_patient_gradients(model, cols, inputs=(fi[idx], x[idx], m[idx]), labels=y[idx])
        if sigma is None:
            s = g.sum(0)
        else:
            s = clip_rows(g, clip).sum(0) + gen.normal(0, sigma * clip, cols.dim)
        gbar = s / (sample_rate * n)
        if server == "momentum":
            mom = beta * mom + gbar
            step = mom
        elif server == "adam":
            mom = 0.9 * mom + 0.1 * gbar
            second = 0.99 * second + 0.01 * gbar * gbar
            step = mom / (np.sqrt(second) + 1e-3)
        else:
            step = gbar
        for name, vec in cols.split(-lr * step).items():
            mm.set(name, mm.get(name) + vec)
    outs = []
    for name in (split_name if isinstance(split_name, tuple) else (split_name,)):
        out = {}
        for t in tables:
            idx = getattr(sp[t.site], name)
            p = predict(model, stars[t.site])[idx]
            out[t.site] = binary_metrics(t.labels[idx], p) if np.all(np.isfinite(p)) else \
                {"auroc": float("nan"), "auprc": float("nan")}  # diverged (selection skips it)
        outs.append(out)
    return (tuple(outs) if isinstance(split_name, tuple) else outs[0]), cols.dim


def distributed(tables, dictionary, *, seed, lr, sample_rate, rounds, sigma, clip, h, workdir):
    cfg = SimulationConfig.model_validate({
        "federation": {"id": "dp-trust", "rounds": rounds, "secure_mode": "masked", "strategy": "fedsgd",
                       "server_lr": lr, "min_clients": 3, "local_epochs": 1, "seed": seed},
        # the GNN, written out: the study measured it (under [privacy] the SDK's default is now the wide path)
        "model": {"hidden": HIDDEN, "init_seed": seed, "deep": True}, "graph": {"k_similar": 0},
        "split": {"seed": seed, "validation_fraction": VAL},
        "privacy": {"enabled": True, "mode": "distributed", "epsilon_budget": 100.0, "delta": DELTA,
                    "noise_multiplier": sigma, "clip_norm": clip, "sample_rate": sample_rate, "min_honest": h,
                    "state_dir": str(workdir / "state")},
        "output": str(workdir / "out")})
    sim = build_simulation(tables, dictionary, cfg, audit_dir=workdir / "audit")
    try:
        for _ in range(rounds):
            sim.run_round()
        eps = next(iter(sim.hospitals.values())).task.trainer.ledger.entries[-1]
        return sim.evaluate("test"), eps["epsilon"], eps["epsilon_alone"]
    finally:
        sim.audit.close()


def local(tables, dictionary, *, seed, epsilon, rounds, workdir):
    cfg = demo_dp_config(rounds=rounds, seed=seed, secure_mode="masked", epsilon=epsilon)
    cfg = cfg.model_copy(update={"output": workdir / "out", "split": cfg.split.model_copy(update={"validation_fraction": VAL}),
                                 "privacy": cfg.privacy.model_copy(update={"state_dir": workdir / "state"})})
    res = simulate(tables, dictionary, cfg, audit_dir=workdir / "audit")
    return res.final, max(v[-1] for v in res.epsilons.values())


def sigma_for(eps, *, q, rounds, scale, dim, clip=CLIP):
    return calibrate_noise_multiplier(target_epsilon=eps, delta=DELTA, rounds=rounds, sample_rate=q, clip=clip,
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
    from research.model_quality import baselines

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


def _score(r: dict) -> float:
    return -1.0 if math.isnan(r["val_auroc"]) else r["val_auroc"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="small hospitals, 1 seed, ε = 3, a tiny grid")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--min-honest", type=int, default=2)
    ap.add_argument("--skip-local", action="store_true")
    ap.add_argument("--add-baselines", action="store_true",
                    help="add logistic regression standalone / pooled (and FedAvg LR, pooled GBM) on the same "
                         "splits to the existing results JSON, per seed, and exit")
    ap.add_argument("--select-eps", default="1,3,10",
                    help="the ε at which the DP hyper-parameters are chosen; any other ε takes the choice at the "
                         "largest of these not above it (the rule of sdk/privacy/schedule.py)")
    ap.add_argument("--seed-list", default=None, help="test only these seeds, e.g. '1,2' (merge with --merge)")
    ap.add_argument("--epsilons", default="1,3,10", help="the target ε values tested")
    ap.add_argument("--select-only", action="store_true", help="run the selection, write it to --out, no test runs")
    ap.add_argument("--merge", nargs="*", default=None, help="JSONs of --seed-list runs to merge into --out")
    ap.add_argument("--optimizers", action="store_true",
                    help="also score server momentum (β 0.5, 0.9) and server Adam on the ε = 3 choice "
                         "(validation only; recorded, never chosen automatically)")
    ap.add_argument("--selection-from", default=None,
                    help="a JSON of earlier validation scores (keys distributed@<ε>, non_dp, server_optimizers; "
                         "e.g. research/dp_trust_models/results/dp_trust_models_selection_eps3.json): reused, not re-run")
    ap.add_argument("--clips", default="1,3", help="the grid's clip norms C for selections run here")
    a = ap.parse_args()
    out_file = out_path(__file__, a)
    if a.add_baselines:
        add_baselines(out_file)
        return
    if a.merge:
        merge([RESULTS / f for f in a.merge], out_file)
        return
    scale = 0.15 if a.quick else 1.0
    seeds = [0] if a.quick else list(range(a.seeds))
    epsilons = [3.0] if a.quick else [float(e) for e in a.epsilons.split(",")]
    clips = {float(c) for c in a.clips.split(",")}
    grid = [g for g in GRID if g["clip"] in clips]
    grid = [g for g in grid if g["rounds"] == 15 and g["lr"] * g["clip"] == 3.0] if a.quick else grid
    prior = json.loads(Path(a.selection_from).read_text()) if a.selection_from else {}
    if "selection" in prior:  # a --select-only output of this script
        prior = {**prior["selection"], "non_dp": prior["selection_non_dp"],
                 "server_optimizers": prior["selection_server_optimizers"]}
    none_grid = [g for g in NONE_GRID if g["rounds"] == 15][:2] if a.quick else NONE_GRID
    t0 = time.time()
    data = {seed: tables_for(seed, scale) for seed in seeds}
    tables, d = data[seeds[0]]
    _, dim0 = pooled(tables, d, seed=0, sigma=None, clip=CLIP, lr=0.0, sample_rate=0.01, rounds=0)
    ring = _ring_scale(len(tables))

    def val_score(g: dict, *, sigma: float | None, **server) -> dict:
        """Mean over the seeds of the mean-over-hospitals VALIDATION AUROC (test never read)."""
        per = []
        for seed in seeds:
            t, dd = data[seed]
            val, _ = pooled(t, dd, seed=seed, sigma=sigma, split_name="validation", **g, **server)
            per.append(_mean(val, "auroc"))
        v = [x for x in per if not math.isnan(x)]
        return {**g, **server, "sigma": sigma, "val_auroc_per_seed": per,
                "val_auroc": float(np.mean(v)) if len(v) == len(per) else float("nan")}

    # -- selection on validation: the distributed accountant's σ (= central's at q = 1, within 1 %)
    sel_eps = [e for e in (float(x) for x in a.select_eps.split(",")) if e in epsilons] or [epsilons[0]]
    sel, hps = {}, {}

    def seen(rows: list, g: dict) -> bool:
        return any(all(r.get(k) == g[k] for k in ("lr", "rounds", "clip", "sample_rate")) for r in rows)

    def capped(rows: list) -> list:
        return [r for r in rows if r["rounds"] <= MAX_ROUNDS and not r.get("server")]

    for se in sel_eps:
        key = f"distributed@{se}"
        sel[key] = list(prior.get(key, []))
        for g in [g for g in grid if not seen(sel[key], g)]:
            sig = sigma_for(se, q=g["sample_rate"], rounds=g["rounds"], scale=ring, dim=dim0, clip=g["clip"])
            sel[key].append(val_score(g, sigma=sig))
            print("select", key, sel[key][-1], flush=True)
        best = max(capped(sel[key]), key=_score)
        hps[key] = {k: best[k] for k in ("lr", "sample_rate", "rounds", "clip")}

    def hp_for(eps: float) -> dict:
        fits = [e for e in sel_eps if e <= eps] or [min(sel_eps)]
        return hps[f"distributed@{max(fits)}"]

    sel_opt = list(prior.get("server_optimizers", []))
    if a.optimizers and not sel_opt:  # server momentum / Adam on the ε = 3 choice: post-processing, same σ
        hd = hp_for(3.0)
        sig = sigma_for(3.0, q=hd["sample_rate"], rounds=hd["rounds"], scale=ring, dim=dim0, clip=hd["clip"])
        for beta in (0.5, 0.9):
            sel_opt.append(val_score(dict(hd, lr=hd["lr"] * (1 - beta)), sigma=sig, server="momentum", beta=beta))
            print("select optimizer", sel_opt[-1], flush=True)
        for lr in (0.003, 0.01, 0.03):
            sel_opt.append(val_score(dict(hd, lr=lr), sigma=sig, server="adam"))
            print("select optimizer", sel_opt[-1], flush=True)
    sel_none = list(prior.get("non_dp", []))
    for g in [g for g in none_grid if not seen(sel_none, g)]:
        sel_none.append(val_score(g, sigma=None))
        print("select none", sel_none[-1], flush=True)
    best_none = max(capped(sel_none), key=_score)
    hp_none = {k: best_none[k] for k in ("lr", "sample_rate", "rounds")}
    runs = []
    test_seeds = [] if a.select_only else [int(x) for x in a.seed_list.split(",")] if a.seed_list else seeds
    for seed in test_seeds:
        tables, d = data[seed]
        none, dim = pooled(tables, d, seed=seed, sigma=None, clip=CLIP, **hp_none)
        runs.append({"model": "none", "seed": seed, "epsilon": None, **hp_none, "auroc": _mean(none, "auroc"),
                     "auprc": _mean(none, "auprc"), "per_hospital": none})
        print({k: v for k, v in runs[-1].items() if k != "per_hospital"}, flush=True)
        n = len(tables)
        for eps in epsilons:
            ring = _ring_scale(n)
            hd = hp_for(eps)
            sig_d = sigma_for(eps, q=hd["sample_rate"], rounds=hd["rounds"], scale=ring, dim=dim, clip=hd["clip"])
            with tempfile.TemporaryDirectory() as tmp:
                res, e, e_alone = distributed(tables, d, seed=seed, sigma=sig_d, h=a.min_honest, workdir=Path(tmp), **hd)
            runs.append({"model": "distributed", "seed": seed, "epsilon": eps, "epsilon_spent": e,
                         "epsilon_alone": e_alone, "sigma": sig_d, "min_honest": a.min_honest, **hd,
                         "auroc": _mean(res, "auroc"), "auprc": _mean(res, "auprc"), "per_hospital": res})
            print({k: v for k, v in runs[-1].items() if k != "per_hospital"}, flush=True)
            sig_c = gaussian_sigma(eps, q=hd["sample_rate"], rounds=hd["rounds"])
            res, _ = pooled(tables, d, seed=seed, sigma=sig_c, **hd)
            runs.append({"model": "central", "seed": seed, "epsilon": eps, "sigma": sig_c, **hd,
                         "auroc": _mean(res, "auroc"), "auprc": _mean(res, "auprc"), "per_hospital": res})
            print({k: v for k, v in runs[-1].items() if k != "per_hospital"}, flush=True)
            if not a.skip_local:
                with tempfile.TemporaryDirectory() as tmp:
                    res, e = local(tables, d, seed=seed, epsilon=eps, rounds=2 if a.quick else 8, workdir=Path(tmp))
                runs.append({"model": "local", "seed": seed, "epsilon": eps, "epsilon_spent": e,
                             "auroc": _mean(res, "auroc"), "auprc": _mean(res, "auprc"), "per_hospital": res})
                print({k: v for k, v in runs[-1].items() if k != "per_hospital"}, flush=True)
    out = {"benchmark": "dp_trust_models", "delta": DELTA, "hidden": HIDDEN, "seeds": seeds,
           "selection_metric": "mean over seeds of the mean-over-hospitals validation AUROC",
           "hyperparameters": hps, "non_dp_hyperparameters": hp_none, "select_eps": sel_eps, "max_rounds": MAX_ROUNDS,
           "selection": sel, "selection_from": a.selection_from, "selection_non_dp": sel_none,
           "selection_server_optimizers": sel_opt, "min_honest": a.min_honest, "runs": runs,
           "seconds": round(time.time() - t0, 1), "machine": machine(), "quick": a.quick}
    out["summary"] = summarise(runs)
    save(out, out_file)
    print(json.dumps({k: {m: round(v[m]["mean"], 4) for m in v} for k, v in out["summary"].items()}, indent=1))


def summarise(runs: list) -> dict:
    table = {}
    for r in runs:
        key = f"{r['model']}@{r['epsilon']}"
        table.setdefault(key, {"auroc": [], "auprc": []})
        table[key]["auroc"].append(r["auroc"])
        table[key]["auprc"].append(r["auprc"])
    return {k: {m: {"mean": float(np.mean(v)), "std": float(np.std(v)), "n": len(v), "per_seed": v}
                for m, v in x.items()} for k, x in table.items()}


def merge(parts: list, path: Path) -> None:
    """One JSON from ``--seed-list`` runs that share one selection (their runs concatenated)."""
    docs = [json.loads(p.read_text()) for p in parts]
    out = dict(docs[0])
    out["runs"] = sorted((r for d in docs for r in d["runs"]), key=lambda r: (r["seed"], str(r["epsilon"]), r["model"]))
    out["seconds"] = sum(d["seconds"] for d in docs)
    out["seconds_note"] = "sum over the parallel --seed-list processes (each re-read the selection)"
    out["merged_from"] = [p.name for p in parts]
    out["summary"] = summarise(out["runs"])
    path.write_text(json.dumps(out, indent=2, sort_keys=True, default=float))
    print(json.dumps({k: {m: round(v[m]["mean"], 4) for m in v} for k, v in out["summary"].items()}, indent=1))


if __name__ == "__main__":
    main()
