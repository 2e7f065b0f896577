"""An aborted round spends its number: the next round is planned and the federation goes on."""

import json

import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation
from sdk_helpers import small_tables

from clinograph.core.errors import ProtocolError


def test_after_an_aborted_round_the_next_round_runs_with_the_same_hospitals(tmp_path):
    tables = small_tables()
    config = SimulationConfig.model_validate({
        "federation": {"rounds": 2, "local_epochs": 1, "min_clients": 3, "suspend_after_missed": 0},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}})
    sim = build_simulation(tables, tables[0].dictionary, config, audit_dir=tmp_path / "a")
    before = sim.server.state
    sim.transport.drop_at(0, {"east": 2, "south": 2})  # two of three go silent mid-round: below the threshold
    with pytest.raises(ProtocolError):
        sim.run_round()
    assert sim.server.state is before  # nothing applied
    out = sim.run_round()  # round 1: every hospital accepts the new plan (no replayed round number)
    sim.audit.close()
    assert out.result.round == 1 and out.result.contributors == ("east", "north", "south")
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "a" / "audit.jsonl").read_text().splitlines()]
    assert kinds.count("round_aborted") == 1 and kinds.count("aggregate") == 1
