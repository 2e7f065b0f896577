"""Relayed signatures at n = 100 (issue 35, item 4): a hospital verifies O(k + t) of them, not
O(n), and every one it needs is still checked -- a forged relayed key is refused and blamed on
the server that relayed it, and a server showing hospitals different survivor sets is caught."""

from __future__ import annotations

from collections import Counter

import pytest
from clinograph.secure.masking.client import MaskingClient
from clinograph.secure.masking.messages import (
    MAX_VOUCHED_PAYLOAD,
    AdvertiseKeys,
    KeyDirectory,
    UnmaskRequest,
)
from clinograph.secure.masking.params import masked_defaults
from clinograph.secure.masking.server import MaskingServer
from clinograph.secure.wire import Envelope, load_payload, parse_envelope, seal, signed_bytes
from masking_helpers import identities, identity, make_plan, make_updates
from test_masking_rejections import Round

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import PublicIdentity

N = 100
SERVER = identity("server")


class Hundred:
    """A hand-driven masked round of 100 hospitals (default k and t) that counts, per party,
    the Ed25519 verifications it makes and under whose key."""

    def __init__(self, monkeypatch):
        d = masked_defaults(N)
        self.k, self.t = d.neighbours, d.threshold
        self.plan = make_plan(N, threshold=self.t, min_clients=N // 2)
        ids = identities(self.plan)
        peers = {c: ids[c].public for c in self.plan.participants}
        self.server = MaskingServer(plan=self.plan, peers=peers, identity=SERVER)
        updates = make_updates(self.plan, seed=5)
        self.clients = {c: MaskingClient(plan=self.plan, identity=ids[c], server=SERVER.public, peers=peers,
                                         update=updates[c]) for c in self.plan.participants}
        self.verified: dict[str, Counter] = {}
        self.party = "server"
        real = PublicIdentity.verify

        def counted(key, *a, **kw):
            self.verified.setdefault(self.party, Counter())[key.name] += 1
            return real(key, *a, **kw)

        monkeypatch.setattr(PublicIdentity, "verify", counted)
        self.outgoing = {}
        for c, cl in self.clients.items():
            self.party = c
            self.outgoing[c] = cl.first_message()
        self.party = "server"

    def stage(self, answer=True):
        """Deliver the outgoing client messages; return the server's next messages (answered if asked)."""
        self.party = "server"
        for c, data in self.outgoing.items():
            self.server.receive_bytes(c, data)
        msgs = self.server.next_stage() or {}
        self.outgoing = {}
        for c, data in msgs.items() if answer else ():
            self.party = c
            self.outgoing[c] = self.clients[c].handle(data)
        self.party = "server"
        return msgs


def test_a_hospital_at_n_100_verifies_k_key_and_few_consistency_signatures_not_n(monkeypatch):
    rnd = Hundred(monkeypatch)
    requests = None
    for stage in range(5):
        msgs = rnd.stage()
        if stage == 3:
            requests = msgs
    assert sorted(rnd.server.result().contributors) == sorted(rnd.plan.participants)
    # what travels: t consistency signatures in every unmask request and those of the hospitals its
    # confirmed group goes through (min_clients = 50 members, about 4 more a signer: 16..19), not |U3| = 100
    carried = {c: len(load_payload(parse_envelope(data), UnmaskRequest).signatures) for c, data in requests.items()}
    assert rnd.t < min(carried.values()) and max(carried.values()) <= rnd.t + N // 2 // (rnd.k // 2)
    for c in rnd.plan.participants:
        got = rnd.verified[c]
        assert got.pop("server") == 4  # the server's four messages
        relayed = sum(got.values())
        assert relayed == rnd.k + carried[c]  # its k neighbours' key signatures, the consistency signatures
        assert relayed < N // 3  # O(log n + min_clients / k), not O(n)
    assert sum(rnd.verified["server"].values()) == 5 * N  # the server checks every hospital's every message


def test_a_forged_relayed_key_at_n_100_is_refused_and_blamed_on_the_server(monkeypatch):
    rnd = Hundred(monkeypatch)
    victim = rnd.plan.participants[17]
    msgs = rnd.stage(answer=False)  # stage 0 closed: every hospital's key directory, undelivered
    directory = load_payload(parse_envelope(msgs[victim]), KeyDirectory)
    assert len(directory.keys) == rnd.k
    last = directory.keys[-1]  # the last one checked: a check that stopped early would miss it
    swapped = AdvertiseKeys.model_validate_json(last.payload).model_copy(update={"s_pk": bytes(32 * [9])})
    forged = last.model_copy(update={"payload": swapped.model_dump_json().encode()})
    bad = directory.model_copy(update={"keys": (*directory.keys[:-1], forged)})
    with pytest.raises(IntegrityError, match=rf"Relayed 'masked_advertise_keys' message of '{last.client}' does "
                                             r"not verify.*the server relayed, in a message it signed"):
        rnd.clients[victim].handle(seal(bad, SERVER))
    with pytest.raises(ProtocolError, match="expects no server message"):  # and it stays out of the round
        rnd.clients[victim].handle(seal(directory, SERVER))
    other = rnd.plan.participants[18]  # control: an untouched directory is answered
    assert rnd.clients[other].handle(msgs[other])


def test_an_equivocating_server_at_n_100_gets_no_share(monkeypatch):
    """The server tells one hospital that a neighbour of it dropped while the others signed a U3
    that contains it: with only t (not n) signatures forwarded, the view the hospital signed is
    still compared, and a request padded with signatures on another view is refused."""
    rnd = Hundred(monkeypatch)
    for _ in range(3):
        rnd.stage()
    requests = rnd.stage(answer=False)  # every survivor signed the honest U3 = everyone
    victim = rnd.plan.participants[40]
    honest = load_payload(parse_envelope(requests[victim]), UnmaskRequest)
    neighbour = sorted(rnd.server._graph[victim])[0]
    lie = honest.model_copy(update={"survivors": tuple(c for c in honest.survivors if c != neighbour),
                                    "dropped": (neighbour,)})
    with pytest.raises(ProtocolError, match="differs from the survivor set U3 this client signed"):
        rnd.clients[victim].handle(seal(lie, SERVER))
    other = rnd.plan.participants[41]
    mine = load_payload(parse_envelope(requests[other]), UnmaskRequest)
    short = mine.model_copy(update={"signatures": mine.signatures[:rnd.t - 1]})
    with pytest.raises(ProtocolError, match=rf"Only {rnd.t - 1} valid consistency signature"):
        rnd.clients[other].handle(seal(short, SERVER))
    third = rnd.plan.participants[42]  # control: the honest request is answered
    assert rnd.clients[third].handle(requests[third])


@pytest.mark.parametrize("stage", [0, 3], ids=["advertise_keys", "consistency_signature"])
def test_a_padded_message_too_long_to_relay_is_refused_and_charged_to_its_sender(stage):
    """A hospital that pads its validly signed key advertisement or consistency signature with
    JSON whitespace beyond what may be relayed is refused when the server receives it (before,
    the server's relay step failed for everyone); the round completes without it."""
    rnd = Round(n=5, threshold=3)
    for _ in range(stage):
        rnd.deliver()
    culprit = "hosp02"
    env = parse_envelope(rnd.outgoing[culprit])
    padded = env.payload[:-1] + b" " * MAX_VOUCHED_PAYLOAD + b"}"
    context, data = signed_bytes(env.kind, padded)
    forged = Envelope(sender=culprit, kind=env.kind, payload=padded,
                      signature=identity(culprit).sign(data, context=context)).to_bytes()
    with pytest.raises(ProtocolError, match=r"can be relayed to its peers"):
        rnd.server.receive_bytes(culprit, forged)
    assert "can be relayed" in rnd.server.rejected()[culprit]
    del rnd.outgoing[culprit]
    res = rnd.finish()
    assert culprit not in res.contributors or stage == 3  # at stage 3 its masked input is already in the sum
    assert len(res.contributors) >= 4
