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
