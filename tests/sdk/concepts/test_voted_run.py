"""The voted run's derivation step refuses what would make a federation inconsistent: hospitals
that derive different models, hospitals that agree with each other but not with the server's
decision, a model that is not the one a signed answer names; a hospital refuses to train a model
it has not derived, or to derive from a vote round it did not see. Nothing is trained then."""

from __future__ import annotations

import dataclasses
import json

import pytest
from clinograph.sdk.concepts.encoders import MLPEncoder
from clinograph.sdk.concepts.federation import ConceptSettings, concept_member, vote_models
from clinograph.sdk.concepts.modules import ConceptHParams
from clinograph.sdk.concepts.task import ConceptTraining
from clinograph.sdk.config import ReleaseSection
from clinograph.secure.runtime import InProcessTransport
from clinograph.secure.runtime.assemble import ServerSide
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.runtime.models import DeriveRequest, RunStart
from clinograph.secure.runtime.voted import run_voted
from clinograph.secure.wire import seal
from test_concept_task import CARDS, CONCEPTS, DICT_HASH, PROPOSALS, _site

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity

FED = FederationSection(id="voted-test", rounds=1, secure_mode="masked", strategy="fedavg", local_epochs=1, seed=3,
                        max_weight=1000.0, min_clients=3)
SETTINGS = ConceptSettings(concepts=CONCEPTS, task="y", cards=CARDS, kind="cgm", encoder=lambda: MLPEncoder(6, 8, (16,)),
                           z_dim=8, seed=3, hp=ConceptHParams(hidden=8, emb=4), training=ConceptTraining(batch_size=32))


def _federation(settings_for=lambda name: SETTINGS, mode: str = "masked"):
    server = Identity.generate("server")
    ids = {n: Identity.generate(n) for n in sorted(PROPOSALS)}
    publics = {n: i.public for n, i in ids.items()}
    release = ReleaseSection(secure_modes=(mode,))  # the hospitals joined a federation under this mode
    members = {n: concept_member(_site(n, k), settings_for(n), identity=ids[n], server=server.public, peers=publics,
                                 federation_id=FED.id, dictionary_hash=DICT_HASH, release=release)
               for k, n in enumerate(sorted(PROPOSALS))}
    return server, publics, members


def _run(tmp_path, server, publics, members, fed=FED):
    side = ServerSide(federation=fed, identity=server, enrolled=publics, dp_policy=None, audit_dir=tmp_path / "audit")
    models = vote_models(next(iter(members.values())).vote_client.task, dictionary_hash=DICT_HASH, vote_rounds=1,
                         seed=SETTINGS.seed)
    return run_voted(models, side=side, transport=InProcessTransport(dict(members)), rounds=fed.rounds)


def _kinds(tmp_path) -> list[str]:
    return [json.loads(line)["kind"] for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["masked", "ckks_threshold"])  # ckks_threshold: docs/matrix.md's concepts row
def test_an_honest_voted_run_derives_one_model_and_trains_it(tmp_path, mode):
    server, publics, members = _federation(mode=mode)
    run = _run(tmp_path, server, publics, members, fed=FED.model_copy(update={"secure_mode": mode}))
    kinds = _kinds(tmp_path)
    assert kinds.count("dag_outcome") == 1 and kinds.count("model_derived") == 1 and kinds.count("aggregate") == 2
    derived = [json.loads(line)["payload"] for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()
               if json.loads(line)["kind"] == "model_derived"][0]
    assert sorted(derived["hospitals"]) == sorted(PROPOSALS)
    assert all(m.trained is not None and m.outcome == run.outcome for m in members.values())
    from clinograph.secure.audit.report import render_report

    html = render_report(tmp_path / "audit", out=tmp_path / "report.html").read_text()
    assert "Model derived from the voted DAG" in html and derived["initial_sha256"] in html  # the auditor sees it


def test_hospitals_that_derive_different_models_stop_the_run_before_training(tmp_path):
    server, publics, members = _federation(lambda n: dataclasses.replace(SETTINGS, z_dim=6) if n == "h3" else SETTINGS)
    with pytest.raises(ProtocolError, match="derived different models"):
        _run(tmp_path, server, publics, members)
    assert "model_derived" not in _kinds(tmp_path) and _kinds(tmp_path).count("aggregate") == 1  # the vote only


