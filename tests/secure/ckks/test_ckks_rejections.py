"""Negative cases at the server boundary: each is refused with a precise reason and the round
goes on without that message. A message validly signed by its sender for this round and stage
but wrong in content is recorded against the sender in rejected(); one that does not
authenticate as the sender's message for this round and stage (bad signature, another round or
stage, an unparsable payload) is refused *unattributed*: nobody is blamed for bytes they may
not have sent, and the named hospital's genuine message would still count."""

from __future__ import annotations

import pytest
from ckks_helpers import (
    FED,
    Ceremony,
    ceremony,
    client_for,
    identity,
    make_plan,
    make_updates,
    names,
    relay,
    server_for,
)
from clinograph.secure.aggregation.checks import Unattributed
from clinograph.secure.ckks import CkksPreset, CkksRecipientKey
from clinograph.secure.ckks.layout import SlotLayout
from clinograph.secure.ckks.messages import CkksUpdate
from clinograph.secure.wire import Envelope, open_envelope, parse_envelope, seal

from clinograph.core.errors import IntegrityError, ProtocolError

N = 3


@pytest.fixture(scope="module")
def cer():
    return ceremony(N)


def _round(cer, plan, tamper, *, victim="hosp02", match, attributed=True):
    """Let ``tamper`` rewrite the victim's first message; check the refusal (attributed to the
    victim or not) and that the others still get a correct aggregate."""
    updates = make_updates(plan, seed=3)
    clients = {c: client_for(cer, plan, c, u) for c, u in updates.items()}
    first = {c: cl.first_message() for c, cl in clients.items()}
    first[victim] = tamper(first[victim])
    server = server_for(cer, plan)
    with pytest.raises((ProtocolError, IntegrityError), match=match) as raised:
        server.receive(parse_envelope(first[victim]))
    assert isinstance(raised.value, Unattributed) != attributed
    if attributed:
        assert victim in server.rejected() and victim not in server.expected
    else:
        assert victim not in server.rejected() and victim in server.expected  # still waited for
    others = {c: d for c, d in first.items() if c != victim}
    results, rejected = relay(server, clients, others)
    assert set(rejected) == ({victim} if attributed else set())
    assert set(results) == set(others)
    for got in results.values():
        assert got.contributors == tuple(sorted(others))
    return rejected[victim] if attributed else str(raised.value)


def _reseal(data: bytes, **changes) -> bytes:
    env = parse_envelope(data)
    msg = open_envelope(env, sender=identity(env.sender).public, model=CkksUpdate)
    return seal(msg.model_copy(update=changes), identity(env.sender))


def test_replay_is_refused_and_first_update_kept(cer):
    plan = make_plan(cer, N)
    updates = make_updates(plan)
    clients = {c: client_for(cer, plan, c, u) for c, u in updates.items()}
    first = {c: cl.first_message() for c, cl in clients.items()}
    server = server_for(cer, plan)
    for d in first.values():
        server.receive(parse_envelope(d))
    with pytest.raises(Unattributed, match="Replayed message: an exact re-send of 'hosp01'.*first was kept"):
        server.receive(parse_envelope(first["hosp01"]))
    results, rejected = relay(server, clients, {})
    assert "hosp01" not in rejected  # a re-send may come from anyone on the path: not held against hosp01
    assert results["hosp01"].contributors == tuple(names(N))  # replay did not double-count


def test_out_of_round(cer):
    plan = make_plan(cer, N)
    other_round = make_plan(cer, N, round_=plan.round + 1)
    upd = make_updates(other_round)["hosp02"]
    stale = client_for(cer, other_round, "hosp02", upd).first_message()
    reason = _round(cer, plan, lambda _: stale, match="Out-of-round message: it is for round 5", attributed=False)
    assert "current round is 4" in reason


def test_wrong_stage_kind_and_after_close(cer):
    plan = make_plan(cer, N)
    wrong_kind = CkksRecipientKey.generate(identity=identity("hosp02"), federation_id=FED).request()
    _round(cer, plan, lambda _: wrong_kind, match="Wrong stage: expected a 'ckks_update' message, got 'ckks_key_request'",
           attributed=False)
    # an update after the stage closed
    server = server_for(cer, plan)
    late = client_for(cer, plan, "hosp01", make_updates(plan)["hosp01"]).first_message()
    for c in ("hosp00", "hosp02"):
        server.receive(parse_envelope(client_for(cer, plan, c, make_updates(plan)[c]).first_message()))
    server.next_stage()
    with pytest.raises(ProtocolError, match="Wrong stage: the ckks round is 'done'"):
        server.receive(parse_envelope(late))


