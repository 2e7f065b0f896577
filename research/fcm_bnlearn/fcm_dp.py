"""F-CMs under differential privacy (F-CMs appendix E.4, Table 5; issue 14 item 5).

    python -m research.fcm_bnlearn.fcm_dp --quick     # 1 seed, few rounds, small data; prints JSON only
    python -m research.fcm_bnlearn.fcm_dp             # Asia, ε ∈ {10, 5, 1}, δ = 1e-5, 3 seeds
    python -m research.fcm_bnlearn.fcm_dp --tuned --rounds 30   # the docs/concepts.md table's settings
    python -m research.fcm_bnlearn.fcm_dp --baselines-only      # only the LR rows (research/fcm_bnlearn/fcm_lr.py), merged into the JSON

Setting: Table 5 does not name its dataset; its task accuracies (OpaqNN 80.0, C2BM 79.4 at
ε = 10) match the Asia column of Table 1's F-CMs rows (80.0, 80.4), so Asia (task ``dysp``,
15,000 samples, 70/10/20, appendix B.1 inputs as research/fcm_bnlearn/fcm_bnlearn.py builds them), 20
clients, 10 a round, late joiners at round 10 (appendix D.1/D.3), C2BM and the opaque NN.

- ``none``: the research loop (:class:`~research.fcm_bnlearn.fcm_federation.FCMFederation`)
  without DP, the same fixed number of rounds.
- ``local`` (the paper's DP, E.4): every local step of every client is DP-SGD -- Poisson batch
  (expected size B = 512, appendix D.3, so q = B/n_k), per-patient clip C = 1.0 (eq. 4),
  Gaussian noise σ·C; σ from Opacus's RDP accountant for the client's planned steps
  (rounds × 2 local epochs × max(1, round(1/q)); the steps taken are checked against it),
  counting EVERY round as one the client takes part in (no amplification by client
  sampling: conservative). Client lr (--dp-lr) and rounds chosen on validation
  (docs/concepts.md; the grid and the choice are in the JSON's ``local_dp_tuning``).
- ``distributed`` (issue 14): one DP-SGD step a round (FedSGD), q = 1 (the operating point of
  docs/privacy.md), each sampled client adds a Skellam share Sk(μ/h) to its randomly rounded
  clipped gradient sum at the ring scale s; at least h of the 10 sampled clients are honest.
  σ from the Skellam accountant (:func:`clinograph.secure.dp.calibrate_noise_multiplier`) over
  every round, for a dimension bound above the largest model of the run (checked).

Model selection: the round with the lowest global validation loss after the join (as
research/fcm_bnlearn/fcm_bnlearn.py; post-processing of released models on held-out data). Metrics on
the test split: task accuracy, concept accuracy (C2BM; the opaque NN predicts the task only),
task AUROC. Beside the paper's Table 5, the non-DP figures of fcm_bnlearn.json and logistic
regression standalone / pooled, with and without DP at the same ε (``baselines``). Writes
research/fcm_bnlearn/results/fcm_dp.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from research._common import add_convention, machine, out_path, results_dir, save  # noqa: E402

RESULTS = results_dir(__file__)
from clinograph.sdk.concepts.encoders import MLPEncoder  # noqa: E402
from clinograph.sdk.concepts.graph import ConceptGraph  # noqa: E402
from clinograph.sdk.concepts.metrics import evaluate  # noqa: E402
from clinograph.sdk.concepts.model import ConceptModel  # noqa: E402
from clinograph.sdk.concepts.modules import ConceptHParams  # noqa: E402
from clinograph.sdk.datasets import bnlearn  # noqa: E402
from clinograph.sdk.privacy.calibration import calibrate_noise_multiplier  # noqa: E402
from clinograph.sdk.training.metrics import binary_metrics  # noqa: E402
from clinograph.secure.dp import calibrate_noise_multiplier as skellam_sigma  # noqa: E402

from research.fcm_bnlearn.fcm_bnlearn import client_split, labels_of, prepare  # noqa: E402
from research.fcm_bnlearn.fcm_federation import (  # noqa: E402
    ClientData,
    ConceptDP,
    FCMFederation,
    FederationConfig,
    local_dp_steps_per_epoch,
)
from research.fcm_bnlearn.fcm_lr import lr_rows  # noqa: E402

NETWORK, DELTA, CLIP = "asia", 1e-5, 1.0
#: F-CMs Table 5 (task accuracy, concept accuracy) at ε = 10 / 5 / 1
PAPER = {"opaqnn": {"10": (80.03, 90.37), "5": (79.19, 89.43), "1": (77.31, 89.15)},
         "c2bm": {"10": (79.37, 86.89), "5": (79.20, 86.89), "1": (76.22, 85.81)}}
#: (lr, rounds) chosen on seed-0 validation loss (JSON ``local_dp_tuning``/``distributed_dp_tuning``):
#: local -- the client's Adam lr; distributed -- the server's. Used with --tuned.
TUNED = {("c2bm", "local", 10.0): (1e-2, 60), ("c2bm", "local", 5.0): (1e-2, 30), ("c2bm", "local", 1.0): (3e-2, 30),
         ("opaqnn", "local", 10.0): (3e-2, 60), ("opaqnn", "local", 5.0): (3e-2, 30),
         ("opaqnn", "local", 1.0): (3e-2, 60),
         ("c2bm", "distributed", 10.0): (1e-2, 40), ("c2bm", "distributed", 5.0): (1e-2, 40),
         ("c2bm", "distributed", 1.0): (1e-2, 20), ("opaqnn", "distributed", 10.0): (1e-2, 20),
         ("opaqnn", "distributed", 5.0): (1e-2, 40), ("opaqnn", "distributed", 1.0): (3e-2, 20)}
#: F-CMs Table 1, Asia, F-CMs rows (no DP)
PAPER_NO_DP = {"opaqnn": 80.0, "c2bm": 80.4}


def model_dim(kind: str, nodes, cards, task: str, in_dim: int, hp: ConceptHParams) -> int:
    """Parameters of the model on the complete DAG over every node (an upper bound on any voted graph's)."""
    order = list(nodes)
    if kind == "opaqnn":
        g = ConceptGraph.from_edges(nodes=[task], edges=[], task=task, cards=cards)
    else:
        edges = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]]
        g = ConceptGraph.from_edges(nodes=order, edges=edges, task=task, cards=cards)
    m = ConceptModel(kind="c2bm" if kind == "opaqnn" else kind, encoder=MLPEncoder(in_dim, 64, (128,)), graph=g,
                     z_dim=64, hp=hp)
    return sum(p.numel() for p in m.parameters())


