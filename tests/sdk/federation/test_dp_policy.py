"""A distributed-DP simulation's public parameters (one operator configures every party): σ calibrated
to the budget and q = 1 when [privacy] leaves them out, h required; local_epochs derived; quality
metrics refused at configuration. Before, each of these stopped the run at round 0 or named
[dp_policy], a section a simulation does not use for them."""

from __future__ import annotations

import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.dp_policy import check_simulation, with_public_parameters
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError

DIM = 985  # the demo model's shared size (benchmarks/dp_step); any public d works


def _config(**privacy):
    return SimulationConfig.model_validate({"federation": {"rounds": 5, "strategy": "fedsgd"},
                                            "privacy": {"mode": "distributed", "epsilon_budget": 3.0, **privacy}})


def test_sigma_is_calibrated_to_the_budget_and_q_is_one_when_left_out():
    cfg = with_public_parameters(_config(min_honest=2), n_hospitals=3, dim=DIM)
    p = cfg.privacy
    assert p.sample_rate == 1.0 and p.noise_multiplier is not None and p.noise_multiplier > 0
    promised = check_simulation(cfg, small_tables(), dim=DIM)  # the server's own check of the promise
    assert 2.9 < promised <= 3.0
    fewer = with_public_parameters(_config(min_honest=2, target_epsilon=1.0), n_hospitals=3, dim=DIM)
    assert fewer.privacy.noise_multiplier > p.noise_multiplier  # a smaller target: more noise


def test_written_parameters_are_kept_and_h_is_required():
    cfg = _config(min_honest=2, noise_multiplier=7.5, sample_rate=0.5)
    assert with_public_parameters(cfg, n_hospitals=3, dim=DIM) is cfg
    with pytest.raises(ConfigError, match=r"needs min_honest \(h\).*Set \[privacy\] min_honest = 2"):
        with_public_parameters(_config(), n_hospitals=3, dim=DIM)


def test_local_epochs_is_one_under_distributed_dp_and_a_written_two_is_refused():
    assert _config().federation.local_epochs == 1
    assert SimulationConfig.model_validate({}).federation.local_epochs == 2
    with pytest.raises(ValueError, match="local_epochs = 2 with .privacy. mode = 'distributed'"):
        SimulationConfig.model_validate({"federation": {"local_epochs": 2}, "privacy": {"mode": "distributed"}})


def test_quality_metrics_under_distributed_dp_are_refused_at_configuration():
    with pytest.raises(ValueError, match="metrics = 'quality' with .privacy. mode = 'distributed'"):
        SimulationConfig.model_validate({"privacy": {"mode": "distributed"}, "release": {"metrics": "quality"}})
    assert SimulationConfig.model_validate({"privacy": {"mode": "local"}, "release": {"metrics": "quality"}})
