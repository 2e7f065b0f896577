"""The ServerApp SIGKILLed mid-run over Flower (real processes) resumes from its journal.

One SuperLink (TLS + SuperNode authentication), three SuperNodes, ``flwr run`` of
examples/flower_deployment/app with run config ``journal`` set (the same harness as
test_flower_deployment.py). Each hospital is the real :class:`HospitalClient` over the tiny
deterministic task of tests/secure/runtime/crash_harness.py (``--participant-factory``), keeping
its anchor, model and privacy ledger in its state directory. Mid-round 1 the test SIGKILLs the
``flwr-serverapp`` process, stops that ``flwr run``, and starts the same run again: the new
ServerApp resumes (round 1 aborted as ``server restart``), the hospitals' SuperNodes serve the
new Flower run with participants rebuilt from their state directories, and the final model of
every hospital equals, bit for bit, an uninterrupted in-process run of the same federation
(same keys, same server.toml).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
RUNTIME_TESTS = HERE.parent / "secure" / "runtime"
sys.path[:0] = [str(HERE), str(RUNTIME_TESTS)]

# imported here, not in the factory: a SuperNode imports this module when it starts, before its hello
from clinograph.sdk.config import ReleaseSection  # noqa: E402
from clinograph.sdk.federation.client import HospitalClient  # noqa: E402
from clinograph.secure.enrolment import load_federation  # noqa: E402
from crash_harness import DICTIONARY_HASH, LineTask  # noqa: E402
from flower_processes import APP, flower_processes, serverapp_pids  # noqa: E402
from flower_processes import events as _events  # noqa: E402

HOSPITALS = ("h1", "h2", "h3")
FEDERATION = "fed-resume"
ROUNDS = 2
TOTAL_BUDGET = 600.0  # seconds; the test fails and cleans up past this


def make_line_hospital(*, node_config, run_config, run_id, identity):
    """Participant factory: HospitalClient over crash_harness.LineTask, state in the node's state dir."""
    fed = load_federation(Path(str(node_config["federation-file"])))
    state = Path(str(node_config["state-dir"]))
    return HospitalClient(task=LineTask(identity.name, state), identity=identity, server=fed.server_public(),
                          peers=fed.enrolled(), dictionary_hash=DICTIONARY_HASH, federation_id=fed.federation_id,
                          release=ReleaseSection(), state_dir=state)


def _write_server(tmp: Path) -> Path:
    from clinograph.secure.runtime.build import InitialModel

    from clinograph.core.spec import ModuleKind

    task = LineTask("h0", tmp / "scratch")
    initial = InitialModel.create(task="toy", dictionary_hash=DICTIONARY_HASH, spec=task.modules.spec(version=1),
                                  state=task.modules.state(ModuleKind.SHARED))
    server = tmp / "server"
    server.mkdir()
    (server / "initial_model.json").write_bytes(initial.to_bytes())
    (server / "server.toml").write_text(
        f'initial_model = "initial_model.json"\naudit_dir = "{tmp / "audit"}"\n\n[federation]\nid = "{FEDERATION}"\n'
        f'rounds = {ROUNDS}\nsecure_mode = "masked"\nstrategy = "fedavg"\nmin_clients = 3\nlocal_epochs = 1\n'
        'max_weight = 1.0\nmasked_clip = 1.0\n')
    return server / "server.toml"


def _reference(tmp: Path, keys, server_toml: Path) -> dict[str, np.ndarray]:
    """The same federation, uninterrupted, in process: the model every hospital must end with."""
    from clinograph.secure.audit import AuditTrail
    from clinograph.secure.runtime import InProcessTransport, ServerConfig, build_server, run_rounds
    from clinograph.secure.runtime.build import initial_model_from_bytes

    from clinograph.core.identity import Identity

    config = ServerConfig.from_toml(server_toml)
    fed = load_federation(keys.federation_file)
    hospitals = {}
    for h in HOSPITALS:
        ident = Identity.load(h, keys.hospital_dirs[h] / f"{h}.ed25519.pem")
        hospitals[h] = make_line_hospital(node_config={"federation-file": str(keys.federation_file),
                                                       "state-dir": str(tmp / "ref" / h)},
                                          run_config={}, run_id=0, identity=ident)
    server_id = Identity.load(fed.server.name, keys.superlink_dir / "server.ed25519.pem")
    with AuditTrail(tmp / "ref" / "audit", identity=server_id) as audit:
        server = build_server(federation=config.federation, identity=server_id, enrolled=fed.enrolled(),
                              initial=initial_model_from_bytes(config.initial_model.read_bytes()), audit=audit,
                              dp_policy=None)
        run_rounds(server, InProcessTransport(hospitals), rounds=ROUNDS)
    return server.state


