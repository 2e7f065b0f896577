"""The run's set-up sums (sdk/federation/setup.py, secure/runtime/setup.py): what `clinograph model
init` writes, why the initial models may be written before the sums run, and the hospital's
checks that the server cannot make it train on scales or features its operator did not configure."""

import json
import re

import numpy as np
import pytest
from clinograph.sdk.config import HospitalConfig, NSFLConfig, ScalingSection, SimulationConfig
from clinograph.sdk.federation import scaling
from clinograph.sdk.federation.build import initial_model_for, run_models
from clinograph.sdk.federation.member import FederationMember, MemberCandidate
from clinograph.sdk.federation.setup import HospitalSetup, run_in_process, setup_sums
from clinograph.sdk.federation.simulate import simulate_one
from clinograph.secure.audit import AuditTrail
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.runtime.models import (
    RunStart,
    SetupAnnounce,
    SetupClose,
    overrides_digest,
    run_models_from_bytes,
)
from clinograph.secure.runtime.setup import check_setup
from clinograph.secure.state import state_digest
from clinograph.secure.wire import seal
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity

BOTH = {"scaling": {"source": "federated"}, "model": {"hidden": 8, "features": "shared"}}


def _derived(dictionary, tables):
    bins = scaling.public_bins(dictionary, bins=200, span=5.0)
    counts = sum(scaling.local_histograms(t, bins) for t in tables)
    return scaling.derive_scaling(dictionary, counts=counts, bins=bins, quantiles="iqr")[0]


@pytest.mark.parametrize("model", [{}, {"linear_shape": True}, {"deep": False}])
def test_initial_models_depend_neither_on_the_scales_nor_on_the_feature_list(model):
    """Why `clinograph model init` may write the initial models before the set-up sums run."""
    tables = small_tables()
    d = tables[0].dictionary
    derived = _derived(d, tables)
    assert derived.digest() != d.digest()
    base = initial_model_for(HospitalConfig(model=NSFLConfig(hidden=8, **model)), dictionary=d)
    for cfg, dictionary in ((HospitalConfig(model=NSFLConfig(hidden=8, features="shared", **model)), d),
                            (HospitalConfig(model=NSFLConfig(hidden=8, features=("heart_rate", "glucose"), **model)), d),
                            (HospitalConfig(model=NSFLConfig(hidden=8, **model)), derived)):
        other = initial_model_for(cfg, dictionary=dictionary)
        assert other.spec.digest() == base.spec.digest()
        assert state_digest(other.state()) == state_digest(base.state())


def test_model_init_writes_the_sums_simulate_builds_the_same():
    d = small_tables()[0].dictionary
    hospital = HospitalConfig.model_validate(BOTH)
    written = run_models_from_bytes(run_models(hospital, dictionary=d).to_bytes())
    assert [s.name for s in written.setup] == ["scaling_histogram", "feature_coverage"]
    assert [s.result_kind for s in written.setup] == ["scaling_derived", "feature_coverage"]
    assert written.setup[0].length == 200 * len(scaling.public_bins(d, bins=200, span=5.0).features)
    assert written.setup[1].length == len(d.node_ids()) and written.setup[1].cap == 1.0
    sim = SimulationConfig.model_validate(BOTH)
    assert run_models(sim.hospital_config(), dictionary=d).setup == written.setup
    assert run_models(HospitalConfig(), dictionary=d).setup == ()
    # a candidate asking for "shared" is enough; its overrides stay as written
    cands = HospitalConfig.model_validate({"selection": {"candidates": [
        {"name": "wide"}, {"name": "wide_shared", "model": {"features": "shared"}}]}})
    models = run_models(cands, dictionary=d)
    assert [s.name for s in models.setup] == ["feature_coverage"]
    assert json.loads(models.candidates[1].overrides) == {"model": {"features": "shared"}}


def _setup(config, tables, server, me):
    t = tables[0]
    return HospitalSetup(table=t, dictionary=t.dictionary, config=config, candidates=[], identity=me,
                         server=server.public, peers={me.name: me.public}, federation_id="fed")


