"""Peak memory and time of the ``similar_to`` kNN (``sdk/graph/build.py`` ``knn_similarity``) as a
hospital grows: distances ranked in row blocks (``KNN_BLOCK_BYTES``, the default since session 10)
against every row at once (``block_bytes`` large enough for one block: the code before session 10
held the whole n×n distance matrix and its temporaries). Each measurement runs in a fresh child
process (peak RSS is per process), the two sides interleaved; the edges of both sides are compared
at every n where both run.

    python -m benchmarks.runtime_speed.knn_memory            # n = 2000 ... 30000, 3 repetitions, writes benchmarks/runtime_speed/results/knn_memory.json
    python -m benchmarks.runtime_speed.knn_memory --quick    # n = 1000, 2000, 1 repetition, prints
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

FEATURES = 30
ALL_ROWS = 1 << 62

CHILD = r"""
import hashlib, resource, sys, time
import numpy as np
from clinograph.sdk.graph.build import knn_similarity
n, block, features = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(n)
values = rng.normal(size=(n, features))
observed = rng.random((n, features)) < 0.8
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
ei, w = knn_similarity(values, observed, k=5, block_bytes=block)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
digest = hashlib.sha256(ei.numpy().tobytes() + w.numpy().round(6).tobytes()).hexdigest()
print(seconds, peak * 1024, base * 1024, digest)
"""


def measure(n: int, block: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(block), str(FEATURES)], check=True,
                         capture_output=True, text=True).stdout.split()
    return {"seconds": float(out[0]), "peak_rss_bytes": int(out[1]), "rss_before_bytes": int(out[2]),
            "edges_sha256": out[3]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from clinograph.sdk.graph.build import KNN_BLOCK_BYTES

    sizes, reps = ((1000, 2000), 1) if a.quick else ((2000, 4000, 8000, 12000, 30000), a.reps)
    full_up_to = 12000  # every row at once needs ~5 n² float64s: 30000 patients would need ~36 GB
    rows = []
    for n in sizes:
        sides = {"blocked": KNN_BLOCK_BYTES} | ({"all_rows": ALL_ROWS} if n <= full_up_to else {})
        runs: dict[str, list[dict]] = {k: [] for k in sides}
        for _ in range(reps):
            for name, block in sides.items():  # interleaved
                runs[name].append(measure(n, block))
        row = {"n": n, "features": FEATURES, "k": 5}
        for name, rs in runs.items():
            row[name] = {"median_seconds": median([r["seconds"] for r in rs]),
                         "median_peak_rss_gb": median([r["peak_rss_bytes"] for r in rs]) / 1e9,
                         "median_rss_before_gb": median([r["rss_before_bytes"] for r in rs]) / 1e9}
        if "all_rows" in runs:
            row["same_edges"] = runs["all_rows"][0]["edges_sha256"] == runs["blocked"][0]["edges_sha256"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    emit({"benchmark": "knn_memory", "machine": machine(), "block_bytes": KNN_BLOCK_BYTES, "reps": reps,
          "rows": rows}, out=out_path(__file__, a))


if __name__ == "__main__":
    main()
