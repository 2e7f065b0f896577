"""sdk/config.py: the SDK's DP default model (issue 30) -- under [privacy], a binary static NS-FL
hospital that did not write [model] deep trains the wide path alone; everything else is as written."""

from __future__ import annotations

from pathlib import Path

import pytest
from clinograph.sdk.config import HospitalConfig, SimulationConfig, dp_default_model, merge_sections

DP = {"privacy": {"enabled": True}}
DISTRIBUTED = {"privacy": {"enabled": True, "mode": "distributed"}}


@pytest.mark.parametrize("privacy", [DP, DISTRIBUTED])
def test_under_dp_the_default_model_is_the_wide_path_and_stays_derived(privacy):
    c = SimulationConfig.model_validate(privacy)
    assert c.model.deep is False and "deep" not in c.model.model_fields_set and dp_default_model(c)
    assert c.hospital_config().model.deep is False  # what every simulated hospital trains
    again = SimulationConfig.model_validate(c.model_dump(mode="python", exclude_unset=True))
    assert again.model.deep is False
    # derived, not chosen: turning DP off again (a dump without unset fields) gives the GNN back
    off = SimulationConfig.model_validate(merge_sections(c.model_dump(mode="python", exclude_unset=True),
                                                         {"privacy": {"enabled": False}}))
    assert off.model.deep is True


@pytest.mark.parametrize("over", [
    {},  # no DP
    DP | {"model": {"deep": True}},  # the operator chose the GNN
    DP | {"selection": {"enabled": True}},  # private choice among the default candidates (wide among them)
    DP | {"target": {"kind": "survival", "time_unit": "d", "breaks": [30.0, 60.0], "horizon": 60.0}},
    DP | {"model": {"temporal": "attention"}},
    DP | {"model": {"linear_path": False}},
])
def test_everything_else_keeps_the_model_as_written(over):
    c = HospitalConfig.model_validate(over)
    assert c.model.deep is True and not dp_default_model(c)


def test_a_toml_under_privacy_reads_the_rule(tmp_path: Path):
    p = tmp_path / "hospital.toml"
    p.write_text("[privacy]\nenabled = true\nepsilon_budget = 3.0\n")
    assert HospitalConfig.from_toml(p).model.deep is False
    p.write_text("[privacy]\nenabled = true\n[model]\ndeep = true\n")
    assert HospitalConfig.from_toml(p).model.deep is True