def test_a_hospital_answers_only_the_sums_its_own_config_asks_for():
    tables = small_tables()
    server, me = Identity.generate("server"), Identity.generate(tables[0].site)
    mine = HospitalConfig.model_validate({"scaling": {"source": "federated"}})
    setup = _setup(mine, tables, server, me)
    coverage = setup_sums(HospitalConfig.model_validate({"model": {"features": "shared"}}),
                          dictionary=tables[0].dictionary, candidates=[])[0]

    def announce(s, **kw):
        msg = {"federation_id": "fed", "sum": s, "index": 0, "count": 1, "round": 0,
               "dictionary_hash": tables[0].dictionary.digest(), "secure_mode": "masked", **kw}
        return {"data": seal(SetupAnnounce(**msg), kw.pop("signer", server))}

    with pytest.raises(ProtocolError, match=r"'feature_coverage' \(1 of 1\) is not the next one this hospital's "
                                             r"config asks for \(its sums: scaling_histogram"):
        setup.on_setup("setup/sum", announce(coverage))
    other_bins = setup_sums(HospitalConfig.model_validate({"scaling": {"source": "federated", "bins": 100}}),
                            dictionary=tables[0].dictionary, candidates=[])[0]
    with pytest.raises(ProtocolError, match="is not the next one"):
        setup.on_setup("setup/sum", announce(other_bins))
    with pytest.raises(ProtocolError, match="over dictionary .* Use the same dictionary file"):
        setup.on_setup("setup/sum", announce(setup.expected[0], dictionary_hash="e" * 64))
    with pytest.raises(ProtocolError, match="under secure_mode 'ckks'"):
        setup.on_setup("setup/sum", announce(setup.expected[0], secure_mode="ckks"))
    with pytest.raises(Exception, match="signature|Signature"):
        setup.on_setup("setup/sum", {"data": seal(SetupAnnounce(
            federation_id="fed", sum=setup.expected[0], index=0, count=1, round=0,
            dictionary_hash=tables[0].dictionary.digest(), secure_mode="masked"), Identity.generate("server"))})
    assert setup.client is None and setup.missing == ["scaling_histogram"]
    # the right sum is answered; its result only after the hospital sent its share and got the summed model
    assert setup.on_setup("setup/sum", announce(setup.expected[0])) == {"ok": b"1"} and setup.client is not None
    close = SetupClose(federation_id="fed", name="scaling_histogram", round=0, contributors=3)
    with pytest.raises(ProtocolError, match="does not follow this hospital's set-up round"):
        setup.on_setup("setup/result", {"data": seal(close, server)})
    assert setup.missing == ["scaling_histogram"]
    # run/start before the sums ran is refused: the hospital would train on scales it did not agree
    cand = MemberCandidate(name="model", overrides="{}", build=lambda fid, rounds: None)  # type: ignore[arg-type,return-value]
    member = FederationMember(identity=me, server=server.public, federation_id="fed", candidates=[cand], setup=setup)
    start = RunStart(federation_id="fed", run_id="fed", candidate="model", overrides_sha256=overrides_digest("{}"),
                     index=0, count=1, rounds=3)
    with pytest.raises(ProtocolError, match=r"run/start before the set-up sum\(s\) this hospital's config asks for "
                                             r"\(scaling_histogram\)"):
        member.on_setup("run/start", {"data": seal(start, server)})
    # a hospital whose config asks for no sum refuses to answer one
    plain = FederationMember(identity=me, server=server.public, federation_id="fed", candidates=[cand])
    with pytest.raises(ProtocolError, match="asks for no set-up sum"):
        plain.on_setup("setup/sum", announce(coverage))


def test_in_process_sums_resolve_every_hospitals_table_dictionary_and_features(tmp_path):
    tables = small_tables()
    d = tables[0].dictionary
    ids = {t.site: Identity.generate(t.site) for t in tables}
    audit = AuditTrail(tmp_path / "audit", identity=(server := Identity.generate("server")))
    try:
        setups, next_round = run_in_process(tables, d, config=HospitalConfig.model_validate(BOTH),
                                            federation=FederationSection(id="fed", min_clients=2),
                                            server_identity=server, identities=ids, audit=audit)
    finally:
        audit.close()
    assert next_round == 2
    assert len({s.dictionary.digest() for s in setups.values()}) == 1  # every hospital derived the same
    exact, got = _derived(d, tables), next(iter(setups.values())).dictionary  # the masked sum is fixed point
    for f in exact.features:
        assert (got.get(f.id).scale_center or 0) == pytest.approx(exact.get(f.id).scale_center or 0, rel=1e-4, abs=1e-3)
    assert all(s.table.dictionary is s.dictionary and not s.missing for s in setups.values())
    assert len({s.shared for s in setups.values()}) == 1
    cfg = next(iter(setups.values())).resolve(HospitalConfig.model_validate(BOTH))
    assert cfg.model.features == next(iter(setups.values())).shared and "svo2" not in cfg.model.features


