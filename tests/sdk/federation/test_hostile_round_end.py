"""A malicious server's round ends and catch-ups (helper hadv5's adversarial pass): the server drives the
in-process transport itself, with messages it signs; the hospitals run unchanged."""

from __future__ import annotations

import numpy as np
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.secure.aggregation.checks import encode_modules
from clinograph.secure.messages import GlobalModel
from clinograph.secure.state import state_digest
from clinograph.secure.wire import seal
from sdk_helpers import small_tables
from test_federation import cfg


def test_a_ckks_hospital_applies_its_decrypted_aggregate_once_and_loads_no_model_of_the_servers(tmp_path):
    """Under ckks the hospitals decrypt the aggregate and the server holds no model (SECURITY.md). Before, a
    server that replayed the empty round end made one hospital apply the round's aggregate a second time, and a
    plaintext model it signed was loaded (at a round end or as a 'catch-up'); ckks plans carry no model digest,
    so nothing later noticed -- the next round ran with every hospital on another model."""
    tables = small_tables()
    sim = build_simulation(tables, tables[0].dictionary, cfg("ckks", rounds=2), audit_dir=tmp_path / "a")
    assert sim.run_round().result.contributors == ("east", "north", "south")
    held = {n: state_digest(h._global) for n, h in sim.hospitals.items()}
    assert len(set(held.values())) == 1
    answers, failed = sim.transport.exchange("end", {"north": {"model": b""}}, round_=0)  # the round end, replayed
    assert answers == {"north": {}} and not failed
    fake = {k: np.full_like(v, 0.5) for k, v in sim.hospitals["south"]._global.items()}
    for number in (1, 7):  # the model following round 0, and a 'catch-up' to a later round
        model = GlobalModel(federation_id=sim.server.federation_id, round=number, spec=sim.server.spec,
                            modules=encode_modules(fake, "<f8"))
        answers, _ = sim.transport.exchange("end", {"south": {"model": seal(model, sim.server.identity)}}, round_=0)
        assert set(answers["south"]) == {"refusal"}
        assert b"the server holds no model" in answers["south"]["refusal"]
    assert {n: state_digest(h._global) for n, h in sim.hospitals.items()} == held
    sim.audit.close()


def test_a_global_model_of_another_federation_is_refused():
    """Before, a server-signed model of another federation (another candidate's run, another study under the same
    server key) numbered as the next round's was loaded -- and, under ckks or before the next plan, kept and
    exported as this federation's. Found replaying one federation's round end into another's."""
    import pytest
    from clinograph.sdk.config import ReleaseSection
    from test_plan_downgrade import SERVER, _hospital, _plan

    from clinograph.core.errors import ProtocolError

    hospital = _hospital(ReleaseSection())
    hospital.task.after_round = lambda: None  # the test task trains nothing after a round
    hospital.on_plan(_plan(hospital, 3, threshold=2))
    before = state_digest(hospital._global)
    other = {k: v + 1.0 for k, v in hospital._global.items()}
    for federation, number in (("other", 1), ("other", 5)):  # the next round's model; a 'catch-up'
        model = GlobalModel(federation_id=federation, round=number, spec=hospital.task.modules.spec(version=1),
                            modules=encode_modules(other, "<f8"))
        with pytest.raises(ProtocolError, match="Global model of federation 'other' sent to this hospital's round 0 "
                                                "of federation 'fed'"):
            hospital.on_round_end(seal(model, SERVER))
    assert state_digest(hospital._global) == before
    model = GlobalModel(federation_id="fed", round=1, spec=hospital.task.modules.spec(version=1),
                        modules=encode_modules(other, "<f8"))
    hospital.on_round_end(seal(model, SERVER))  # this federation's model loads
    assert state_digest(hospital._global) == state_digest(other)


