"""Wall seconds of the demo's NS-FL federation (its config, its 3 hospitals, masked aggregation)
with every hospital in this process (``[simulation] workers = 1``) and in 2 worker processes,
interleaved in one process; and whether the two give the same results (they must).

Run: python -m benchmarks.runtime_speed.parallel_hospitals [--quick] [--rounds R] [--restarts K]
  -> benchmarks/runtime_speed/results/parallel_hospitals.json
Defaults: 5 rounds, 1 initialisation, 3 repetitions (the demo itself runs DEMO_ROUNDS rounds with
3 initialisations: --rounds 30 --restarts 3). Run it with OMP_NUM_THREADS=1 and nice -n 5 on a
machine whose load you record (the JSON has it). Asserts nothing; reports medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from clinograph.sdk.datasets.alarm import load_dictionary  # noqa: E402
from clinograph.sdk.demo.run import demo_config, write_hospital_files  # noqa: E402
from clinograph.sdk.federation.simulate import simulate  # noqa: E402
from clinograph.sdk.ingest import ingest, read_table  # noqa: E402
from clinograph.sdk.ontology import SiteSchema  # noqa: E402

from research._common import add_convention, machine, median, write  # noqa: E402
from research._common import out_path as default_out  # noqa: E402


def main(quick: bool, rounds: int, restarts: int, out_path: Path) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    reps = 1 if quick else 3
    rounds = 2 if quick else rounds
    dictionary = load_dictionary()
    seconds: dict[int, list[float]] = {1: [], 2: []}
    finals: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        files = write_hospital_files(Path(tmp), 0, 1.0)
        tables = [ingest(read_table(t), schema=SiteSchema.from_toml(s), dictionary=dictionary) for t, s in files]
        base = demo_config(rounds=rounds, seed=0, secure_mode="masked")
        base = base.model_copy(update={"selection": base.selection.model_copy(update={"restarts": restarts})})
        for rep in range(reps):
            for workers in (1, 2):  # interleaved
                config = base.model_copy(update={"simulation": base.simulation.model_copy(update={"workers": workers}),
                                                 "output": Path(tmp) / f"out_{rep}_{workers}"})
                began = time.perf_counter()
                res = simulate(tables, dictionary, config, audit_dir=Path(tmp) / f"audit_{rep}_{workers}")
                seconds[workers].append(time.perf_counter() - began)
                finals[workers].append(res.final)
                print(f"rep {rep} workers {workers}: {seconds[workers][-1]:.1f} s", flush=True)
    aurocs = {w: [sum(m["auroc"] for m in f.values()) / len(f) for f in fs] for w, fs in finals.items()}
    result = {
        "machine": machine(), "load_average_at_end": list(os.getloadavg()),
        "parameters": {"hospitals": {t.site: t.n_patients for t in tables}, "rounds": rounds, "restarts": restarts,
                       "reps": reps, "secure_mode": "masked", "config": "sdk.demo.run.demo_config(seed=0)",
                       "torch_threads": 1, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "seconds": {f"workers_{w}": s for w, s in seconds.items()},
        "seconds_median": {f"workers_{w}": median(s) for w, s in seconds.items()},
        "speedup_serial_over_workers_2": median(seconds[1]) / median(seconds[2]),
        "mean_test_auroc": {f"workers_{w}": a for w, a in aurocs.items()},
        "identical_final_metrics": all(f == finals[1][0] for fs in finals.values() for f in fs),
    }
    write(out_path, result)
    print(result["seconds_median"], result["speedup_serial_over_workers_2"], result["identical_final_metrics"])


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    add_convention(p, quick_help="2 rounds, 1 repetition")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--restarts", type=int, default=1)
    args = p.parse_args()
    main(args.quick, args.rounds, args.restarts, default_out(__file__, args))
