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


def test_the_deployment_path_says_and_audits_the_dp_default_model(tmp_path: Path):
    """Issue 30 leftover: `clinograph simulate` announced the DP default model, the deployment path
    did not. `clinograph model init` now says the same line and writes it into the initial model,
    whose server audits it (resolved_default) and logs it (tests/secure/transport/test_flower_operator.py)."""
    from clinograph.sdk.config import DP_DEFAULT_MODEL_LINE
    from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
    from clinograph.secure.runtime.models import run_models_from_bytes
    from typer.testing import CliRunner

    from clinograph.cli import app

    p, out = tmp_path / "hospital.toml", tmp_path / "initial_model.json"
    for extra, said in (("", True), ("[model]\ndeep = true\n", False)):
        p.write_text(f'dictionary = "{DICTIONARY_PATH}"\n[privacy]\nenabled = true\nepsilon_budget = 3.0\n{extra}')
        res = CliRunner().invoke(app, ["model", "init", "--config", str(p), "--out", str(out), "--force"])
        assert res.exit_code == 0, res.output
        models = run_models_from_bytes(out.read_bytes())
        assert (DP_DEFAULT_MODEL_LINE in res.output) is said
        assert models.default_lines() == ([DP_DEFAULT_MODEL_LINE] if said else [])
        assert [d.payload() for c in models.candidates for d in c.initial.defaults] == (
            [{"setting": "model.deep", "value": "false", "rule": "dp_default_model", "line": DP_DEFAULT_MODEL_LINE}]
            if said else [])
