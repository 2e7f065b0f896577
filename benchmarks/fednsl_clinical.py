"""Do rules learned across a federation reach the hospital that never saw the phenotype?

Hospitals are cut from ALARM demo patients (:mod:`clinograph.sdk.research.alarm_demo`; head:
``shunt``). Shunt has two causes in ALARM: pulmonary embolism (PE, ~1 % of patients, seen in
the monitors as a high pulmonary artery pressure) and one-sided intubation. ``north`` has *no*
PE patient at all; ``south`` is enriched in PE; ``east`` has the ordinary mix. North's unseen
subgroup is a held-out set of PE patients no hospital trained on.

Arms (same predicates, same split; north's personalised model is evaluated):

- ``fednsl_kl``: FedNSL over the runtime in ``masked`` mode, λ = 1 (eq. 2's KL to the prior);
- ``fednsl_kl_0.1``: the same with λ = 0.1 (the paper's Fig. 2 b3: the coefficient matters);
- ``fednsl_no_kl``: the same with λ = 0 (the paper's "W/O. KL" ablation);
- ``fedavg``: FedAvg of a logistic regression on the same fuzzy predicate values (global model);
- ``local``: north's logistic regression alone.

Accuracy at 0.5 on north's unseen PE subgroup and on its own (seen) test split; AUROC on the
seen split. Writes benchmarks/results/fednsl_clinical.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from clinograph.sdk.fednsl import (
    EStepSettings,
    HospitalGraph,
    HospitalRules,
    RuleSpace,
    ScorerSettings,
)
from clinograph.sdk.fednsl.federation import run_rules_federation
from clinograph.sdk.fednsl.generator import GeneratorPreset, RuleGenerator
from clinograph.sdk.fednsl.predicates import fuzzy_values, predicate_names
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ontology import SiteSchema
from clinograph.sdk.ontology.schema import ColumnMap
from clinograph.sdk.research.alarm_demo import load_dictionary, render_patients, sample_alarm
from clinograph.secure.audit import AuditTrail
from clinograph.secure.audit.verify import verify_audit_dir
from clinograph.secure.identity import Identity
from clinograph.secure.runtime.config import FederationSection
from sklearn.metrics import roc_auc_score

from benchmarks._common import machine, write

SITES = {"north": 1200, "south": 900, "east": 900}
PE_SHARE = {"north": 0.0, "south": 0.25, "east": None}  # None: the population's own mix
UNSEEN = 150


def cohorts(seed: int):
    """Canonical tables per hospital plus north's unseen PE set (the PE flag never leaves the benchmark)."""
    states = sample_alarm(40_000, seed=seed)
    canon = render_patients(states, seed=seed + 1)
    pe = (states["PULMEMBOLUS"] == "TRUE").to_numpy()
    rng = np.random.default_rng(seed)
    pe_idx, other = rng.permutation(np.flatnonzero(pe)), rng.permutation(np.flatnonzero(~pe))
    unseen, pe_idx = pe_idx[:UNSEEN], pe_idx[UNSEEN:]
    out, o, p = {}, 0, 0
    for site, n in SITES.items():
        share = PE_SHARE[site]
        n_pe = int(round(n * share)) if share is not None else int(round(n * pe.mean()))
        rows = np.concatenate([pe_idx[p:p + n_pe], other[o:o + n - n_pe]])
        p, o = p + n_pe, o + n - n_pe
        out[site] = canon.iloc[rows].reset_index(drop=True)
    return out, canon.iloc[unseen].reset_index(drop=True)


def to_table(df: pd.DataFrame, site: str, dictionary):
    feats = [c for c in df.columns if c != "shunt"]
    t = df[feats].copy()
    t.insert(0, "pid", [f"{site}-{i}" for i in range(len(df))])
    t["y"] = df["shunt"].to_numpy()
    schema = SiteSchema(site=site, patient_id="pid", label="y",
                        columns={f: ColumnMap(feature=f, unit=dictionary.get(f).unit) for f in feats})
    return ingest(t, schema=schema, dictionary=dictionary)


def _lr(x: np.ndarray, y: np.ndarray, init=None, steps: int = 200) -> torch.nn.Linear:
    m = torch.nn.Linear(x.shape[1], 1).double()
    if init is not None:
        m.load_state_dict(init)
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y, dtype=torch.float64)
    pos = yt.mean().clamp(1e-3, 1 - 1e-3)
    w = torch.where(yt > 0, 0.5 / pos, 0.5 / (1 - pos))
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(m(xt)[:, 0], yt, weight=w)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m


def _lr_predict(m, x):
    with torch.no_grad():
        return torch.sigmoid(m(torch.as_tensor(x))[:, 0]).numpy()


def _metrics(p_seen, y_seen, p_unseen, y_unseen) -> dict:
    return {"seen_acc": float(((p_seen >= 0.5) == (y_seen == 1)).mean()),
            "seen_auroc": float(roc_auc_score(y_seen, p_seen)),
            "unseen_acc": float(((p_unseen >= 0.5) == (y_unseen == 1)).mean()),
            "unseen_positive_rate": float(y_unseen.mean())}


