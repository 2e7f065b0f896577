"""The SDK's default run over real Flower processes matches the simulation of the same config.

One SuperLink (TLS + SuperNode authentication), three SuperNodes (``clinograph.secure.transport.
flower.supernode``, the real ``make_hospital`` factory over each hospital's data, state and key
folders) and ``flwr run`` of examples/flower_deployment/app: the four default candidates, masked,
each with its training round (one: every Flower message starts a ClientApp process, which costs
tens of seconds a round on this 2-core machine), its scoring round and every hospital keeping the
chosen, calibrated model.
Then ``simulate()`` of the same configuration and seeds. Asserted from the two audit trails: the
same ``model_chosen`` and ``model_selected`` entries, the same global model after every round of
every candidate (``aggregate`` state digests) and the same entry kinds; the deployed trail
verifies against the enrolled server key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_flower_deployment import _events, _free_port, _port_open, _wait

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower_deployment" / "app"
BIN = Path(sys.executable).parent
HOSPITALS = ("h1", "h2", "h3")
TOTAL_BUDGET = 900.0  # seconds (about 5 min on a quiet 2-core machine); the test fails and cleans up past this


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
    from clinograph.secure.transport.flower.keyset import init_keyset

    sys.path.insert(0, str(APP))
    from clinograph_flower_app.prepare import prepare

    started = time.monotonic()
    remaining = lambda: TOTAL_BUDGET - (time.monotonic() - started)  # noqa: E731
    sites = tmp_path / "sites"
    prepare(sites, hospitals=list(HOSPITALS), patients=120, dp=False, seed=0, federation_id="fed-loopback",
            audit_dir=tmp_path / "audit")
    link_port = _free_port()
    keys = init_keyset(tmp_path / "keys", federation_id="fed-loopback", hospitals=list(HOSPITALS),
                       superlink_hosts=["127.0.0.1", "localhost"], superlink_port=link_port)
    flwr_home = tmp_path / "flwr"
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "127.0.0.1:{link_port}"\n'
        f'root-certificates = "{keys.superlink_dir / "ca.pem"}"\n')
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(APP), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, cmd: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(cmd, env=env, stdout=(logs / f"{name}.log").open("wb"), stderr=subprocess.STDOUT,
                             cwd=tmp_path, start_new_session=True)
        procs.append((name, p))
        return p

    link = keys.superlink_dir
    events = tmp_path / "events.jsonl"
    try:
        start("superlink", [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(link / "ca.pem"),
                            "--ssl-certfile", str(link / "server.pem"), "--ssl-keyfile", str(link / "server.key"),
                            "--enable-supernode-auth", "--host", "127.0.0.1", "--port", str(link_port),
                            "--disable-runtime-dependency-installation"])
        _wait(lambda: _port_open(link_port), timeout=min(60, remaining()), what="the SuperLink", procs=procs)
        for h in HOSPITALS:
            p = subprocess.run([str(BIN / "flwr"), "supernode", "register", str(keys.hospital_dirs[h] / f"{h}.node-auth.pub"),
                                "loopback", "--name", h], env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=min(60, remaining()))
            assert p.returncode == 0 and "registered successfully" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
        for h in HOSPITALS:
            d = keys.hospital_dirs[h]
            node_config = (f"hospital='{h}' data-dir='{sites / h / 'data'}' state-dir='{sites / h / 'state'}' "
                           f"key-file='{d / f'{h}.ed25519.pem'}' federation-file='{d / 'federation.toml'}'")
            start(f"supernode-{h}", [
                sys.executable, "-m", "clinograph.secure.transport.flower.supernode", "--environment", "production",
                "--node-config", node_config, "--superlink", f"127.0.0.1:{link_port}",
                "--root-certificates", str(d / "ca.pem"), "--auth-supernode-private-key", str(d / f"{h}.node-auth"),
                "--port", str(_free_port()), "--max-retries", "5", "--max-wait-time", "60"])
        run_config = " ".join([
            f"server-config='{sites / 'server' / 'server.toml'}'", f"federation-file='{link / 'federation.toml'}'",
            f"server-key='{link / 'server.ed25519.pem'}'", f"events-file='{events}'", "min-nodes=3",
            "rounds=1", "wait-timeout=60.0", "hello-timeout=60.0", "plan-timeout=120.0", "stage-timeout=30.0",
            "end-timeout=30.0", "relay-timeout=120.0"])
        start("flwr-run", [str(BIN / "flwr"), "run", str(APP), "loopback", "--run-config", run_config, "--stream"])
        _wait(lambda: any(e["event"] == "finished" for e in _events(events)), timeout=max(1, remaining() - 60),
              what="the federation to finish", procs=[(n, p) for n, p in procs if n in ("superlink", "flwr-run")])
    finally:
        for _, p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _, p in procs:
            p.wait(timeout=10)

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
