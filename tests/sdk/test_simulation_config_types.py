"""Hospital and simulation configs inherit the typed scalars of secure's config sections."""

from __future__ import annotations

import pytest
from clinograph.sdk.config import SimulationConfig

from clinograph.core.errors import ConfigError


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("federation", "rounds", "5", "expected an integer, got the text '5'; write the value without quotes"),
    ("training", "lr", "0.01", "expected a number, got the text '0.01'"),
    ("privacy", "enabled", 1, "expected true or false, got 1"),
    ("privacy", "enabled", "yes", "expected true or false, got the text 'yes'"),
])
def test_quoted_numbers_and_numeric_switches_are_refused_by_name(section, key, value, message):
    with pytest.raises(ConfigError) as err:
        SimulationConfig.model_validate({section: {key: value}})
    assert f"{section}.{key}" in str(err.value) and message in str(err.value)


def test_typed_values_still_pass_and_ints_serve_floats():
    cfg = SimulationConfig.model_validate({"federation": {"rounds": 5}, "training": {"lr": 1},
                                           "privacy": {"enabled": False}})
    assert (cfg.federation.rounds, cfg.training.lr, cfg.privacy.enabled) == (5, 1.0, False)


def test_a_privacy_budget_the_server_policy_could_not_hold_is_refused_at_the_config():
    """[privacy] epsilon_budget has the bound of the server's [dp_policy] max_epsilon (100): a larger
    budget was accepted here and then failed inside the run, building the server's policy."""
    with pytest.raises(ConfigError) as err:
        SimulationConfig.model_validate({"privacy": {"enabled": True, "epsilon_budget": 1000.0}})
    assert "privacy.epsilon_budget" in str(err.value)
    assert SimulationConfig.model_validate({"privacy": {"enabled": True, "epsilon_budget": 100.0}}).dp_policy()


@pytest.mark.parametrize(("section", "key", "value"), [
    ("privacy", "clip_norm", "inf"), ("privacy", "noise_multiplier", "inf"), ("training", "weight_decay", "inf"),
    ("selection", "min_delta", "inf"), ("target", "breaks", "[1.0, inf]"), ("training", "lr", "nan"),
])
def test_inf_and_nan_in_a_config_file_are_refused_by_name(tmp_path, section, key, value):
    """A clip norm of inf made DP's noise σ·C infinite; every float of a config is now finite."""
    from clinograph.core.errors import ConfigError

    path = tmp_path / "sim.toml"
    path.write_text(f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as err:
        SimulationConfig.from_toml(path)
    assert f"{section}.{key}" in str(err.value) and "expected a finite number" in str(err.value)


def test_a_simulations_hospitals_accept_the_masked_threshold_its_federation_sets():
    """One operator configures every party of a simulation: its hospitals take [federation]
    masked_threshold as their [release] rule (a deployed hospital's own hospital.toml decides)."""
    fed = {"secure_mode": "masked", "masked_threshold": 3}
    assert SimulationConfig.model_validate({"federation": fed}).hospital_config().release.masked_threshold == 3
    assert SimulationConfig.model_validate({}).hospital_config().release.masked_threshold is None
    own = SimulationConfig.model_validate({"federation": fed, "release": {"masked_threshold": 4}})
    assert own.hospital_config().release.masked_threshold == 4  # a written [release] rule is kept


@pytest.mark.parametrize(("section", "enabled", "mode"), [
    ({"mode": "distributed"}, True, "distributed"), ({"mode": "local", "epsilon_budget": 3.0}, True, "local"),
    ({"mode": "none"}, False, "none"), ({"enabled": True}, True, "local"), ({}, False, "local"),
    ({"state_dir": "state"}, False, "local"), ({"enabled": False, "mode": "distributed"}, False, "distributed")])
def test_privacy_mode_is_the_switch(section, enabled, mode):
    """`[privacy] mode = "distributed"` without `enabled = true` ran a federation with no DP, silently."""
    p = SimulationConfig.model_validate({"privacy": section}).privacy
    assert (p.enabled, p.mode) == (enabled, mode)


@pytest.mark.parametrize(("section", "said"), [
    ({"epsilon_budget": 3.0, "noise_multiplier": 1.1}, "sets epsilon_budget, noise_multiplier but neither mode nor enabled"),
    ({"mode": "none", "enabled": True}, "enabled = true but mode = 'none'")])
def test_dp_settings_without_a_switch_or_a_contradiction_are_refused(tmp_path, section, said):
    from clinograph.core.errors import ConfigError

    path = tmp_path / "sim.toml"
    path.write_text("[privacy]\n" + "".join(f"{k} = {v!r}\n".replace("True", "true") for k, v in section.items()))
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        SimulationConfig.from_toml(path)
