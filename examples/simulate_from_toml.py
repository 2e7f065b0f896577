"""Run a simulated federation from a TOML config.

Run:  python examples/simulate_from_toml.py [--config examples/simulation.toml] [--rounds N] [--out DIR]

The config names each hospital's table (CSV or Parquet) and site schema; the same config runs
with `clinograph simulate CONFIG`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import clinograph as cg

HERE = Path(__file__).parent


def main(config_path: Path, rounds: int | None, out: Path | None) -> None:
    config = cg.SimulationConfig.from_toml(config_path)  # unknown keys are errors that name the key
    updates = {}
    if rounds is not None:
        updates["federation"] = config.federation.model_copy(update={"rounds": rounds})
    if out is not None:
        updates["output"] = out
    config = config.model_copy(update=updates)
    result = cg.simulate_from_config(config, on_round=lambda r, m: print(
        f"round {r}: " + ", ".join(f"{site} AUROC {v['auroc']:.3f}" for site, v in sorted(m.items()))))
    verdict = cg.verify_audit_dir(result.audit_dir)
    print(f"audit directory {result.audit_dir}: {'verified' if verdict.ok else 'FAILED: ' + verdict.problems[0]}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", type=Path, default=HERE / "simulation.toml")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    main(a.config, a.rounds, a.out)
