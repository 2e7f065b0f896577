"""Calibrate the input noise of the bnlearn data against the paper's centralised OpaqNN (F-CMs Table 1).

    python -m research.fcm_bnlearn.fcm_calibration            # all five networks, 2 data seeds
    python -m research.fcm_bnlearn.fcm_calibration --quick    # Asia, three scales

Appendix B.1 mixes the autoencoder latent 50/50 with Gaussian noise but does not give the
latent's scale, and that scale alone decides how hard the task is (with our autoencoder's
natural scale, centralised OpaqNN on Alarm reaches about 64% where the paper reports 73.6%,
and about 88% on Asia where it reports 80.6%). This script measures centralised OpaqNN's
*validation* accuracy on the task over a grid of signal scales ``s`` (latent standardised,
times ``s``, then mixed 50/50 with N(0, I)), and interpolates the ``s`` at which it equals
the paper's Cent. OpaqNN row. Only that row is used as a target: the F-CMs rows the
benchmark is judged against are never looked at. Writes
research/fcm_bnlearn/results/fcm_calibration.json (the grid, the natural-scale accuracy and the
chosen ``s``); :data:`clinograph.sdk.datasets.bnlearn.SIGNAL_SCALE` copies the chosen values.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from clinograph.sdk.concepts.opaque import train_centralised
from clinograph.sdk.datasets import bnlearn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, out_path, save  # noqa: E402
from research.fcm_bnlearn.fcm_bnlearn import PAPER_CENT_OPAQUE  # noqa: E402  (Table 1, Cent. OpaqNN)


def _accuracy(job) -> tuple[str, int, float | None, float, float]:
    name, seed, scale, ae_epochs, inputs = job
    torch.set_num_threads(1)
    n = bnlearn.PAPER_SAMPLES[name]
    states = bnlearn.network_states(name)
    df = bnlearn.sample_network(name, n, seed)
    codes = bnlearn.encode_states(df, states)
    cards = [len(states[c]) for c in df.columns]
    task_col = list(df.columns).index(bnlearn.TASKS[name])
    cols = [j for j in range(len(cards)) if inputs == "all" or j != task_col]  # as fcm_bnlearn.prepare
    z = bnlearn.autoencode(codes[:, cols], [cards[j] for j in cols], latent_dim=bnlearn.LATENT_DIM[name], seed=seed,
                           epochs=ae_epochs)
    x = torch.from_numpy(bnlearn.mix_noise(z, seed=seed, signal_scale=scale))
    y = torch.from_numpy(codes[:, list(df.columns).index(bnlearn.TASKS[name])])
    tr, va, te = (torch.from_numpy(i) for i in bnlearn.split_indices(n, seed))
    res = train_centralised(x[tr], y[tr], x[va], y[va], card=cards[list(df.columns).index(bnlearn.TASKS[name])],
                            seed=seed)
    return name, seed, scale, 100 * res.accuracy(x[va], y[va]), 100 * res.accuracy(x[te], y[te])


def interpolate_scale(scales: list[float], acc: list[float], target: float) -> float | None:
    """The ``s`` where the (isotonic-smoothed) accuracy curve crosses ``target``; None if it never does."""
    a = np.maximum.accumulate(np.asarray(acc, dtype=float))
    s = np.asarray(scales, dtype=float)
    if target < a[0] or target > a[-1]:
        return None
    i = int(np.searchsorted(a, target))
    if i == 0 or a[i] == a[i - 1]:
        return float(s[i])
    return float(s[i - 1] + (target - a[i - 1]) * (s[i] - s[i - 1]) / (a[i] - a[i - 1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_convention(p, quick_help="Asia, one seed, three scales")
    p.add_argument("--networks", nargs="*", default=list(bnlearn.TASKS))
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ae-epochs", type=int, default=10)
    p.add_argument("--inputs", choices=["all", "concepts"], default="all",
                   help="columns fed to the autoencoder, as fcm_bnlearn.py --inputs")
    args = p.parse_args(argv)
    args.out = out_path(__file__, args)
    grid = [0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0, 1.2, 1.5]
    if args.quick:
        args.networks, args.seeds, grid = ["asia"], 1, [0.2, 0.4, 0.8]
    jobs = [(nm, seed, s, args.ae_epochs, args.inputs) for nm in args.networks for seed in range(args.seeds) for s in [None, *grid]]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        done = list(pool.map(_accuracy, jobs))
    report = {"benchmark": "fcm_calibration", "quick": args.quick, "python": platform.python_version(),
              "torch": torch.__version__, "settings": {"seeds": args.seeds, "ae_epochs": args.ae_epochs, "grid": grid, "inputs": args.inputs,
                                                       "noise_mix": 0.5, "selection": "validation accuracy"},
              "networks": {}}
    for nm in args.networks:
        rows = [r for r in done if r[0] == nm]
        natural = [r for r in rows if r[2] is None]
        val = [float(np.mean([r[3] for r in rows if r[2] == s])) for s in grid]
        test = [float(np.mean([r[4] for r in rows if r[2] == s])) for s in grid]
        chosen = interpolate_scale(grid, val, PAPER_CENT_OPAQUE[nm])
        report["networks"][nm] = {
            "paper_cent_opaqnn": PAPER_CENT_OPAQUE[nm],
            "natural_scale": {"val_acc": float(np.mean([r[3] for r in natural])),
                              "test_acc": float(np.mean([r[4] for r in natural]))},
            "grid": [{"signal_scale": s, "val_acc": v, "test_acc": t} for s, v, t in zip(grid, val, test, strict=True)],
            "signal_scale": chosen,
        }
        print(f"{nm:10s} natural val={report['networks'][nm]['natural_scale']['val_acc']:.1f} "
              f"target={PAPER_CENT_OPAQUE[nm]} -> s={chosen}", file=sys.stderr)
    report["total_seconds"] = time.perf_counter() - t0
    save(report, args.out, sort_keys=False, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
