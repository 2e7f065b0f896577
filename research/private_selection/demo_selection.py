"""The demo's DP federation with private selection (issue 30, item 5: "the demo's DP federation uses it").

Session 54's noise-aware rule (secure/runtime/selection.py, ``selection_step``) met issue 30's
targets with selection on, on the five real tables (README, "Session 54: a selection rule that
knows its noise"). This runs the demo's own DP federation (``sdk/demo/run.py``
``demo_distributed_config``: the GNN preset at ε = 10, σ calibrated as ``clinograph demo`` does)
with ``[selection] enabled = true`` (one model: ``candidates = []``) against the same config
without it, on the demo's tables for seeds 0-2, arms alternating; validation and test AUROC,
rounds run, kept round, σ and the ε the ledger shows. The decision (turn it on in the demo or not)
reads validation; test is reported beside it.

    python -m research.private_selection.demo_selection            # seeds 0-2, ~3 min
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from research._common import add_convention, machine, out_path, write  # noqa: E402
from research.private_selection.private_selection import run_arm, stored  # noqa: E402
from research.private_selection.validation_choice import demo_config  # noqa: E402

ARMS = {"off": ("preset", {}), "on": ("preset", {"selection": {"enabled": True, "candidates": []}})}


def run(seeds: list[int], *, epsilon: float = 10.0) -> dict:
    from research.demo_quality.demo_quality import demo_tables

    per_seed = []
    for seed in seeds:
        dictionary, tables = demo_tables(seed, 1.0)
        row = {"seed": seed}
        for name in (("off", "on") if seed % 2 == 0 else ("on", "off")):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = demo_config(ARMS[name], seed, epsilon=epsilon, tables=tables, dictionary=dictionary,
                                  work=Path(tmp))
                out = stored(run_arm(tables, dictionary, cfg, choose=False))
            row[name] = out | {"noise_multiplier": cfg.privacy.noise_multiplier, "rounds": cfg.federation.rounds}
            print(f"demo seed {seed} selection {name}: test AUROC {out['auroc']:.3f} validation "
                  f"{out['validation_auroc']:.3f}, {out['rounds_run']} rounds, kept {out['selected_round']}, "
                  f"σ {cfg.privacy.noise_multiplier:.3g}, {out['seconds']:.0f} s", flush=True)
        per_seed.append(row)
    mean = {arm: {k: sum(r[arm][k] for r in per_seed) / len(per_seed) for k in ("auroc", "validation_auroc")}
            for arm in ARMS}
    return {"epsilon": epsilon, "per_seed": per_seed, "mean": mean}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    add_convention(ap)
    a = ap.parse_args()
    payload = {"machine": machine()} | run([int(s) for s in a.seeds.split(",")] if not a.quick else [0])
    write(out_path(__file__, a), payload)
    print(payload["mean"])


if __name__ == "__main__":
    main()
