"""What naming a hospital whose input voids rounds costs (secure/runtime/attribution.py).

One hostile hospital among n = 4 and 8, at every position: in masked mode it puts out-of-bound
counts into its masked vector, in ckks mode it encrypts under a key of its own (the hostile
clients of tests/secure/hostile_helpers.py; real protocol, in-process transport, the one round
loop). For each run: the test rounds of the search (after the voided round that opened it), how
many of them voided (lost) and how many aggregated (ordinary training rounds over a subset), and
the wall time of a run of ``rounds`` training rounds against the same run without the culprit
(interleaved, medians of repetitions). The extra time is the voided rounds' plus the smaller test
rounds'; an honest run runs no test round at all.

Run: python -m benchmarks.secure_aggregation_cost.attribution [--quick]
     -> benchmarks/secure_aggregation_cost/results/attribution.json
Asserts nothing; reports medians.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root
sys.path.insert(0, str(ROOT / "tests" / "secure"))
from clinograph.secure.runtime import run_rounds  # noqa: E402
from hostile_helpers import HOSTILE, audit_entries, federation  # noqa: E402

from research._common import add_convention, machine, median, write  # noqa: E402
from research._common import out_path as default_out  # noqa: E402


def one_run(*, mode: str, n: int, culprit: str | None, rounds: int) -> dict:
    """One federation run; the search's numbers from its audit trail and the run's wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        server, transport, _ = federation(Path(tmp), n=n, mode=mode,
                                          hospitals={culprit: HOSTILE[mode]} if culprit else None)
        began = time.perf_counter()
        run_rounds(server, transport, rounds=rounds)
        seconds = time.perf_counter() - began
        server.audit.close()
        entries = audit_entries(Path(tmp))
    steps = [e["payload"] for e in entries if e["kind"] == "attribution_step"]
    tests = [s for s in steps if s["test"] > 0]
    named = [e["payload"]["client"] for e in entries if e["kind"] == "hospital_retired"]
    return {"seconds": seconds, "named": named, "test_rounds": len(tests),
            "voided_test_rounds": sum(s["outcome"] == "voided" for s in tests),
            "rounds_run": sum(e["kind"] == "round_plan" for e in entries)}


def main(quick: bool, out_path: Path) -> None:
    sizes, reps, rounds = ((4,), 1, 6) if quick else ((4, 8), 3, 8)
    result: dict = {"machine": machine(), "parameters": {"sizes": list(sizes), "reps": reps, "rounds": rounds,
                                                         "min_clients": 2, "ckks_preset": "add_only_128"},
                    "modes": {}}
    for mode in ("masked", "ckks"):
        per_n = {}
        for n in sizes:
            names = [f"h{i}" for i in range(n)]
            honest_s, attacked_s, rows = [], [], []
            for _ in range(reps):
                for culprit in names:  # interleaved: an honest run beside each attacked one
                    honest_s.append(one_run(mode=mode, n=n, culprit=None, rounds=rounds)["seconds"])
                    row = one_run(mode=mode, n=n, culprit=culprit, rounds=rounds)
                    attacked_s.append(row["seconds"])
                    rows.append({"culprit": culprit, **row})
            per_n[str(n)] = {
                "named_correctly": sum(r["named"] == [r["culprit"]] for r in rows), "runs": len(rows),
                "test_rounds_max": max(r["test_rounds"] for r in rows),
                "test_rounds_median": median([r["test_rounds"] for r in rows]),
                "voided_test_rounds_max": max(r["voided_test_rounds"] for r in rows),
                "bound_ceil_log2_n_plus_2": math.ceil(math.log2(n)) + 2,
                "run_seconds_median": {"honest": median(honest_s), "attacked": median(attacked_s)},
                "extra_seconds_median": median(attacked_s) - median(honest_s),
                "per_culprit": {r["culprit"]: {k: r[k] for k in ("test_rounds", "voided_test_rounds", "rounds_run")}
                                for r in rows[:n]},
            }
            print(mode, n, {k: v for k, v in per_n[str(n)].items() if k != "per_culprit"})
        result["modes"][mode] = per_n
    write(out_path, result)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    add_convention(p, quick_help="n = 4 only, one repetition, 6 rounds")
    args = p.parse_args()
    main(args.quick, default_out(__file__, args))
