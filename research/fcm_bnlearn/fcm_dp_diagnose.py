"""Why is C2BM under local DP below F-CMs Table 5? A seed-0 validation grid (issue 14).

    python -m research.fcm_bnlearn.fcm_dp_diagnose --quick   # 1 variant, 1 ε, small data; prints only
    python -m research.fcm_bnlearn.fcm_dp_diagnose           # seed 0, every variant x ε ∈ {10, 5, 1}

The setting of research/fcm_bnlearn/fcm_dp.py's ``local`` rows (Asia, 20 clients, 10 a round, join at 10,
B = 512, C = 1, δ = 1e-5, 30 rounds, the client Adam lr of its TUNED table), one factor changed
at a time:

- ``base``: as fcm_dp (σ composed over every round's steps; selection on eq. 2 validation loss).
- ``per_round_sigma``: σ calibrated for ONE round's steps (2 epochs x 1 step), as a client that
  calls Opacus's ``make_private_with_epsilon`` afresh every round would get. NOT a guarantee for
  the run (ε composes over rounds): a hypothesis about the paper's placement, diagnostic only.
- ``task_selection``: the same training, the released round chosen on the validation TASK loss
  (eq. 2's concept terms weigh 0.8 and can pick a round whose task head is poor).
- ``small``: hidden 16, emb 8 (a quarter of the parameters: less noise norm per step).
- ``clip0.1``: C = 0.1.
- ``per_module``: each module's part of a patient's gradient clipped to C/√G (same sensitivity
  C; ``ConceptDP(clipping="per_module")``), so the concept terms cannot crowd out the task head.
- factors combine with ``+`` (e.g. ``small+task_selection``); ``--seeds`` reruns a variant on
  more seeds, ``--append`` adds runs to the JSON.
- ``opaqnn_per_round_sigma``: the opaque NN with the per-round σ (to compare with its Table 5 row).

Selection uses validation only; the test accuracy is reported beside it. Writes
research/fcm_bnlearn/results/fcm_dp_diagnose.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from clinograph.sdk.concepts.metrics import evaluate  # noqa: E402
from clinograph.sdk.concepts.model import fcm_loss  # noqa: E402
from clinograph.sdk.concepts.modules import ConceptHParams  # noqa: E402
from clinograph.sdk.datasets import bnlearn  # noqa: E402
from clinograph.sdk.privacy.calibration import calibrate_noise_multiplier  # noqa: E402

from research._common import add_convention, machine, out_path, save  # noqa: E402
from research.fcm_bnlearn.fcm_bnlearn import client_split, labels_of, prepare  # noqa: E402
from research.fcm_bnlearn.fcm_dp import CLIP, DELTA, NETWORK, PAPER, TUNED  # noqa: E402
from research.fcm_bnlearn.fcm_federation import (  # noqa: E402
    ClientData,
    ConceptDP,
    FCMFederation,
    FederationConfig,
    local_dp_steps_per_epoch,
)

VARIANTS = ("base", "per_round_sigma", "task_selection", "small", "clip0.1", "opaqnn_per_round_sigma")
#: factors combine with "+", e.g. "small+task_selection"


class TaskSelected(FCMFederation):
    """Model selection on the validation task cross-entropy only (diagnostic)."""

    @torch.no_grad()
    def val_loss(self) -> float:
        x, labels = self.val
        if self.task not in self.model.graph.nodes:
            return float("inf")
        out = self.model(x)
        return float(fcm_loss(out, labels, supervised=set(), has_task=True, task=self.task, gamma=0.0))


def one(variant: str, eps: float, data, args, seed: int = 0) -> dict:
    nodes, cards, x, codes, (tr, va, te) = data
    parts_of = set(variant.split("+"))
    task = bnlearn.TASKS[NETWORK]
    kind = "opaqnn" if variant.startswith("opaqnn") else "c2bm"
    views, parts = client_split(NETWORK, nodes, tr, seed, args)
    clients = [ClientData(f"h{k:02d}", torch.from_numpy(x[p]), labels_of(codes, p, nodes, set(v.nodes)), v)
               for k, (p, v) in enumerate(zip(parts, views, strict=True))]
    hp = ConceptHParams(hidden=16, emb=8) if "small" in parts_of else ConceptHParams(hidden=64, emb=16)
    clip = 0.1 if "clip0.1" in parts_of else CLIP
    lr = TUNED[(kind, "local", eps)][0]
    q = min(1.0, args.batch / min(c.n for c in clients))
    per_round = args.local_epochs * local_dp_steps_per_epoch(q)
    steps = per_round if any(v.endswith("per_round_sigma") for v in parts_of) else args.rounds * per_round
    sigma = calibrate_noise_multiplier(target_epsilon=eps, delta=DELTA, sample_rate=q, steps=steps)
    cfg = FederationConfig(kind=kind, rounds=args.rounds, patience=None, join_round=args.join,
                           n_initial=args.clients // 2, clients_per_round=args.per_round,
                           local_epochs=args.local_epochs, lr=lr, seed=seed, hp=hp,
                           dp=ConceptDP(mode="local", noise_multiplier=sigma, clip=clip, sample_rate=q,
                                        clipping="per_module" if "per_module" in parts_of else "flat"))
    cls = TaskSelected if "task_selection" in parts_of else FCMFederation
    fed = cls(config=cfg, concepts=nodes, task=task, cards=cards, clients=clients, in_dim=x.shape[1],
              val=(torch.from_numpy(x[va]), labels_of(codes, va, nodes)))
    t0 = time.perf_counter()
    res = fed.run()
    out = evaluate(res.model, torch.from_numpy(x[te]), labels_of(codes, te, nodes), task=task, cards=cards,
                   gt_edges=bnlearn.network_edges(NETWORK))
    with torch.no_grad():
        val_task = float(fcm_loss(res.model(torch.from_numpy(x[va])), labels_of(codes, va, nodes), supervised=set(),
                                  has_task=True, task=task, gamma=0.0))
    r = {"variant": variant, "seed": seed, "kind": kind, "epsilon": eps, "sigma": sigma, "steps_calibrated": steps, "clip": clip,
         "lr": lr, "dim": sum(p.numel() for p in res.model.parameters()), "best_round": res.best_round,
         "val_task_loss": val_task, "val_loss_best": min(res.val_loss), "test_task_acc": 100 * out["task_acc"],
         "test_concept_acc": None if kind == "opaqnn" else 100 * out["concept_acc"],
         "paper_task_acc": PAPER[kind][f"{eps:g}"][0], "seconds": round(time.perf_counter() - t0, 1)}
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(ap, quick_help="1 variant, 1 ε, small data")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--epsilons", nargs="*", type=float, default=[10.0, 5.0, 1.0])
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--append", action="store_true", help="add the runs to an existing --out")
    a = ap.parse_args()
    a.out = str(out_path(__file__, a))
    args = SimpleNamespace(clients=20, per_round=10, perturb_clients=0.2, perturb_edges=0.3, join=10, local_epochs=2,
                           rounds=30, batch=512)
    n, ae = bnlearn.PAPER_SAMPLES[NETWORK], 10
    variants, epsilons = a.variants, a.epsilons
    if a.quick:
        n, ae, args.rounds, args.join, variants, epsilons = 3000, 2, 4, 2, variants[:1], epsilons[:1]
    t0 = time.time()
    runs = []
    for seed in a.seeds:
        data = prepare(NETWORK, seed=seed, n=n, ae_epochs=ae, inputs="all", data="calibrated")
        runs += [one(v, e, data, args, seed) for v in variants for e in epsilons]
    old = json.loads(Path(a.out).read_text()) if a.append and Path(a.out).exists() else {"runs": [], "seconds": 0}
    save({"benchmark": "fcm_dp_diagnose", "settings": vars(args), "runs": old["runs"] + runs,
          "seconds": old["seconds"] + round(time.time() - t0, 1), "machine": machine()}, Path(a.out), sort_keys=False)


if __name__ == "__main__":
    main()
