"""A config model built in code with a bad value raises the one exception tree (ConfigError, also a
ValueError), with the message a TOML file gets: every bad key, what was found, what was expected.
Before: pydantic's ValidationError, outside ClinographError, its text quoting the input values."""

import re

import pytest

import clinograph as cg
from clinograph.core.errors import ClinographError, ConfigError, ConfigValidationError


@pytest.mark.parametrize(("build", "message"), [
    (lambda: cg.HospitalConfig(training={"lr": "0.1"}, privacy={"enabled": 1}, federation={}),
     "HospitalConfig is invalid (3 problem(s)):\n  - training.lr: expected a number, got the text '0.1'; write the "
     "value without quotes\n  - privacy.enabled: expected true or false, got 1; write true or false\n"
     "  - federation: unknown key (remove it or check the spelling)"),
    (lambda: cg.SimulationConfig(federation={"roundz": 5}),
     "SimulationConfig is invalid (1 problem(s)):\n  - federation.roundz: unknown key (remove it or check the spelling)"),
    (lambda: cg.ServerConfig.model_validate({"federation": {"rounds": True}}),
     "ServerConfig is invalid (1 problem(s)):\n  - federation.rounds: expected an integer, got true"),
    (lambda: cg.SiteSchema(site="h1", label=None), "SiteSchema is invalid (1 problem(s)):\n  - (top level): label is not set"),
    (lambda: cg.ColumnMap(feature="hr", unit=3), "ColumnMap is invalid (1 problem(s)):\n  - unit: Input should be"),
    (lambda: cg.FeatureDictionary(name="x", version="one", features=()),
     "FeatureDictionary is invalid (1 problem(s)):\n  - version: Input should be a valid integer"),
])
def test_a_public_config_model_with_a_bad_value_raises_a_config_error(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        build()
    assert isinstance(err.value, ConfigValidationError) and isinstance(err.value, ClinographError)
    assert isinstance(err.value, ValueError)  # `except ValueError` (pydantic's base) still catches it
    assert err.value.error_count() == len(err.value.errors()) >= 1


def test_the_message_quotes_no_input_value():
    """pydantic's text quoted every input (input_value=...): a value may be a secret or a cell."""
    with pytest.raises(ConfigError) as err:
        cg.SiteSchema(site="h1", label=None, columns={"hr": {"feature": 12345678}})
    assert "12345678" not in str(err.value)
