"""The production DP setting with private selection (research/private_selection/production_selection.py):
the arm is the SDK's DP default with selection on, σ covers the scoring rounds, and the ε parts
are read from the ledger's rounds."""

import math

import pytest

pytest.importorskip("lifelines")


def test_the_arm_is_the_dp_default_with_selection_on_and_sigma_covers_the_scoring_rounds(tmp_path, monkeypatch):
    import clinograph.sdk.privacy.calibration as calibration

    from research.private_selection.production_selection import arm_config
    from research.real_tables.real_tables import load

    # the SDK's calibration is tested where it lives; here: that each arm asks it for the rounds its promise covers
    monkeypatch.setattr(calibration, "distributed_noise_multiplier",
                        lambda cfg, *, dim, n_hospitals, target_epsilon, rounds: rounds / target_epsilon)
    c, tables = load("lung")
    on, off = (arm_config("lung", 0, epsilon=3.0, selection=s, tables=tables, dictionary=c.dictionary,
                          work=tmp_path / str(s)) for s in (True, False))
    for cfg in (on, off):
        p, f = cfg.privacy, cfg.federation
        assert p.mode == "distributed" and p.sample_rate == 1.0 and p.clip_norm == 1.0 and p.min_honest == 2
        assert (f.rounds, f.server_lr, f.strategy, cfg.model.deep) == (25, 1.0, "fedsgd", False)
    assert on.selection.enabled is True and off.selection.enabled is False
    assert on.hospital_config().selection_active() and not off.hospital_config().selection_active()
    # one model (deep = false: no default candidates), 25 training rounds plus the scoring round and a spare
    assert (on.privacy.noise_multiplier, off.privacy.noise_multiplier) == (27 / 3, 25 / 3)


def test_epsilon_parts_separate_the_training_rounds_from_the_scoring_round():
    from research.private_selection.production_selection import epsilon_parts

    # a run stopped early after 3 training rounds (0-2); round 3 is the evaluation-only scoring round
    ledger = {"a": {"epsilon_by_round": [[0, 0.5], [1, 0.7], [2, 0.9], [3, 1.0]]},
              "b": {"epsilon_by_round": [[0, 0.5], [1, 0.7], [2, 0.9], [3, 1.2]]}}
    got = epsilon_parts(ledger, rounds_run=3)
    assert got["epsilon_training"] == pytest.approx(0.9) and got["epsilon_composed"] == pytest.approx(1.1)
    assert got["epsilon_composed_max"] == 1.2 and got["ledger_entries"] == [4, 4]
    # selection off: the last entry is the last training round
    off = epsilon_parts({"a": {"epsilon_by_round": [[0, 0.5], [1, 0.7]]}}, rounds_run=2)
    assert off["epsilon_training"] == off["epsilon_composed"] == 0.7 and off["ledger_entries"] == [2]


def test_released_loss_noise_prediction_and_measurement():
    from research.private_selection.production_selection import released_loss_noise

    run = {"validation_losses": [9.0, 0.5, 0.7, 0.3, 0.5], "hospitals": 4, "min_honest": 2, "noise_multiplier": 8.0}
    got = released_loss_noise(run, 100)
    first = 8.0 * math.sqrt(2) * math.sqrt(2) / 100  # σ·√2·√(K/h) / Σ n_val
    assert got["predicted_std_numerator"] == pytest.approx(first)
    assert got["predicted_std"] == pytest.approx(first * math.sqrt(1 + 0.5**2))  # the median released loss: 0.5
    assert got["measured_std"] == pytest.approx(math.sqrt(0.02))  # round 0 (the untrained model) is left out
    assert got["measured_robust_std"] == pytest.approx((0.55 - 0.45) / 1.349)
