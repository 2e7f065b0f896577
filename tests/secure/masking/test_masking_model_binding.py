"""A masked round binds the global model it starts from (masked/3): the plan's
``global_state_digest`` travels, signed, in every client message, and each hospital checks the
relayed key advertisements and consistency signatures of its peers against its own plan's.

Before (masked/2) the key agreement and consistency check bound federation, round, ModelSpec and
dictionary only, so a server could send one hospital a plan naming a model of its own making (the
hospital checks the plan against the model it was sent, nothing more) and the round completed with
that hospital's update, trained on the server's model, in the sum (SECURITY.md, "Each hospital
trusts the server for the global model it is sent"). Seen failing before the fix: the round below
completed with all five contributors."""

from __future__ import annotations

import pytest
from clinograph.secure.masking import server as masking_server
from clinograph.secure.masking.messages import AdvertiseKeys, KeyDirectory
from clinograph.secure.wire import load_payload, parse_envelope, seal
from test_masking_rejections import SERVER, Round, assert_completed_without

from clinograph.core.errors import IntegrityError, ProtocolError

OTHER = "1" * 64  # the digest of the model the server made for one hospital


def _other_model(rnd: Round) -> dict:
    return {"hosp02": rnd.plan.model_copy(update={"global_state_digest": OTHER})}


def test_a_hospital_sent_another_model_cannot_complete_a_round_with_the_others(monkeypatch):
    """A hostile server (it skips its own header check) gives hosp02 a plan whose model digest differs and
    relays every message: each hospital refuses at the key directory, naming the reason; nothing is summed."""
    real = masking_server.check_header

    def lenient(plan, **kw):  # the server's own check of the starting model and plan, left out
        kw.pop("global_state_digest", None)
        kw.pop("plan_digest", None)
        return real(plan, **kw)

    monkeypatch.setattr(masking_server, "check_header", lenient)
    rnd = Round(n=5, threshold=3)  # 5 participants: the complete graph, hosp02 is everyone's neighbour
    rnd = Round(n=5, threshold=3, client_plans=_other_model(rnd))
    for c, data in rnd.outgoing.items():
        rnd.server.receive_bytes(c, data)
    assert rnd.server.rejected() == {}  # the hostile server lets hosp02's advertisement through
    refusals = {}
    for c, data in rnd.server.next_stage().items():
        with pytest.raises((ProtocolError, IntegrityError)) as exc:
            rnd.clients[c].handle(data)
        refusals[c] = str(exc.value)
    assert set(refusals) == set(rnd.plan.participants)
    for c, why in refusals.items():
        peer = "'hosp00'" if c == "hosp02" else "'hosp02'"  # hosp02 refuses its first neighbour; the others hosp02
        assert f"Relayed 'masked_advertise_keys' message of {peer} starts from another global model" in why, why
        assert "sent hospitals different models" in why
    rnd.server.next_stage()  # nobody shared keys: the stage closes below the threshold
    with pytest.raises(ProtocolError, match="abort|below"):
        rnd.server.result()


def test_an_honest_server_refuses_an_advertisement_naming_another_model_and_completes_without_it():
    rnd = Round(n=5, threshold=3)
    rnd = Round(n=5, threshold=3, client_plans=_other_model(rnd))
    res = rnd.finish()
    assert "starts from another global model" in rnd.server.rejected()["hosp02"]
    assert_completed_without(rnd, res, "hosp02")


def test_every_client_message_names_the_plans_model():
    rnd = Round(n=5, threshold=3)
    advertised = {c: load_payload(parse_envelope(d), AdvertiseKeys) for c, d in rnd.outgoing.items()}
    assert {a.global_state_digest for a in advertised.values()} == {rnd.plan.global_state_digest}
    res = rnd.finish()
    assert set(res.contributors) == set(rnd.plan.participants)


def test_a_relayed_advertisement_for_another_model_is_refused_even_among_matching_ones():
    """The relayed payload is the peer's own signed bytes: a server cannot rewrite the digest in it (the
    signature breaks), so a directory mixing models is refused at the first mismatching key."""
    rnd = Round(n=5, threshold=3)
    other = Round(n=5, threshold=3, client_plans=_other_model(rnd))
    for c, data in rnd.outgoing.items():
        rnd.server.receive_bytes(c, data)
    directory = load_payload(parse_envelope(rnd.server.next_stage()["hosp00"]), KeyDirectory)
    swapped = parse_envelope(other.outgoing["hosp02"])
    keys = tuple(k.model_copy(update={"payload": swapped.payload, "signature": swapped.signature})
                 if k.client == "hosp02" else k for k in directory.keys)
    with pytest.raises(ProtocolError, match="starts from another global model"):
        rnd.clients["hosp00"].handle(seal(directory.model_copy(update={"keys": keys}), SERVER))


