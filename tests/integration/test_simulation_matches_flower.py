"""The same configuration and seeds give the same run in simulation and over Flower.

``simulate()`` (in-process transport) against the Flower ServerApp's ``run_federation`` over a
loopback Grid that goes through the real ClientApp, the real local-socket relay and a real
``HospitalWorker`` per node built by the real SuperNode factory (``make_hospital``: hospital.toml,
table.csv, schema.toml from disk). Both run the SDK's default candidates (four, chosen on the
federated validation loss, eliminated early by successive halving over 4 rounds: all four train 2
rounds, the best goes on to 4), masked, on the demo's ALARM hospitals written by the deployment
example's ``prepare``. Asserted: the same cuts, the same candidates' kept rounds and validation
losses, the same chosen model, every hospital's kept model equal bit for bit (its run paused and
resumed, its anchors checked across the other candidates' entries), and the same audit entry kinds.
The real-process variant (SuperLink, SuperNodes, TLS, node authentication) is
``test_flower_one_run.py``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from flwr.supercore.task_identity import TaskIdentity

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "flower_deployment" / "app"))
sys.path.insert(0, str(ROOT / "tests" / "secure" / "transport"))

HOSPITALS = ["h1", "h2", "h3"]
RUN_ID = 777
ROUNDS = 4


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def _kinds(audit_dir: Path) -> Counter:
    return Counter(json.loads(line)["kind"] for line in (audit_dir / "audit.jsonl").read_text().splitlines())


def _entries(audit_dir: Path, kind: str) -> list[dict]:
    lines = (audit_dir / "audit.jsonl").read_text().splitlines()
    return [e["payload"] for e in map(json.loads, lines) if e["kind"] == kind]


def _simulation_config(sites: Path, server_toml: Path, out: Path):
    import tomllib

    from clinograph.sdk.config import SimulationConfig

    hospital = tomllib.loads((sites / "h1" / "data" / "hospital.toml").read_text())
    server = tomllib.loads(server_toml.read_text())
    hospital["dictionary"] = str(sites / "h1" / "data" / "dictionary.toml")
    entries = [{"site": h, "table": str(sites / h / "data" / "table.csv"), "schema": str(sites / h / "data" / "schema.toml")}
               for h in HOSPITALS]
    return SimulationConfig.model_validate({**hospital, "federation": {**server["federation"], "rounds": ROUNDS},
                                            "output": str(out), "hospitals": entries})


@pytest.mark.slow  # four candidates over Flower and again in simulation
def test_default_candidates_give_the_same_kept_model_in_simulation_and_over_flower(tmp_path):
    from clinograph.sdk.federation.node import make_hospital
    from clinograph.sdk.federation.simulate import load_tables, simulate
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.transport.flower.keyset import init_keyset
    from clinograph.secure.transport.flower.serverapp import run_federation
    from clinograph.secure.transport.flower.worker import HospitalWorker
    from clinograph_flower_app.prepare import prepare
    from flower_helpers import LoopbackGrid

    sites = tmp_path / "sites"
    prepare(sites, hospitals=HOSPITALS, patients=120, dp=False, seed=0, federation_id="fed-loopback",
            audit_dir=tmp_path / "flower-audit")
    keys = init_keyset(tmp_path / "keys", federation_id="fed-loopback", hospitals=HOSPITALS,
                       superlink_hosts=["127.0.0.1"], superlink_port=19093)
    workers, configs = {}, {}
    for i, name in enumerate(HOSPITALS):
        cfg = {"hospital": name, "state-dir": str(sites / name / "state"), "data-dir": str(sites / name / "data"),
               "key-file": str(keys.hospital_dirs[name] / f"{name}.ed25519.pem"),
               "federation-file": str(keys.hospital_dirs[name] / "federation.toml")}
        workers[name] = HospitalWorker(node_config=cfg, factory=make_hospital)
        workers[name].start()
        configs[201 + i] = cfg
    run_config = {"server-config": str(sites / "server" / "server.toml"), "federation-file": str(keys.federation_file),
                  "server-key": str(keys.superlink_dir / "server.ed25519.pem"), "min-nodes": 3, "wait-timeout": 1.0,
                  "hello-timeout": 60.0, "plan-timeout": 600.0, "stage-timeout": 60.0, "end-timeout": 60.0,
                  "events-file": str(tmp_path / "events.jsonl"), "relay-timeout": 600.0, "rounds": ROUNDS}
    try:
        flower = run_federation(LoopbackGrid(run_id=RUN_ID, node_configs=configs, run_config=run_config), run_config)
        members = {n: w._participants[RUN_ID] for n, w in workers.items()}
    finally:
        for w in workers.values():
            w.stop()
    assert flower  # the kept candidate's rounds

    config = _simulation_config(sites, sites / "server" / "server.toml", tmp_path / "sim")
    tables, dictionary = load_tables(config)
    sim = simulate(tables, dictionary, config, audit_dir=tmp_path / "sim-audit")

    # the same choice: every candidate's kept round and validation loss, the same winner
    chosen_flower = _entries(tmp_path / "flower-audit", "model_chosen")
    chosen_sim = _entries(tmp_path / "sim-audit", "model_chosen")
    assert len(chosen_flower) == len(chosen_sim) == 1
    assert [r["name"] for r in chosen_sim[0]["candidates"]] == ["wide", "wide_shape", "linear", "shape"]
    assert chosen_flower == chosen_sim
    assert sim.choice["chosen"] == chosen_flower[0]["chosen"]
    assert _entries(tmp_path / "flower-audit", "model_selected") == _entries(tmp_path / "sim-audit", "model_selected")
    # the same early elimination: one cut after 2 rounds, the same losses, the same survivor
    cuts = _entries(tmp_path / "flower-audit", "candidates_eliminated")
    assert cuts == _entries(tmp_path / "sim-audit", "candidates_eliminated")
    assert [(c["rung"], c["rounds"], len(c["kept"]), len(c["eliminated"])) for c in cuts] == [(0, 2, 1, 3)]
    assert cuts[0]["kept"] == [sim.choice["chosen"]]

    # every hospital keeps the chosen candidate's selected, calibrated model -- bit for bit
    for name in HOSPITALS:
        deployed, simulated = members[name], sim.hospitals[name]
        assert deployed.chosen == simulated.chosen == sim.choice["chosen"]
        a, b = deployed.client.task.model.state_dict(), simulated.client.task.model.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        ca, cb = deployed.client.task.calibration, simulated.client.task.calibration
        assert (ca.a, ca.b) == (cb.a, cb.b)

    # the same audit: the same entry kinds, as often (the ServerApp adds nothing but its greeting)
    flower_kinds, sim_kinds = _kinds(tmp_path / "flower-audit"), _kinds(tmp_path / "sim-audit")
    assert {k: v for k, v in flower_kinds.items() if k not in ("envelope", "artefact")} == \
        {k: v for k, v in sim_kinds.items() if k not in ("envelope", "artefact")}
    assert flower_kinds["model_chosen"] == 1 and flower_kinds["model_selected"] == 1  # the survivor's run alone ended
    assert flower_kinds["run_paused"] == 4 and flower_kinds["run_resumed"] == 1
    assert verify_audit_dir(tmp_path / "flower-audit").ok and verify_audit_dir(tmp_path / "sim-audit").ok
