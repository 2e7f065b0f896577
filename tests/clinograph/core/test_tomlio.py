"""clinograph/core/tomlio.py: a TOML file of another kind (server.toml as hospital.toml, a dictionary
as a site schema) is named as such, not only as a list of unknown keys."""

from __future__ import annotations

import pytest
from clinograph.sdk.config import HospitalConfig

from clinograph.core.errors import ConfigError


def test_a_file_of_another_kind_is_asked_whether_it_is_the_right_file(tmp_path):
    """`clinograph model init --config server.toml` listed `federation: unknown key (remove it ...)`:
    removing it leaves an empty file, not the fix."""
    server = tmp_path / "server.toml"
    server.write_text('[federation]\nid = "x"\nrounds = 2\n')
    with pytest.raises(ConfigError) as err:
        HospitalConfig.from_toml(server)
    said = str(err.value)
    assert "federation: unknown key" in said and "None of its top-level keys is one a hospital config has" in said
    assert "privacy, release" in said and "is this the right file" in said, said
    typo = tmp_path / "hospital.toml"
    typo.write_text('[privacy]\nenabled = true\n[relase]\nmetrics = "none"\n')
    with pytest.raises(ConfigError) as err:  # one misspelt key among known ones: no such question
        HospitalConfig.from_toml(typo)
    assert "relase: unknown key" in str(err.value) and "right file" not in str(err.value)


def test_a_section_of_another_file_names_that_file_and_the_fix(tmp_path):
    """docs/privacy.md's distributed-DP block holds [privacy] (hospital) and [dp_policy] (server);
    pasted whole into a simulation config it said only 'dp_policy: unknown key (remove it or check
    the spelling)', as if misspelt."""
    from clinograph.sdk.config import HospitalConfig, SimulationConfig

    (tmp_path / "sim.toml").write_text('[privacy]\nmode = "local"\n\n[dp_policy]\nmax_epsilon = 3.0\n')
    with pytest.raises(ConfigError) as caught:
        SimulationConfig.from_toml(tmp_path / "sim.toml")
    said = str(caught.value)
    assert "  - dp_policy: unknown key" in said
    assert "[dp_policy] is server.toml's section; a simulation has one config for every party" in said
    assert "leave [dp_policy] out" in said and "None of its top-level keys" not in said
    (tmp_path / "hospital.toml").write_text("[dp_policy]\nmax_epsilon = 3.0\n")
    with pytest.raises(ConfigError) as caught:
        HospitalConfig.from_toml(tmp_path / "hospital.toml")
    said = str(caught.value)  # only server keys: both the section's owner and the wrong-file hint
    assert "[dp_policy] is server.toml's section (the federation's DP policy" in said
    assert "this hospital's own DP settings are [privacy]" in said and "None of its top-level keys" in said
