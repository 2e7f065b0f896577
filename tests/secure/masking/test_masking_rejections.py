"""Boundary checks: every malformed, replayed or misdirected message is refused with its reason,
and the round completes without that client.

A message that does not authenticate as its sender's message for this round and stage is
refused *unattributed* (:class:`~clinograph.secure.aggregation.checks.Unattributed`): the
hospital it names is not blamed and keeps its place -- its genuine message, if it also comes,
still counts (tested below by injecting the bad bytes before the genuine ones)."""

from __future__ import annotations

import pytest
from clinograph.secure.aggregation.checks import Unattributed
from clinograph.secure.masking import MaskingClient, MaskingServer
from clinograph.secure.masking.messages import AdvertiseKeys, KeyDirectory, MaskedInput
from clinograph.secure.wire import load_payload, parse_envelope, seal
from masking_helpers import expected_sums, identities, identity, make_plan, make_updates, rel_err

from clinograph.core.errors import IntegrityError, ProtocolError

SERVER = identity("server")


class Round:
    """A hand-driven masked round whose client messages a test can tamper with."""

    def __init__(self, n=5, threshold=3, client_plans=None, updates=None, **kw):
        self.plan = make_plan(n, threshold=threshold, **kw)
        self.updates = updates or make_updates(self.plan, seed=11)
        ids = identities(self.plan)
        peers = {c: ids[c].public for c in self.plan.participants}
        self.server = MaskingServer(plan=self.plan, peers=peers, identity=SERVER)
        plans = client_plans or {}
        self.clients = {c: MaskingClient(plan=plans.get(c, self.plan), identity=ids[c], server=SERVER.public,
                                         peers=peers, update=self.updates[c]) for c in self.plan.participants}
        self.outgoing = {c: cl.first_message() for c, cl in self.clients.items()}
        self.stage = 0
        self.sent: dict[int, dict[str, bytes]] = {}
        self.refused: list[tuple[str, Exception]] = []

    def deliver(self, tamper=None, answer=True):
        """Deliver this stage's client messages (``tamper(client, data) -> list of bytes``)."""
        self.sent[self.stage] = dict(self.outgoing)
        for c, data in self.outgoing.items():
            for d in (tamper(c, data) if tamper else [data]):
                try:
                    self.server.receive_bytes(c, d)
                except (ProtocolError, IntegrityError) as exc:
                    self.refused.append((c, exc))
        msgs = self.server.next_stage()
        self.stage += 1
        self.outgoing = {}
        for c, data in (msgs or {}).items() if answer else ():
            try:
                self.outgoing[c] = self.clients[c].handle(data)
            except (ProtocolError, IntegrityError):
                pass
        return msgs

    def finish(self, tamper_at=None, tamper=None):
        while self.stage < 5:
            self.deliver(tamper if self.stage == tamper_at else None)
        return self.server.result()


def refusal(rnd, victim, *, unattributed=True) -> str:
    """The reason the last refused message naming ``victim`` was refused (and how)."""
    exc = [e for c, e in rnd.refused if c == victim][-1]
    assert isinstance(exc, Unattributed) == unattributed, exc
    if unattributed:
        assert victim not in rnd.server.rejected()  # nobody is blamed for bytes they did not sign
    return str(exc)


def before(victim, bad):
    """A tamper function that sends ``bad(data)`` *before* ``victim``'s genuine message."""
    return lambda c, data: [bad(data), data] if c == victim else [data]


def only(victim, bad):
    """A tamper function that replaces ``victim``'s message with ``bad(data)``."""
    return lambda c, data: [bad(data)] if c == victim else [data]


def assert_completed_without(rnd, res, victim):
    assert victim not in res.contributors
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6


def flip_signature(data: bytes) -> bytes:
    env = parse_envelope(data)
    sig = bytes([env.signature[0] ^ 1]) + env.signature[1:]
    return env.model_copy(update={"signature": sig}).to_bytes()


def payload(data: bytes) -> bytes:
    return parse_envelope(data).payload


@pytest.mark.parametrize("stage", [0, 1, 2, 3, 4])
def test_bad_signature_is_refused_at_every_stage(stage):
    rnd = Round()
    res = rnd.finish(tamper_at=stage, tamper=only("hosp01", flip_signature))
    assert "does not verify" in refusal(rnd, "hosp01")
    if stage < 3:
        assert_completed_without(rnd, res, "hosp01")
    else:  # its masked input is already in the sum: it still counts, its shares are not needed
        assert "hosp01" in res.contributors


