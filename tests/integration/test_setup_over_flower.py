"""The run's set-up sums (``[scaling] source = "federated"``, ``[model] features = "shared"``) over
Flower give what the simulation gives.

1. Loopback: the ServerApp's ``run_federation`` over a loopback Grid (the real ClientApp, relay,
   ``HospitalWorker`` and the SuperNode factory ``make_hospital`` reading each hospital's files,
   the initial model written by ``clinograph model init``) against ``simulate()`` of the same
   configuration: the same ``scaling_histogram``, ``scaling_derived`` and ``feature_coverage``
   entries, the same global model after every round, the same entry kinds.
2. Real processes (slow): a SuperLink with TLS and SuperNode authentication, three SuperNodes and
   ``flwr run`` of examples/flower_deployment/app, one training round after both set-up sums.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import pytest
import tomli_w

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "secure" / "transport"))
APP = ROOT / "examples" / "flower_deployment" / "app"
from loopback_run import entries, run_over_loopback, task_identity  # noqa: E402, F401 -- task_identity: the fixture

BIN = Path(sys.executable).parent
#: hospital.toml of every hospital: both set-up sums, one model (no candidates), a small network
HOSPITAL = {"dictionary": "dictionary.toml", "model": {"hidden": 8, "features": "shared"}, "graph": {"k_similar": 0},
            "training": {"lr": 0.02, "batch_size": 64}, "scaling": {"source": "federated"},
            "selection": {"candidates": []}, "release": {"metrics": "none"}}
SETUP_KINDS = ("scaling_histogram", "scaling_derived", "feature_coverage")


def _payloads(entries: list[dict], kind: str) -> list[dict]:
    return [e["payload"] for e in entries if e["kind"] == kind]


def _model_init(hospital_toml: Path, out: Path) -> None:
    """`clinograph model init` (the real command) writes the run's models, set-up sums included."""
    from typer.testing import CliRunner

    from clinograph.cli import app

    res = CliRunner().invoke(app, ["model", "init", "--config", str(hospital_toml), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "set-up sums scaling_histogram, feature_coverage" in res.output


def _sites(root: Path) -> list[str]:
    """Three hospitals' folders (east lacks the blood gases) and the server's initial model."""
    from sdk_helpers import raw_tables, small_tables

    dictionary = small_tables()[0].dictionary
    names = []
    for df, schema in raw_tables():
        data = root / schema.site / "data"
        data.mkdir(parents=True)
        df.to_csv(data / "table.csv", index=False)
        (data / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
        (data / "hospital.toml").write_text(tomli_w.dumps(HOSPITAL))
        (data / "dictionary.toml").write_text(tomli_w.dumps(dictionary.model_dump(mode="json", exclude_none=True)))
        names.append(schema.site)
    (root / "server").mkdir()
    _model_init(root / names[0] / "data" / "hospital.toml", root / "server" / "initial_model.json")
    return names


def _simulate(sites: Path, names: list[str], fed: dict, out: Path):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import load_tables, simulate

    config = SimulationConfig.model_validate({
        **HOSPITAL, "dictionary": str(sites / names[0] / "data" / "dictionary.toml"), "federation": fed,
        "output": str(out / "sim"),
        "hospitals": [{"site": n, "table": str(sites / n / "data" / "table.csv"),
                       "schema": str(sites / n / "data" / "schema.toml")} for n in names]})
    tables, dictionary = load_tables(config)
    return simulate(tables, dictionary, config, audit_dir=out / "sim-audit")


def _assert_same_run(deployed: list[dict], simulated: list[dict]) -> None:
    for kind in SETUP_KINDS:
        got = _payloads(deployed, kind)
        assert len(got) == 1 and got == _payloads(simulated, kind), kind
    (cov,) = _payloads(deployed, "feature_coverage")
    assert cov["hospitals"] == 3 and not {"paco2", "sao2", "svo2"} & set(cov["shared"]) and cov["shared"]
    assert _payloads(deployed, "model_selected") == _payloads(simulated, "model_selected")
    digests = [(p["round"], p["global_state_digest"]) for p in _payloads(deployed, "aggregate")]
    assert digests == [(p["round"], p["global_state_digest"]) for p in _payloads(simulated, "aggregate")]
    assert [r for r, _ in digests][:3] == [0, 1, 2]  # the two sums' rounds, then training continues the numbering
    (derived,) = _payloads(deployed, "scaling_derived")
    manifests = _payloads(deployed, "manifest")
    assert manifests[-1]["dictionary_hash"] == derived["dictionary_digest"]  # the candidate runs on the derived one
    ignore = ("envelope", "artefact")
    assert Counter(e["kind"] for e in deployed if e["kind"] not in ignore) == \
        Counter(e["kind"] for e in simulated if e["kind"] not in ignore)
    kinds = [e["kind"] for e in deployed]
    assert kinds.index("scaling_histogram") < kinds.index("scaling_derived") < kinds.index("feature_coverage") \
        < kinds.index("model_selected")


@pytest.mark.usefixtures("task_identity")
def test_setup_sums_over_a_loopback_flower_grid_match_the_simulation(tmp_path):
    from clinograph.secure.audit import verify_audit_dir

    sites = tmp_path / "sites"
    names = _sites(sites)
    fed = {"id": "fed-setup", "rounds": 1, "min_clients": 2, "local_epochs": 1, "secure_mode": "masked",
           "strategy": "fedavg"}
    (sites / "server" / "server.toml").write_text(tomli_w.dumps({
        "initial_model": "initial_model.json", "audit_dir": str(tmp_path / "flower-audit"), "federation": fed}))
    run_over_loopback(sites=sites, names=names, server_toml=sites / "server" / "server.toml", tmp_path=tmp_path,
                      federation_id="fed-setup", port=19097)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _simulate(sites, names, fed, tmp_path)
    _assert_same_run(entries(tmp_path / "flower-audit"), entries(tmp_path / "sim-audit"))
    assert verify_audit_dir(tmp_path / "flower-audit").ok and verify_audit_dir(tmp_path / "sim-audit").ok


TOTAL_BUDGET = 900.0  # seconds; the test fails and cleans up past this


@pytest.mark.slow
def test_setup_sums_over_real_flower_processes_match_the_simulation(tmp_path):
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.enrolment import load_federation
    from flower_processes import events as _events
    from flower_processes import flower_processes

    sites = tmp_path / "sites"
    names = _sites(sites)
    fed = {"id": "fed-setup", "rounds": 1, "min_clients": 2, "local_epochs": 1, "secure_mode": "masked",
           "strategy": "fedavg", "environment": "production"}
    (sites / "server" / "server.toml").write_text(tomli_w.dumps({
        "initial_model": "initial_model.json", "audit_dir": str(tmp_path / "audit"), "federation": fed}))
    states = Path(tempfile.mkdtemp(prefix="cg-"))  # short: a worker's socket lives in its state directory
    events = tmp_path / "events.jsonl"
    try:
        with flower_processes(tmp_path, federation_id="fed-setup", hospitals=names, budget=TOTAL_BUDGET) as fp:
            keys, link = fp.keys, fp.keys.superlink_dir
            run_log = fp.federation(names, node_configs={h: {"data-dir": sites / h / "data", "state-dir": states / h}
                                                         for h in names}, events_file=events, values={
                "server-config": sites / "server" / "server.toml", "federation-file": link / "federation.toml",
                "server-key": link / "server.ed25519.pem", "events-file": events, "min-nodes": 3, "rounds": 1,
                "wait-timeout": 60.0, "hello-timeout": 60.0, "plan-timeout": 120.0, "stage-timeout": 30.0,
                "end-timeout": 30.0, "relay-timeout": 120.0})
    finally:
        shutil.rmtree(states, ignore_errors=True)
    assert any(e["event"] == "finished" for e in _events(events)), run_log
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _simulate(sites, names, fed, tmp_path)
    _assert_same_run(entries(tmp_path / "audit"), entries(tmp_path / "sim-audit"))
    server_key = load_federation(keys.federation_file).server_public().raw
    report = verify_audit_dir(tmp_path / "audit", trusted_server_key=server_key)
    assert report.ok, report.problems