def test_hospitals_deriving_different_results_stop_the_run(tmp_path, monkeypatch):
    tables = small_tables()
    real, calls = scaling.derive_scaling, []

    def odd(dictionary, *, counts, bins, quantiles, **kw):  # the second hospital scales otherwise
        calls.append(1)
        return real(dictionary, counts=counts, bins=bins, quantiles="p05_p95" if len(calls) == 2 else quantiles, **kw)

    monkeypatch.setattr(scaling, "derive_scaling", odd)
    ids = {t.site: Identity.generate(t.site) for t in tables}
    audit = AuditTrail(tmp_path / "audit", identity=(server := Identity.generate("server")))
    try:
        with pytest.raises(ProtocolError, match="derived different results from the set-up sum 'scaling_histogram'"):
            run_in_process(tables, tables[0].dictionary,
                           config=HospitalConfig(scaling=ScalingSection(source="federated")),
                           federation=FederationSection(id="fed", min_clients=2), server_identity=server,
                           identities=ids, audit=audit)
    finally:
        audit.close()


def test_a_server_that_keeps_the_base_dictionary_after_scaling_is_refused(tmp_path, monkeypatch):
    """The hospitals train on the dictionary they derived themselves, never on one the server names."""
    from clinograph.secure.runtime import run, setup

    def forgetful(models, **kw):  # runs the sums, then keeps the base dictionary's digest
        setup.run_setup(models, **kw)
        return models

    monkeypatch.setattr(run, "run_setup", forgetful)
    tables = small_tables()
    cfg = SimulationConfig.model_validate({"federation": {"rounds": 1, "min_clients": 2, "local_epochs": 1},
                                           "model": {"hidden": 8}, "graph": {"k_similar": 0},
                                           "scaling": {"source": "federated"}})
    with pytest.raises(ProtocolError):
        simulate_one(tables, tables[0].dictionary, cfg, audit_dir=tmp_path / "audit")
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    refusals = [e["payload"]["reason"] for e in entries if e["kind"] == "hospital_refused"]
    assert len(refusals) == 3 and all("Plan uses feature dictionary" in r for r in refusals)
    assert not any(e["kind"] == "aggregate" and e["payload"]["round"] >= 1 for e in entries)


def test_set_up_sums_are_refused_under_dp_ckks_and_a_journal_before_anything_runs():
    d = small_tables()[0].dictionary
    models = run_models(HospitalConfig.model_validate(BOTH), dictionary=d)
    with pytest.raises(ConfigError, match=r"set-up sums \(scaling_histogram, feature_coverage\) are released with "
                                           "local noise.*runs distributed DP"):
        check_setup(models, secure_mode="masked", distributed_dp=True, journal=False)
    check_setup(models, secure_mode="masked", distributed_dp=False, journal=False)  # local DP: accounted releases
    with pytest.raises(ConfigError, match="under 'ckks' the server never sees a sum, but the result every hospital"):
        check_setup(models, secure_mode="ckks", distributed_dp=False, journal=False)
    with pytest.raises(ConfigError, match="not journalled"):
        check_setup(models, secure_mode="masked", distributed_dp=False, journal=True)
    check_setup(run_models(HospitalConfig(), dictionary=d), secure_mode="ckks", distributed_dp=True, journal=True)