@pytest.mark.parametrize("stage", [0, 1, 2, 3, 4])
def test_a_forgery_does_not_knock_out_the_hospital_it_names(stage):
    rnd = Round()
    res = rnd.finish(tamper_at=stage, tamper=before("hosp01", flip_signature))
    assert "does not verify" in refusal(rnd, "hosp01")
    assert "hosp01" in res.contributors
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6


def test_unsigned_message_is_refused():
    def strip(data):
        return data[:-64]  # the binary frame without its 64-byte signature

    rnd = Round()
    res = rnd.finish(tamper_at=0, tamper=only("hosp02", strip))
    assert "Malformed envelope" in refusal(rnd, "hosp02")
    assert_completed_without(rnd, res, "hosp02")


def test_message_signed_by_another_hospital_is_refused():
    rnd = Round()
    def impostor(data):
        return seal(AdvertiseKeys.model_validate_json(payload(data)), identity("hosp03"))

    rnd.deliver(tamper=only("hosp02", impostor))
    assert "claims sender 'hosp03' but arrived from 'hosp02'" in refusal(rnd, "hosp02")
    assert "hosp03" not in rnd.server.rejected()  # nor is the hospital whose name the envelope carries


def test_truncated_message_is_refused():
    rnd = Round()
    res = rnd.finish(tamper_at=2, tamper=only("hosp00", lambda d: d[: len(d) // 2]))
    assert "Malformed envelope" in refusal(rnd, "hosp00")
    assert_completed_without(rnd, res, "hosp00")


def test_oversized_message_is_refused_before_parsing():
    rnd = Round()
    res = rnd.finish(tamper_at=2, tamper=only("hosp04", lambda d: d + b" " * rnd.server.max_message_bytes))
    assert "exceeds the limit" in refusal(rnd, "hosp04")
    assert_completed_without(rnd, res, "hosp04")


def test_masked_vector_of_the_wrong_length_is_refused():
    rnd = Round()
    rnd.deliver()
    rnd.deliver()
    c = rnd.clients["hosp03"]
    bad = MaskedInput(**c._header(), words=b"\x00" * 8)
    rnd.outgoing["hosp03"] = seal(bad, identity("hosp03"))
    res = rnd.finish()
    assert "expected" in rnd.server.rejected()["hosp03"] and "4 bytes x" in rnd.server.rejected()["hosp03"]
    assert_completed_without(rnd, res, "hosp03")


def test_replay_within_a_stage_is_refused_but_the_original_counts():
    rnd = Round()
    res = rnd.finish(tamper_at=2, tamper=lambda c, d: [d, d] if c == "hosp01" else [d])
    assert "re-send" in refusal(rnd, "hosp01").lower() or "replay" in refusal(rnd, "hosp01").lower()
    assert "hosp01" in res.contributors  # the replay did not add its vector twice
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6


def test_replay_of_an_earlier_stage_is_refused_as_wrong_stage():
    rnd = Round()
    rnd.deliver()
    res = rnd.finish(tamper_at=1, tamper=only("hosp02", lambda d: rnd.sent[0]["hosp02"]))
    assert "stage" in refusal(rnd, "hosp02").lower()
    assert_completed_without(rnd, res, "hosp02")


def test_out_of_round_message_is_refused():
    plan = make_plan(5, threshold=3)
    rnd = Round(client_plans={"hosp04": make_plan(5, threshold=3, round_=plan.round + 1)})
    res = rnd.finish()
    assert "round" in refusal(rnd, "hosp04").lower()
    assert_completed_without(rnd, res, "hosp04")


def test_wrong_dictionary_hash_is_refused():
    other = make_plan(5, threshold=3).model_copy(update={"dictionary_hash": "e" * 64})
    rnd = Round(client_plans={"hosp00": other})
    res = rnd.finish()
    assert "Wrong feature dictionary" in rnd.server.rejected()["hosp00"]
    assert_completed_without(rnd, res, "hosp00")


def test_message_from_a_non_participant_is_refused():
    rnd = Round()
    stranger = identity("stranger")
    with pytest.raises(Unattributed, match="not enrolled"):
        rnd.server.receive_bytes("stranger", seal(MaskedInput(
            federation_id="fed-test", round=7, client="stranger", spec_digest="0" * 64, dictionary_hash="d" * 64,
            global_state_digest="0" * 64, plan_digest="0" * 64, words=b""), stranger))
    assert "stranger" not in rnd.server.rejected()


def test_client_refuses_a_relayed_key_the_peer_did_not_sign():
    """A server that swaps a neighbour's round key (man in the middle) is caught by the client."""
    victim = "hosp00"
    rnd2 = Round()
    for c, data in rnd2.outgoing.items():
        rnd2.server.receive_bytes(c, data)
    msgs = rnd2.server.next_stage()
    directory = load_payload(parse_envelope(msgs[victim]), KeyDirectory)
    relayed = directory.keys[0]
    swapped = AdvertiseKeys.model_validate_json(relayed.payload).model_copy(update={"s_pk": bytes(32 * [7])})
    forged = relayed.model_copy(update={"payload": swapped.model_dump_json().encode()})  # the peer's signature kept
    bad = directory.model_copy(update={"keys": (forged, *directory.keys[1:])})
    with pytest.raises(IntegrityError, match="does not verify"):
        rnd2.clients[victim].handle(seal(bad, SERVER))


def test_client_refuses_server_messages_not_signed_by_the_server():
    rnd = Round()
    for c, data in rnd.outgoing.items():
        rnd.server.receive_bytes(c, data)
    msgs = rnd.server.next_stage()
    directory = load_payload(parse_envelope(msgs["hosp01"]), KeyDirectory)
    with pytest.raises(IntegrityError):
        rnd.clients["hosp01"].handle(seal(directory, identity("hosp02")).replace(b'"hosp02"', b'"server"', 1))
    with pytest.raises(ProtocolError, match="not for 'hosp02'"):
        rnd.clients["hosp02"].handle(msgs["hosp01"])


@pytest.mark.parametrize("how", ["other_round", "other_peer"])
def test_client_refuses_a_relayed_advertisement_from_another_round_or_peer(how):
    """The envelope signature serves as the key signature (consistency.py): a server replaying a
    neighbour's genuine advertisement from an earlier round, or relaying one neighbour's as
    another's, is refused like a forged key."""
    victim = "hosp00"
    rnd = Round()
    for c, data in rnd.outgoing.items():
        rnd.server.receive_bytes(c, data)
    directory = load_payload(parse_envelope(rnd.server.next_stage()[victim]), KeyDirectory)
    first, second = directory.keys[0], directory.keys[1]
    if how == "other_round":
        earlier = Round(round_=6)
        env = parse_envelope(earlier.outgoing[first.client])
        relayed, err, match = first.model_copy(update={"payload": env.payload, "signature": env.signature}), \
            ProtocolError, "for another client, federation, round"
    else:
        relayed, err, match = second.model_copy(update={"client": first.client}), IntegrityError, "does not verify"
    bad = directory.model_copy(update={"keys": (relayed, *directory.keys[1:])})
    with pytest.raises(err, match=match):
        rnd.clients[victim].handle(seal(bad, SERVER))


@pytest.mark.parametrize("key", ["s_pk", "c_pk"])
def test_a_low_order_advertised_key_is_refused_by_name_at_stage_0(key):
    """Relayed, a low-order key would make every neighbour's agreement fail at stage 2 (an
    unattributed ValueError there): the server refuses the hospital that advertised it, and the
    round completes without it."""
    rnd = Round()

    def low_order(data):
        adv = AdvertiseKeys.model_validate_json(payload(data)).model_copy(update={key: bytes(32)})
        return seal(adv, identity("hosp02"))

    res = rnd.finish(tamper_at=0, tamper=only("hosp02", low_order))
    assert "advertised an unusable " + key in rnd.server.rejected()["hosp02"]
    assert_completed_without(rnd, res, "hosp02")


def test_a_relayed_low_order_pairwise_key_is_a_protocol_error_naming_the_peer():
    """Against a server that relays one anyway (dishonest, or an older one): the client's refusal
    names the peer, it is not a bare ValueError."""
    from clinograph.secure.masking.messages import ForwardShares

    rnd = Round()
    rnd.deliver()
    victim = "hosp00"
    forwarded = load_payload(parse_envelope(rnd.deliver()[victim]), ForwardShares)
    cl = rnd.clients[victim]  # it has its neighbours' keys and shares: stage 2 can be run again by hand
    peer = sorted(cl._masked_with)[0]
    cl._held = {victim: cl._held[victim]}
    cl._peer_keys[peer] = (cl._peer_keys[peer][0], bytes(32))  # as if the server had relayed a low-order s_pk
    with pytest.raises(ProtocolError, match=f"Pairwise-mask key of '{peer}' is invalid"):
        cl._masked_input(forwarded)
