"""What the candidates cost, and what early elimination saves (issue 35, item 2): on the demo's
patients (the 4 ALARM hospitals of ``clinograph demo``), seeds 0-2, the SDK's defaults (the four
default candidates chosen on the federated validation loss) with every candidate trained in full
(``[selection] elimination = "none"``, the behaviour before) and with successive halving (the
default now, secure/runtime/elimination.py), beside the demo's own settings (piecewise value
encoding, shape functions, 3 initialisations), with and without elimination.

Per variant and seed: mean test AUROC over hospitals (and AUPRC, Brier, ECE), the training rounds
every candidate ran in all (``model_chosen`` rows; one model = ``rounds``), every round the server
planned (evaluation-only scoring rounds included), wall time, the chosen candidate, the
``candidates_eliminated`` cuts, and the machine's load average before and after the run.

    python -m research.demo_quality.candidates_cost            # seeds 0-2, full tables, 30 rounds
    python -m research.demo_quality.candidates_cost --quick    # seed 0, quarter tables, 10 rounds
    python -m research.demo_quality.candidates_cost --variants defaults_halving,defaults_full
Writes research/demo_quality/results/candidates_cost.json after every run. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402

#: variant -> (base settings, [selection] elimination)
VARIANTS = {
    "defaults_halving": ("defaults", "successive_halving"),
    "defaults_full": ("defaults", "none"),
    "demo_full": ("demo", "none"),
    "demo_halving": ("demo", "successive_halving"),
    # the defaults' four candidates and a fifth with the demo's model and training settings (what the demo's
    # settings have that the defaults do not; [selection] stays the defaults': patience 5, one initialisation)
    "defaults_plus_demo_halving": ("defaults_plus_demo", "successive_halving"),
    # session 54: the defaults' four candidates, each from 3 initialisations (what the demo's settings have
    # that the defaults do not, besides its model: restarts), halving over all 12
    "defaults_restarts3_halving": ("defaults_restarts3", "successive_halving"),
    "defaults_plus_demo_restarts3_halving": ("defaults_plus_demo_restarts3", "successive_halving"),
}
#: the demo's [model] and [training] settings as a candidate (sdk/demo/run.py demo_config)
DEMO_CANDIDATE = {"name": "demo", "model": {"hidden": 32, "linear_shape": True, "value_encoding": "piecewise"},
                  "training": {"lr": 0.003, "batch_size": 64, "wide_lr_factor": 0.3, "weight_decay": 1e-4}}


def defaults_config(*, rounds: int, seed: int):
    """The SDK's defaults on the demo's federation: the demo's ``[federation]`` (masked, fedsgd,
    local_epochs 2, min_clients 3) and seeds; every other section at its default (so the four
    default candidates, patience 5, one initialisation)."""
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.demo.run import demo_config

    demo = demo_config(rounds=rounds, seed=seed, secure_mode="masked")
    return SimulationConfig.model_validate({
        "federation": demo.federation.model_dump(mode="json"), "model": {"init_seed": seed},
        "training": {"seed": seed}, "split": {"seed": seed}, "dictionary": str(demo.dictionary)})


def config_for(variant: str, *, rounds: int, seed: int):
    from clinograph.sdk.federation.candidates import DEFAULT_BINARY_CANDIDATES

    from research.demo_quality.demo_quality import config_for as demo_settings

    base, elimination = VARIANTS[variant]
    cfg = defaults_config(rounds=rounds, seed=seed) if base.startswith("defaults") else demo_settings(seed, {}, rounds)
    if base.startswith("defaults_plus_demo"):
        cfg = cfg.model_copy(update={"selection": cfg.selection.model_copy(update={
            "candidates": (*DEFAULT_BINARY_CANDIDATES, DEMO_CANDIDATE)})})
    if base.endswith("_restarts3"):
        cfg = cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"restarts": 3})})
    # model_copy, not a dump and reload: the default candidates apply only to settings left unset
    return cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"elimination": elimination})})


def run_one(variant: str, *, seed: int, scale: float, rounds: int) -> dict:
    from clinograph.sdk.federation.simulate import simulate

    from research.demo_quality.demo_quality import demo_tables, summary

    d, tables = demo_tables(seed, scale)
    cfg = config_for(variant, rounds=rounds, seed=seed)
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit"
        res = simulate(tables, d, cfg.model_copy(update={"output": Path(tmp)}), audit_dir=audit)
        entries = [json.loads(x) for x in (audit / "audit.jsonl").read_text().splitlines()]
    seconds = time.perf_counter() - t0
    rows = res.choice.get("candidates") or []
    cuts = [e["payload"] for e in entries if e["kind"] == "candidates_eliminated"]
    return {
        "variant": variant, "seed": seed, "mean": summary(res.final), "per_hospital": res.final,
        "seconds": seconds, "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
        "candidates": len(rows) or 1, "chosen": res.choice.get("chosen"),
        "training_rounds": sum(r["rounds_run"] for r in rows) if rows else len(res.rounds),
        "rounds_planned": sum(e["kind"] == "round_plan" for e in entries),
        "scoring_rounds": sum(e["kind"] == "model_selected" for e in entries),
        "one_model_rounds": rounds, "validation_loss": res.selection.get("validation_loss"),
        "rows": rows, "cuts": [{k: c[k] for k in ("rung", "rounds", "kept", "eliminated", "schedule", "cost")}
                               for c in cuts]}


def aggregate(runs: list[dict]) -> dict:
    import numpy as np

    out: dict = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        rs = [r for r in runs if r["variant"] == variant]
        out[variant] = {"seeds": [r["seed"] for r in rs],
                        "mean_auroc": float(np.mean([r["mean"]["auroc"] for r in rs])),
                        "auroc_by_seed": [r["mean"]["auroc"] for r in rs],
                        "mean_training_rounds": float(np.mean([r["training_rounds"] for r in rs])),
                        "training_rounds_over_one_model": float(np.mean([r["training_rounds"] / r["one_model_rounds"]
                                                                         for r in rs])),
                        "mean_rounds_planned": float(np.mean([r["rounds_planned"] for r in rs])),
                        "median_seconds": float(np.median([r["seconds"] for r in rs])),
                        "seconds_by_seed": [r["seconds"] for r in rs]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_convention(ap, quick_help="seed 0, quarter-size tables, 10 rounds")
    ap.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; --quick: 0)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    args = ap.parse_args()
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    scale, rounds = (0.25, 10) if args.quick else (1.0, 30)
    variants = args.variants.split(",")
    out = out_path(__file__, args)
    runs: list[dict] = []
    for seed in seeds:  # seed-major: a cut-short measurement still compares the variants on the same seeds
        for variant in variants:
            r = run_one(variant, seed=seed, scale=scale, rounds=rounds)
            runs.append(r)
            print(f"{variant} seed {seed}: AUROC {r['mean']['auroc']:.4f}, {r['training_rounds']} training rounds "
                  f"({r['rounds_planned']} planned), {r['seconds']:.0f} s, chosen {r['chosen']}", flush=True)
            write(out, {"setting": {"scale": scale, "rounds": rounds, "seeds": seeds, "variants": variants},
                        "summary": aggregate(runs), "runs": runs, "machine": machine()})


if __name__ == "__main__":
    main()
