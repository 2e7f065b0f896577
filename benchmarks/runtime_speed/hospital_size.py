"""Wall time and peak memory of a federation at the SDK's defaults (masked, the four default
candidates, selection, calibration) as hospitals grow: the demo's ALARM hospitals at
``--scales`` × their sizes (1× = 2400 / 1600 / 1000 / 600 patients), a fixed number of rounds
(early stopping off, so every size trains the same rounds). Each size runs in a fresh child
process (peak RSS is per process).

    python -m benchmarks.runtime_speed.hospital_size                 # scales 1 and 5, 2 rounds, writes benchmarks/runtime_speed/results/hospital_size.json
    python -m benchmarks.runtime_speed.hospital_size --quick         # scale 0.25, 1 round, prints
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, out_path  # noqa: E402

CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from research.demo_quality.demo_quality import demo_tables
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate
scale, rounds = float(sys.argv[1]), int(sys.argv[2])
d, tables = demo_tables(0, scale)
with tempfile.TemporaryDirectory() as tmp:
    cfg = SimulationConfig.model_validate({"output": tmp, "federation": {"id": "size", "rounds": rounds, "seed": 0},
                                           "selection": {"patience": 0}})
    t0 = time.perf_counter()
    res = simulate(tables, d, cfg, audit_dir=Path(tmp) / "audit")
    seconds = time.perf_counter() - t0
print(json.dumps({"patients": [t.n_patients for t in tables], "seconds": seconds, "rounds_run": len(res.rounds),
                  "candidates": len(res.choice.get("candidates", [])) or 1, "chosen": res.choice.get("chosen"),
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="scale 0.25, 1 round")
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 5.0])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    scales, rounds = ([0.25], 1) if a.quick else (a.scales, a.rounds)
    root = str(Path(__file__).resolve().parents[2])  # the repository root
    rows = []
    for s in scales:
        out = subprocess.run([sys.executable, "-c", CHILD, str(s), str(rounds), root], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        row = {"scale": s, **json.loads(out)}
        row["seconds_per_round"] = row["seconds"] / rounds
        rows.append(row)
        print(json.dumps(row), flush=True)
    emit({"benchmark": "hospital_size", "machine": machine(), "rounds": rounds, "rows": rows},
         out=out_path(__file__, a))


if __name__ == "__main__":
    main()
