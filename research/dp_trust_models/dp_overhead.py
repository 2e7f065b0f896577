"""DP step time ÷ non-DP step time: same NS-FL star model, same patients, same process (issue 14 item 6).

    python -m research.dp_trust_models.dp_overhead            # the demo's largest hospital (north, 2400 patients), hidden 32, 7 reps
    python -m research.dp_trust_models.dp_overhead --quick    # 600 patients, 2 reps; prints JSON, writes nothing

What is measured, interleaved within every repetition (non-DP, DP star, DP hooks, ...), median
over the repetitions, torch single-threaded. An epoch is ⌈n/B⌉ steps in every variant (B = 64
minibatches without DP, Poisson batches of expected size ≈ 64 with DP), so epoch ratios are
step ratios; ``*_per_step_ms`` divides by the steps.

- ``non_dp_star``: one epoch of :func:`clinograph.sdk.training.local.train_epochs` on the stars
  without ``similar_to`` (shuffled minibatches, Adam) -- the same model function as DP.
- ``dp_star``: one epoch of :class:`clinograph.sdk.privacy.DPTrainer` with the default
  ``grad_sample_mode = "star"`` (the one-backward per-patient engine of
  ``sdk/privacy/per_patient.py``; CSPRNG Poisson sampling; flat clipping C = 1; CSPRNG noise),
  one trainer for the whole run (built once, carried across rounds), the epoch loop only.
- (``dp_hooks`` / ``dp_ew``, the same trainer on Opacus's per-sample gradients, went with that
  path of the trainer; the committed results/dp_overhead.json still has them. Opacus against the
  engine, step by step: benchmarks/runtime_speed/nsfl_dp_step.py.)
- ``before_opacus_per_round``: what the trainer did before this change (commit 0789c1c),
  reproduced here: a new ``PrivacyEngine.make_private`` every round (hooks mode, Opacus's Poisson
  DataLoader), the epoch loop only; ``before_round_overhead`` is what such a round added
  around its epoch (probe, ``make_private``, uncached ε for the budget check, commit).
- ``dp_star_round_overhead``: what a round of the new trainer adds around its epoch (budget
  check, commit and ledger write; the engine is built in the warm-up round, not here).
- ``dp_noise_only``: the CSPRNG noise of one epoch (one batched draw a step), to see its share.
- ``non_dp_graph``: one epoch of the non-DP default (``GraphTrainer``, ``similar_to`` k = 5),
  for context.

Besides the ratio of medians, ``per_rep_ratio_median`` is the median over repetitions of the
ratio inside each repetition (robust to the machine's load drifting between repetitions).
Writes research/dp_trust_models/results/dp_overhead.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from clinograph.sdk.datasets.alarm import (  # noqa: E402
    DEFAULT_HOSPITALS,
    load_dictionary,
    make_hospital_tables,
)
from clinograph.sdk.graph.star import star_batch  # noqa: E402
from clinograph.sdk.ingest.validate import ingest  # noqa: E402
from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel  # noqa: E402
from clinograph.sdk.privacy import (  # noqa: E402
    DPTrainer,
    PrivacyLedger,
    secure_gaussian,
    star_loss,
    unused_star_parameters,
)
from clinograph.sdk.privacy.noise import install_secure_noise, os_seeded_generator  # noqa: E402
from clinograph.sdk.training.local import TrainConfig, train_epochs  # noqa: E402

from clinograph.core.identity import Identity  # noqa: E402
from research._common import add_convention, machine, out_path, save  # noqa: E402

NORTH = Identity.generate("north")  # signs the benchmark's privacy ledgers

B = 64


def before_round(model: NSFLModel, tr: DPTrainer, ledger: PrivacyLedger, round_: int) -> tuple[float, float]:
    """(epoch seconds, round seconds) of one round as the trainer ran it at 0789c1c: a fresh
    PrivacyEngine and make_private every round, Opacus's Poisson DataLoader, hooks mode."""
    from clinograph.sdk.privacy import accountant as acc_mod
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    acc_mod._rdp_per_step.cache_clear()  # noqa: SLF001 - the old ledger had no per-(σ, q) cache
    t0 = time.perf_counter()
    ledger.check_round(round_=round_, noise_multiplier=tr.noise_multiplier, sample_rate=tr.sample_rate,
                       steps=tr.steps_per_epoch)
    frozen = [p for n, p in model.named_parameters() if n in set(unused_star_parameters(model))]
    for p in frozen:
        p.requires_grad_(False)
    model.train()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        engine = PrivacyEngine(accountant="rdp")
        engine.accountant.load_state_dict({"history": list(ledger.history), "mechanism": engine.accountant.mechanism()})
        engine.secure_rng = os_seeded_generator()
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=tr.lr)
        gsm, dp_opt, dp_loader = engine.make_private(
            module=model, optimizer=opt, data_loader=DataLoader(tr.dataset, batch_size=B), noise_multiplier=1.0,
            max_grad_norm=1.0, poisson_sampling=True, grad_sample_mode="hooks", noise_generator=os_seeded_generator())
        install_secure_noise(dp_opt)
        t_epoch = time.perf_counter()
        for fi, x, m, y in dp_loader:
            dp_opt.zero_grad(set_to_none=True)
            star_loss(gsm(fi, x, m), y).backward()
            dp_opt.step()
        epoch = time.perf_counter() - t_epoch
    gsm._close()
    for p in frozen:
        p.requires_grad_(True)
    ledger.commit(round_=round_, history=engine.accountant.state_dict()["history"], noise_multiplier=1.0,
                  sample_rate=tr.sample_rate, clip_norm=1.0)
    return epoch, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patients", type=int, default=DEFAULT_HOSPITALS[0].n_patients)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--reps", type=int, default=7)
    add_convention(ap, quick_help="600 patients, 2 repetitions")
    a = ap.parse_args()
    if a.quick:
        a.patients, a.reps = 600, 2
    d = load_dictionary()
    spec = replace(DEFAULT_HOSPITALS[0], n_patients=a.patients)
    [(df, schema)] = make_hospital_tables(seed=0, hospitals=(spec,))
    table = ingest(df, schema=schema, dictionary=d)
    train_idx = np.arange(table.n_patients)
    cfg = TrainConfig(lr=0.01, batch_size=B)
    stars = star_batch(table, k_similar=0)
    stars_sim = star_batch(table, k_similar=5)
    model = NSFLModel(len(d.node_ids()), NSFLConfig(hidden=a.hidden))
    n_params = sum(p.numel() for p in model.parameters())
    frozen = set(unused_star_parameters(model))
    n_trained = sum(p.numel() for n, p in model.named_parameters() if n not in frozen)
    keys = ("non_dp_star", "dp_star", "before_opacus_per_round", "dp_star_round_overhead",
            "before_round_overhead", "dp_noise_only", "non_dp_graph")
    times: dict[str, list[float]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory() as td:
        def trainer(mode: str, name: str) -> DPTrainer:
            ledger = PrivacyLedger(Path(td) / name, site="north", budget_epsilon=1e6, delta=1e-5, signer=NORTH)
            return DPTrainer(table, train_idx=train_idx, ledger=ledger, noise_multiplier=1.0, clip_norm=1.0,
                             batch_size=B, train_config=cfg, grad_sample_mode=mode)

        trainers = {"star": trainer("star", "star")}
        before_ledger = PrivacyLedger(Path(td) / "before", site="north", budget_epsilon=1e6, delta=1e-5,
                                      signer=NORTH)
        for tr in trainers.values():  # warm-up round: builds the engine once (not timed)
            tr.train(model, round_=0, epochs=1, plan_options={})
        for rep in range(a.reps):
            t = time.perf_counter()
            train_epochs(model, epochs=1, train_idx=train_idx, config=cfg, stars=stars, round_=rep)
            times["non_dp_star"].append(time.perf_counter() - t)
            for mode, tr in trainers.items():
                t = time.perf_counter()
                tr.train(model, round_=rep + 1, epochs=1, plan_options={})
                total = time.perf_counter() - t
                epoch = tr.last_timings["epoch_seconds"][0]
                times[f"dp_{mode}"].append(epoch)
                if mode == "star":
                    times["dp_star_round_overhead"].append(total - epoch)
            epoch, total = before_round(model, trainers["star"], before_ledger, rep)
            times["before_opacus_per_round"].append(epoch)
            times["before_round_overhead"].append(total - epoch)
            t = time.perf_counter()
            train_epochs(model, epochs=1, train_idx=train_idx, config=cfg, stars=stars_sim, round_=rep)
            times["non_dp_graph"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(trainers["star"].steps_per_epoch):  # one batched draw a step, as DPTrainer does
                secure_gaussian(1.0, torch.Size([n_trained]), torch.float64)
            times["dp_noise_only"].append(time.perf_counter() - t)
            print(f"rep {rep}: " + ", ".join(f"{k}={v[-1]:.3f}s" for k, v in times.items()), file=sys.stderr)
    steps = trainers["star"].steps_per_epoch
    med = {k: statistics.median(v) for k, v in times.items()}
    base = times["non_dp_star"]

    def per_rep(key: str) -> float:
        return statistics.median([x / b for x, b in zip(times[key], base, strict=True)])

    result = {
        "what": "seconds per epoch (= steps_per_epoch steps), median over interleaved reps (see module docstring)",
        "command": "OMP_NUM_THREADS=1 python -m research.dp_trust_models.dp_overhead" + (" --quick" if a.quick else ""),
        "patients": table.n_patients, "max_star_size": int(stars.values.shape[1]), "hidden": a.hidden,
        "parameters": n_params, "dp_trained_parameters": n_trained, "batch_size": B, "steps_per_epoch": steps,
        "reps": a.reps, "median_seconds": med, "all_seconds": times,
        "per_step_ms": {k: 1e3 * med[k] / steps for k in ("non_dp_star", "dp_star", "before_opacus_per_round",
                                                          "dp_noise_only")},
        "ratio_to_non_dp_step": {k: med[k] / med["non_dp_star"] for k in ("dp_star", "before_opacus_per_round",
                                                                          "non_dp_graph")},
        "per_rep_ratio_median": {k: per_rep(k) for k in ("dp_star", "before_opacus_per_round")},
        "round_over_non_dp_epoch": {
            "dp_star": (med["dp_star"] + med["dp_star_round_overhead"]) / med["non_dp_star"],
            "before": (med["before_opacus_per_round"] + med["before_round_overhead"]) / med["non_dp_star"]},
        "noise_share_of_dp_star_epoch": med["dp_noise_only"] / med["dp_star"],
        "goal": "dp_star step <= 1.5 x non_dp_star step",
        "goal_met": med["dp_star"] / med["non_dp_star"] <= 1.5,
        "sampling": "Poisson, ChaCha20 keystream under an os.urandom key (CsprngUniform)",
        "noise": "ChaCha20(os.urandom) Box-Muller, 4-sum", "threads": torch.get_num_threads(), **machine(),
        "load_average_at_end": os.getloadavg()[0], "machine": machine(),
    }
    print(json.dumps(result, indent=1, default=float))
    save(result, out_path(__file__, a), sort_keys=False, indent=1)


if __name__ == "__main__":
    main()
