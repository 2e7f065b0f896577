"""How long `clinograph demo`'s run takes, and what it scores (issue 35, item 6): the whole demo
(`clinograph.sdk.demo.run.run_demo`: tables, the NS-FL federation with its 3 initialisations under
successive halving, the distributed-DP federation, the baselines, the audit verification and the
report) for seeds 0-2, one after another in this process, one thread.

Per seed: wall seconds of the whole run, the NS-FL federation's seconds, mean test AUROC over the
hospitals (NS-FL, NS-FL + DP, LR standalone, LR pooled, GBM pooled), the kept initialisation, and
the machine's load average before and after. The issue's goal: the run ≤ 90 s at today's quality
(mean NS-FL AUROC over seeds 0-2 within 0.01 of the demo before successive halving).

    python -m research.demo_quality.demo_time            # seeds 0-2
    python -m research.demo_quality.demo_time --quick    # seed 0, quarter tables
Writes research/demo_quality/results/demo_time.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402

ARMS = ("clinograph_nsfl", "clinograph_nsfl_dp", "lr_standalone", "lr_pooled", "gbm_pooled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="seed 0 on quarter tables")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from clinograph.sdk.demo.run import run_demo

    seeds, scale = ([0], 0.25) if args.quick else ([0, 1, 2], 1.0)
    out = out_path(__file__, args)
    rows = []
    for seed in seeds:
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            result = run_demo(out_dir=Path(tmp) / "demo", seed=seed, scale=scale)
            wall = time.perf_counter() - t0
        m = result.metrics
        rows.append({"seed": seed, "wall_seconds": round(wall, 2),
                     "nsfl_federation_seconds": m["federated_training_seconds"],
                     "mean_auroc": {a: m["mean_auroc"].get(a) for a in ARMS},
                     "kept": (m.get("model_choice") or {}).get("chosen"), "audit_ok": result.audit_ok,
                     "load_average_before": list(load_before), "load_average_after": list(os.getloadavg())})
        payload = {"benchmark": "demo_time", "scale": scale, "seeds": seeds, "machine": machine(), "runs": rows,
                   "median_wall_seconds": statistics.median(r["wall_seconds"] for r in rows),
                   "mean_nsfl_auroc": statistics.fmean(r["mean_auroc"]["clinograph_nsfl"] for r in rows)}
        write(out, payload)
    print(f"wrote {out}: median {payload['median_wall_seconds']} s, mean NS-FL AUROC "
          f"{payload['mean_nsfl_auroc']:.3f}")


if __name__ == "__main__":
    main()
