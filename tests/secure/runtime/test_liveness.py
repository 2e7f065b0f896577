"""Liveness: a hospital that keeps missing rounds is suspended (audited) and retried."""

import json

import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.secure.runtime.liveness import Liveness
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError


def test_suspended_after_consecutive_misses_and_back_when_it_contributes():
    live = Liveness(suspend_after=2, retry_every=3)
    hosp = ("a", "b", "c")
    assert live.invited(0, hosp) == hosp
    assert live.observe(0, hosp, ("a", "b")) == []
    recs = live.observe(1, hosp, ("a", "b"))
    assert recs == [("hospital_suspended", {"round": 1, "hospital": "c", "missed_rounds": 2, "retry_every": 3})]
    assert live.invited(2, hosp) == ("a", "b") and live.invited(3, hosp) == ("a", "b")
    assert live.invited(4, hosp) == hosp  # a retry every 3 rounds
    assert live.observe(4, hosp, hosp) == [("hospital_rejoined", {"round": 4, "hospital": "c"})]
    assert live.invited(5, hosp) == hosp


def test_a_hospital_that_misses_once_is_not_suspended():
    live = Liveness(suspend_after=2, retry_every=1)
    assert live.observe(0, ("a", "b"), ("a",)) == [] and live.observe(1, ("a", "b"), ("a", "b")) == []
    assert live.observe(2, ("a", "b"), ("a",)) == []  # the count restarts after a contribution


def test_zero_never_suspends_and_bad_settings_are_refused():
    live = Liveness(suspend_after=0, retry_every=1)
    for r in range(5):
        assert live.observe(r, ("a", "b"), ("a",)) == []
    with pytest.raises(ConfigError, match="retry_every >= 1"):
        Liveness(suspend_after=1, retry_every=0)


def test_a_dead_hospital_stops_costing_rounds_and_the_audit_says_when(tmp_path):
    tables = small_tables()
    config = SimulationConfig.model_validate({
        "federation": {"rounds": 4, "local_epochs": 1, "suspend_after_missed": 2, "retry_every": 10},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}})
    sim = build_simulation(tables, tables[0].dictionary, config, audit_dir=tmp_path / "a")
    for r in range(4):
        sim.transport.drop_at(r, {"east": 0})  # east never answers
    invited = []
    for _ in range(4):
        out = sim.run_round()
        invited.append(sorted(json.loads(x)["payload"]["participants"] for x in
                              (tmp_path / "a" / "audit.jsonl").read_text().splitlines()
                              if json.loads(x)["kind"] == "round_plan")[-1])
        assert "east" not in out.result.contributors
    sim.audit.close()
    assert [("east" in p) for p in invited] == [True, True, False, False]
    entries = [json.loads(x) for x in (tmp_path / "a" / "audit.jsonl").read_text().splitlines()]
    suspended = [e["payload"] for e in entries if e["kind"] == "hospital_suspended"]
    assert suspended == [{"round": 1, "hospital": "east", "missed_rounds": 2, "retry_every": 10}]
