"""Run a deployment's files through the ServerApp over a loopback Grid: the real ClientApp, relay,
``HospitalWorker`` and SuperNode factory (``make_hospital``) reading each hospital's data folder,
one process. Shared by the tests that compare a task over Flower with its in-process run."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "secure" / "transport"))

RUN_ID = 909


@pytest.fixture
def task_identity():
    """Flower's task identity of a loopback run (what flwr-clientapp sets in its process)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def entries(audit_dir: Path) -> list[dict]:
    """Every entry of ``audit_dir``'s trail, parsed."""
    return [json.loads(line) for line in (audit_dir / "audit.jsonl").read_text().splitlines()]


def write_sites(sites: Path, cohort: Any, hospital: dict[str, Any]) -> list[str]:
    """Each hospital of ``cohort`` (a ``cohort_tables`` result) as deployment files in
    ``sites/<name>/data``: its table, schema, the shared dictionary and ``hospital``
    (hospital.toml). Returns the names."""
    import tomli_w

    names = []
    for df, schema in cohort.hospitals:
        data = sites / schema.site / "data"
        data.mkdir(parents=True)
        df.to_csv(data / "table.csv", index=False)
        (data / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
        (data / "hospital.toml").write_text(tomli_w.dumps(hospital))
        (data / "dictionary.toml").write_text(tomli_w.dumps(cohort.dictionary.model_dump(mode="json",
                                                                                         exclude_none=True)))
        names.append(schema.site)
    return names


def run_over_loopback(*, sites: Path, names: list[str], server_toml: Path, tmp_path: Path, federation_id: str,
                      port: int, extra: dict[str, Any] | None = None,
                      on_deliver: Callable[[Any, int, Callable[[int], None]], None] | None = None) -> None:
    """Enrol ``names`` (their files in ``sites/<name>/data``), start their workers and run the
    ServerApp's ``run_federation`` on ``server_toml``; the workers stop whatever happens.
    ``on_deliver(message, node, restart)`` is called before each message is delivered;
    ``restart(node)`` stops that node's worker and starts a new one on the same files (a
    restarted SuperNode)."""
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
        grid = LoopbackGrid(run_id=RUN_ID, node_configs=configs, run_config=run_config)
        if on_deliver is not None:
            def restart(node: int) -> None:
                i = node - 401
                workers[i].stop()
                workers[i] = HospitalWorker(node_config=configs[node], factory=make_hospital)
                workers[i].start()

            grid.on_deliver = lambda message, node: on_deliver(message, node, restart)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # insecure_* options warn by design
            run_federation(grid, run_config)
    finally:
        for w in workers:
            w.stop()
        shutil.rmtree(states, ignore_errors=True)


def simulate_sites(*, sites: Path, names: list[str], hospital: dict[str, Any], federation: dict[str, Any],
                   out: Path, audit_dir: Path) -> None:
    """``simulate()`` of the same hospitals' files (``hospital`` settings, ``federation``), as a
    simulation config names them: what a deployment's run is compared with."""
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import load_tables, simulate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = SimulationConfig.model_validate({
            **hospital, "dictionary": str(sites / names[0] / "data" / "dictionary.toml"), "federation": federation,
            "output": str(out),
            "hospitals": [{"site": n, "table": str(sites / n / "data" / "table.csv"),
                           "schema": str(sites / n / "data" / "schema.toml")} for n in names]})
        tables, dictionary = load_tables(config)
        simulate(tables, dictionary, config, audit_dir=audit_dir)
