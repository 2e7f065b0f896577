"""sdk/federation/client.py: the strategy a hospital applies itself (ckks: it decrypts the sum) is
built from the server-signed plan, so the plan cannot make it one that reads files or the sum."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from clinograph.sdk.federation.client import HospitalClient

from clinograph.core.errors import ProtocolError


@pytest.mark.parametrize("strategy", ["fednsl_rules", "dag_voting"])
def test_a_plan_cannot_make_a_hospital_build_a_server_side_strategy(tmp_path, strategy):
    """A plan naming fednsl_rules with strategy.rule_space = any path made the hospital read that file
    (a FIFO hung it, /dev/zero exhausted its memory; a missing one was a bare FileNotFoundError).
    Strategies that read the sum at the server never run at a hospital in an honest run (the server
    refuses them under ckks: runtime/build.py check_reads_sum)."""
    missing = tmp_path / "no-such-rule-space.json"
    options = ({"strategy.rule_space": str(missing), "strategy.rule_space_sha256": "0" * 64}
               if strategy == "fednsl_rules" else {"strategy.concepts": "a,b"})
    plan = SimpleNamespace(strategy=strategy, options=options)
    with pytest.raises(ProtocolError, match=strategy):
        HospitalClient._strategy_for(SimpleNamespace(_strategy=None), plan)


def test_a_plan_strategy_a_hospital_applies_is_still_built():
    plan = SimpleNamespace(strategy="fedsgd", options={"strategy.server_lr": 0.5})
    assert HospitalClient._strategy_for(SimpleNamespace(_strategy=None), plan).name == "fedsgd"
