"""A hospital trains at most once per round: replayed or old plans are refused before training.

One plan replayed three times used to cause four training runs, each a DP ledger commit; in
CKKS an old plan was accepted after later rounds. Round numbers must strictly advance per
federation (ProtocolError, no training, no ledger commit).
"""

from __future__ import annotations

import json

import pytest
from clinograph.sdk.config import GraphSection, NSFLConfig, PrivacySection, SimulationConfig
from clinograph.sdk.datasets.alarm import load_dictionary
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.secure.runtime.config import FederationSection
from sdk_helpers import small_tables

from clinograph.core.errors import ProtocolError


def _plan_bytes(audit_dir, round_: int) -> bytes:
    for line in (audit_dir / "audit.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "artefact" and e["payload"]["name"] == f"round-{round_:04d}/plan.json":
            return (audit_dir / "artefacts" / e["payload"]["sha256"]).read_bytes()
    raise AssertionError(f"no plan for round {round_}")


def _sim(tmp):
    cfg = SimulationConfig(
        federation=FederationSection(rounds=2, secure_mode="masked", local_epochs=1, min_clients=2),
        model=NSFLConfig(hidden=8), graph=GraphSection(k_similar=0),
        privacy=PrivacySection(enabled=True, epsilon_budget=50.0, noise_multiplier=1.0, clip_norm=1.0, batch_size=16,
                               state_dir=tmp / "state"),
        output=tmp / "out")
    s = build_simulation(small_tables(), load_dictionary(), cfg, audit_dir=tmp / "audit")
    s.tmp = tmp
    return s


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return _sim(tmp_path_factory.mktemp("replay"))


def _ledger_rounds(hospital) -> list[int]:
    return [e["round"] for e in hospital.task.trainer.ledger.entries]


def test_replayed_plan_is_refused_before_training(tmp_path):
    """The plan of the open round, replayed three times while the hospital waits for the next stage."""
    sim = _sim(tmp_path)
    plan = sim.server.open_round(tuple(sorted(sim.hospitals)))
    hospital = sim.hospitals[sorted(sim.hospitals)[0]]
    hospital.on_plan(plan)
    for _ in range(3):
        with pytest.raises(ProtocolError, match="round 0 .*already"):
            hospital.on_plan(plan)
    assert _ledger_rounds(hospital) == [0]  # exactly one entry per round


def test_rounds_run_normally_and_the_ledger_has_one_entry_per_round(sim):
    sim.run_round()
    for hospital in sim.hospitals.values():
        assert _ledger_rounds(hospital) == [0]


def test_old_plan_is_refused_after_later_rounds(sim):
    sim.run_round()
    for hospital in sim.hospitals.values():
        assert _ledger_rounds(hospital) == [0, 1]
        with pytest.raises(ProtocolError, match="round 0 .*already"):
            hospital.on_plan(_plan_bytes(sim.tmp / "audit", 0))
        assert _ledger_rounds(hospital) == [0, 1]