def test_wrong_dictionary_hash(cer):
    plan = make_plan(cer, N)
    _round(cer, plan, lambda d: _reseal(d, dictionary_hash="e" * 64), match="Wrong feature dictionary")


def test_bad_signature(cer):
    plan = make_plan(cer, N)

    def forge(d: bytes) -> bytes:  # signed by hosp00's key but claiming to be hosp02
        env = parse_envelope(d)
        sig = parse_envelope(seal(open_envelope(env, sender=identity("hosp02").public, model=CkksUpdate),
                                  identity("hosp00"))).signature
        return Envelope(sender="hosp02", kind=env.kind, payload=env.payload, signature=sig).to_bytes()

    _round(cer, plan, forge, match="Signature by 'hosp02' does not verify", attributed=False)


def test_truncated_ciphertext(cer):
    plan = make_plan(cer, N)

    def cut(d: bytes) -> bytes:
        msg = open_envelope(parse_envelope(d), sender=identity("hosp02").public, model=CkksUpdate)
        return _reseal(d, ciphertexts=(msg.ciphertexts[0][:-1000],) + msg.ciphertexts[1:])

    _round(cer, plan, cut, match="Ciphertext 0 from 'hosp02' is truncated, corrupt")


def test_oversized_ciphertext_and_oversized_update(cer):
    plan = make_plan(cer, N)

    def pad(d: bytes) -> bytes:
        msg = open_envelope(parse_envelope(d), sender=identity("hosp02").public, model=CkksUpdate)
        return _reseal(d, ciphertexts=(msg.ciphertexts[0] + bytes(300_000),) + msg.ciphertexts[1:])

    # model_copy does not validate, so this is what a malicious client can put on the wire
    reason = _round(cer, plan, pad, match="Malformed 'ckks_update' payload")  # signed by hosp02: its own doing
    assert "ciphertexts" in reason and "at most 300000 bytes" in reason

    def bulk(d: bytes) -> bytes:  # a valid message far larger than this plan's ciphertexts can be
        msg = open_envelope(parse_envelope(d), sender=identity("hosp02").public, model=CkksUpdate)
        return _reseal(d, ciphertexts=msg.ciphertexts * 6)

    _round(cer, plan, bulk, match="naming 'hosp02' exceeds the stage limit", attributed=False)  # refused before its signature is checked

    def extra(d: bytes) -> bytes:
        msg = open_envelope(parse_envelope(d), sender=identity("hosp02").public, model=CkksUpdate)
        return _reseal(d, ciphertexts=msg.ciphertexts + msg.ciphertexts[:1])

    _round(cer, plan, extra, match="has 3 ciphertexts; this plan needs 2")


def test_update_under_another_ceremony_is_refused(cer):
    plan = make_plan(cer, N)
    stranger = Ceremony(names(N))  # same preset, different key
    their_plan = make_plan(stranger, N)
    theirs = client_for(stranger, their_plan, "hosp02", make_updates(their_plan)["hosp02"]).first_message()
    _round(cer, plan, lambda _: theirs, match="encrypted under another CKKS context")


def test_ciphertext_under_other_parameters_is_refused_even_with_the_right_digest(cer):
    plan = make_plan(cer, N)
    nv = ceremony(N, CkksPreset.NVFLARE_DEFAULT)
    ring = nv.keyrings["hosp02"]
    vec = SlotLayout.from_plan(plan).pack(make_updates(plan)["hosp02"], client="hosp02", tag=1500.0)
    foreign = tuple(ring.context.encrypt(vec))
    _round(cer, plan, lambda d: _reseal(d, ciphertexts=foreign),
           match="Ciphertext 0 from 'hosp02' is truncated, corrupt or not under this round's CKKS parameters")


def test_non_participant_and_foreign_federation(cer):
    plan = make_plan(cer, N)
    _round(cer, plan, lambda d: _reseal(d, federation_id="other-fed"), match="for federation 'other-fed'",
           attributed=False)  # could be the hospital's genuine message to another federation
    _round(cer, plan, lambda d: _reseal(d, client="hosp01"), match="names client 'hosp01' but was sent by 'hosp02'")