def one_run(kind: str, seed: int, mode: str, eps: float | None, data, args) -> dict:
    nodes, cards, x, codes, (tr, va, te) = data
    task, edges = bnlearn.TASKS[NETWORK], bnlearn.network_edges(NETWORK)
    views, parts = client_split(NETWORK, nodes, tr, seed, args)
    clients = [ClientData(f"h{k:02d}", torch.from_numpy(x[p]), labels_of(codes, p, nodes, set(v.nodes)), v)
               for k, (p, v) in enumerate(zip(parts, views, strict=True))]
    hp = ConceptHParams(hidden=64, emb=16)
    rounds = args.dist_rounds if mode == "distributed" else args.rounds
    dp_lr, server_lr = args.dp_lr, args.server_lr
    if args.tuned and (kind, mode, eps) in TUNED:
        tuned_lr, rounds = TUNED[(kind, mode, eps)]
        dp_lr, server_lr = (tuned_lr, server_lr) if mode == "local" else (dp_lr, tuned_lr)
    dp, info = None, {}
    if mode == "local":
        n_min = min(c.n for c in clients)
        q = min(1.0, args.batch / n_min)
        steps = rounds * args.local_epochs * local_dp_steps_per_epoch(q)
        sigma = calibrate_noise_multiplier(target_epsilon=eps, delta=DELTA, sample_rate=q, steps=steps)
        dp = ConceptDP(mode="local", noise_multiplier=sigma, clip=CLIP, sample_rate=q)
        dim = model_dim(kind, nodes, cards, task, x.shape[1], hp)
        # per step: the clipped mean has norm <= C; the noise on it has norm ~ σ·C·sqrt(d)/B
        info = {"sigma": sigma, "sample_rate": q, "steps": steps, "accountant": "rdp (Opacus)",
                "dim_bound": dim, "noise_norm_over_clip_per_step": sigma * math.sqrt(dim) / (q * n_min)}
    elif mode == "distributed":
        dim = model_dim(kind, nodes, cards, task, x.shape[1], hp)
        sigma = skellam_sigma(target_epsilon=eps, delta=DELTA, rounds=rounds, sample_rate=1.0, clip=CLIP,
                              scale=args.scale, dim=dim)
        dp = ConceptDP(mode="distributed", noise_multiplier=sigma, clip=CLIP, sample_rate=1.0,
                       min_honest=args.min_honest, scale=args.scale, server_lr=server_lr)
        info = {"sigma": sigma, "sample_rate": 1.0, "rounds": rounds, "dim_bound": dim, "min_honest": args.min_honest,
                "scale": args.scale, "server_lr": server_lr, "accountant": "skellam (secure.dp)",
                "total_noise_over_sigma": math.sqrt(args.per_round / args.min_honest)}
    lr = dp_lr if mode == "local" else args.lr
    cfg = FederationConfig(kind=kind, rounds=rounds, patience=None, join_round=args.join, n_initial=args.clients // 2,
                           clients_per_round=args.per_round, local_epochs=args.local_epochs, lr=lr, seed=seed,
                           hp=hp, dp=dp)
    fed = FCMFederation(config=cfg, concepts=nodes, task=task, cards=cards, clients=clients, in_dim=x.shape[1],
                        val=(torch.from_numpy(x[va]), labels_of(codes, va, nodes)))
    t0 = time.perf_counter()
    res = fed.run()
    seconds = time.perf_counter() - t0
    if mode == "local":  # the accountant counted every step taken (sound), and no more were taken
        info["max_steps_taken"] = max(fed.dp_steps.values(), default=0)
        if info["max_steps_taken"] > steps:
            raise RuntimeError(f"a client took {info['max_steps_taken']} DP-SGD steps, the accountant counted {steps}")
    info["lr"] = lr
    info["val_loss_first_best_last"] = [res.val_loss[0], min(res.val_loss), res.val_loss[-1]]
    if mode == "distributed":
        final_dim = sum(p.numel() for p in res.model.parameters())
        info["largest_dim_checked"] = final_dim <= info["dim_bound"]
    xt = torch.from_numpy(x[te])
    lab = labels_of(codes, te, nodes)
    out = evaluate(res.model, xt, lab, task=task, cards=cards, gt_edges=edges)
    with torch.no_grad():
        o = res.model(xt) if res.model.graph.nodes else None
    y = lab[task].numpy()
    auroc = float("nan")
    if o is not None and task in o.probs:
        auroc = binary_metrics(y, o.probs[task][:, 1].numpy())["auroc"]
    concept = out["concept_acc"] if kind != "opaqnn" else None
    r = {"kind": kind, "seed": seed, "mode": mode, "epsilon": eps, "task_acc": 100 * out["task_acc"],
         "concept_acc": None if concept is None else 100 * concept, "task_auroc": auroc,
         "best_round": res.best_round, "rounds": rounds, "seconds": round(seconds, 1), **info}
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    return r


