"""Utility of patient-level DP on the demo federation: AUROC per hospital at ε ∈ {10, 5, 1} vs non-DP.

    python -m research.dp_trust_models.dp_utility                 # 4 demo hospitals (5,600 patients), R rounds, 1 seed
    python -m research.dp_trust_models.dp_utility --quick         # 2 rounds, small hospitals; prints JSON, writes nothing

The F-CMs paper's DP setting: δ = 1e-5, clip norm C = 1.0, ε ∈ {10, 5, 1}. Every run is a full
:func:`clinograph.sdk.federation.simulate.simulate` (masked secure aggregation,
FedSGD, signed plans, audit trail) on :data:`DEFAULT_HOSPITALS`. Under DP each hospital's σ is
calibrated (Opacus ``get_noise_multiplier``, RDP accountant) so that its ε after the planned
R rounds × E local epochs equals the target; ``similar_to`` is off (k = 0). Two non-DP
references: the default non-DP model (``similar_to`` k = 5) and the same star model as DP
without noise (k = 0). AUROC on each hospital's held-out 30 %. One data seed: differences of
a few AUROC points between runs are within seed noise; no error bars. Writes
research/dp_trust_models/results/dp_utility.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from clinograph.sdk.config import (  # noqa: E402
    GraphSection,
    PrivacySection,
    SimulationConfig,
)
from clinograph.sdk.datasets.alarm import (  # noqa: E402
    DEFAULT_HOSPITALS,
    load_dictionary,
    make_hospital_tables,
)
from clinograph.sdk.federation.simulate import simulate  # noqa: E402
from clinograph.sdk.ingest.validate import ingest  # noqa: E402
from clinograph.secure.runtime.config import FederationSection  # noqa: E402

from research._common import add_convention, machine, out_path, save  # noqa: E402

DELTA, CLIP = 1e-5, 1.0


def _run(tables, dictionary, *, rounds: int, epochs: int, k_similar: int, epsilon: float | None, work: Path) -> dict:
    privacy = PrivacySection(enabled=epsilon is not None, epsilon_budget=epsilon or 10.0, target_epsilon=epsilon,
                             planned_rounds=rounds, planned_local_epochs=epochs, delta=DELTA, clip_norm=CLIP,
                             batch_size=64, state_dir=work / "state")
    cfg = SimulationConfig(federation=FederationSection(rounds=rounds, local_epochs=epochs, secure_mode="masked"),
                           graph=GraphSection(k_similar=k_similar), privacy=privacy, output=work)
    t = time.perf_counter()
    res = simulate(tables, dictionary, cfg, audit_dir=work / "audit")
    out: dict = {"seconds": time.perf_counter() - t,
                 "auroc": {s: m["auroc"] for s, m in res.final.items()},
                 "auprc": {s: m["auprc"] for s, m in res.final.items()},
                 "dropped_or_rejected": [d for d in res.dropped if d]}
    if epsilon is not None:
        out["epsilon_spent"], out["noise_multiplier"], out["sample_rate"] = {}, {}, {}
        for t_ in tables:
            # the hospital's signed ledger, read as a record (its identity stays inside the simulation)
            path = work / "state" / t_.site / "privacy_ledger.json"
            entries = json.loads(path.read_text())["entries"] if path.exists() else []
            out["epsilon_spent"][t_.site] = entries[-1]["epsilon"] if entries else 0.0
            if entries:
                out["noise_multiplier"][t_.site] = entries[-1]["noise_multiplier"]
                out["sample_rate"][t_.site] = entries[-1]["sample_rate"]
    print(f"k={k_similar} eps={epsilon}: {json.dumps(out['auroc'])} ({out['seconds']:.0f}s)", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=2)
    add_convention(ap, quick_help="2 rounds, 150 patients a hospital")
    a = ap.parse_args()
    hospitals = DEFAULT_HOSPITALS
    if a.quick:
        from dataclasses import replace

        a.rounds, hospitals = 2, tuple(replace(h, n_patients=150) for h in DEFAULT_HOSPITALS)
    d = load_dictionary()
    tables = [ingest(df, schema=s, dictionary=d) for df, s in make_hospital_tables(seed=0, hospitals=hospitals)]
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as td:
        runs["non_dp_similar_to_k5"] = _run(tables, d, rounds=a.rounds, epochs=a.epochs, k_similar=5, epsilon=None,
                                            work=Path(td) / "nondp5")
        runs["non_dp_star_k0"] = _run(tables, d, rounds=a.rounds, epochs=a.epochs, k_similar=0, epsilon=None,
                                      work=Path(td) / "nondp0")
        for eps in (10.0, 5.0, 1.0):
            runs[f"dp_eps_{eps:g}"] = _run(tables, d, rounds=a.rounds, epochs=a.epochs, k_similar=0, epsilon=eps,
                                           work=Path(td) / f"dp{eps:g}")
    result = {
        "what": "final-round AUROC per hospital on its held-out 30 %, demo federation (see module docstring)",
        "hospitals": {t.site: t.n_patients for t in tables}, "rounds": a.rounds, "local_epochs": a.epochs,
        "delta": DELTA, "clip_norm": CLIP, "batch_size": 64, "accountant": "rdp", "seed": 0,
        "mean_auroc": {k: sum(v["auroc"].values()) / len(v["auroc"]) for k, v in runs.items()},
        "runs": runs, "torch": torch.__version__, "opacus": __import__("opacus").__version__,
        "machine": machine(),
    }
    print(json.dumps(result, indent=1, default=float))
    save(result, out_path(__file__, a), sort_keys=False, indent=1)


if __name__ == "__main__":
    main()
