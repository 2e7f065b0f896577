"""The model-quality harness: NS-FL federated (masked, selected, calibrated), NS-FL local-only,
and the references of :mod:`clinograph.sdk.demo.baselines`, on the same hospitals and the same splits.

Shared by the studies under ``research/`` (real tables, demo quality, DP trust models).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from clinograph.sdk.config import HospitalConfig, SimulationConfig, merge_sections
from clinograph.sdk.demo.baselines import reference_baselines
from clinograph.sdk.federation.nsfl_task import NSFLTask
from clinograph.sdk.federation.simulate import simulate_one
from clinograph.sdk.federation.split import Split, hospital_split
from clinograph.sdk.ingest.table import PatientTable
from clinograph.sdk.ontology.dictionary import FeatureDictionary
from clinograph.sdk.training.metrics import log_loss
from clinograph.sdk.training.selection import ModelSelection

#: NS-FL settings of the benchmark, chosen on validation (docs/model_quality.md, ablation table)
NSFL_DEFAULTS: dict = {
    "federation": {"rounds": 40, "secure_mode": "masked", "strategy": "fedsgd", "server_lr": 1.0,
                   "min_clients": 2, "local_epochs": 1},
    "model": {"hidden": 16, "linear_path": True},
    "training": {"lr": 0.01, "batch_size": 32, "weight_decay": 1e-4},
    "graph": {"k_similar": 0},
    "selection": {"patience": 8},
}


def nsfl_config(*, seed: int, dictionary_id: str = "bench", **overrides) -> SimulationConfig:
    """The benchmark's NS-FL federation for ``seed`` (init, training and split seeds)."""
    data = merge_sections(NSFL_DEFAULTS, overrides)
    data = merge_sections(data, {"federation": {"id": f"{dictionary_id}-{seed}", "seed": seed},
                         "model": {"init_seed": seed}, "training": {"seed": seed}, "split": {"seed": seed}})
    return SimulationConfig.model_validate(data)


def sdk_config(*, seed: int, dictionary_id: str = "bench") -> SimulationConfig:
    """The federation at the SDK's defaults (masked, the default candidates), seeded by
    ``seed``: what an integrator's minimal config runs, and how the held-out tables are judged."""
    return SimulationConfig.model_validate({"federation": {"id": f"{dictionary_id}-{seed}", "seed": seed},
                                            "model": {"init_seed": seed}, "training": {"seed": seed},
                                            "split": {"seed": seed}})


def splits_for(tables: Sequence[PatientTable], config: SimulationConfig | HospitalConfig) -> list[Split]:
    """Each hospital's split under ``config`` (the rule every runtime uses)."""
    s = config.split
    return [hospital_split(t.labels, site=t.site, test_fraction=s.test_fraction,
                           validation_fraction=s.validation_fraction, seed=s.seed) for t in tables]


def federated(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig,
              audit_dir: Path | None = None) -> dict:
    """NS-FL over the real protocol; returns ``{"final", "selection", "rounds_run"}``."""
    with tempfile.TemporaryDirectory() as tmp:
        res = simulate_one(tables, dictionary, config, audit_dir=audit_dir or Path(tmp) / "audit")
    return {"final": res.final, "selection": {k: v for k, v in res.selection.items() if k != "calibration"},
            "rounds_run": len(res.rounds), "round1_test": res.rounds[0] if res.rounds else {}}


def local_only(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig
               ) -> dict[str, dict[str, float]]:
    """The same NS-FL model trained at each hospital alone, with the same selection (its own
    validation loss, same patience) and calibration."""
    hconf = config.hospital_config()
    out = {}
    for t, split in zip(tables, splits_for(tables, hconf), strict=True):
        task = NSFLTask(t, dictionary=dictionary, config=hconf, split=split)
        sel = ModelSelection(patience=hconf.selection.patience, min_delta=hconf.selection.min_delta)
        for r in range(config.federation.rounds + 1):
            idx = split.validation
            sel.offer(round_=r, state=task.model.state_dict())
            sel.observe(log_loss(t.labels[idx], task.predict()[idx]))
            if sel.should_stop or r == config.federation.rounds:
                break
            task.trainer.train(task.model, round_=r, epochs=config.federation.local_epochs, plan_options={})
        task.selection = sel
        task.finish()
        out[t.site] = task.evaluate("test")
    return out


def baselines(tables: Sequence[PatientTable], splits: Sequence[Split], *, seed: int) -> dict[str, dict]:
    """The linear and tree references on the same splits (the demo's own, shared)."""
    return reference_baselines(tables, splits, seed=seed)


def mean_over_hospitals(per_hospital: Mapping[str, Mapping[str, float]], key: str) -> float:
    """Mean of ``key`` over hospitals (NaN entries skipped)."""
    vals = [v[key] for v in per_hospital.values() if not math.isnan(v[key])]
    return float(np.mean(vals)) if vals else float("nan")
