"""The SDK's default run over real Flower processes matches the simulation of the same config.

One SuperLink (TLS + SuperNode authentication), three SuperNodes (``clinograph.secure.transport.
flower.supernode``, the real ``make_hospital`` factory over each hospital's data, state and key
folders) and ``flwr run`` of examples/flower_deployment/app: the four default candidates, masked,
each with its training round (one, to keep the test short), its scoring round and every hospital keeping the
chosen, calibrated model.
Then ``simulate()`` of the same configuration and seeds. Asserted from the two audit trails: the
same ``model_chosen`` and ``model_selected`` entries, the same global model after every round of
every candidate (``aggregate`` state digests) and the same entry kinds; the deployed trail
verifies against the enrolled server key.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from flower_processes import APP, flower_processes
from flower_processes import events as _events

HOSPITALS = ("h1", "h2", "h3")
TOTAL_BUDGET = 900.0  # seconds; the test fails and cleans up past this


def _audit(audit_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (audit_dir / "audit.jsonl").read_text().splitlines()]


def _payloads(entries: list[dict], kind: str) -> list[dict]:
    return [e["payload"] for e in entries if e["kind"] == kind]


@pytest.mark.slow
def test_default_candidates_over_real_flower_processes_match_the_simulation(tmp_path):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import load_tables, simulate
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.enrolment import load_federation

    sys.path.insert(0, str(APP))
    from clinograph_flower_app.prepare import prepare

    sites = tmp_path / "sites"
    prepare(sites, hospitals=list(HOSPITALS), patients=120, dp=False, seed=0, federation_id="fed-loopback",
            audit_dir=tmp_path / "audit")
    events = tmp_path / "events.jsonl"
    with flower_processes(tmp_path, federation_id="fed-loopback", hospitals=HOSPITALS, budget=TOTAL_BUDGET) as fp:
        keys, link = fp.keys, fp.keys.superlink_dir
        fp.superlink()
        fp.register(HOSPITALS)
        for h in HOSPITALS:
            fp.supernode(h, node_config={"data-dir": sites / h / "data", "state-dir": sites / h / "state"})
        fp.flwr_run({"server-config": sites / "server" / "server.toml", "federation-file": link / "federation.toml",
                     "server-key": link / "server.ed25519.pem", "events-file": events, "min-nodes": 3, "rounds": 1,
                     "wait-timeout": 60.0, "hello-timeout": 60.0, "plan-timeout": 120.0, "stage-timeout": 30.0,
                     "end-timeout": 30.0, "relay-timeout": 120.0})
        fp.wait(lambda: any(e["event"] == "finished" for e in _events(events)), what="the federation to finish",
                spare=60, procs=fp.named("superlink", "flwr-run"))

    import tomllib

    hospital = tomllib.loads((sites / "h1" / "data" / "hospital.toml").read_text())
    server = tomllib.loads((sites / "server" / "server.toml").read_text())
    config = SimulationConfig.model_validate({
        **hospital, "dictionary": str(sites / "h1" / "data" / "dictionary.toml"), "federation": {**server["federation"], "rounds": 1},
        "output": str(tmp_path / "sim"),
        "hospitals": [{"site": h, "table": str(sites / h / "data" / "table.csv"),
                       "schema": str(sites / h / "data" / "schema.toml")} for h in HOSPITALS]})
    tables, dictionary = load_tables(config)
    sim = simulate(tables, dictionary, config, audit_dir=tmp_path / "sim-audit")

    deployed, simulated = _audit(tmp_path / "audit"), _audit(tmp_path / "sim-audit")
    chosen = _payloads(deployed, "model_chosen")
    assert len(chosen) == 1 and [r["name"] for r in chosen[0]["candidates"]] == ["wide", "wide_shape", "linear", "shape"]
    assert chosen == _payloads(simulated, "model_chosen") and chosen[0]["chosen"] == sim.choice["chosen"]
    assert _payloads(deployed, "model_selected") == _payloads(simulated, "model_selected")
    digests = [(p["round"], p["global_state_digest"]) for p in _payloads(deployed, "aggregate")]
    assert digests == [(p["round"], p["global_state_digest"]) for p in _payloads(simulated, "aggregate")]
    assert len(digests) == 4 * 2  # every candidate: its training round and its scoring round
    ignore = ("envelope", "artefact")
    assert Counter(e["kind"] for e in deployed if e["kind"] not in ignore) == \
        Counter(e["kind"] for e in simulated if e["kind"] not in ignore)
    server_key = load_federation(keys.federation_file).server_public().raw
    report = verify_audit_dir(tmp_path / "audit", trusted_server_key=server_key)
    assert report.ok, report.problems
    finished = [e for e in _events(events) if e["event"] == "finished"]
    assert finished[0]["candidate"] == sim.choice["chosen"]