def baseline_rows(seed: int, data, args, epsilons) -> list[dict]:
    """The logistic-regression rows of research/fcm_bnlearn/fcm_lr.py on this seed's data and clients."""
    nodes, _cards, x, codes, splits = data
    views, parts = client_split(NETWORK, nodes, splits[0], seed, args)
    return lr_rows(x=x, codes=codes, task_col=nodes.index(bnlearn.TASKS[NETWORK]), splits=splits, parts=parts,
                   has_task=[v.has_task for v in views], epsilons=epsilons, delta=DELTA, batch=args.batch,
                   clip=CLIP, seed=seed)


def baseline_summary(rows: list[dict]) -> dict:
    keys = sorted({(r["baseline"], r["epsilon"]) for r in rows}, key=lambda k: (k[0], -(k[1] or 0)))
    return {b + ("" if e is None else f"@{e:g}"): summarise([r["task_acc"] for r in rows
                                                            if r["baseline"] == b and r["epsilon"] == e])
            for b, e in keys}


def summarise(vals):
    v = [x for x in vals if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return {"mean": float(np.mean(v)), "std": float(np.std(v)), "n": len(v)} if v else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="1 seed, few rounds, small data")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--kinds", nargs="*", default=["c2bm", "opaqnn"])
    ap.add_argument("--modes", nargs="*", default=["none", "local", "distributed"])
    ap.add_argument("--epsilons", nargs="*", type=float, default=[10.0, 5.0, 1.0])
    ap.add_argument("--rounds", type=int, default=30, help="rounds of the none/local runs (fixed: σ is planned)")
    ap.add_argument("--dist-rounds", type=int, default=60, help="rounds (DP-SGD steps) of the distributed runs")
    ap.add_argument("--batch", type=int, default=512, help="expected Poisson batch B of local DP (appendix D.3)")
    ap.add_argument("--lr", type=float, default=1e-3, help="client Adam lr (fcm_tuning.json: Asia 1e-3)")
    ap.add_argument("--dp-lr", type=float, default=1e-3, help="local DP: the client Adam lr (tuned on validation)")
    ap.add_argument("--tuned", action="store_true", help="lr and rounds of each DP row from TUNED (the table's)")
    ap.add_argument("--server-lr", type=float, default=3e-3, help="distributed: the server's Adam lr")
    ap.add_argument("--min-honest", type=int, default=5, help="distributed: h of the 10 sampled clients")
    ap.add_argument("--scale", type=float, default=2.0 ** 16, help="distributed: ring fixed-point scale s")
    ap.add_argument("--baselines-only", action="store_true",
                    help="only the logistic-regression rows (research/fcm_bnlearn/fcm_lr.py); merged into an existing --out")
    ap.add_argument("--seed-list", nargs="*", type=int, default=None, help="run only these seeds (partial JSON)")
    ap.add_argument("--merge", nargs="*", default=None, help="partial JSONs of --seed-list runs to merge into --out")
    ap.add_argument("--merge-logs", nargs="*", default=None,
                    help="stdout logs of runs (one printed dict a run, values rounded to 3 decimals) to merge into --out")
    a = ap.parse_args()
    a.out = str(out_path(__file__, a))
    args = SimpleNamespace(clients=20, per_round=10, perturb_clients=0.2, perturb_edges=0.3, join=10,
                           local_epochs=2, **{k: getattr(a, k) for k in ("rounds", "dist_rounds", "batch", "lr", "dp_lr", "tuned",
                                                                         "server_lr", "min_honest", "scale")})
    n, ae_epochs, seeds = bnlearn.PAPER_SAMPLES[NETWORK], 10, list(range(a.seeds))
    if a.quick:
        n, ae_epochs, seeds, args.join = 3000, 2, [0], 2
        args.rounds, args.dist_rounds = 4, 4
    if a.seed_list is not None:
        seeds = a.seed_list
    t0 = time.time()
    if a.baselines_only:
        rows = []
        for seed in seeds:
            data = prepare(NETWORK, seed=seed, n=n, ae_epochs=ae_epochs, inputs="all", data="calibrated")
            rows += baseline_rows(seed, data, args, a.epsilons)
        block = {"source": "research/fcm_bnlearn/fcm_lr.py", "seeds": seeds, "summary": baseline_summary(rows), "runs": rows,
                 "seconds": round(time.time() - t0, 1)}
        print(json.dumps(block["summary"], indent=1))
        if not a.quick:
            old = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {}
            old["baselines"] = block
            Path(a.out).write_text(json.dumps(old, indent=2, sort_keys=True, default=float))
        return
    runs, baselines = [], []
    partials = [json.loads(Path(f).read_text()) for f in (a.merge or [])]
    if a.merge_logs:
        import ast

        logged = [ast.literal_eval(line) for f in a.merge_logs for line in Path(f).read_text().splitlines()
                  if line.startswith("{'kind'")]
        partials.append({"seeds": sorted({r["seed"] for r in logged}), "runs": logged,
                         "seconds": sum(r["seconds"] for r in logged)})
    if partials:  # runs made by separate --seed-list processes (in parallel), summarised together
        seeds = sorted({s for p in partials for s in p["seeds"]})
        runs = [r for p in partials for r in p["runs"]]
    for seed in ([] if partials else seeds):
        data = prepare(NETWORK, seed=seed, n=n, ae_epochs=ae_epochs, inputs="all", data="calibrated")
        baselines += baseline_rows(seed, data, args, a.epsilons)
        for kind in a.kinds:
            for mode in a.modes:
                for eps in ([None] if mode == "none" else a.epsilons):
                    runs.append(one_run(kind, seed, mode, eps, data, args))
    summary: dict = {}
    for kind in a.kinds:
        for mode in a.modes:
            for eps in ([None] if mode == "none" else a.epsilons):
                rs = [r for r in runs if r["kind"] == kind and r["mode"] == mode and r["epsilon"] == eps]
                key = f"{kind}/{mode}" + ("" if eps is None else f"@{eps:g}")
                paper = PAPER.get(kind, {}).get(f"{eps:g}") if eps is not None else None
                summary[key] = {m: summarise([r[m] for r in rs]) for m in ("task_acc", "concept_acc", "task_auroc")}
                summary[key]["paper_task_acc"] = paper[0] if paper and mode == "local" else (
                    PAPER_NO_DP.get(kind) if mode == "none" else None)
                summary[key]["paper_concept_acc"] = paper[1] if paper and mode == "local" else None
    non_dp_reference = None
    ref = RESULTS / "fcm_bnlearn.json"
    if ref.exists():
        asia = json.loads(ref.read_text())["networks"].get(NETWORK, {})
        non_dp_reference = {"source": "research/fcm_bnlearn/results/fcm_bnlearn.json (early stopping, up to 200 rounds)",
                            "c2bm_task_acc": asia.get("models", {}).get("c2bm", {}).get("task_acc"),
                            "centralised_opaqnn_task_acc": asia.get("centralised_opaqnn", {}).get("task_acc")}
    seconds = sum(p["seconds"] for p in partials) if partials else round(time.time() - t0, 1)
    out = {"benchmark": "fcm_dp", "network": NETWORK, "task": bnlearn.TASKS[NETWORK], "delta": DELTA, "clip": CLIP,
           "seeds": seeds, "settings": vars(args), "paper_table5": PAPER, "paper_table1_asia_fcms": PAPER_NO_DP,
           "non_dp_reference": non_dp_reference, "summary": summary, "runs": runs,
           "baselines": {"source": "research/fcm_bnlearn/fcm_lr.py", "summary": baseline_summary(baselines), "runs": baselines}
           if baselines else None,
           "seconds": seconds, "seconds_note": "sum over the parallel processes" if partials else "",
           "machine": machine(), "quick": a.quick}
    save(out, Path(a.out))
    print(json.dumps({k: {m: (v[m]["mean"] if isinstance(v.get(m), dict) else v.get(m))
                          for m in ("task_acc", "concept_acc", "task_auroc", "paper_task_acc")}
                      for k, v in summary.items()}, indent=1))


if __name__ == "__main__":
    main()