def test_one_hospital_that_derives_another_model_is_named_and_left_out(tmp_path):
    """With min_clients = 2, two hospitals agreeing are enough: the third, which derived another
    model (other settings), is named and trains nothing; it cannot void the run."""
    import json

    server, publics, members = _federation(lambda n: dataclasses.replace(SETTINGS, z_dim=6) if n == "h3" else SETTINGS)
    _run(tmp_path, server, publics, members, fed=FED.model_copy(update={"min_clients": 2}))
    found = [json.loads(line) for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    refused = [e["payload"] for e in found if e["kind"] == "hospital_refused"]
    assert [r["client"] for r in refused] == ["h3"] and "another model" in refused[0]["reason"]
    derived = [e["payload"] for e in found if e["kind"] == "model_derived"]
    assert derived[0]["hospitals"] == ["h1", "h2"]
    training = [e["payload"] for e in found if e["kind"] == "aggregate" and e["payload"]["round"] >= 1]
    assert training and all(sorted(a["contributors"]) == ["h1", "h2"] for a in training)


def test_hospitals_that_agree_with_each_other_but_not_with_the_server_are_refused(tmp_path):
    """Every hospital decides with another tie-break seed than the server's strategy: the same
    model everywhere, but another decision than the audited one (here the DAG itself differs)."""
    server, publics, members = _federation()
    for m in members.values():
        m.seed = 99  # what a hospital with another [concepts]/seed setting would do
        m.task_node = "c"
    with pytest.raises(ProtocolError, match="agree with each other and with the server's DAG .* on another DAG"):
        _run(tmp_path, server, publics, members)
    assert "model_derived" not in _kinds(tmp_path)


def test_a_model_that_is_not_the_signed_one_is_not_accepted(tmp_path):
    server, publics, members = _federation()
    for m in members.values():
        derive = m._derive

        def tampered(data, derive=derive):
            out = derive(data)
            return {**out, "model": out["model"].replace(b'"task":"concepts"', b'"task":"concepts" ')}

        m._derive = tampered  # type: ignore[method-assign]
    with pytest.raises(ProtocolError, match="not the one its signed answer names"):
        _run(tmp_path, server, publics, members)


def test_a_hospital_trains_only_a_model_it_derived_and_derives_only_a_vote_it_saw():
    server, publics, members = _federation()
    member = members["h1"]
    start = seal(RunStart(federation_id=FED.id, run_id=FED.id, candidate="model", overrides_sha256="0" * 64, index=0,
                          count=1, rounds=1), server)
    with pytest.raises(ProtocolError, match="before it derived the model"):
        member.on_setup("run/start", {"data": start})
    derive = seal(DeriveRequest(federation_id=FED.id, round=0), server)
    with pytest.raises(ProtocolError, match="cannot derive that vote's model"):
        member.on_setup("vote/derive", {"data": derive})
    forged = seal(DeriveRequest(federation_id=FED.id, round=0), Identity.generate("server"))
    with pytest.raises(IntegrityError, match="does not verify"):
        member.on_setup("vote/derive", {"data": forged})


def test_a_voted_run_refuses_a_journal(tmp_path):
    from clinograph.secure.runtime.journal import Journal

    server, publics, members = _federation()
    side = ServerSide(federation=FED, identity=server, enrolled=publics, dp_policy=None, audit_dir=tmp_path / "a")
    models = vote_models(members["h1"].vote_client.task, dictionary_hash=DICT_HASH, vote_rounds=1, seed=3)
    with pytest.raises(ConfigError, match="not journalled"):
        run_voted(models, side=side, transport=InProcessTransport(dict(members)), rounds=1,
                  journal=Journal(tmp_path / "j.sqlite"))
    assert not (tmp_path / "a").exists() or not list((tmp_path / "a").iterdir())


def test_simulate_refuses_the_concepts_task_with_its_reason(tmp_path):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import simulate

    config = SimulationConfig.model_validate({"task": "concepts", "output": str(tmp_path / "o"),
                                              "concepts": {"concepts": ["a", "y"], "task": "y",
                                                           "states": {"a": ["0", "1"]}}})
    from clinograph.sdk.datasets.alarm import load_dictionary

    with pytest.raises(ConfigError, match="run_concept_federation"):  # arguments of the right types (checked first)
        simulate([], load_dictionary(), config, audit_dir=tmp_path / "audit")


def test_an_unusable_concepts_section_lists_every_problem():
    from clinograph.sdk.concepts.registration import problems
    from clinograph.sdk.config import HospitalConfig

    found = problems(HospitalConfig.model_validate({"task": "concepts", "concepts": {
        "concepts": ["a", "b"], "task": "z", "states": {"q": ["0"]}}}))
    text = "; ".join(found)
    assert "task 'z' must be one of concepts" in text and "states lacks ['a', 'b']" in text and "'q'" in text
