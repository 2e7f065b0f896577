"""Fuzzing as a habit, with a longer budget than `make test`: every parser and every server stage.

Runs the property tests that are fuzzers -- random CSV bytes through read_table + ingest
(tests/sdk/ingest/test_fuzz_tables.py), messy hospital exports (detection limits, missing
markers, units in cells, dates, hostile ids) that must ingest completely or fail clearly
(tests/sdk/ingest/test_fuzz_exports.py) and hostile messages at every stage of a real round
(tests/secure/test_server_hostile.py) -- with ``CLINOGRAPH_FUZZ_EXAMPLES`` examples each instead
of the suite's small budget, and writes research/fuzz/results/fuzz.json: cases run, seconds and
findings (failing tests, with hypothesis's minimal example in the output file beside it).

    python -m research.fuzz.fuzz [--examples N] [--quick] [--only tables,exports]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root
sys.path.insert(0, str(ROOT))
from research._common import add_convention, out_path, save  # noqa: E402

TARGETS = {"tables": "tests/sdk/ingest/test_fuzz_tables.py",
           "exports": "tests/sdk/ingest/test_fuzz_exports.py",
           "server_stages": "tests/secure/test_server_hostile.py::test_hostile_messages_at_any_stage_never_break_the_round"}


def run(name: str, target: str, examples: int, log: Path) -> dict:
    env = {**os.environ, "CLINOGRAPH_FUZZ_EXAMPLES": str(examples), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", target], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=6 * 3600)
    seconds = time.perf_counter() - t0
    log.write_text(out.stdout + out.stderr)
    tail = [line for line in out.stdout.splitlines() if " passed" in line or " failed" in line]
    return {"target": target, "examples_per_property": examples, "seconds": round(seconds, 1),
            "findings": 0 if out.returncode == 0 else max(1, out.stdout.count("FAILED")),
            "summary": tail[-1] if tail else out.stdout[-300:],
            "log": str(log.relative_to(ROOT)) if log.is_relative_to(ROOT) else str(log)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=2000)
    add_convention(p, quick_help="200 examples each")
    p.add_argument("--only", default="", help=f"comma-separated targets of {sorted(TARGETS)} (default: all); the "
                                              "JSON then holds only those")
    a = p.parse_args()
    examples = 200 if a.quick else a.examples
    names = [n for n in a.only.split(",") if n] or list(TARGETS)
    if unknown := sorted(set(names) - set(TARGETS)):
        p.error(f"unknown targets {unknown}; choose from {sorted(TARGETS)}")
    out = out_path(__file__, a, name="fuzz" + ("_" + "_".join(names) if a.only else ""))
    quick = "_quick" if a.quick else ""
    results = {name: run(name, TARGETS[name], examples, out.with_name(f"fuzz_{name}{quick}.log")) for name in names}
    save({"benchmark": "fuzz", "results": results, "findings": sum(r["findings"] for r in results.values())}, out,
         sort_keys=False)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