def test_a_hospital_sent_another_plan_for_the_same_model_cannot_complete_a_round_with_the_others(monkeypatch):
    """The same with a plan that differs in anything else (here its local epochs; as well its participants,
    min_clients, weights or options): every masked message also names the plan's digest (``RoundPlan.digest``),
    so each hospital refuses the keys of a peer that answers another plan. Before (this session's first
    masked/3, the model digest alone) such a round completed."""
    real = masking_server.check_header

    def lenient(plan, **kw):  # the hostile server skips its own checks of the model and plan
        kw.pop("global_state_digest", None)
        kw.pop("plan_digest", None)
        return real(plan, **kw)

    monkeypatch.setattr(masking_server, "check_header", lenient)
    rnd = Round(n=5, threshold=3)
    other = {"hosp02": rnd.plan.model_copy(update={"local_epochs": rnd.plan.local_epochs + 1})}
    rnd = Round(n=5, threshold=3, client_plans=other)
    for c, data in rnd.outgoing.items():
        rnd.server.receive_bytes(c, data)
    refusals = {}
    for c, data in rnd.server.next_stage().items():
        with pytest.raises(ProtocolError) as exc:
            rnd.clients[c].handle(data)
        refusals[c] = str(exc.value)
    assert set(refusals) == set(rnd.plan.participants)
    assert all("answers another plan" in why and "different plans for one round" in why for why in refusals.values())


def test_an_honest_server_refuses_a_message_answering_another_plan():
    rnd = Round(n=5, threshold=3)
    other = {"hosp02": rnd.plan.model_copy(update={"local_epochs": rnd.plan.local_epochs + 1})}
    rnd = Round(n=5, threshold=3, client_plans=other)
    res = rnd.finish()
    assert "names another plan" in rnd.server.rejected()["hosp02"]
    assert_completed_without(rnd, res, "hosp02")


def test_the_plan_digest_is_the_same_for_the_sealed_and_the_received_plan_and_never_inherited_by_a_copy():
    """Every hospital computes it from the plan it parsed, the server from the one it built: they must agree
    (or no masked round completes); a copy with another field must not keep its original's memo
    (pydantic's model_copy copies private attributes)."""
    from clinograph.secure.messages import RoundPlan

    rnd = Round(n=5, threshold=3)
    received = load_payload(parse_envelope(seal(rnd.plan, SERVER)), RoundPlan)
    assert received.digest() == rnd.plan.digest() and len(rnd.plan.digest()) == 64
    changed = rnd.plan.model_copy(update={"min_clients": rnd.plan.min_clients + 1})
    assert changed.digest() != rnd.plan.digest()
    assert rnd.plan.model_copy().digest() == rnd.plan.digest()


def test_a_copy_of_a_copy_takes_no_memo_from_a_freed_original():
    """The memo named the object that computed it by its id. A copy made without computing its own digest
    carried its original's memo; a copy of that copy, made after the original was freed, could be given the
    freed original's id -- and its digest, with other fields (CPython reused the id 19-49 times in 20-50
    tries). The memo now holds a weak reference (seen failing with the id)."""
    import copy
    import gc

    from clinograph.secure.messages import RoundPlan

    base = Round(n=5, threshold=3).plan
    seen = []  # (copying, id reused, digest, fields): RoundPlans made only after the loop
    for how in ("model_copy", "copy", "deepcopy") * 10:
        original = base.model_copy(update={"round": base.round + 1})
        original.digest()
        middle = original.model_copy() if how == "model_copy" else getattr(copy, how)(original)  # no digest
        address = id(original)
        del original
        gc.collect(0)  # the young generation: a full collection costs ~0.7 s in a loaded test worker
        last = middle.model_copy(update={"min_clients": base.min_clients + 2})
        seen.append((how, id(last) == address, last.digest(), last.model_dump()))
        del middle, last
    assert any(reused for _, reused, _, _ in seen)  # the case the test is about did occur
    for how, _, digest, fields in seen:
        assert digest == RoundPlan.model_validate(fields).digest(), how
    import pickle  # plans travel to worker processes: the memo (a weak reference) is not pickled, the copy computes

    assert pickle.loads(pickle.dumps(base)).digest() == base.digest()
