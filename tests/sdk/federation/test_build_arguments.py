"""The integrator's calls with a wrong argument: a ConfigError naming the argument, what came and the fix
(an AttributeError from deep inside before -- or, for the server's private Identity, no error at all)."""

from __future__ import annotations

import pandas as pd
import pytest
from clinograph.sdk.config import HospitalConfig, SimulationConfig
from clinograph.sdk.datasets.alarm import load_dictionary
from clinograph.sdk.federation.build import build_hospital
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.federation.split import split_patients

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

NORTH, SERVER = Identity.generate("north"), Identity.generate("server")
TABLE = pd.DataFrame({"patient_id": ["a"], "outcome": [0]})


def _build(**over):
    args = {"dictionary": load_dictionary(), "config": HospitalConfig(), "identity": NORTH, "server": SERVER.public,
            "peers": {"north": NORTH.public}, "federation_id": "fed"} | over
    return build_hospital(TABLE, **args)


@pytest.mark.parametrize(("over", "said"), [
    ({"identity": "north"}, "build_hospital: identity is a str; pass your hospital's key: cg.Identity.load("),
    ({"server": SERVER}, "server is the server's private Identity; a hospital holds only the server's public key"),
    ({"server": "server"}, "server is a str; pass the server's PublicIdentity"),
    ({"peers": {"north": NORTH}}, "peers must map each enrolled hospital's name to its PublicIdentity"),
    ({"federation_id": "my federation"}, "federation_id 'my federation' must match"),
    ({"config": {"model": {}}}, "config is a dict; pass cg.HospitalConfig.from_toml('hospital.toml')"),
    ({"dictionary": "dictionary.toml"}, "dictionary is a str; pass cg.FeatureDictionary.from_toml(...)"),
])
def test_build_hospital_names_the_wrong_argument_and_the_fix(over, said):
    with pytest.raises(ConfigError) as err:
        _build(**over)
    assert said in str(err.value)


def test_split_and_simulate_want_ingested_tables():
    with pytest.raises(ConfigError, match=r"split_patients needs the hospital's ingested table .* got a DataFrame"):
        split_patients(TABLE, config=HospitalConfig())
    with pytest.raises(ConfigError, match=r"simulate needs each hospital's ingested table .* got DataFrame"):
        simulate([TABLE], load_dictionary(), SimulationConfig(), audit_dir="unused")


@pytest.mark.parametrize("name", [5, "north/../server", "St Mary's", ""])
def test_an_identity_name_that_no_federation_can_enrol_is_refused_at_once(name):
    """Identity.generate(5) or a name with '/' or a space was accepted, to fail (or write odd file
    names) later; it must be a site name as federation.toml and the site schema spell it."""
    with pytest.raises(ConfigError, match=r"Identity name .* must match .* a hospital's site name or the server's"):
        Identity.generate(name)
