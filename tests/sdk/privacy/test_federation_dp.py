"""Ledger entries flow through a real simulated federation (masked secure aggregation)."""

from __future__ import annotations

import json

from clinograph.sdk.config import GraphSection, NSFLConfig, PrivacySection, SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation, simulate
from clinograph.sdk.privacy import PrivacyLedger
from clinograph.secure.runtime.config import FederationSection


def _config(tmp_path) -> SimulationConfig:
    return SimulationConfig(
        federation=FederationSection(rounds=2, secure_mode="masked", local_epochs=1, min_clients=2),
        model=NSFLConfig(hidden=8), graph=GraphSection(k_similar=0),
        privacy=PrivacySection(enabled=True, epsilon_budget=20.0, noise_multiplier=1.0, clip_norm=1.0, batch_size=16,
                               state_dir=tmp_path / "state"),
        output=tmp_path / "out")


def _audit(audit_dir):
    return [json.loads(x) for x in (audit_dir / "audit.jsonl").read_text().splitlines()]


def test_server_records_one_ledger_entry_per_hospital_per_round(tables, dictionary, tmp_path):
    cfg = _config(tmp_path)
    result = simulate(tables, dictionary, cfg, audit_dir=tmp_path / "audit")
    ledgers = [e["payload"] for e in _audit(tmp_path / "audit") if e["kind"] == "ledger"]
    sites = sorted(t.site for t in tables)
    assert sorted((p["client"], p["round"]) for p in ledgers) == sorted((s, r) for s in sites for r in range(2))
    assert not [e for e in _audit(tmp_path / "audit") if e["kind"] == "update_rejected"]
    for s in sites:  # what the server recorded is what the hospital's own ledger says
        mine = PrivacyLedger(tmp_path / "state" / s, site=s, budget_epsilon=20.0, delta=1e-5,
                             signer=result.hospitals[s].identity)
        last = max((p for p in ledgers if p["client"] == s), key=lambda p: p["round"])
        assert last["epsilon"] == mine.epsilon() > 0
        assert [e["round"] for e in mine.entries] == [0, 1]
    assert all(result.final[s] for s in sites)  # every hospital was evaluated after the last round


def test_a_hospital_whose_ledger_breaks_the_policy_is_refused(tables, dictionary, tmp_path):
    cfg = _config(tmp_path)
    sim = build_simulation(tables, dictionary, cfg, audit_dir=tmp_path / "audit")
    sim.hospitals["gamma"].task.trainer.clip_norm = 5.0  # a hospital clipping at 5 > the federation's max 1.0
    for _ in range(2):
        sim.run_round()
    sim.audit.close()
    entries = _audit(tmp_path / "audit")
    rejected = [e["payload"] for e in entries if e["kind"] == "update_rejected"]
    assert sorted(p["round"] for p in rejected if p["client"] == "gamma") == [0, 1]
    assert all("clip norm 5.0 exceeds the maximum 1.0" in p["reason"] for p in rejected if p["client"] == "gamma")
    assert {p["client"] for p in rejected} == {"gamma"}
    ledgers = [e["payload"] for e in entries if e["kind"] == "ledger"]
    assert sorted((p["client"], p["round"]) for p in ledgers) == [("alpha", 0), ("alpha", 1), ("beta", 0), ("beta", 1)]


def test_a_hospitals_ledger_file_is_signed_and_an_edit_is_refused(tables, dictionary, tmp_path):
    import pytest

    from clinograph.core.errors import PrivacyError

    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    sim.run_round()
    sim.audit.close()
    site = sorted(sim.hospitals)[0]
    path = tmp_path / "state" / site / "privacy_ledger.json"
    state = json.loads(path.read_text())
    assert "signature" in json.dumps(state)  # signed by the hospital's own key
    state["history"] = [[h[0], h[1], 0] for h in state["history"]]  # "forget" the steps taken
    path.write_text(json.dumps(state))
    with pytest.raises(PrivacyError, match="privacy_ledger.json"):
        PrivacyLedger(tmp_path / "state" / site, site=site, budget_epsilon=20.0, delta=1e-5,
                      signer=sim.hospitals[site].identity)
