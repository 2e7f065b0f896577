"""A real federation in process: masked vs plaintext, personal modules never leave, refusals."""

import warnings

import numpy as np
import pytest
from clinograph.sdk.federation.config import SimulationConfig
from clinograph.sdk.federation.simulation import build_federation, run_simulation
from clinograph.secure.errors import SecurityPolicyError
from clinograph.secure.messages import ClientUpdate
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.rounds import run_round
from clinograph.secure.wire import parse_envelope
from sdk_helpers import small_tables


def cfg(mode, rounds=2, **fed):
    return SimulationConfig.model_validate({
        "federation": {"rounds": rounds, "secure_mode": mode, "min_clients": 2, "local_epochs": 1, **fed},
        "model": {"hidden": 8}, "graph": {"k_similar": 3}, "training": {"lr": 0.01, "batch_size": 32}})


def run(mode, tmp_path, rounds=2, **kw):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        return run_simulation(tables, tables[0].dictionary, cfg(mode, rounds), audit_dir=tmp_path / mode, **kw)


def test_masked_mode_gives_the_plaintext_model_and_auroc(tmp_path):
    a, b = run("insecure_plaintext", tmp_path), run("masked", tmp_path)
    for site in a.final:
        assert a.final[site]["auroc"] == pytest.approx(b.final[site]["auroc"], abs=1e-3)
    assert all(not d for d in b.dropped)


def test_global_state_of_masked_and_plaintext_agree_to_fixed_point_precision(tmp_path):
    tables = small_tables()
    states = []
    for mode in ("insecure_plaintext", "masked"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InsecureOptionWarning)
            server, hospitals, audit = build_federation(tables, tables[0].dictionary, cfg(mode), audit_dir=tmp_path / mode)
        run_round(server, {n: h.client for n, h in hospitals.items()}, participants=tuple(sorted(hospitals)))
        audit.close()
        states.append(server.state)
    for name in states[0]:
        ref = states[0][name]
        assert np.max(np.abs(states[1][name] - ref)) <= 1e-6 * max(1.0, np.max(np.abs(ref))), name


def test_personal_modules_never_leave_a_hospital(tmp_path):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        server, hospitals, audit = build_federation(tables, tables[0].dictionary, cfg("insecure_plaintext"),
                                                    audit_dir=tmp_path / "a")
    run_round(server, {n: h.client for n, h in hospitals.items()}, participants=tuple(sorted(hospitals)))
    audit.close()
    for h in hospitals.values():
        sent = h.client.outgoing
        assert sent, "nothing was sent"
        masks = h.client.modules.state(kind=None)
        for data in sent:
            env = parse_envelope(data)
            assert b"mask/" not in env.payload
            if env.kind == "client_update":
                upd = ClientUpdate.model_validate_json(env.payload)
                assert all(not t.name.startswith("mask/") for t in upd.modules)
                assert {t.name for t in upd.modules} <= set(server.spec.names())
            for name, vec in masks.items():
                if name.startswith("mask/"):
                    assert vec.astype("<f4").tobytes() not in env.payload
                    assert vec.astype("<f8").tobytes() not in env.payload


def test_hospital_with_another_dictionary_refuses_the_plan(tmp_path):
    tables = small_tables()
    server, hospitals, audit = build_federation(tables, tables[0].dictionary, cfg("masked"), audit_dir=tmp_path / "d")
    other = hospitals["east"].client
    other.dictionary_hash = "0" * 64
    out = run_round(server, {n: h.client for n, h in hospitals.items()}, participants=tuple(sorted(hospitals)))
    audit.close()
    assert "east" in out.dropped and "feature dictionary" in out.dropped["east"]
    assert out.result.contributors == ("north", "south")


def test_a_hospital_dropping_mid_round_leaves_the_survivors_aggregate(tmp_path):
    res = run("masked", tmp_path, rounds=1, drop_at={0: {"south": 2}})
    assert "south" in res.dropped[0]


def test_insecure_plaintext_warns_and_is_refused_in_production(tmp_path):
    tables = small_tables()
    with pytest.warns(InsecureOptionWarning, match="insecure_plaintext is in use"):
        _, _, audit = build_federation(tables, tables[0].dictionary, cfg("insecure_plaintext"), audit_dir=tmp_path / "w")
    audit.close()
    with pytest.raises(SecurityPolicyError, match='refused because environment = "production"'):
        build_federation(tables, tables[0].dictionary, cfg("insecure_plaintext", environment="production"),
                         audit_dir=tmp_path / "p")


def test_ckks_mode_gives_the_plaintext_auroc_and_the_server_holds_no_model(tmp_path):
    a, c = run("insecure_plaintext", tmp_path), run("ckks", tmp_path)
    for site in a.final:
        assert a.final[site]["auroc"] == pytest.approx(c.final[site]["auroc"], abs=1e-3)
    import json

    kinds = [json.loads(line)["kind"] for line in (tmp_path / "ckks" / "audit.jsonl").read_text().splitlines()]
    assert "aggregate" in kinds
    artefacts = [json.loads(line)["payload"].get("name", "") for line in
                 (tmp_path / "ckks" / "audit.jsonl").read_text().splitlines() if '"kind":"artefact"' in line]
    assert not any("global_model" in a for a in artefacts)  # the server never had a plaintext model to publish
