"""Seconds per round and per stage of the demo federation: graph build, local training,
protocol + aggregation, for insecure_plaintext and masked, interleaved in one process.

Run: python -m benchmarks.runtime_speed.spine_rounds [--quick]   -> benchmarks/runtime_speed/results/spine_rounds.json
Asserts nothing; reports medians.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from clinograph.sdk.config import SimulationConfig  # noqa: E402
from clinograph.sdk.datasets.alarm import DEFAULT_HOSPITALS, load_dictionary, make_hospital_tables  # noqa: E402
from clinograph.sdk.federation.simulate import simulate_one as simulate  # noqa: E402
from clinograph.sdk.graph import build_graph, star_batch  # noqa: E402
from clinograph.sdk.ingest import ingest  # noqa: E402

from research._common import add_convention, machine, median, write  # noqa: E402
from research._common import out_path as default_out  # noqa: E402


def main(quick: bool, out_path: Path) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    scale, rounds, reps = (0.25, 2, 1) if quick else (1.0, 3, 3)
    d = load_dictionary()
    hospitals = tuple(replace(h, n_patients=int(h.n_patients * scale)) for h in DEFAULT_HOSPITALS)
    t0 = time.perf_counter()
    tables = [ingest(df, schema=s, dictionary=d) for df, s in make_hospital_tables(seed=0, hospitals=hospitals)]
    ingest_s = time.perf_counter() - t0
    build = {t.site: [] for t in tables}
    for _ in range(reps):
        for t in tables:
            s = time.perf_counter()
            build_graph(t, k_similar=5)
            star_batch(t, k_similar=5)
            build[t.site].append(time.perf_counter() - s)
    modes = ("insecure_plaintext", "masked")
    per_mode = {m: {"round": [], "training": [], "protocol_and_aggregation": []} for m in modes}
    for _ in range(reps):
        for mode in modes:  # interleaved
            cfg = SimulationConfig.model_validate({"federation": {"rounds": rounds, "secure_mode": mode,
                                                                  "min_clients": 3}})
            with tempfile.TemporaryDirectory() as tmp:
                res = simulate(tables, d, cfg, audit_dir=Path(tmp) / "audit")
            per_mode[mode]["round"] += res.timings["round_seconds"]
            per_mode[mode]["training"] += res.timings["local_training_seconds"]
            per_mode[mode]["protocol_and_aggregation"] += res.timings["protocol_and_aggregation_seconds"]
    result = {
        "machine": machine(),
        "parameters": {"hospitals": {t.site: t.n_patients for t in tables}, "rounds": rounds, "reps": reps,
                       "local_epochs": 2, "k_similar": 5, "hidden": 32, "torch_threads": 1},
        "ingest_seconds_all_hospitals": ingest_s,
        "graph_build_seconds_median": {k: median(v) for k, v in build.items()},
        "per_mode_seconds_median": {m: {k: median(v) for k, v in st.items()} for m, st in per_mode.items()},
        "masked_over_plaintext_round": median(per_mode["masked"]["round"]) / median(per_mode["insecure_plaintext"]["round"]),
    }
    write(out_path, result)
    print(result["per_mode_seconds_median"], result["masked_over_plaintext_round"])


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    add_convention(p, quick_help="1/4 size, 2 rounds, 1 repetition")
    args = p.parse_args()
    main(args.quick, default_out(__file__, args))