def test_a_catch_up_model_whose_plan_is_refused_is_not_kept(tmp_path):
    """A catch-up model rides with a plan and is loaded before the plan is checked. Before, a plan refused (its
    model digest not this model's; a rolled-back server's) left the hospital on the model no plan vouched for,
    kept in its anchor across restarts; now the hospital puts back the model it held, and keeps a catch-up only
    once a plan naming it passed every check."""
    from clinograph.sdk.config import ReleaseSection
    from clinograph.sdk.federation.client import HospitalClient
    from clinograph.secure.masking.params import masked_plan_options
    from clinograph.secure.messages import RoundPlan
    from clinograph.secure.refusals import REFUSAL_PART
    from clinograph.secure.runtime.transport import answer
    from test_plan_downgrade import ME, SERVER, CountingTask

    task = CountingTask()
    task.after_round = lambda: None
    hospital = HospitalClient(task=task, identity=ME, server=SERVER.public, peers={}, dictionary_hash="d" * 64,
                              federation_id="fed", release=ReleaseSection(), state_dir=tmp_path / "h00")
    spec = task.modules.spec(version=1)

    def plan(round_: int, state) -> bytes:
        return seal(RoundPlan(federation_id="fed", round=round_, participants=("h00", "h01", "h02"), spec=spec,
                              dictionary_hash="d" * 64, secure_mode="masked", strategy="fedavg", min_clients=2,
                              local_epochs=1, global_state_digest=state_digest(state),
                              options={**masked_plan_options(n_clients=3, threshold=2, clip=1.0), "weight.max": 1.0}),
                    SERVER)

    def model(round_: int, state) -> bytes:
        return seal(GlobalModel(federation_id="fed", round=round_, spec=spec, modules=encode_modules(state, "<f8")),
                    SERVER)

    held = dict(hospital._global)
    assert REFUSAL_PART not in answer(hospital, "h00", "plan", {"data": plan(0, held)}, round_=0)[0]
    caught = {k: v + 0.25 for k, v in held.items()}
    other = {k: v - 0.25 for k, v in held.items()}
    parts, _, _ = answer(hospital, "h00", "plan", {"data": plan(3, other), "model": model(3, caught)}, round_=3)
    assert REFUSAL_PART in parts  # the plan names another model: refused ...
    assert state_digest(hospital._global) == state_digest(held)  # ... and the catch-up is not kept
    assert hospital.anchor.model("fed", names=list(held)) is None  # nothing loaded at a round end yet
    parts, _, _ = answer(hospital, "h00", "plan", {"data": plan(4, caught), "model": model(9, caught)}, round_=4)
    assert REFUSAL_PART in parts  # a model numbered after the plan's round: of a round that has not closed
    assert state_digest(hospital._global) == state_digest(held)
    parts, _, _ = answer(hospital, "h00", "plan", {"data": plan(4, caught), "model": model(3, caught)}, round_=4)
    assert REFUSAL_PART not in parts and task.trained == 2  # a plan naming it: trained on it, and it is kept
    assert state_digest(hospital.anchor.model("fed", names=list(held))) == state_digest(caught)


def test_a_first_catch_up_is_refused_with_a_ckks_plan():
    """A hospital that took no plan yet loads a catch-up before it sees the plan's mode; a ckks plan (no model
    digest: the server holds no model) would have trained on whatever model the server sent with it."""
    import pytest
    from clinograph.sdk.config import ReleaseSection
    from test_plan_downgrade import SERVER, _hospital, _plan

    from clinograph.core.errors import ProtocolError

    hospital = _hospital(ReleaseSection(secure_modes=("masked", "ckks")))
    held = state_digest(hospital._global)
    other = {k: v + 1.0 for k, v in hospital._global.items()}
    model = GlobalModel(federation_id="fed", round=2, spec=hospital.task.modules.spec(version=1),
                        modules=encode_modules(other, "<f8"))
    assert hospital.on_round_end(seal(model, SERVER)) is None and state_digest(hospital._global) != held
    with pytest.raises(ProtocolError, match="under secure_mode 'ckks', where the server holds no model, came with a "
                                            "model of the server's"):
        hospital.on_plan(_plan(hospital, 3, threshold=2, round_=2, secure_mode="ckks"))
    assert state_digest(hospital._global) == held and hospital.task.trained == 0


def test_a_global_model_lacking_a_shared_module_is_refused():
    """Before, a model with a subset of the shared modules replaced the hospital's global model by that subset;
    a plan naming its digest would then fail after training, on the delta of a module the global model lacks
    (read from the code, not run here)."""
    import torch
    from clinograph.sdk.config import ReleaseSection
    from clinograph.secure.refusals import REFUSAL_PART
    from clinograph.secure.runtime.transport import answer
    from test_plan_downgrade import SERVER, _hospital, _plan

    from clinograph.core.spec import ModuleKind

    hospital = _hospital(ReleaseSection())
    hospital.task.after_round = lambda: None
    hospital.task.modules.add_submodule("extra", ModuleKind.SHARED, torch.nn.Linear(2, 1))
    hospital._global = hospital.task.modules.state(ModuleKind.SHARED)
    assert REFUSAL_PART not in answer(hospital, "h00", "plan", {"data": _plan(hospital, 3, threshold=2)}, round_=0)[0]
    part = {k: v for k, v in hospital._global.items() if k == "head"}
    model = GlobalModel(federation_id="fed", round=1, spec=hospital.task.modules.spec(version=1),
                        modules=encode_modules(part, "<f8"))
    parts, _, _ = answer(hospital, "h00", "end", {"model": seal(model, SERVER)}, round_=0)
    assert REFUSAL_PART in parts and b"lacks 1 shared module(s) of the model spec (extra)" in parts[REFUSAL_PART]
    assert set(hospital._global) == {"head", "extra"}


