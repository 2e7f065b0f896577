"""`clinograph run` against a real SuperLink (TLS + SuperNode authentication) on loopback: a
ServerApp that raises (server.toml runs another federation than the federation file enrols: a
ConfigError before any hospital is greeted, so no SuperNode is needed) ends the command with
exit 1 and the ServerApp's reason on one line -- where ``flwr run --stream`` alone exits 0.

Every wait is bounded; the SuperLink runs in its own process group and is killed in ``finally``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "secure" / "transport"))
from flower_helpers import write_server_files  # noqa: E402
from test_flower_deployment import _events, _free_port, _port_open, _wait  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower_deployment" / "app"
BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_a_serverapp_that_raises_makes_clinograph_run_exit_1_with_its_reason(tmp_path):
    from clinograph.secure.transport.flower.keyset import init_keyset

    port = _free_port()
    keys = init_keyset(tmp_path / "keys", federation_id="fed-loopback", hospitals=["h1", "h2"],
                       superlink_hosts=["127.0.0.1", "localhost"], superlink_port=port)
    server_toml = write_server_files(tmp_path / "server", federation_id="fed-elsewhere")
    flwr_home = tmp_path / "flwr"
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{keys.superlink_dir / "ca.pem"}"\n')
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
           "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    link = keys.superlink_dir
    log = (tmp_path / "superlink.log").open("wb")
    superlink = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(link / "ca.pem"), "--ssl-certfile",
         str(link / "server.pem"), "--ssl-keyfile", str(link / "server.key"), "--enable-supernode-auth",
         "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    events = tmp_path / "events.jsonl"
    try:
        _wait(lambda: _port_open(port), timeout=60, what="the SuperLink", procs=[("superlink", superlink)])
        run_config = " ".join([f"server-config='{server_toml}'", f"federation-file='{keys.federation_file}'",
                               f"server-key='{link / 'server.ed25519.pem'}'", "min-nodes=0", "wait-timeout=1.0"])
        done = subprocess.run([str(BIN / "clinograph"), "run", str(APP), "loopback", "--run-config", run_config,
                               "--events-file", str(events), "--check-every", "5"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    finally:
        os.killpg(superlink.pid, signal.SIGKILL)
        superlink.wait(timeout=10)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("run ") and " failed: ConfigError: server.toml runs federation 'fed-elsewhere'" in last
    assert "Traceback" not in done.stderr
    assert [e["event"] for e in _events(events)] == ["failed"]
