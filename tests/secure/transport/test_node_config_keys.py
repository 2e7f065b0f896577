"""secure/transport/flower/worker.py: a --node-config key Clinograph does not read is named in a
warning, with the key it was likely meant to be (before: accepted silently)."""

import logging

import pytest
from clinograph.secure.transport.flower.worker import check_node_config

from clinograph.core.errors import ConfigError

GOOD = {"hospital": "h1", "state-dir": "/s", "key-file": "/k", "data-dir": "/d", "federation-file": "/f"}


def test_unknown_keys_are_warned_with_the_likely_key_and_known_ones_are_not(caplog):
    with caplog.at_level(logging.WARNING, logger="clinograph.secure.transport.flower.worker"):
        assert check_node_config(GOOD) == []
        assert caplog.records == []
        assert check_node_config({**GOOD, "data_dir": "/x", "colour\x1b[31m": "red"}) == ["colour\x1b[31m", "data_dir"]
    said = [r.getMessage() for r in caplog.records]
    assert any("'data_dir' is not one Clinograph reads" in m and "did you mean 'data-dir'?" in m for m in said)
    assert any("'colour\\x1b[31m'" in m and "ignored unless a participant factory reads it" in m for m in said)
    assert not any("\x1b" in m for m in said)


def test_a_missing_required_key_is_still_an_error():
    with pytest.raises(ConfigError, match=r"--node-config lacks \['key-file'\]"):
        check_node_config({"hospital": "h1", "state-dir": "/s"})
