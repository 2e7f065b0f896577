"""DP epoch time ÷ non-DP epoch time: same NS-FL model, same patients, same process.

    python benchmarks/dp_overhead.py            # the demo's largest hospital (north, 2400 patients), hidden 32, 5 reps
    python benchmarks/dp_overhead.py --quick    # 600 patients, 2 reps; prints JSON, writes nothing

What is measured, interleaved (non-DP, DP, non-DP, DP, ...), median over the repetitions,
torch single-threaded:

- ``non_dp_star``: one epoch of :func:`clinograph.sdk.training.local.train_epochs` on the stars
  without ``similar_to`` (shuffled minibatches of B = 64, Adam) -- the same model function as DP.
- ``dp_epoch``: one epoch of :class:`clinograph.sdk.privacy.DPTrainer` (Opacus hooks mode,
  Poisson sampling at q = 1/⌈n/B⌉, flat clipping C = 1, CSPRNG noise), the epoch loop only.
- ``dp_epoch_ew``: the same with ``grad_sample_mode = "ew"`` (torch ExpandedWeights; exact too).
- ``dp_round_overhead``: what a DP round adds around its epochs (probe, ``make_private``,
  budget check, accountant commit and ledger write; ε from a cold cache).
- ``dp_noise_only``: the CSPRNG noise of one epoch (one batched draw a step), to see its share.
- ``non_dp_graph``: one epoch of the non-DP default (``GraphTrainer``, ``similar_to`` k = 5),
  for context.

Writes benchmarks/results/dp_overhead.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from clinograph.sdk.research.alarm_demo import DEFAULT_HOSPITALS, load_dictionary, make_hospital_tables  # noqa: E402
from clinograph.sdk.graph.star import star_batch  # noqa: E402
from clinograph.sdk.ingest.validate import ingest  # noqa: E402
from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel  # noqa: E402
from clinograph.sdk.privacy import DPTrainer, PrivacyLedger, secure_gaussian, unused_star_parameters  # noqa: E402
from clinograph.sdk.training.local import TrainConfig, train_epochs  # noqa: E402

OUT = Path(__file__).parent / "results" / "dp_overhead.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patients", type=int, default=DEFAULT_HOSPITALS[0].n_patients)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.patients, a.reps = 600, 2
    d = load_dictionary()
    spec = replace(DEFAULT_HOSPITALS[0], n_patients=a.patients)
    [(df, schema)] = make_hospital_tables(seed=0, hospitals=(spec,))
    table = ingest(df, schema=schema, dictionary=d)
    train_idx = np.arange(table.n_patients)
    cfg = TrainConfig(lr=0.01, batch_size=64)
    stars = star_batch(table, k_similar=0)
    stars_sim = star_batch(table, k_similar=5)
    model = NSFLModel(len(d.node_ids()), NSFLConfig(hidden=a.hidden))
    n_params = sum(p.numel() for p in model.parameters())
    frozen = set(unused_star_parameters(model))
    times: dict[str, list[float]] = {k: [] for k in ("non_dp_star", "dp_epoch", "dp_epoch_ew", "dp_round_overhead",
                                                     "non_dp_graph", "dp_noise_only")}
    with tempfile.TemporaryDirectory() as td:
        for rep in range(a.reps):
            t = time.perf_counter()
            train_epochs(model, epochs=1, train_idx=train_idx, config=cfg, stars=stars, round_=rep)
            times["non_dp_star"].append(time.perf_counter() - t)
            ledger = PrivacyLedger(Path(td) / f"r{rep}", site="north", budget_epsilon=1e6, delta=1e-5)
            tr = DPTrainer(table, train_idx=train_idx, ledger=ledger, noise_multiplier=1.0, clip_norm=1.0,
                           batch_size=64, train_config=cfg)
            t = time.perf_counter()
            tr.train(model, round_=0, epochs=1, plan_options={})
            total = time.perf_counter() - t
            epoch = tr.last_timings["epoch_seconds"][0]
            times["dp_epoch"].append(epoch)
            times["dp_round_overhead"].append(total - epoch)
            ledger = PrivacyLedger(Path(td) / f"ew{rep}", site="north", budget_epsilon=1e6, delta=1e-5)
            tr_ew = DPTrainer(table, train_idx=train_idx, ledger=ledger, noise_multiplier=1.0, clip_norm=1.0,
                              batch_size=64, train_config=cfg, grad_sample_mode="ew")
            tr_ew.train(model, round_=0, epochs=1, plan_options={})
            times["dp_epoch_ew"].append(tr_ew.last_timings["epoch_seconds"][0])
            t = time.perf_counter()
            train_epochs(model, epochs=1, train_idx=train_idx, config=cfg, stars=stars_sim, round_=rep)
            times["non_dp_graph"].append(time.perf_counter() - t)
            n_trained = sum(p.numel() for n, p in model.named_parameters() if n not in frozen)
            t = time.perf_counter()
            for _ in range(tr.steps_per_epoch):  # one batched draw a step, as DPTrainer does
                secure_gaussian(1.0, torch.Size([n_trained]), torch.float64)
            times["dp_noise_only"].append(time.perf_counter() - t)
            print(f"rep {rep}: " + ", ".join(f"{k}={v[-1]:.3f}s" for k, v in times.items()), file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "what": "seconds per epoch, median over interleaved reps (see module docstring)",
        "patients": table.n_patients, "max_star_size": int(stars.values.shape[1]), "hidden": a.hidden,
        "parameters": n_params, "batch_size": 64, "steps_per_epoch": tr.steps_per_epoch, "reps": a.reps,
        "median_seconds": med, "all_seconds": times,
        "dp_over_non_dp_epoch": med["dp_epoch"] / med["non_dp_star"],
        "dp_ew_over_non_dp_epoch": med["dp_epoch_ew"] / med["non_dp_star"],
        "dp_round_over_non_dp_epoch": (med["dp_epoch"] + med["dp_round_overhead"]) / med["non_dp_star"],
        "noise_share_of_dp_epoch": med["dp_noise_only"] / med["dp_epoch"],
        "grad_sample_mode": "hooks (dp_epoch), ew (dp_epoch_ew)", "noise": "ChaCha20(os.urandom) Box-Muller, 4-sum",
        "torch": torch.__version__, "opacus": __import__("opacus").__version__, "threads": torch.get_num_threads(),
        "machine": platform.machine(), "cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if not a.quick:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text + "\n")


if __name__ == "__main__":
    main()
