"""A real federation in process: masked vs plaintext, personal modules never leave, refusals."""

import warnings

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation, simulate_one
from clinograph.secure.messages import ClientUpdate
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.wire import load_payload, parse_envelope
from sdk_helpers import small_tables

from clinograph.core.errors import SecurityPolicyError


def cfg(mode, rounds=2, **fed):
    return SimulationConfig.model_validate({
        "federation": {"rounds": rounds, "secure_mode": mode, "min_clients": 2, "local_epochs": 1, **fed},
        "model": {"hidden": 8}, "graph": {"k_similar": 3}, "training": {"lr": 0.01, "batch_size": 32},
        "release": {"feature_relevance": True}})


def run(mode, tmp_path, rounds=2, **kw):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        return simulate_one(tables, tables[0].dictionary, cfg(mode, rounds), audit_dir=tmp_path / mode, **kw)


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
            sim = build_simulation(tables, tables[0].dictionary, cfg(mode), audit_dir=tmp_path / mode)
        sim.run_round()
        sim.audit.close()
        states.append(sim.server.state)
    for name in states[0]:
        ref = states[0][name]
        assert np.max(np.abs(states[1][name] - ref)) <= 1e-6 * max(1.0, np.max(np.abs(ref))), name


def test_personal_modules_never_leave_a_hospital(tmp_path):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        sim = build_simulation(tables, tables[0].dictionary, cfg("insecure_plaintext"), audit_dir=tmp_path / "a")
    sim.run_round()
    sim.audit.close()
    server = sim.server
    for h in sim.hospitals.values():
        sent = h.outgoing
        assert sent, "nothing was sent"
        masks = h.task.modules.state(kind=None)
        for data in sent:
            env = parse_envelope(data)
            assert b"mask/" not in env.payload
            if env.kind == "client_update":
                upd = load_payload(env, ClientUpdate)
                assert all(not t.name.startswith("mask/") for t in upd.modules)
                assert {t.name for t in upd.modules} <= set(server.spec.names())
            for name, vec in masks.items():
                if name.startswith("mask/"):
                    assert vec.astype("<f4").tobytes() not in data  # payload and binary attachments
                    assert vec.astype("<f8").tobytes() not in data


def test_hospital_with_another_dictionary_refuses_the_plan(tmp_path):
    tables = small_tables()
    sim = build_simulation(tables, tables[0].dictionary, cfg("masked"), audit_dir=tmp_path / "d")
    sim.hospitals["east"].dictionary_hash = "0" * 64
    out = sim.run_round()
    sim.audit.close()
    assert "east" in out.dropped and "feature dictionary" in out.dropped["east"]
    assert out.result.contributors == ("north", "south")


def test_a_hospital_refuses_a_plaintext_plan_unless_its_config_accepts_one(tmp_path):
    # before: a hospital followed whatever secure_mode the server's signed plan named, so a server could switch
    # every hospital to insecure_plaintext and read each update (helper hadv2 found it)
    from clinograph.sdk.config import ReleaseSection

    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        sim = build_simulation(tables, tables[0].dictionary, cfg("insecure_plaintext"), audit_dir=tmp_path / "p")
    assert all(h.release.insecure_accept_plaintext for h in sim.hospitals.values())  # the simulation chose it
    sim.hospitals["east"].release = ReleaseSection()  # a deployed hospital's default
    out = sim.run_round()
    sim.audit.close()
    assert "east" in out.dropped and "insecure_accept_plaintext" in out.dropped["east"]
    assert out.result.contributors == ("north", "south")


def test_a_hospital_dropping_mid_round_leaves_the_survivors_aggregate(tmp_path):
    res = run("masked", tmp_path, rounds=1, drop_at={0: {"south": 2}})
    assert "south" in res.dropped[0]


