"""Hospitals as separate processes over Flower, on loopback: the real deployment path.

One SuperLink (TLS + SuperNode authentication), three SuperNodes each serving one hospital's
data, state and key folders, ``flwr run`` of examples/flower_deployment/app (Clinograph's own
ServerApp and ClientApp, configured only by server.toml and each hospital's hospital.toml),
two rounds with patient-level DP (each hospital trains with DP-SGD, its privacy ledger in its
state directory; the server's DP policy refuses updates without a ledger entry), in each
secure mode: masked, CKKS with the key ceremony relayed over Flower, and threshold CKKS 2-of-3
(collective key generation and the re-share relayed over Flower). In round 1, one hospital's
SuperNode is SIGKILLed mid-round (masked: h3, after it shared its keys and seed shares; ckks:
h3, after it sent its ciphertext; ckks_threshold: h1, a key holder asked to decrypt, after it
sent its ciphertext and before its decryption share -- h2 and h3 decrypt instead); the round
completes without it, and the audit directory verifies afterwards.

Every wait is bounded; every process is started in its own process group and killed in
``finally``. The only test double is ``make_hospital_that_hangs`` below: the real
HospitalClient of h3 wrapped so that it stops answering at a known point of round 1, which is
where the test kills its SuperNode (otherwise the kill would race the protocol).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from flower_processes import APP, flower_processes
from flower_processes import events as _events

HOSPITALS = ("h1", "h2", "h3")
TOTAL_BUDGET = 240.0  # seconds; the test fails (and cleans up) rather than hang past this
HANG_ROUND, HANG_AT_STAGE = 1, 2  # h3 answers the plan and stage 1 of round 1, then goes silent


# -- the one test double (imported by h3's SuperNode through --participant-factory) --------
class _HangsMidRound:
    def __init__(self, inner, marker: Path):
        self._c, self.name, self._marker = inner, inner.name, marker
        self._round, self._stage = -1, 0

    def on_setup(self, step, parts):
        return self._c.on_setup(step, parts)

    def on_plan(self, plan: bytes):
        out = self._c.on_plan(plan)
        self._round, self._stage = self._c.plan.round, 0
        # after its ciphertext, before decrypting: ckks at stage 1; ckks_threshold at stage 2 (stage 1
        # is its upload of c0 for the commitment set, stage 2 the decryption)
        self._hang_at = {"ckks": 1, "ckks_threshold": 2}.get(self._c.plan.secure_mode, HANG_AT_STAGE)
        return out

    def on_stage(self, data: bytes):
        self._stage += 1
        if self._round == HANG_ROUND and self._stage == self._hang_at:
            self._marker.write_text(f"round {self._round} stage {self._stage}")
            time.sleep(120)  # bounded; the test SIGKILLs this SuperNode long before
        return self._c.on_stage(data)

    def decrypted_result(self):
        return self._c.decrypted_result()

    def on_round_end(self, global_model):
        self._c.on_round_end(global_model)


def make_hospital_that_hangs(*, node_config, run_config, run_id, identity):
    """Participant factory for h3: the real HospitalClient, silent from a known stage."""
    from clinograph.sdk.federation.node import make_hospital

    inner = make_hospital(node_config=node_config, run_config=run_config, run_id=run_id, identity=identity)
    return _HangsMidRound(inner, Path(str(node_config["state-dir"])) / "hung.marker")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["masked", "ckks", "ckks_threshold"])
def test_two_rounds_over_flower_tls_nodeauth_with_a_supernode_killed(tmp_path, mode, lean_server_python):  # noqa: F811 -- the fixture
    """The SuperLink and so the ServerApp run from the lean server install (no torch, PyG, Opacus,
    pgmpy: tests/lean_env.py), the hospitals from the full install."""
    from clinograph.secure.audit import verify_audit_dir

    sys.path.insert(0, str(APP))
    from clinograph_flower_app.prepare import prepare

    audit_dir, events = tmp_path / "audit", tmp_path / "events.jsonl"
    prep_errors: list[BaseException] = []

    def write_sites() -> None:  # the hospitals' data (ALARM samples, DP settings), while the processes start
        try:
            prepare(tmp_path / "sites", hospitals=list(HOSPITALS), patients=200, dp=True, seed=0,
                    federation_id="fed-loopback", secure_mode=mode, audit_dir=audit_dir,
                    tckks_threshold=2 if mode == "ckks_threshold" else None)
        except BaseException as exc:  # noqa: BLE001 -- reported by the main thread
            prep_errors.append(exc)

    victim = "h1" if mode == "ckks_threshold" else "h3"  # ckks_threshold: the first holder asked to decrypt
    pythonpath = [APP, Path(__file__).parent]  # h3's factory is this module (lean_server_python: conftest.py)
    with flower_processes(tmp_path, federation_id="fed-loopback", hospitals=HOSPITALS, budget=TOTAL_BUDGET,
                          pythonpath=pythonpath) as fp:
        preparing = threading.Thread(target=write_sites, daemon=True)
        preparing.start()
        keys, link = fp.keys, fp.keys.superlink_dir
        lean_bin = Path(lean_server_python).parent
        fp.superlink(bin_dir=lean_bin, env={**fp.env, "PATH": f"{lean_bin}:{os.environ.get('PATH', '')}"})
        fp.register(HOSPITALS)  # the operator registers each hospital's node-auth public key
        supernodes = {h: fp.supernode(h, node_config={"data-dir": tmp_path / "sites" / h / "data",
                                                      "state-dir": tmp_path / "sites" / h / "state"},
                                      factory="test_flower_deployment:make_hospital_that_hangs" if h == victim else None)
                      for h in HOSPITALS}
        fp.mark("supernodes started")
        preparing.join(timeout=max(1.0, fp.remaining() - 120))  # a hospital reads its data at the first hello
        assert not preparing.is_alive() and not prep_errors, prep_errors
        fp.mark("data prepared")
        fp.flwr_run({"server-config": tmp_path / "sites" / "server" / "server.toml",
                     "federation-file": link / "federation.toml", "server-key": link / "server.ed25519.pem",
                     "events-file": events, "rounds": 2, "min-nodes": 3, "wait-timeout": 60.0,
                     "hello-timeout": 40.0, "plan-timeout": 90.0, "stage-timeout": 20.0, "end-timeout": 30.0,
                     "relay-timeout": 60.0})
        marker = tmp_path / "sites" / victim / "state" / "hung.marker"
        fp.wait(marker.exists, what=f"{victim} to reach the middle of round 1", spare=45)
        fp.mark(f"{victim} hung mid-round 1")
        os.killpg(supernodes[victim].pid, signal.SIGKILL)  # mid-round: keys and shares sent, no masked input
        fp.wait(lambda: any(e["event"] == "finished" for e in _events(events)), what="the federation to finish",
                procs=fp.named("superlink", "flwr-run"))
        fp.mark("federation finished")
        wall, milestones = time.monotonic() - fp.started, fp.milestones
    ev = _events(events)
    closed = [e for e in ev if e["event"] == "round_closed"]
    assert [c["round"] for c in closed] == [0, 1]
    assert closed[0]["contributors"] == ["h1", "h2", "h3"] and closed[0]["dropped"] == []
    # masked: h3's masked input never came, the survivors' sum is unmasked; ckks: h3's ciphertext is in
    # the sum (it contributed), it died before decrypting
    survivors = ["h1", "h2"] if mode == "masked" else list(HOSPITALS)
    assert closed[1]["contributors"] == survivors and closed[1]["dropped"] == [victim]
    started = next(e for e in ev if e["event"] == "started")
    assert Path(started["python"]).resolve() == lean_bin.parent.resolve()  # the ServerApp ran in the lean venv
    assert started["torch_installed"] is False
    greeted = next(e for e in ev if e["event"] == "greeted")
    assert greeted["hospitals"] == list(HOSPITALS)
    from clinograph.secure.enrolment import load_federation

    server_key = load_federation(keys.federation_file).server_public().raw
    report = verify_audit_dir(audit_dir, trusted_server_key=server_key)  # signed by the enrolled server key
    assert report.ok, report.problems
    entries = [json.loads(line) for line in (audit_dir / "audit.jsonl").read_text().splitlines()]
    manifest = next(e["payload"] for e in entries if e["kind"] == "manifest")
    assert manifest["secure_mode"] == mode and manifest["insecure_options"] == []
    assert manifest["dp_policy"]["required"] is True  # the server refuses updates without a DP ledger entry
    ledgers = [e["payload"] for e in entries if e["kind"] == "ledger"]
    assert sorted((lg["client"], lg["round"]) for lg in ledgers) == [
        ("h1", 0), ("h1", 1), ("h2", 0), ("h2", 1), ("h3", 0), ("h3", 1)]  # its round-1 report came before it died
    if mode == "ckks":  # the server never held a plaintext model; the key ceremony reached every hospital
        assert not any(e["kind"] == "artefact" and "global_model" in e["payload"].get("name", "") for e in entries)
        assert next(e for e in ev if e["event"] == "ckks_keys")["holders"] == list(HOSPITALS)
    if mode == "ckks_threshold":  # 2-of-3: h1 asked and silent, h2 and h3 opened the same sum instead
        (held,) = [e["payload"] for e in entries if e["kind"] == "tckks_key_holders"]
        assert held["rule"] == "2-of-3" and held["holders"] == list(HOSPITALS)
        assert [e["payload"].get("decrypted_by") for e in entries if e["kind"] == "aggregate"] == [
            ["h1", "h2"], ["h2", "h3"]]
    assert all(0 < lg["epsilon"] <= lg["budget_epsilon"] and lg["noise_multiplier"] > 0 for lg in ledgers)
    assert sorted(manifest["hospitals"]) == list(HOSPITALS)
    aggregates = [e["payload"]["contributors"] for e in entries if e["kind"] == "aggregate"]
    assert aggregates == [["h1", "h2", "h3"], survivors]
    print(f"flower deployment: wall time {wall:.1f} s (budget {TOTAL_BUDGET:g} s); milestones {milestones}")