def test_make_hospital_and_model_init_refuse_set_up_sums_under_distributed_dp(tmp_path, caplog):
    import logging

    import tomli_w
    from clinograph.sdk.config import DP_DEFAULT_MODEL_LINE
    from clinograph.sdk.federation.node import make_hospital
    from clinograph.secure.transport.flower.keyset import init_keyset
    from sdk_helpers import raw_tables
    from typer.testing import CliRunner

    from clinograph.cli import app

    (df, schema), = [x for x in raw_tables() if x[1].site == "north"]
    data = tmp_path / "data"
    data.mkdir()
    df.to_csv(data / "table.csv", index=False)
    (data / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
    (data / "dictionary.toml").write_text(tomli_w.dumps(small_tables()[0].dictionary.model_dump(
        mode="json", exclude_none=True)))
    keys = init_keyset(tmp_path / "keys", federation_id="fed", hospitals=["north", "south"],
                       superlink_hosts=["127.0.0.1"], superlink_port=19099)
    node = {"data-dir": str(data), "state-dir": str(tmp_path / "s"),
            "federation-file": str(keys.hospital_dirs["north"] / "federation.toml")}
    me = Identity.load("north", keys.hospital_dirs["north"] / "north.ed25519.pem")
    privacy = {"enabled": True, "mode": "distributed", "noise_multiplier": 1.0, "sample_rate": 1.0, "min_honest": 2}
    caplog.set_level(logging.INFO, logger="clinograph.sdk.federation.node")
    for settings, match in (({"scaling": {"source": "federated"}}, "source = 'federated' under [privacy] mode = "
                                                                   "'distributed'"),
                            ({"model": {"features": "shared"}}, "under [privacy] mode = 'distributed'")):
        (data / "hospital.toml").write_text(tomli_w.dumps({"dictionary": "dictionary.toml", "graph": {"k_similar": 0},
                                                           "privacy": privacy, **settings}))
        with pytest.raises(ConfigError, match=re.escape(match)):
            make_hospital(node_config=node, run_config={}, run_id=1, identity=me)
        res = CliRunner().invoke(app, ["model", "init", "--config", str(data / "hospital.toml"),
                                       "--out", str(tmp_path / "initial_model.json")])
        assert res.exit_code != 0 and match in " ".join(res.output.split()), res.output
    said = [r.getMessage() for r in caplog.records if r.name == "clinograph.sdk.federation.node"
            and not r.getMessage().startswith("read ")]  # what the hospital read: test_node.py
    assert said == [DP_DEFAULT_MODEL_LINE] * 2  # the hospital's SuperNode log says the DP default model
    caplog.clear()
    (data / "hospital.toml").write_text(tomli_w.dumps({"dictionary": "dictionary.toml", **BOTH}))
    member = make_hospital(node_config=node, run_config={}, run_id=1, identity=me)  # no longer refused
    assert not [r for r in caplog.records if r.name == "clinograph.sdk.federation.node"
                and r.getMessage() == DP_DEFAULT_MODEL_LINE]  # no [privacy]: not said
    assert member.setup is not None and member.setup.missing == ["scaling_histogram", "feature_coverage"]
    assert np.isclose(member.setup.expected[1].cap, 1.0)


def _share_plan(setup, server, round_, people):
    from clinograph.secure.masking.params import masked_plan_options
    from clinograph.secure.messages import RoundPlan

    modules = setup.client.task.modules
    plan = RoundPlan(federation_id="fed", round=round_, participants=people, spec=modules.spec(version=1),
                     dictionary_hash=setup.dictionary.digest(), secure_mode="masked", strategy="fedsgd",
                     min_clients=2, local_epochs=1, global_state_digest=state_digest(setup.client._global),
                     options={**masked_plan_options(n_clients=len(people), threshold=len(people), clip=1.0),
                              "weight.max": 1.0})
    return seal(plan, server)


def test_a_hospital_sends_its_share_of_a_set_up_sum_once():
    """A second sum of the same histogram over other hospitals would give one hospital's histogram by
    difference (sum over {a, b, c} minus sum over {b, c}): before, a share's client answered every plan
    the server sent for it, and a new announcement of the pending sum built a new share."""
    tables = small_tables()
    server, me = Identity.generate("server"), Identity.generate(tables[0].site)
    setup = _setup(HospitalConfig.model_validate({"scaling": {"source": "federated"}}), tables, server, me)
    announce = {"data": seal(SetupAnnounce(federation_id="fed", sum=setup.expected[0], index=0, count=1, round=0,
                                           dictionary_hash=tables[0].dictionary.digest(), secure_mode="masked"),
                             server)}
    setup.on_setup("setup/sum", announce)
    others = tuple(t.site for t in tables[1:])
    setup.client.on_plan(_share_plan(setup, server, 0, (me.name, *others)))  # the one share
    with pytest.raises(ProtocolError, match=r"already sent its share of the set-up sum 'scaling_histogram' "
                                             r"\(round 0\).*by difference.*Refused; nothing was sent"):
        setup.client.on_plan(_share_plan(setup, server, 1, (me.name, others[0])))
    with pytest.raises(ProtocolError, match=r"already sent its share of the set-up sum 'scaling_histogram'"):
        setup.on_setup("setup/sum", announce)
    assert len(setup.client.outgoing) == 2  # the first plan's report and share only