def test_insecure_plaintext_warns_and_is_refused_in_production(tmp_path):
    tables = small_tables()
    with pytest.warns(InsecureOptionWarning, match="insecure_plaintext is in use"):
        sim = build_simulation(tables, tables[0].dictionary, cfg("insecure_plaintext"), audit_dir=tmp_path / "w")
    sim.audit.close()
    with pytest.raises(SecurityPolicyError, match='refused because environment = "production"'):
        build_simulation(tables, tables[0].dictionary, cfg("insecure_plaintext", environment="production"),
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


def test_nothing_beyond_the_protocol_leaves_a_hospital_by_default(tmp_path):
    """Release policy: no [release] section -> no metrics and no feature relevance in the audit."""
    tables = small_tables()
    config = SimulationConfig.model_validate({
        "federation": {"rounds": 1, "secure_mode": "masked", "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 3}})
    simulate_one(tables, tables[0].dictionary, config, audit_dir=tmp_path / "a")
    import json

    kinds = [json.loads(line)["kind"] for line in (tmp_path / "a" / "audit.jsonl").read_text().splitlines()]
    assert "aggregate" in kinds and "update_accepted" in kinds
    assert "metrics" not in kinds and "feature_relevance" not in kinds


def test_a_hospital_weight_is_capped_by_the_plan_not_refused(tmp_path):
    """A hospital larger than max_weight takes part with weight max_weight (masked mode)."""
    tables = small_tables()
    config = SimulationConfig.model_validate({
        "federation": {"rounds": 1, "secure_mode": "masked", "local_epochs": 1, "max_weight": 50.0},
        "model": {"hidden": 8}, "graph": {"k_similar": 3}})
    sim = build_simulation(tables, tables[0].dictionary, config, audit_dir=tmp_path / "a")
    out = sim.run_round()
    sim.audit.close()
    assert not out.dropped and len(out.result.contributors) == 3
    assert all(h.task.num_samples > 50 for h in sim.hospitals.values())  # every hospital was capped


def test_split_depends_on_the_hospital_not_its_position(tmp_path):
    from clinograph.sdk.federation.split import hospital_split

    t = small_tables()[0]
    a = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    b = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    c = hospital_split(t.labels, site="elsewhere", test_fraction=0.3, validation_fraction=0.2, seed=0)
    assert np.array_equal(a.test, b.test) and not np.array_equal(a.test, c.test)
    assert not set(a.train) & set(a.test) and not set(a.validation) & set(a.test)


def test_a_simulation_ends_with_its_release_and_run_ended_entries(tmp_path):
    import json

    res = run("masked", tmp_path, rounds=1)
    entries = [json.loads(x) for x in (res.audit_dir / "audit.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert kinds.index("release") < kinds.index("run_ended") and kinds[-1] == "run_ended"
    assert entries[-1]["payload"]["status"] == "completed"


@pytest.mark.parametrize("task", ["nsfl", "agat"])
def test_model_init_without_a_table_equals_what_every_hospital_builds(task, tmp_path):
    """`clinograph model init` (no table) and a hospital's own task start from the same model:
    otherwise the lean server's first plan would not match any hospital's state digest."""
    from clinograph.sdk.config import HospitalConfig
    from clinograph.sdk.federation.build import build_task, initial_model, initial_model_for
    from clinograph.secure.state import state_digest

    tables = small_tables()
    config = HospitalConfig.model_validate({"task": task, "model": {"hidden": 8}, "graph": {"k_similar": 0}})
    fresh = initial_model_for(config, dictionary=tables[0].dictionary)
    for t in tables:
        built = initial_model(build_task(t, dictionary=t.dictionary, config=config), dictionary=t.dictionary)
        assert built.spec.digest() == fresh.spec.digest()
        assert state_digest(built.state()) == state_digest(fresh.state())


def test_a_hospital_scores_new_patients_locally(tmp_path):
    tables = small_tables()
    sim = build_simulation(tables, tables[0].dictionary, cfg("masked", rounds=1), audit_dir=tmp_path / "p")
    sim.run_round()
    sim.audit.close()
    risks = sim.hospitals["north"].predict_table(tables[0])
    assert risks.shape == (tables[0].n_patients,) and np.all((risks >= 0) & (risks <= 1)) and np.std(risks) > 0


def test_a_hospital_that_missed_a_round_gets_the_model_with_the_next_plan_and_contributes_again(tmp_path):
    """A hospital that dropped in round 0 never received round 0's model, and refused every later
    plan ('does not match the plan's (missed a round?)') -- seen over Flower in session 50. The
    server now sends it the current model with the plan; it loads it and takes part again."""
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.audit.read import payloads

    res = run("masked", tmp_path, rounds=3, drop_at={0: {"south": 2}})
    assert "south" in res.dropped[0]
    audit = tmp_path / "masked"
    contributors = [tuple(p["contributors"]) for p in payloads(audit, "aggregate")]
    assert "south" not in contributors[0] and all("south" in c for c in contributors[1:3]), contributors
    assert not payloads(audit, "hospital_refused")
    assert verify_audit_dir(audit).ok
    globals_ = {name: m.client._global for name, m in res.hospitals.items()}
    for name, state in globals_.items():  # every hospital ends on the same global model
        assert all(np.array_equal(state[k], globals_["north"][k]) for k in state), name


def test_a_hospital_that_never_saw_a_plan_catches_up_too(tmp_path):
    """A hospital silent from round 0's plan on (it took no plan of the federation) refused the catch-up sent
    with round 1's plan ('End of a round this hospital did not take part in') and so every later plan, for good
    (helper hadv5 found it). It now loads the model (decoded against its own model spec) and contributes."""
    from clinograph.secure.runtime.loop import run_round
    from clinograph.secure.state import state_digest

    tables = small_tables()
    sim = build_simulation(tables, tables[0].dictionary, cfg("masked"), audit_dir=tmp_path / "m")
    getattr(sim.transport, "inner", sim.transport).drop_at(0, {"south": 0})
    assert "south" in run_round(sim.server, sim.transport).dropped
    assert sim.hospitals["south"].plan is None
    out = run_round(sim.server, sim.transport)
    sim.audit.close()
    assert out.result.contributors == ("east", "north", "south") and not out.dropped
    assert len({state_digest(h._global) for h in sim.hospitals.values()}) == 1
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.audit.read import payloads

    first = payloads(tmp_path / "m", "aggregate")[0]  # the audit says who was sent which model (hadv5)
    assert payloads(tmp_path / "m", "model_caught_up") == [
        {"round": 1, "hospitals": ["south"], "global_state_digest": first["global_state_digest"]}]
    assert verify_audit_dir(tmp_path / "m").ok