def run_seed(seed: int, *, rounds: int, workdir: Path) -> dict:
    dictionary = load_dictionary()
    frames, unseen_df = cohorts(seed)
    preds = predicate_names(dictionary, normal=False)
    space = RuleSpace.enumerate(heads=("shunt",), predicates=preds, max_len=2)
    tables = {s: to_table(df, s, dictionary) for s, df in frames.items()}
    # north's graph includes the unseen patients as unlabelled nodes (they arrive at north; never trained on)
    north_all = to_table(pd.concat([frames["north"], unseen_df], ignore_index=True), "north", dictionary)
    tables_graph = {**tables, "north": north_all}
    rng = np.random.default_rng(seed)
    splits = {}
    for s, t in tables.items():
        perm = rng.permutation(t.n_patients)
        splits[s] = (perm[: int(0.7 * len(perm))], perm[int(0.7 * len(perm)):])
    unseen_rows = np.arange(tables["north"].n_patients, north_all.n_patients)
    y_unseen = north_all.labels[unseen_rows]
    results = {"n_pe_train": {s: int(PE_SHARE[s] * SITES[s]) if PE_SHARE[s] is not None else None for s in SITES},
               "shunt_rate": {s: float(t.labels.mean()) for s, t in tables.items()}}
    for arm, lam in (("fednsl_kl", 1.0), ("fednsl_kl_0.1", 0.1), ("fednsl_no_kl", 0.0)):
        hospitals, tests = {}, {}
        for s, t in tables_graph.items():
            labels = t.labels.copy()
            if s == "north":
                labels[unseen_rows] = -1  # unlabelled at north: never in training
            hospitals[s] = HospitalRules(space=space, graph=HospitalGraph.build(t, preds, k=5), labels={"shunt": labels},
                                         train=splits[s][0],
                                         settings=EStepSettings(draws=256, scorer=ScorerSettings(kl_weight=lam)))
            tests[s] = splits[s][1]
        sid = Identity.generate("server")
        run_dir = workdir / f"{arm}-{seed}"
        audit = AuditTrail(run_dir / "audit", identity=sid)
        gen = RuleGenerator(space, preset=GeneratorPreset(epochs=10, samples_per_head=512), seed=seed)
        res = run_rules_federation(hospitals=hospitals, tests=tests, space=space, audit=audit, server_identity=sid,
                                   federation=FederationSection(id=f"fednsl-{arm}", rounds=rounds, secure_mode="masked",
                                                                seed=seed),
                                   dictionary_hash=dictionary.digest(), workdir=run_dir, generator=gen)
        audit.close()
        north = res.tasks["north"].rules
        seen_rows = splits["north"][1]
        m = _metrics(north.predict("shunt", seen_rows), tables["north"].labels[seen_rows],
                     north.predict("shunt", unseen_rows), y_unseen)
        prior = res.priors[-1][0]
        m["top_rules"] = [[str(space.rule(0, j)), float(prior[j])] for j in np.argsort(-prior)[:5]]
        fit = north.fits["shunt"]
        m["north_posterior_top"] = [[str(space.rule(0, int(fit.candidates[j]))), float(fit.posterior[j])]
                                    for j in np.argsort(-fit.posterior)[:5]]
        m["audit_verified"] = bool(verify_audit_dir(run_dir / "audit").ok)
        results[arm] = m
    # FedAvg / local logistic regression on the same fuzzy predicate values
    xs = {s: fuzzy_values(t, preds) for s, t in tables.items()}
    x_unseen = fuzzy_values(north_all, preds)[unseen_rows]
    glob = None
    for _ in range(rounds * 4):
        states, ws = [], []
        for s in tables:
            tr = splits[s][0]
            m = _lr(xs[s][tr], tables[s].labels[tr], init=glob, steps=25)
            states.append(m.state_dict())
            ws.append(len(tr))
        glob = {k: sum(w * st[k] for st, w in zip(states, ws, strict=True)) / sum(ws) for k in states[0]}
    fedavg = torch.nn.Linear(len(preds), 1).double()
    fedavg.load_state_dict(glob)
    tr, te = splits["north"]
    results["fedavg"] = _metrics(_lr_predict(fedavg, xs["north"][te]), tables["north"].labels[te],
                                 _lr_predict(fedavg, x_unseen), y_unseen)
    local = _lr(xs["north"][tr], tables["north"].labels[tr], steps=300)
    results["local"] = _metrics(_lr_predict(local, xs["north"][te]), tables["north"].labels[te],
                                _lr_predict(local, x_unseen), y_unseen)
    return results


ARMS = ("fednsl_kl", "fednsl_kl_0.1", "fednsl_no_kl", "fedavg", "local")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        per_seed = [run_seed(s, rounds=args.rounds, workdir=Path(tmp)) for s in range(args.seeds)]
    summary = {arm: {k: {"mean": float(np.mean([r[arm][k] for r in per_seed])),
                         "sd": float(np.std([r[arm][k] for r in per_seed]))}
                     for k in ("seen_acc", "seen_auroc", "unseen_acc")} for arm in ARMS}
    u = {a: summary[a]["unseen_acc"]["mean"] for a in ARMS}
    payload = {"experiment": "FedNSL clinical rule transfer (ALARM demo, shunt, PE phenotype unseen at north)",
               "seeds": args.seeds, "rounds": args.rounds, "summary": summary,
               "goal_kl_gt_nokl_gt_fedavg": bool(u["fednsl_kl"] > u["fednsl_no_kl"] > u["fedavg"]),
               "goal_best_kl_gt_nokl_gt_fedavg": bool(max(u["fednsl_kl"], u["fednsl_kl_0.1"]) > u["fednsl_no_kl"] > u["fedavg"]),
               "per_seed": per_seed, "seconds": time.time() - t0, "machine": machine()}
    print(write("fednsl_clinical", payload))
    for a in ARMS:
        print(f"{a:14s} " + "  ".join(f"{k}={v['mean']:.3f}±{v['sd']:.3f}" for k, v in summary[a].items()))
    print("goal:", payload["goal_kl_gt_nokl_gt_fedavg"])


if __name__ == "__main__":
    main()
