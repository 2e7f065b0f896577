"""The plan's model-settings digest: the DP default model is derived alike at every hospital, and a
mismatch names [privacy] as a cause (under it an unwritten [model] deep becomes false)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from clinograph.sdk.config import HospitalConfig
from clinograph.sdk.model.settings import PLAN_OPTION, check_plan_settings, config_settings_digest

from clinograph.core.errors import ProtocolError


def _config(**sections) -> HospitalConfig:
    return HospitalConfig.model_validate({"dictionary": "dictionary.toml", **sections})


def test_the_dp_default_digests_like_an_explicit_wide_path_and_unlike_the_gnn():
    derived = _config(privacy={"enabled": True})
    assert config_settings_digest(derived) == config_settings_digest(_config(privacy={"enabled": True},
                                                                             model={"deep": False}))
    gnn = config_settings_digest(_config())
    assert config_settings_digest(derived) != gnn
    task = SimpleNamespace(name="nsfl", config=derived)
    with pytest.raises(ProtocolError, match=r"and \[privacy\] enabled \(under \[privacy\] an "
                                             r"unwritten \[model\] deep becomes false.*dp_default_model"):
        check_plan_settings({PLAN_OPTION: gnn}, task=task, hospital="h1", round_=0)
    check_plan_settings({PLAN_OPTION: config_settings_digest(derived)}, task=task, hospital="h1", round_=0)