def _run_id(log: Path) -> int:
    """The Flower run id ``flwr run`` printed ("Successfully started run N")."""
    match = re.search(r"Successfully started run (\d+)", log.read_text(errors="replace"))
    assert match, f"no run id in {log}"
    return int(match.group(1))


def _journal_stages(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return [(int(r), str(s)) for r, s in db.execute("SELECT round, stage FROM boundary ORDER BY seq")]
    except sqlite3.Error:
        return []


@pytest.mark.slow
def test_serverapp_killed_mid_round_resumes_to_the_uninterrupted_model(tmp_path):
    from clinograph.sdk.federation.anchor import HospitalAnchor
    from clinograph.secure.audit import verify_audit_dir

    server_toml = _write_server(tmp_path)
    journal, events = tmp_path / "audit.journal.sqlite", tmp_path / "events.jsonl"
    pythonpath = [APP, HERE, RUNTIME_TESTS]  # not tests/: its clinograph/ test folders would shadow the package
    with flower_processes(tmp_path, federation_id=FEDERATION, hospitals=HOSPITALS, budget=TOTAL_BUDGET,
                          pythonpath=pythonpath) as fp:
        keys, link = fp.keys, fp.keys.superlink_dir
        run_config = {
            "server-config": server_toml, "federation-file": link / "federation.toml",
            "server-key": link / "server.ed25519.pem", "events-file": events, "journal": journal, "rounds": ROUNDS,
            "min-nodes": 3, "wait-timeout": 90.0, "hello-timeout": 90.0, "plan-timeout": 60.0, "stage-timeout": 30.0,
            "end-timeout": 30.0, "relay-timeout": 60.0}
        superlink = fp.superlink()
        fp.register(HOSPITALS)
        for h in HOSPITALS:
            fp.supernode(h, node_config={"state-dir": tmp_path / "sites" / h},
                         factory="test_flower_resume:make_line_hospital", environment=None)
        first = fp.flwr_run(run_config, name="flwr-run-1")
        fp.wait(lambda: (1, "stage 1") in _journal_stages(journal), spare=120,
                what="round 1 of the first run to pass its first masked stage")
        pids = serverapp_pids(superlink.pid)
        assert pids, "no flwr-serverapp process found below the SuperLink"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # the ServerApp dies mid-round
        last_before = _journal_stages(journal)[-1]
        os.killpg(first.pid, signal.SIGKILL)  # its `flwr run --stream` would wait for a run that never ends
        # as docs/deployment.md says: stop the killed run first, or a SuperNode fetching one of its
        # messages waits (about a minute) until the SuperLink misses the dead ServerApp's heartbeats
        fp.flwr_stop(_run_id(fp.logs / "flwr-run-1.log"))
        fp.flwr_run(run_config, name="flwr-run-2")
        fp.wait(lambda: any(e["event"] == "finished" for e in _events(events)), what="the resumed run to finish",
                procs=fp.named("superlink", "flwr-run-2"))
    reference = _reference(tmp_path, keys, server_toml)
    server_key = load_federation(keys.federation_file).server_public()
    for h in HOSPITALS:  # every hospital ends with the uninterrupted run's model, bit for bit
        kept = HospitalAnchor(tmp_path / "sites" / h, server=server_key).model(FEDERATION, names=sorted(reference))
        assert kept is not None and all(np.array_equal(kept[n], reference[n]) for n in reference), h
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    aborted = [e["payload"] for e in entries if e["kind"] == "round_aborted"]
    aggregated = [e["payload"]["round"] for e in entries if e["kind"] == "aggregate"]
    was_open = last_before[1] not in ("close", "end", "aborted", "run_ended")
    assert len(aborted) == int(was_open) and all(a["reason"].startswith("server restart") for a in aborted)
    assert len(aggregated) == ROUNDS == len(set(aggregated))
    assert verify_audit_dir(tmp_path / "audit", trusted_server_key=server_key.raw).ok
    assert any(e["event"] == "resumed" for e in _events(events))
    for h in HOSPITALS:  # each hospital's privacy ledger: every round it trained for, once
        ledger = json.loads((tmp_path / "sites" / h / "privacy_ledger.json").read_text())
        trained = [e["round"] for e in ledger["entries"]]
        accepted = [e["payload"]["round"] for e in entries
                    if e["kind"] == "update_accepted" and e["payload"]["client"] == h]
        assert trained == sorted(set(trained)) and set(accepted) <= set(trained)
