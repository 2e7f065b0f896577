"""Threshold CKKS relayed over the in-process transport: key generation, decryption, dropouts."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.ckks.threshold import Combiner, ThresholdParty, ThresholdPreset
from clinograph.secure.ckks.threshold_relayed import (
    ThresholdKeyHolder,
    open_aggregate,
    run_threshold_keygen,
)
from clinograph.secure.runtime.transport import InProcessTransport

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import Identity

PRESET = ThresholdPreset.THRESHOLD_128
FED = "fed"


class _Hospital:
    """Only the set-up steps of a RoundParticipant (the threshold ones)."""

    def __init__(self, identity: Identity, server: Identity):
        self.name = identity.name
        self.holder = ThresholdKeyHolder(identity=identity, server=server.public, federation_id=FED)

    def on_setup(self, step, parts):
        return self.holder.on_setup(step, parts)


@pytest.fixture
def net():
    server = Identity.generate("server")
    ids = {f"h{i}": Identity.generate(f"h{i}") for i in range(3)}
    hospitals = {n: _Hospital(i, server) for n, i in ids.items()}
    return server, ids, hospitals, InProcessTransport(hospitals)


def _keygen(net, **kw):
    server, ids, hospitals, transport = net
    return run_threshold_keygen(transport, federation_id=FED, participants=tuple(ids),
                                enrolled={n: i.public for n, i in ids.items()}, preset=PRESET, **kw)


def _aggregate(public, n=3, length=100):
    xs = [np.random.default_rng(i).normal(size=length) for i in range(n)]
    return xs, Combiner(public=public, round=1, aggregate=public.add([public.encrypt(x) for x in xs]), contributions=n)


def test_keygen_and_decryption_over_the_transport(net):
    server, ids, hospitals, transport = net
    public, holders = _keygen(net, min_holders=3)
    assert holders == ("h0", "h1", "h2")
    assert all(h.holder.party is not None for h in hospitals.values())
    assert "held" in repr(hospitals["h0"].holder)
    xs, comb = _aggregate(public)
    y = open_aggregate(transport, combiner=comb, identity=server, enrolled={n: i.public for n, i in ids.items()},
                       length=100)
    assert np.abs(y - sum(xs)).max() < 1e-5


def test_a_hospital_silent_at_keygen_is_not_a_holder(net):
    server, ids, hospitals, transport = net
    transport.drop_at(0, {"h2": 0})
    public, holders = _keygen(net, min_holders=2)
    assert holders == ("h0", "h1")
    with pytest.raises(ProtocolError, match="only 2 hospital"):
        _keygen(net, min_holders=3)


def test_a_holder_silent_at_decryption_stops_it_and_is_named(net):
    server, ids, hospitals, transport = net
    public, _ = _keygen(net, min_holders=3)
    _, comb = _aggregate(public)
    transport.drop_at(1, {"h1": 0})
    with pytest.raises(ProtocolError, match=r"from h1 .*N-of-N: re-run key generation"):
        open_aggregate(transport, combiner=comb, identity=server, enrolled={n: i.public for n, i in ids.items()},
                       length=100)


def test_a_holder_with_a_wrong_key_share_is_named(net):
    server, ids, hospitals, transport = net
    public, _ = _keygen(net, min_holders=3)
    hospitals["h2"].holder.party = ThresholdParty(preset=PRESET, federation_id=FED, name="h2")  # lost or swapped
    _, comb = _aggregate(public)
    with pytest.raises(IntegrityError, match="of h2 are not made with their key share"):
        open_aggregate(transport, combiner=comb, identity=server, enrolled={n: i.public for n, i in ids.items()},
                       length=100)


def test_a_request_not_signed_by_the_server_is_refused(net):
    server, ids, hospitals, transport = net
    public, _ = _keygen(net, min_holders=3)
    _, comb = _aggregate(public)
    with pytest.raises(ProtocolError, match="No valid decryption share"):
        open_aggregate(transport, combiner=comb, identity=ids["h0"], enrolled={n: i.public for n, i in ids.items()},
                       length=100)


def test_keygen_for_another_federation_is_refused(net):
    server, ids, hospitals, transport = net
    with pytest.raises(ProtocolError, match="only 0 hospital"):
        run_threshold_keygen(transport, federation_id="other", participants=tuple(ids),
                             enrolled={n: i.public for n, i in ids.items()}, preset=PRESET, min_holders=1)
    with pytest.raises(ProtocolError, match="expected one of tckks/keygen"):
        hospitals["h0"].holder.on_setup("tckks/nope", {})