def test_a_hospital_sent_a_model_of_the_servers_making_cannot_complete_a_masked_round(tmp_path, monkeypatch):
    """SECURITY.md, "Each hospital trusts the server for the global model it is sent": a server sends south a
    model of its own making with a plan naming it (south checks the plan against that model: it passes) and
    the others the honest plan, and skips its own check of the hospitals' messages. Before (masked/2) the key
    agreement bound federation, round, spec and dictionary only: the round completed with south's update,
    trained on the server's model, in the sum (seen). Now every masked message names the plan's model, each
    hospital refuses its neighbours' keys naming another, signed and audited, and nothing is summed."""
    import pytest
    from clinograph.secure.audit.read import payloads
    from clinograph.secure.masking import server as masking_server
    from clinograph.secure.messages import RoundPlan
    from clinograph.secure.runtime.loop import RoundAborted
    from clinograph.secure.wire import load_payload, parse_envelope

    real = masking_server.check_header
    monkeypatch.setattr(masking_server, "check_header",
                        lambda plan, **kw: real(plan, **{k: v for k, v in kw.items()
                                                         if k not in ("global_state_digest", "plan_digest")}))
    tables = small_tables()
    sim = build_simulation(tables, tables[0].dictionary, cfg("masked", rounds=1), audit_dir=tmp_path / "a")
    server = sim.server
    fake = {k: np.full_like(v, 0.01) for k, v in sim.hospitals["south"]._global.items()}
    honest_exchange = sim.transport.exchange

    def hostile(stage, outgoing, *, round_):
        if stage == "plan":
            plan = load_payload(parse_envelope(outgoing["south"]["data"]), RoundPlan)
            own = plan.model_copy(update={"global_state_digest": state_digest(fake)})
            model = GlobalModel(federation_id=server.federation_id, round=round_, spec=server.spec,
                                modules=encode_modules(fake, "<f8"))
            outgoing = {**outgoing, "south": {"data": seal(own, server.identity),
                                              "model": seal(model, server.identity)}}
        return honest_exchange(stage, outgoing, round_=round_)

    monkeypatch.setattr(sim.transport, "exchange", hostile)
    with pytest.raises(RoundAborted):
        sim.run_round()
    assert state_digest(sim.hospitals["south"]._global) == state_digest(fake)  # it trained on the server's model
    sim.audit.close()
    refused = {p["client"]: p for p in payloads(tmp_path / "a", "hospital_refused")}
    assert set(refused) == {"east", "north", "south"}
    assert all(p["signed"] and p["stage"] == "stage 1" and "starts from another global model" in p["reason"]
               and "sent hospitals different models" in p["reason"] for p in refused.values()), refused
    assert not payloads(tmp_path / "a", "aggregate")  # nothing summed, nothing published


def test_a_validation_aggregate_naming_more_contributors_than_the_round_had_is_refused():
    """GlobalModel.validation (distributed DP with selection) carries the round's Σ w and contributor count of
    metric/validation, from which each hospital reads the noise on the released loss (its std grows with
    √contributors: a larger count makes every round look within noise, so none is worse and no run stops).
    Before, a count above the plan's participants was taken as sent; now the model is refused (helper hrev9)."""
    import pytest
    from clinograph.sdk.config import ReleaseSection
    from clinograph.secure.messages import ValidationAggregate
    from test_plan_downgrade import SERVER, _hospital, _plan

    from clinograph.core.errors import ProtocolError

    hospital = _hospital(ReleaseSection())
    hospital.task.after_round = lambda: None  # the test task trains nothing after a round
    hospital.on_plan(_plan(hospital, 3, threshold=2))
    before = state_digest(hospital._global)
    other = {k: v + 1.0 for k, v in hospital._global.items()}

    def model(contributors: int) -> bytes:
        return seal(GlobalModel(federation_id="fed", round=1, spec=hospital.task.modules.spec(version=1),
                                modules=encode_modules(other, "<f8"),
                                validation=ValidationAggregate(weight=250.0, contributors=contributors)), SERVER)

    with pytest.raises(ProtocolError, match="names 4 contributors, but the round's signed plan has 3 participants"):
        hospital.on_round_end(model(4))
    assert state_digest(hospital._global) == before
    hospital.on_round_end(model(3))  # as many as the plan's participants: loaded
    assert state_digest(hospital._global) == state_digest(other)
