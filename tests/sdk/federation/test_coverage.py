"""[model] features: the shared features found by a secure sum of coverage vectors (the server
learns how many hospitals observe each feature, never which), and a model that reads only its
listed features in training, prediction and the exported file."""

import json

import numpy as np
import pytest
from clinograph.sdk.config import HospitalConfig, NSFLConfig, SimulationConfig
from clinograph.sdk.federation import securesum
from clinograph.sdk.federation.build import build_task
from clinograph.sdk.federation.candidates import candidate_configs
from clinograph.sdk.federation.coverage import local_coverage, restrict
from clinograph.sdk.federation.setup import shared_features
from clinograph.sdk.federation.simulate import simulate, simulate_one
from clinograph.sdk.model.load import load_exported, predict_exported
from clinograph.secure.audit import AuditTrail, verify_audit_dir
from clinograph.secure.hazmat import fixedpoint
from clinograph.secure.masking.messages import MaskedInput
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.wire import open_envelope, parse_envelope
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

MISSING_AT_EAST = {"paco2", "sao2", "svo2"}  # the small federation's `east` has no blood gases


def cfg(**extra):
    base = {"federation": {"rounds": 3, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
            "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.03, "batch_size": 32},
            "selection": {"patience": 5}}
    for k, v in extra.items():
        base[k] = {**base.get(k, {}), **v}
    return SimulationConfig.model_validate(base)


def _entries(audit_dir):
    return [json.loads(x) for x in (audit_dir / "audit.jsonl").read_text().splitlines()]


def test_restrict_keeps_every_patient_and_only_the_listed_features():
    t = small_tables()[0]
    index = t.dictionary.node_index()
    kept = restrict(t, ("heart_rate", "glucose"))
    assert kept.patient_ids == t.patient_ids and np.array_equal(kept.labels, t.labels)
    assert set(kept.node.tolist()) == {index["heart_rate"], index["glucose"]}
    sel = np.isin(t.node, [index["heart_rate"], index["glucose"]])
    assert np.array_equal(kept.value, t.value[sel]) and np.array_equal(kept.patient, t.patient[sel])
    assert restrict(t, "all") is t
    with pytest.raises(ConfigError, match="'nope', 'nada'"):
        restrict(t, ("heart_rate", "nope", "nada"))


def test_the_coverage_round_finds_the_shared_features_and_the_server_sees_only_counts(tmp_path, monkeypatch):
    tables = small_tables()
    clients = {}
    real = securesum.HospitalClient

    class Spy(real):  # keeps each hospital's client: what it sent the server
        def __init__(self, **kw):
            super().__init__(**kw)
            clients[self.name] = self

    monkeypatch.setattr(securesum, "HospitalClient", Spy)
    d = tables[0].dictionary
    ids = {t.site: Identity.generate(t.site) for t in tables}
    audit = AuditTrail(tmp_path / "audit", identity=(server := Identity.generate("server")))
    try:
        shared, observed, nxt = shared_features(
            tables, d, federation=FederationSection(id="cov", secure_mode="masked", min_clients=2),
            server_identity=server, identities=ids, audit=audit)
    finally:
        audit.close()
    assert set(shared) == set(d.node_ids()) - MISSING_AT_EAST and nxt == 1
    assert list(shared) == [f for f in d.node_ids() if f in shared]  # dictionary order
    assert all(observed[f] == 2 for f in MISSING_AT_EAST) and observed["heart_rate"] == 3
    for t in tables:  # what a hospital sent is masked: not its coverage vector in fixed point
        client = clients[t.site]
        (masked,) = [open_envelope(env, sender=client.identity.public, model=MaskedInput)
                     for env in map(parse_envelope, client.outgoing) if env.kind == "masked_input"]
        opts = client.plan.options
        plain = np.concatenate([local_coverage(t), [1.0]]) * float(opts["masked.clip"])
        words, _ = fixedpoint.encode(plain, scale=float(opts["masked.scale"]), bound=float(opts["masked.clip"]),
                                     clip=False)
        seen = np.frombuffer(masked.words, dtype="<u4")[:len(plain)]
        assert np.mean(seen == words) < 0.1
    (entry,) = [e["payload"] for e in _entries(tmp_path / "audit") if e["kind"] == "feature_coverage"]
    assert entry["hospitals"] == 3 and set(entry["shared"]) == set(shared)
    assert entry["hospitals_observing"]["svo2"] == 2
    facts = json.dumps({k: v for k, v in entry.items() if k != "rule"})
    assert not any(t.site in facts for t in tables)  # counts, never which hospital


def test_a_model_on_listed_features_ignores_the_others_in_training_prediction_and_export(tmp_path):
    tables = small_tables()
    keep = ("heart_rate", "systolic_bp", "creatinine")
    res = simulate_one(tables, tables[0].dictionary, cfg(model={"features": list(keep)}),
                       audit_dir=tmp_path / "audit")
    assert res.final and verify_audit_dir(tmp_path / "audit").ok
    # a hospital built from the same config: a model whose unlisted features never moved (Theorem 1)
    hconf = cfg(model={"features": list(keep)}).hospital_config()
    task = build_task(tables[0], dictionary=tables[0].dictionary, config=hconf)
    index = tables[0].dictionary.node_index()
    before = {n: p.detach().clone() for n, p in task.model.named_parameters()}
    task.train(round_=0, epochs=1, plan_options={})
    after = dict(task.model.named_parameters())
    lin = task.model.linear.weight if hasattr(task.model, "linear") else None
    assert lin is not None
    for f in ("glucose", "paco2"):
        assert torch_equal(before["linear.weight"][index[f]], after["linear.weight"][index[f]])
    assert not torch_equal(before["linear.weight"][index["heart_rate"]], after["linear.weight"][index["heart_rate"]])
    # prediction: scrambling an unlisted feature's values changes nothing; a listed one does
    t = tables[0]
    scrambled = _with_values(t, "glucose", 10.0)
    base = task.predict_table(t)
    np.testing.assert_array_equal(task.predict_table(scrambled), base)
    assert not np.allclose(task.predict_table(_with_values(t, "heart_rate", 10.0)), base)
    # the exported file reads only the listed features too, whatever the loader passes
    me = Identity.generate(t.site)
    path, sidecar = task.export(tmp_path / "model.safetensors", signer=me)
    loaded = load_exported(path, trusted=me.public, insecure_untrusted_model=True)
    assert list(loaded.description.features_used) == [f for f in t.dictionary.node_ids() if f in keep]
    np.testing.assert_allclose(predict_exported(loaded, scrambled), base, rtol=1e-5, atol=1e-7)


def torch_equal(a, b):
    import torch

    return bool(torch.equal(a, b))


def _with_values(t, feature, std_value):
    from dataclasses import replace

    sel = t.node == t.dictionary.node_index()[feature]
    std = t.std_value.copy()
    std[sel] = std_value
    return replace(t, std_value=std)


def test_unresolved_or_unknown_features_are_refused_with_the_fix():
    t = small_tables()[0]
    with pytest.raises(ConfigError, match="copy `shared` from the simulation's feature_coverage"):
        build_task(t, dictionary=t.dictionary, config=HospitalConfig(model=NSFLConfig(features="shared")))
    with pytest.raises(ConfigError, match="lacks: 'Na'"):
        build_task(t, dictionary=t.dictionary, config=HospitalConfig(model=NSFLConfig(features=("heart_rate", "Na"))))
    with pytest.raises(ValueError, match="twice: heart_rate"):
        NSFLConfig(features=("heart_rate", "heart_rate"))


def test_shared_is_refused_under_distributed_dp_and_ckks(tmp_path):
    tables = small_tables()
    with pytest.raises(ConfigError, match="under \\[privacy\\] mode = 'distributed'"):
        simulate_one(tables, tables[0].dictionary,
                     cfg(model={"features": "shared"}, privacy={"enabled": True, "mode": "distributed", "noise_multiplier": 1.0,
                                                                "sample_rate": 1.0, "min_honest": 2,
                                                                "state_dir": str(tmp_path / "dp")},
                         selection={"enabled": False}),
                     audit_dir=tmp_path / "a1")
    with pytest.raises(ConfigError, match="not 'ckks'"):
        simulate_one(tables, tables[0].dictionary,
                     cfg(model={"features": "shared"}, federation={"secure_mode": "ckks"}), audit_dir=tmp_path / "a2")


SHARED_CANDIDATES = [{"name": "wide", "model": {"deep": False}},
                     {"name": "wide_shared", "model": {"deep": False, "features": "shared"}}]


def test_shared_candidates_resolve_once_and_the_list_is_audited(tmp_path):
    tables = small_tables()
    c = cfg(selection={"candidates": SHARED_CANDIDATES, "restarts": 2})
    assert [x.name for x in candidate_configs(c)] == ["wide", "wide-init1", "wide_shared", "wide_shared-init1"]
    res = simulate(tables, tables[0].dictionary, c, audit_dir=tmp_path / "audit")
    rows = {r["name"]: r for r in res.choice["candidates"]}
    for name in ("wide_shared", "wide_shared-init1"):
        # the overrides are the config as written (what `clinograph model init` and run/start carry) ...
        assert json.loads(rows[name]["overrides"])["model"]["features"] == "shared"
        assert rows[name]["validation_loss"] is not None and rows[name]["rounds_run"] >= 1
    # ... the resolved list is the feature_coverage entry's, and the hospitals built those candidates on it
    (cov,) = [e["payload"] for e in _entries(tmp_path / "audit") if e["kind"] == "feature_coverage"]
    assert set(cov["shared"]) == set(tables[0].dictionary.node_ids()) - MISSING_AT_EAST
    for member in res.hospitals.values():
        assert member.clients["wide_shared"].task.config.model.features == tuple(cov["shared"])
    assert rows["wide_shared"]["validation_loss"] != rows["wide"]["validation_loss"]
    kinds = [e["kind"] for e in _entries(tmp_path / "audit")]
    assert kinds.count("feature_coverage") == 1 and kinds.index("feature_coverage") < kinds.index("model_selected")
    verdict = verify_audit_dir(tmp_path / "audit")
    assert verdict.ok, verdict.problems


def test_a_listed_shared_candidate_with_nothing_shared_is_an_error(tmp_path, monkeypatch):
    from clinograph.sdk.federation import coverage

    tables = small_tables()
    monkeypatch.setattr(coverage, "local_coverage", lambda t: np.eye(len(t.dictionary.node_ids()))[
        [0, 1, 2][[x.site for x in tables].index(t.site)]])  # three hospitals, three disjoint features
    with pytest.raises(ConfigError, match="'wide_shared' ask for .* no feature is observed at every hospital"):
        simulate(tables, tables[0].dictionary,
                          cfg(selection={"candidates": SHARED_CANDIDATES}),
                          audit_dir=tmp_path / "audit")


@pytest.mark.parametrize("scaling", [{}, {"source": "federated"}])
def test_one_model_on_shared_features_resolves_in_its_own_run(tmp_path, scaling):
    tables = small_tables()
    res = simulate_one(tables, tables[0].dictionary, cfg(model={"features": "shared"}, scaling=scaling),
                       audit_dir=tmp_path / "audit")
    assert res.selection and res.final
    entries = _entries(tmp_path / "audit")
    kinds = [e["kind"] for e in entries]
    (cov,) = [e["payload"] for e in entries if e["kind"] == "feature_coverage"]
    assert set(cov["shared"]) == set(tables[0].dictionary.node_ids()) - MISSING_AT_EAST
    # the set-up round(s) first (scaling, then coverage), training rounds numbered after them, one verified trail
    plans = [e["payload"]["round"] for e in entries if e["kind"] == "round_plan"]
    assert plans[0] == 0 and plans[1:] == list(range(1, len(plans)))
    assert kinds.index("feature_coverage") < kinds.index("model_selected")
    verdict = verify_audit_dir(tmp_path / "audit")
    assert verdict.ok, verdict.problems
