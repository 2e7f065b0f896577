"""Clinograph's AGAT against the AGAT authors' released code, on the same patients and splits.

    python -m research.real_tables.agat_vs_authors                          # ours + LR only (offline)
    python -m research.real_tables.agat_vs_authors --authors-code DIR       # + the authors' code
    python -m research.real_tables.agat_vs_authors --quick                  # 1 seed, 5 rounds

Cohorts: :mod:`clinograph.sdk.datasets.real_tables` as they are cut there (gbsg2: 4 hospitals
with 7-10 of 10 features; kidney: 3 hospitals with 2-3 of 3 features); seeds 0.. are the split,
initialisation and training seeds. Every arm sees the same hospitals and the same splits
(the hospital split rule: test 30 %, validation 20 % of the rest); every choice is made on
validation only; test AUROC per hospital.

Arms:

- ``agat_plaintext``: Clinograph's AGAT (``task = "agat"``), ``insecure_attention`` (FedAtt
  layer-wise at the server) under ``insecure_plaintext``; ``agat_secure``: the same with
  ``agat_secure_attention`` under ``masked``; ``agat_fedsgd``: the same network with plain
  sample-weighted averaging (``fedsgd``, masked), which isolates the attention. The paper's appendix C training (Adam lr 0.001,
  batch 64, 2 local epochs), ``--rounds`` rounds (the paper: 300), round kept by federated
  validation loss, Platt on validation.
- ``authors``: the authors' code (github.com/AnshThakur/FL4HeterogenousEHRs, MIT licence, the
  commit recorded in the JSON), given with ``--authors-code`` (a checkout; nothing is downloaded).
  Their ``GATT``, ``MakegraphHT``, ``prediction_binaryT`` and ``combine_grads`` are imported and
  their ``client_training`` is executed from ``main_graph.ipynb`` as published; three shims, all
  recorded: ``dgl`` (imported, never used by these functions) is stubbed; PyG's ``knn_graph``
  needs torch-cluster, which does not install here, so it is replaced by an exact k-NN with the
  same semantics (k = 1, ``loop=True``: each patient's nearest patient *including itself*, flow
  source to target); their ``evaluate_modelsT`` (pandas' removed ``DataFrame.append``, files on
  disk) is replaced by the same rule in memory: each hospital keeps its personalised model of
  the round with the best validation AUROC. Their inputs: each hospital's own standardised
  columns (features all hospitals have first, then its own, in dictionary order), median-filled
  from its training patients (their loaders), ``in_dim`` = 100 (the notebook's; their
  ``prediction_binaryT`` hard-codes it).
  Their server: the unweighted mean of the hospitals' deltas as the gradient of Adam lr 0.001
  (no attention); their clients: fresh Adam lr 0.001, ``inner_epochs = 1``, batches of 64.
  Their ``client_training`` skips every hospital's last training batch (``if i<len(train_loader)-1``),
  so a hospital with at most 64 training patients never trains; ``authors_all_batches`` is the
  same code with that one condition removed (the only edit), to separate that effect.
- ``lr_standalone``, ``lr_pooled``: logistic regression per hospital on its own features and
  pooled (a ceiling no federation may build), C chosen on validation
  (:func:`clinograph.sdk.demo.baselines.reference_baselines`).

Writes research/real_tables/results/agat_vs_authors.json (means, sds and medians over seeds of
the mean over hospitals, per hospital too). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, summarise_arms, write  # noqa: E402

OURS = ("agat_plaintext", "agat_secure", "agat_fedsgd")
#: the authors' input width (main_graph.ipynb; utilsGHomo.prediction_binaryT pads to 100 whatever in_dim is)
AUTHORS_IN_DIM = 100
REFERENCES = ("lr_standalone", "lr_pooled")


# -- ours ------------------------------------------------------------------------------------------
def agat_config(*, arm: str, seed: int, rounds: int):
    from clinograph.sdk.config import SimulationConfig

    plain = arm == "agat_plaintext"
    strategy = {"agat_plaintext": "insecure_attention", "agat_secure": "agat_secure_attention"}.get(arm, "fedsgd")
    return SimulationConfig.model_validate({
        "task": "agat",
        "federation": {"id": f"agat-{arm}-{seed}", "seed": seed, "rounds": rounds, "local_epochs": 2,
                       "secure_mode": "insecure_plaintext" if plain else "masked",
                       "strategy": strategy,
                       "strategy_options": {"server_lr": 1.0}},
        "agat": {"hidden": 128, "heads": 1, "dropout": 0.25, "k_neighbours": 5},
        "training": {"lr": 0.001, "batch_size": 64, "seed": seed},
        "model": {"init_seed": seed}, "split": {"seed": seed}, "selection": {"restarts": 1},
    })


def run_ours(arm: str, tables, dictionary, *, seed: int, rounds: int) -> tuple[dict, dict]:
    from clinograph.sdk.agat.federation import run_agat_simulation

    config = agat_config(arm=arm, seed=seed, rounds=rounds)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_agat_simulation(tables, dictionary, config, audit_dir=Path(tmp) / "audit")
    info = {"seconds": round(time.perf_counter() - t0, 1), "rounds_run": len(res.rounds),
            "selected_round": res.selection.get("round")}
    return {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in res.final.items()}, info


# -- the authors' code -----------------------------------------------------------------------------
def exact_knn_graph(x, k: int = 1, loop: bool = False, **_):
    """PyG ``knn_graph(x, k, loop)`` without torch-cluster: edges (neighbour -> patient) to each
    patient's k nearest patients in Euclidean distance, itself included when ``loop`` (so k = 1
    with ``loop=True`` gives self-loops only, as torch-cluster does for distinct points)."""
    import torch

    d = torch.cdist(x.double(), x.double())
    if not loop:
        d.fill_diagonal_(float("inf"))
    kk = min(k, x.shape[0] - (0 if loop else 1))
    nbr = torch.sort(d, dim=1, stable=True).indices[:, :kk]
    dst = torch.arange(x.shape[0]).repeat_interleave(kk)
    return torch.stack([nbr.reshape(-1), dst])


#: the one edit of the ``authors_all_batches`` arm: their client loop's skip of the last training batch
LAST_BATCH_SKIP = "if i<len(train_loader)-1:"


def load_authors(code_dir: Path) -> dict:
    """The authors' modules and their ``client_training`` (executed from their notebook)."""
    for name in ("dgl", "dgl.nn", "dgl.function"):  # imported by Model.py / MakeGraph.py, unused here
        mod = types.ModuleType(name)
        mod.GraphConv = None
        sys.modules.setdefault(name, mod)
    sys.modules["dgl"].nn = sys.modules["dgl.nn"]
    sys.modules["dgl"].function = sys.modules["dgl.function"]
    sys.path.insert(0, str(code_dir))
    import MakeGraph  # noqa: PLC0415
    import Model  # noqa: PLC0415
    import utilsGHomo  # noqa: PLC0415

    MakeGraph.knn_graph = exact_knn_graph
    cells = json.loads((code_dir / "main_graph.ipynb").read_text())["cells"]
    src = "".join(next(c["source"] for c in cells if "def client_training" in "".join(c["source"])))
    start = src.index("def client_training")
    fn_src = src[start:src.index("# %% [code]", start)]
    commit = subprocess.run(["git", "-C", str(code_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
    return {"Model": Model, "MakeGraph": MakeGraph, "utils": utilsGHomo, "client_training_src": fn_src,
            "commit": commit.stdout.strip() or None}


def authors_inputs(tables, splits):
    """Per hospital: (train, val, test) arrays of its own columns, common features first, median-filled
    from its training patients (their loaders' rule); columns never observed in training are dropped."""
    observed = [set(np.flatnonzero(t.dense()[1][s.train].any(axis=0))) for t, s in zip(tables, splits, strict=True)]
    common = set.intersection(*observed)
    out = []
    for t, s, obs in zip(tables, splits, observed, strict=True):
        cols = sorted(common) + sorted(obs - common)
        v = t.dense()[0][:, cols]
        med = np.nanmedian(v[s.train], axis=0)
        v = np.where(np.isnan(v), med, v)
        out.append([(v[idx], t.labels[idx].astype(float)) for idx in (s.train, s.validation, s.test)])
    return out


def run_authors(authors: dict, tables, splits, *, seed: int, rounds: int, in_dim: int,
                all_batches: bool = False) -> tuple[dict, dict]:
    """Their training loop (main_graph.ipynb): server Adam on the mean delta, clients' best-val-AUROC
    personalised model tested on the test split. ``all_batches``: their client loop without the
    last-batch skip (:data:`LAST_BATCH_SKIP` -> ``if True:``)."""
    import copy
    import random

    import torch
    from sklearn.metrics import average_precision_score
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = torch.device("cpu")
    GATT, utils = authors["Model"].GATT, authors["utils"]
    data = authors_inputs(tables, splits)
    loaders = [[DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=64, shuffle=(i == 0))
                for i, (x, y) in enumerate(parts)] for parts in data]
    ns = {"GATT": GATT, "MakegraphHT": authors["MakeGraph"].MakegraphHT, "torch": torch, "nn": nn,
          "OrderedDict": __import__("collections").OrderedDict, "in_dim": in_dim, "hidden_dim": 128, "device": device}
    src = authors["client_training_src"]
    if all_batches:
        if src.count(LAST_BATCH_SKIP) != 1:
            raise RuntimeError("the authors' client_training changed: the last-batch skip is not found once")
        src = src.replace(LAST_BATCH_SKIP, "if True:")
    exec(src, ns)  # noqa: S102 -- their published function, unchanged
    client_training = ns["client_training"]
    global_model = GATT(in_dim, 128, device)
    optimizer = torch.optim.Adam(params=global_model.parameters(), lr=0.001)
    loss_fn = nn.BCELoss()
    best = [(-1.0, None)] * len(tables)
    t0 = time.perf_counter()
    for _ in range(rounds):
        global_model.train()
        optimizer.zero_grad()
        weights = global_model.state_dict()
        grads, nets = [], []
        for j in range(len(tables)):
            _, g, net = client_training(weights, loaders, j, inner_epochs=1)
            grads.append(g)
            nets.append(net)
        grad = utils.combine_grads(grads)
        for name, par in global_model.named_parameters():
            if par.requires_grad:
                par.grad = grad[name]
        optimizer.step()
        for k in range(len(tables)):
            _, auc = utils.prediction_binaryT(nets[k], loaders[k][1], loss_fn, device)
            if auc > best[k][0]:
                best[k] = (auc, copy.deepcopy(nets[k]))
    out = {}
    for k, t in enumerate(tables):
        model = best[k][1]
        model.eval()
        preds, labels = [], []
        with torch.no_grad():
            for x, y in loaders[k][2]:  # prediction_binaryT's own augmentation and graph, kept for AUPRC
                torch.manual_seed(seed * 1000 + k)
                preds.append(_authors_predict(model, x, authors, in_dim))
                labels.append(y.numpy())
        torch.manual_seed(seed * 1000 + k)
        _, auc = utils.prediction_binaryT(model, loaders[k][2], loss_fn, device)
        out[t.site] = {"auroc": float(auc),
                       "auprc": float(average_precision_score(np.concatenate(labels), np.concatenate(preds)))}
    info = {"seconds": round(time.perf_counter() - t0, 1), "best_val_auroc": {t.site: float(b[0])
            for t, b in zip(tables, best, strict=True)},
            "columns": {t.site: int(d[0][0].shape[1]) for t, d in zip(tables, data, strict=True)},
            "train_batches_used": {t.site: -(-len(d[0][0]) // 64) - (0 if all_batches else 1)
                                   for t, d in zip(tables, data, strict=True)}}
    return out, info


def _authors_predict(model, data, authors, in_dim):
    """prediction_binaryT's forward for one test batch (their augmentation, their graph)."""
    import torch

    mean, std = data.mean(), data.std()
    normalised = (data - mean) / std
    idx = torch.randint(0, normalised.size(1), (in_dim - data.shape[1],))
    resized = torch.cat((data, normalised[:, idx]), axis=1)
    g = authors["MakeGraph"].MakegraphHT(resized)
    return model(g.edge_index, resized.to(torch.float32)).numpy()


# -- the study -------------------------------------------------------------------------------------
def medians(summary: dict) -> dict:
    return {arm: {site: {m: float(statistics.median(v[m]["per_seed"])) for m in v} for site, v in sites.items()}
            for arm, sites in summary.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="1 seed, 5 rounds")
    ap.add_argument("--cohorts", default="gbsg2,kidney")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=100, help="rounds of every federated arm (the notebook: 100; the paper: 300)")
    ap.add_argument("--authors-code", type=Path, default=None,
                    help="a checkout of github.com/AnshThakur/FL4HeterogenousEHRs (MIT); without it, no 'authors' arm")
    ap.add_argument("--arms", default=",".join(OURS), help="which of our arms to run")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    from clinograph.sdk.demo.baselines import reference_baselines

    from research.model_quality import splits_for
    from research.real_tables.real_tables import load

    seeds = [0] if args.quick else list(range(args.seeds))
    rounds = 5 if args.quick else args.rounds
    authors = load_authors(args.authors_code.resolve()) if args.authors_code else None
    ours = [a for a in args.arms.split(",") if a]
    arms = ours + (["authors", "authors_all_batches"] if authors else []) + list(REFERENCES)
    payload: dict = {"setup": __doc__.split("Writes")[0].strip(), "seeds": seeds, "rounds": rounds,
                     "authors_commit": authors["commit"] if authors else None, "cohorts": {}}
    t_all = time.perf_counter()
    for cohort in args.cohorts.split(","):
        c, tables = load(cohort)
        in_dim = AUTHORS_IN_DIM
        per_seed, runs = [], []
        for seed in seeds:
            splits = splits_for(tables, agat_config(arm=ours[0] if ours else "agat_plaintext", seed=seed, rounds=1))
            results, info = {}, {}
            for arm in ours:
                results[arm], info[arm] = run_ours(arm, tables, c.dictionary, seed=seed, rounds=rounds)
            if authors:
                for arm, every in (("authors", False), ("authors_all_batches", True)):
                    results[arm], info[arm] = run_authors(authors, tables, splits, seed=seed, rounds=rounds,
                                                          in_dim=in_dim, all_batches=every)
            refs = reference_baselines(tables, splits, seed=seed)
            for arm in REFERENCES:
                results[arm] = {k: {"auroc": v["auroc"], "auprc": v["auprc"]} for k, v in refs[arm].items()}
            for arm in arms:
                r = results[arm]
                print(f"{cohort} seed {seed} {arm:15s} mean {np.mean([v['auroc'] for v in r.values()]):.3f}  "
                      + " ".join(f"{k} {v['auroc']:.3f}" for k, v in sorted(r.items())), flush=True)
            per_seed.append(results)
            runs.append({"seed": seed, "info": info, "hospitals": {
                t.site: {"patients": t.n_patients, "test": len(s.test), "test_positives": int(t.labels[s.test].sum()),
                         "features": len(t.observed_nodes())} for t, s in zip(tables, splits, strict=True)}})
        summary = summarise_arms(per_seed, arms)
        payload["cohorts"][cohort] = {"summary": summary, "medians": medians(summary), "runs": runs,
                                      "in_dim": in_dim}
        for arm in arms:
            r = summary[arm]["mean_over_hospitals"]["auroc"]
            print(f"{cohort} {arm:15s} AUROC mean {r['mean']:.3f} ± {r['sd']:.3f}  "
                  f"median {statistics.median(r['per_seed']):.3f}", flush=True)
    payload["total_seconds"] = round(time.perf_counter() - t_all, 1)
    payload["machine"] = machine()
    write(out_path(__file__, args), payload)


if __name__ == "__main__":
    main()
