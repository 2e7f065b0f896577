"""Concepts (F-CMs: DAG vote, the model every hospital derives, its training) over Flower give what
the in-process run gives: the ServerApp over a loopback Grid (the real ClientApp, relay,
``HospitalWorker`` and the SuperNode factory building each hospital from its files) against
``run_concept_federation`` on the same files. Asserted: the voted DAG, the derived model's digest,
every round's global state digest and the audit entry kinds are the same, bit for bit (masked).
Under distributed DP (the noise is drawn from the CSPRNG, so the trained digests differ) the same
DAG, derived model and audit entry kinds, and every training round's noise check passed over the
derived model's coordinates in both."""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from pathlib import Path

import pytest
import tomli_w
from loopback_run import entries, run_over_loopback, task_identity  # noqa: F401 -- task_identity: the fixture

pytestmark = pytest.mark.usefixtures("task_identity")
FEDERATION = {"id": "fed-concepts", "rounds": 2, "min_clients": 3, "local_epochs": 1, "secure_mode": "masked",
              "strategy": "fedavg"}


#: distributed DP as every hospital's [privacy] holds it (the server's [dp_policy] is derived from it)
DISTRIBUTED = {"enabled": True, "mode": "distributed", "epsilon_budget": 50.0, "noise_multiplier": 1.0,
               "sample_rate": 1.0, "min_honest": 2, "planned_rounds": 2}


