"""Config sections type their numbers and switches: a quoted number or a 0/1 switch is refused."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.runtime.config import FederationSection

from clinograph.core.errors import ConfigError


@pytest.mark.parametrize(("value", "message"), [
    ("5", "expected an integer, got the text '5'; write the value without quotes"),
    (True, "expected an integer, got true"),
])
def test_a_quoted_or_boolean_round_count_is_refused_by_name(value, message):
    with pytest.raises(ConfigError) as err:
        FederationSection.model_validate({"rounds": value})
    assert "rounds" in str(err.value) and message in str(err.value)


def test_typed_values_pass():
    assert FederationSection.model_validate({"rounds": 5}).rounds == 5
    assert FederationSection.model_validate({"rounds": np.int64(3)}).rounds == 3  # programmatic numpy ints


def test_a_threshold_outside_threshold_ckks_is_refused_by_name():
    """tckks_threshold only means something under secure_mode = "ckks_threshold": elsewhere it was silently ignored."""
    with pytest.raises(ConfigError) as err:
        FederationSection.model_validate({"secure_mode": "masked", "tckks_threshold": 2})
    assert "tckks_threshold" in str(err.value) and "ckks_threshold" in str(err.value)
    assert FederationSection.model_validate({"secure_mode": "ckks_threshold", "tckks_threshold": 2}).tckks_threshold == 2


@pytest.mark.parametrize(("toml", "key"), [
    ("[federation]\nserver_lr = inf\n", "federation.server_lr"),
    ("[federation]\nstrategy_options = { beta = nan }\n", "federation.strategy_options.beta"),
    ("[dp_policy]\nmax_clip_norm = inf\n", "dp_policy.max_clip_norm"),
    ("[dp_policy]\nmin_noise_multiplier = inf\n", "dp_policy.min_noise_multiplier"),
])
def test_an_infinite_or_nan_number_in_server_toml_is_refused_by_name(tmp_path, toml, key):
    """TOML has inf and nan: a bound of inf (max_clip_norm) let any hospital's clip through the DP
    policy; server_lr = inf an infinite server step. Both loaded as valid."""
    from clinograph.secure.runtime.config import ServerConfig

    from clinograph.core.errors import ConfigError

    path = tmp_path / "server.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        ServerConfig.from_toml(path)
    assert key in str(err.value) and "expected a finite number, got" in str(err.value)
