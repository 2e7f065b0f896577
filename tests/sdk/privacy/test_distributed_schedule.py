"""The DP presets: what the studies (research/dp_trust_models, research/private_selection) chose on
validation, and what the demo runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from clinograph.sdk.privacy.schedule import (
    DISTRIBUTED_SCHEDULES,
    WIDE_DISTRIBUTED_SCHEDULE,
    distributed_schedule,
)

from clinograph.core.errors import ConfigError

RESULTS = Path(__file__).resolve().parents[3] / "research" / "dp_trust_models" / "results" / "dp_trust_models.json"


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


def test_the_demo_runs_the_gnn_with_the_preset_for_its_epsilon():
    from clinograph.sdk.config import dp_default_model
    from clinograph.sdk.demo.run import demo_distributed_config, dp_model

    for eps in (3.0, 10.0):
        cfg = demo_distributed_config(seed=0, epsilon=eps)
        s = distributed_schedule(eps)
        assert (cfg.federation.rounds, cfg.federation.server_lr, cfg.privacy.clip_norm, cfg.privacy.sample_rate) == (
            s.rounds, s.server_lr, s.clip_norm, s.sample_rate)
        assert cfg.privacy.mode == "distributed" and cfg.federation.strategy == "fedsgd"
        # the GNN, written out: the SDK's DP default (the wide path) scored lower on the demo's validation
        assert cfg.model.deep and not dp_default_model(cfg) and dp_model(cfg) == "the GNN (hidden 8) and the wide path"
    assert demo_distributed_config(seed=0, epsilon=3.0, rounds=2).federation.rounds == 2


def test_without_a_model_choice_the_dp_default_model_takes_the_wide_schedule():
    assert distributed_schedule(3.0, deep=False) is distributed_schedule(0.5, deep=False) is WIDE_DISTRIBUTED_SCHEDULE


def test_the_wide_schedule_is_the_entry_chosen_on_validation():
    path = RESULTS.parents[2] / "private_selection" / "results" / "validation_choice.json"
    payload = json.loads(path.read_text())
    rounds, clip, lr = payload["grid_entries"][payload["choice"]["chosen"]]["schedule"]
    s = WIDE_DISTRIBUTED_SCHEDULE
    assert (s.rounds, s.clip_norm, s.server_lr, s.sample_rate) == (rounds, clip, lr, 1.0)
    assert payload["grid_entries"][payload["choice"]["chosen"]]["overrides"] == {"model": {"deep": False}}


def test_the_demo_local_dp_run_is_the_configuration_chosen_on_validation():
    from clinograph.sdk.demo.run import demo_dp_config

    path = RESULTS.parent / "dp_local_tuning_candidates.json"
    hp = json.loads(path.read_text())["summary"]["10.0"]["chosen"]["hp"]
    cfg = demo_dp_config(rounds=hp["rounds"], seed=0, secure_mode="masked", epsilon=10.0)
    assert (cfg.training.lr, cfg.privacy.clip_norm, cfg.privacy.batch_size, cfg.model.hidden,
            cfg.federation.local_epochs, cfg.federation.rounds) == (
        hp["lr"], hp["clip"], hp["batch_size"], hp["hidden"], hp["local_epochs"], hp["rounds"])
    assert cfg.privacy.enabled and cfg.privacy.mode == "local" and cfg.model.deep  # the GNN it was tuned with