def _write_sites(root: Path, privacy: dict | None = None) -> tuple[list[str], object]:
    """The demo's ALARM hospitals (three, small) with their concept columns, as deployment files."""
    from clinograph.sdk.datasets import alarm, bnlearn
    from clinograph.sdk.demo.concepts import CONCEPTS, RECORDS, TASK, WRONG

    hospitals = tuple(dataclasses.replace(h, n_patients=150) for h in alarm.DEFAULT_HOSPITALS[:3])
    states = alarm.sample_alarm(sum(h.n_patients for h in hospitals), seed=0)
    net_states = bnlearn.network_states("alarm")
    truth = [(a, b) for a, b in bnlearn.network_edges("alarm") if a in CONCEPTS and b in CONCEPTS]
    dictionary = alarm.load_dictionary()
    names, start = [], 0
    for h, (df, schema) in zip(hospitals, alarm.make_hospital_tables(seed=0, hospitals=hospitals), strict=True):
        part = states.iloc[start:start + h.n_patients].reset_index(drop=True)
        start += h.n_patients
        for c in RECORDS[h.site]:
            df[c] = part[c].to_numpy()
        nodes = [c for c in CONCEPTS if c in RECORDS[h.site] or c == TASK]
        edges = [list(e) for e in truth if e[0] in nodes and e[1] in nodes]
        if h.site in WRONG and all(v in nodes for v in WRONG[h.site]):
            edges.append(list(WRONG[h.site]))
        data = root / h.site / "data"
        data.mkdir(parents=True)
        df.to_csv(data / "table.csv", index=False)
        schema = schema.model_copy(update={"concepts": RECORDS[h.site]})
        (data / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
        (data / "dictionary.toml").write_text(tomli_w.dumps(dictionary.model_dump(mode="json", exclude_none=True)))
        (data / "hospital.toml").write_text(tomli_w.dumps({
            "task": "concepts", "dictionary": "dictionary.toml", "training": {"seed": 0},
            "concepts": {"concepts": list(CONCEPTS), "task": TASK, "edges": edges, "z_dim": 8,
                         "encoder_hidden": [16], "hidden": 8, "emb": 4, "batch_size": 64,
                         "states": {c: list(net_states[c]) for c in CONCEPTS if c != TASK}},
            **({"privacy": privacy} if privacy else {})}))
        names.append(h.site)
    return names, dictionary


def _server_files(tmp_path: Path, audit_dir: Path, privacy: dict | None = None,
                  federation: dict = FEDERATION) -> tuple[Path, list[str], object, object]:
    """The hospitals' files and the server's (what `clinograph model init` writes: the vote model)."""
    from clinograph.sdk.concepts.federation import dp_policy_section
    from clinograph.sdk.config import HospitalConfig, PrivacySection
    from clinograph.sdk.federation.build import run_models

    sites = tmp_path / "sites"
    names, dictionary = _write_sites(sites, privacy)
    config = HospitalConfig.from_toml(sites / names[0] / "data" / "hospital.toml")
    server = sites / "server"
    server.mkdir()
    models = run_models(config, dictionary=dictionary)
    assert models.vote is not None and [c.name for c in models.candidates] == ["vote"]
    (server / "initial_model.json").write_bytes(models.to_bytes())
    policy = {"dp_policy": dp_policy_section(PrivacySection(**privacy)).model_dump(exclude_none=True)} if privacy else {}
    (server / "server.toml").write_text(tomli_w.dumps({"initial_model": "initial_model.json",
                                                       "audit_dir": str(audit_dir), "federation": federation, **policy}))
    return sites, names, dictionary, config


def _in_process(sites: Path, names: list[str], dictionary, config, audit_dir: Path,  # noqa: ANN001
                federation: dict = FEDERATION) -> None:
    """``run_concept_federation`` on the same files: the in-process run."""
    from clinograph.sdk.concepts.federation import run_concept_federation
    from clinograph.sdk.concepts.registration import cards, settings_from_config, site_from_files
    from clinograph.sdk.config import HospitalConfig
    from clinograph.secure.audit import AuditTrail
    from clinograph.secure.runtime.config import FederationSection

    from clinograph.core.identity import Identity

    own = [site_from_files(sites / n / "data", config=HospitalConfig.from_toml(sites / n / "data" / "hospital.toml"),
                           dictionary=dictionary) for n in names]
    settings = settings_from_config(config, in_dim=int(own[0].inputs.shape[1]))
    server_id = Identity.generate("server")
    audit = AuditTrail(audit_dir, identity=server_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            run_concept_federation(sites=own, concepts=settings.concepts, task=settings.task, cards=cards(config),
                                   kind=settings.kind, encoder=settings.encoder, z_dim=settings.z_dim,
                                   federation=FederationSection(**federation), audit=audit, server_identity=server_id,
                                   dictionary_hash=dictionary.digest(), hp=settings.hp, training=settings.training,
                                   privacy=settings.privacy, state_dir=audit_dir.parent / "sim-state")
        finally:
            audit.close()


def payloads(entries: list[dict], kind: str) -> list[dict]:
    return [e["payload"] for e in entries if e["kind"] == kind]


def _assert_same_run(deployed: list[dict], simulated: list[dict], names: list[str], *, noised: bool = False) -> None:
    def digests(entries):
        return [(p["round"], p["global_state_digest"]) for p in payloads(entries, "aggregate")]

    assert len(digests(deployed)) == 3  # one vote round, two training rounds
    assert digests(deployed)[:1 if noised else 3] == digests(simulated)[:1 if noised else 3]
    assert payloads(deployed, "dag_outcome") == payloads(simulated, "dag_outcome")
    derived = payloads(deployed, "model_derived")
    assert len(derived) == 1 and sorted(derived[0]["hospitals"]) == sorted(names)
    assert [d["initial_sha256"] for d in derived] == [d["initial_sha256"] for d in payloads(simulated, "model_derived")]
    ignore = ("envelope", "artefact")
    assert Counter(e["kind"] for e in deployed if e["kind"] not in ignore) == \
        Counter(e["kind"] for e in simulated if e["kind"] not in ignore)


def test_concepts_over_flower_match_the_in_process_run(tmp_path):
    from clinograph.secure.audit import verify_audit_dir

    sites, names, dictionary, config = _server_files(tmp_path, tmp_path / "flower-audit")
    run_over_loopback(sites=sites, names=names, server_toml=sites / "server" / "server.toml", tmp_path=tmp_path,
                      federation_id=FEDERATION["id"], port=19096)
    _in_process(sites, names, dictionary, config, tmp_path / "sim-audit")
    _assert_same_run(entries(tmp_path / "flower-audit"), entries(tmp_path / "sim-audit"), names)
    assert verify_audit_dir(tmp_path / "flower-audit").ok and verify_audit_dir(tmp_path / "sim-audit").ok


@pytest.mark.slow  # real processes: a SuperLink (TLS, SuperNode authentication), three SuperNodes, flwr run
def test_concepts_over_real_flower_processes_match_the_in_process_run(tmp_path):
    """The same voted run over real Flower processes, each hospital's SuperNode building its
    ConceptMember from its files with the default factory; the server key pins the audit."""
    import shutil
    import tempfile

    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.enrolment import load_federation
    from flower_processes import events as progress
    from flower_processes import flower_processes

    sites, names, dictionary, config = _server_files(tmp_path, tmp_path / "audit")
    states = Path(tempfile.mkdtemp(prefix="cg-"))  # short: a worker's socket lives in its state directory
    events = tmp_path / "events.jsonl"
    try:
        with flower_processes(tmp_path, federation_id=FEDERATION["id"], hospitals=names, budget=600.0) as fp:
            link, keys = fp.keys.superlink_dir, fp.keys
            run_log = fp.federation(names, node_configs={h: {"data-dir": sites / h / "data", "state-dir": states / h}
                                                         for h in names}, events_file=events, values={
                "server-config": sites / "server" / "server.toml", "federation-file": link / "federation.toml",
                "server-key": link / "server.ed25519.pem", "events-file": events, "min-nodes": 3,
                "wait-timeout": 60.0, "hello-timeout": 60.0, "plan-timeout": 120.0, "stage-timeout": 30.0,
                "end-timeout": 30.0, "relay-timeout": 120.0})
    finally:
        shutil.rmtree(states, ignore_errors=True)
    assert any(e["event"] == "finished" for e in progress(events)), run_log
    _in_process(sites, names, dictionary, config, tmp_path / "sim-audit")
    _assert_same_run(entries(tmp_path / "audit"), entries(tmp_path / "sim-audit"), names)
    server_key = load_federation(keys.federation_file).server_public().raw
    report = verify_audit_dir(tmp_path / "audit", trusted_server_key=server_key)
    assert report.ok, report.problems


def test_concepts_under_distributed_dp_over_flower_match_the_in_process_run(tmp_path):
    """The voted run with every hospital under distributed DP (hospital.toml [privacy], server.toml
    [dp_policy], FedSGD): the same vote, derived model and audit kinds over Flower as in process,
    and in both every training round's noise check passed with all three hospitals over the derived
    model's coordinates, each ledger entry accounted over that dimension."""
    federation = FEDERATION | {"strategy": "fedsgd"}
    sites, names, dictionary, config = _server_files(tmp_path, tmp_path / "flower-audit", DISTRIBUTED, federation)
    run_over_loopback(sites=sites, names=names, server_toml=sites / "server" / "server.toml", tmp_path=tmp_path,
                      federation_id=FEDERATION["id"], port=19097)
    _in_process(sites, names, dictionary, config, tmp_path / "sim-audit", federation)
    deployed, simulated = entries(tmp_path / "flower-audit"), entries(tmp_path / "sim-audit")
    _assert_same_run(deployed, simulated, names, noised=True)
    for run in (deployed, simulated):
        dim = payloads(run, "model_derived")[0]["parameters"]
        checks = payloads(run, "noise_check")
        assert [c["round"] for c in checks] == [1, 2]
        assert all(c["passed"] and c["contributors"] == 3 and c["dim"] == dim for c in checks)
        ledgers = payloads(run, "ledger")
        assert len(ledgers) == 6 and all(p["share"]["dim"] == dim for p in ledgers)
