"""An operator extends an ended federation over Flower, as docs/deployment.md says.

The ServerApp's ``run_federation`` over a loopback Grid (the real ClientApp, relay and one
``HospitalWorker`` per node built by the real SuperNode factory from each hospital's files), with
a crash journal: a first Flower run of 2 rounds ends; a second Flower run of the same app with
``rounds=4`` and the same journal goes on -- same federation id, keys, hospitals and their state
directories, round numbers continuing, a ``run_extended`` entry linking the two runs of one audit
trail. Asking for no more rounds than ran is refused with the fix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from flwr.supercore.task_identity import TaskIdentity

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "flower_deployment" / "app"))
sys.path.insert(0, str(Path(__file__).parent))

HOSPITALS = ["h1", "h2", "h3"]


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def _entries(audit_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (audit_dir / "audit.jsonl").read_text().splitlines()]


def test_an_ended_federation_goes_on_with_more_rounds_in_the_same_journal_and_audit(tmp_path):
    from clinograph.sdk.config import HospitalConfig
    from clinograph.sdk.federation.build import run_models
    from clinograph.sdk.federation.node import load_dictionary, make_hospital
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.transport.flower.keyset import init_keyset
    from clinograph.secure.transport.flower.serverapp import run_federation
    from clinograph.secure.transport.flower.worker import HospitalWorker
    from clinograph_flower_app.prepare import prepare
    from flower_helpers import LoopbackGrid

    from clinograph.core.errors import ConfigError

    sites = tmp_path / "sites"
    prepare(sites, hospitals=HOSPITALS, patients=80, dp=False, seed=0, federation_id="fed-loopback",
            audit_dir=tmp_path / "audit")
    for h in HOSPITALS:  # one model with selection (a journal holds one candidate's run)
        toml = sites / h / "data" / "hospital.toml"
        toml.write_text(toml.read_text() + "\n[selection]\ncandidates = []\n")
    config = HospitalConfig.from_toml(sites / "h1" / "data" / "hospital.toml")
    (sites / "server" / "initial_model.json").write_bytes(
        run_models(config, dictionary=load_dictionary(config, sites / "h1" / "data" / "hospital.toml")).to_bytes())
    keys = init_keyset(tmp_path / "keys", federation_id="fed-loopback", hospitals=HOSPITALS,
                       superlink_hosts=["127.0.0.1"], superlink_port=19094)
    workers, configs = [], {}
    for i, name in enumerate(HOSPITALS):
        cfg = {"hospital": name, "state-dir": str(sites / name / "state"), "data-dir": str(sites / name / "data"),
               "key-file": str(keys.hospital_dirs[name] / f"{name}.ed25519.pem"),
               "federation-file": str(keys.hospital_dirs[name] / "federation.toml")}
        w = HospitalWorker(node_config=cfg, factory=make_hospital)
        w.start()
        workers.append(w)
        configs[301 + i] = cfg
    base = {"server-config": str(sites / "server" / "server.toml"), "federation-file": str(keys.federation_file),
            "server-key": str(keys.superlink_dir / "server.ed25519.pem"), "min-nodes": 3, "wait-timeout": 1.0,
            "hello-timeout": 30.0, "plan-timeout": 300.0, "stage-timeout": 30.0, "end-timeout": 30.0,
            "events-file": str(tmp_path / "events.jsonl"), "relay-timeout": 300.0,
            "journal": str(tmp_path / "audit.journal.sqlite")}
    try:
        for run_id, rounds in ((11, 2), (12, 4)):  # a new Flower run each time: fresh participants from disk
            cfg = {**base, "rounds": rounds}
            run_federation(LoopbackGrid(run_id=run_id, node_configs=configs, run_config=cfg), cfg)
        with pytest.raises(ConfigError, match=r"after 4 training round\(s\).*rounds > 4"):
            cfg = {**base, "rounds": 4}
            run_federation(LoopbackGrid(run_id=13, node_configs=configs, run_config=cfg), cfg)
    finally:
        for w in workers:
            w.stop()

    entries = _entries(tmp_path / "audit")
    kinds = [e["kind"] for e in entries]
    assert not [e for e in entries if e["kind"] in ("hospital_refused", "update_rejected", "round_aborted")]
    ended = [e["payload"] for e in entries if e["kind"] == "run_ended"]
    assert [(p["status"], p["rounds_completed"], p["rounds_planned"]) for p in ended][:2] == [
        ("completed", 2, 2), ("completed", 4, 4)]
    extended = [e for e in entries if e["kind"] == "run_extended"]
    assert len(extended) == 1
    first_end = next(e for e in entries if e["kind"] == "run_ended")
    assert extended[0]["payload"]["previous_audit_seq"] >= first_end["seq"]  # linked to the ended run
    assert extended[0]["payload"]["rounds_completed"] == 2 and extended[0]["payload"]["rounds_planned"] == 4
    rounds = [e["payload"]["round"] for e in entries if e["kind"] == "round_plan"]
    assert rounds == list(range(len(rounds))) and len(rounds) == 6  # 2 + scoring, then 2 more + scoring
    assert kinds.count("model_selected") == 2 and kinds.count("release") == 2
    assert verify_audit_dir(tmp_path / "audit").ok
