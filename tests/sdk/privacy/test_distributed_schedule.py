"""The distributed-DP schedule presets: what the benchmark chose on validation, and what the demo runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from clinograph.sdk.privacy.schedule import DISTRIBUTED_SCHEDULES, distributed_schedule
from clinograph.secure.errors import ConfigError

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "dp_trust_models.json"


def test_the_presets_are_what_the_benchmark_chose_on_validation():
    chosen = json.loads(RESULTS.read_text())["hyperparameters"]
    for eps, schedule in DISTRIBUTED_SCHEDULES.items():
        hp = chosen[f"distributed@{eps}"]
        assert (schedule.rounds, schedule.clip_norm, schedule.sample_rate) == (hp["rounds"], hp["clip"],
                                                                              hp["sample_rate"])
        assert math.isclose(schedule.server_lr, hp["lr"])


def test_a_target_epsilon_takes_the_preset_of_the_largest_listed_epsilon_not_above_it():
    listed = sorted(DISTRIBUTED_SCHEDULES)
    assert distributed_schedule(listed[0]) is DISTRIBUTED_SCHEDULES[listed[0]]
    assert distributed_schedule(listed[-1] * 10) is DISTRIBUTED_SCHEDULES[listed[-1]]
    assert distributed_schedule((listed[0] + listed[1]) / 2) is DISTRIBUTED_SCHEDULES[listed[0]]
    assert distributed_schedule(listed[0] / 2) is DISTRIBUTED_SCHEDULES[listed[0]]  # below: the most cautious
    with pytest.raises(ConfigError, match=r"needs a finite target ε > 0, got nan"):
        distributed_schedule(float("nan"))


def test_the_demo_runs_the_preset_for_its_epsilon():
    from clinograph.sdk.research.demo import demo_distributed_config

    for eps in (3.0, 10.0):
        cfg = demo_distributed_config(rounds=2, seed=0, epsilon=eps)
        s = distributed_schedule(eps)
        assert (cfg.federation.server_lr, cfg.privacy.clip_norm, cfg.privacy.sample_rate) == (
            s.server_lr, s.clip_norm, s.sample_rate)
        assert cfg.privacy.mode == "distributed" and cfg.federation.strategy == "fedsgd"
