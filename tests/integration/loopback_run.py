"""Run a deployment's files through the ServerApp over a loopback Grid: the real ClientApp, relay,
``HospitalWorker`` and SuperNode factory (``make_hospital``) reading each hospital's data folder,
one process. Shared by the tests that compare a task over Flower with its in-process run."""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "secure" / "transport"))

RUN_ID = 909


def run_over_loopback(*, sites: Path, names: list[str], server_toml: Path, tmp_path: Path, federation_id: str,
                      port: int, extra: dict[str, Any] | None = None) -> None:
    """Enrol ``names`` (their files in ``sites/<name>/data``), start their workers and run the
    ServerApp's ``run_federation`` on ``server_toml``; the workers stop whatever happens."""
    from clinograph.sdk.federation.node import make_hospital
    from clinograph.secure.transport.flower.keyset import init_keyset
    from clinograph.secure.transport.flower.serverapp import run_federation
    from clinograph.secure.transport.flower.worker import HospitalWorker
    from flower_helpers import LoopbackGrid

    keys = init_keyset(tmp_path / "keys", federation_id=federation_id, hospitals=names,
                       superlink_hosts=["127.0.0.1"], superlink_port=port)
    states = Path(tempfile.mkdtemp(prefix="cg-"))  # short: a worker's socket lives in its state directory
    workers, configs = [], {}
    try:
        for i, name in enumerate(names):
            cfg = {"hospital": name, "state-dir": str(states / name), "data-dir": str(sites / name / "data"),
                   "key-file": str(keys.hospital_dirs[name] / f"{name}.ed25519.pem"),
                   "federation-file": str(keys.hospital_dirs[name] / "federation.toml")}
            workers.append(HospitalWorker(node_config=cfg, factory=make_hospital))
            workers[-1].start()
            configs[401 + i] = cfg
        run_config = {"server-config": str(server_toml), "federation-file": str(keys.federation_file),
                      "server-key": str(keys.superlink_dir / "server.ed25519.pem"), "min-nodes": len(names),
                      "wait-timeout": 1.0, "hello-timeout": 60.0, "plan-timeout": 600.0, "stage-timeout": 60.0,
                      "end-timeout": 60.0, "relay-timeout": 600.0, **(extra or {})}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # insecure_* options warn by design
            run_federation(LoopbackGrid(run_id=RUN_ID, node_configs=configs, run_config=run_config), run_config)
    finally:
        for w in workers:
            w.stop()
        shutil.rmtree(states, ignore_errors=True)
