"""An operator's Ctrl-C (KeyboardInterrupt, which carries no message) ends the run's audit in words."""

import json

import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.secure.runtime.loop import failure_reason, run_rounds
from sdk_helpers import small_tables


def test_a_run_interrupted_by_the_operator_says_so_in_run_ended(tmp_path):
    tables = small_tables()
    config = SimulationConfig.model_validate({
        "federation": {"rounds": 3, "local_epochs": 1, "min_clients": 3}, "model": {"hidden": 8},
        "graph": {"k_similar": 0}})
    sim = build_simulation(tables, tables[0].dictionary, config, audit_dir=tmp_path / "a")

    def ctrl_c(r, outcome):
        raise KeyboardInterrupt  # what Python raises on SIGINT, here after round 0 closed

    with pytest.raises(KeyboardInterrupt):
        run_rounds(sim.server, sim.transport, rounds=3, on_round=ctrl_c)
    sim.audit.close()
    ended = [json.loads(x)["payload"] for x in (tmp_path / "a" / "audit.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "run_ended"]
    assert ended == [{"status": "failed", "rounds_completed": 1, "rounds_planned": 3,
                      "reason": "interrupted by the operator (Ctrl-C / SIGINT) before round 1 closed: the rounds "
                                "before it stand, nothing of that round was applied"}]


def test_an_exception_without_a_message_is_named_without_a_dangling_colon():
    assert failure_reason(TimeoutError(), round_=2) == "TimeoutError"
    assert failure_reason(ValueError("bad"), round_=2) == "ValueError: bad"
