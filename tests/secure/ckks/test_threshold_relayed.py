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


# -- t-of-N: every holder's key share re-shared at set-up (threshold_reshare) ------------------------

class _Peer(_Hospital):
    def __init__(self, identity: Identity, server: Identity, peers):
        self.name = identity.name
        self.holder = ThresholdKeyHolder(identity=identity, server=server.public, federation_id=FED, peers=peers,
                                         min_threshold=2)  # each hospital's own rule: t-of-N from t = 2


@pytest.fixture(scope="module")
def tnet():
    """2-of-3: keys re-shared once for the module (each test restores what it changes)."""
    server = Identity.generate("server")
    ids = {f"h{i}": Identity.generate(f"h{i}") for i in range(3)}
    enrolled = {n: i.public for n, i in ids.items()}
    hospitals = {n: _Peer(i, server, enrolled) for n, i in ids.items()}
    transport = InProcessTransport(hospitals)
    public, _ = run_threshold_keygen(transport, federation_id=FED, participants=tuple(ids), enrolled=enrolled,
                                     preset=PRESET, min_holders=3, distribute=True, threshold=2)
    return server, enrolled, hospitals, transport, public


def _tcombiner(public, present, n=3, round_=1):
    xs = [np.random.default_rng(i).normal(size=100) for i in range(n)]
    return xs, Combiner(public=public, round=round_, aggregate=public.add([public.encrypt(x) for x in xs]),
                        contributions=n, present=present)


def test_t_of_n_any_t_holders_decrypt_a_dropped_one_is_named_and_others_step_in(tnet):
    server, enrolled, hospitals, transport, public = tnet
    assert public.rule == "2-of-3"
    assert all(h.holder.party.threshold == 2 and h.holder.party._s is not None for h in hospitals.values())  # s_i kept: it encrypts its own updates
    for present in (("h0", "h1"), ("h1", "h2"), ("h0", "h2"), ("h0", "h1", "h2")):
        xs, comb = _tcombiner(public, present)
        y = open_aggregate(transport, combiner=comb, identity=server, enrolled=enrolled, length=100)
        assert np.abs(y - sum(xs)).max() < 1e-5, present
    _, comb = _tcombiner(public, ("h0", "h1"), round_=9)
    transport.drop_at(9, {"h1": 0})
    with pytest.raises(ProtocolError, match=r"No valid decryption share from h1 .*Ask another 2"):
        open_aggregate(transport, combiner=comb, identity=server, enrolled=enrolled, length=100)


def test_t_of_n_fewer_than_t_decrypt_nothing(tnet):
    from clinograph.secure.hazmat import threshold_ckks as T

    server, enrolled, hospitals, transport, public = tnet
    with pytest.raises(ProtocolError, match="at least 2 key holders; 1 present"):
        _tcombiner(public, ("h0",))
    _, comb = _tcombiner(public, ("h0", "h1"))
    ring, ctx = public._c.ring, public._c.context
    shares = {n: hospitals[n].holder.party.decryption_share(comb.request) for n in ("h0", "h1")}
    k = 1 - comb._canary_at if comb._canary_at <= 1 else 0  # an aggregate c1, not the canary

    def plaintext_bits(names):
        d = [public._c.poly(shares[n].shares[k], ring.data_count, n) for n in names]
        m = T.combine_decryption(c0=comb._c0[0], shares=d, ring=ring)
        coeffs = T.to_coefficients(m, ring=ring, context=ctx, parms_id=ring.data_parms_id)
        return float(np.log2(np.abs(T.centered_approx(coeffs, ring)).max() + 1))

    assert plaintext_bits(("h0", "h1")) < 100  # Delta*m + noise: scale 2^96, |m| < 8
    assert plaintext_bits(("h0",)) > 115  # one share of two: uniform mod q (~2^119)
    # each share is masked by its part of a sharing of zero: d_k - lambda_k*S_k*c1 is uniform, not the smudging
    q = ring.q(ring.data_count)
    c1 = public._c.poly(comb.request.c1[k], ring.data_count, "c1")
    for n in ("h0", "h1"):
        party = hospitals[n].holder.party
        unmasked = T.submod(public._c.poly(shares[n].shares[k], ring.data_count, n),
                            T.mulmod(c1, party._secret_for(comb.request), q), q)
        coeffs = T.to_coefficients(unmasked, ring=ring, context=ctx, parms_id=ring.data_parms_id)
        assert np.log2(np.abs(T.centered_approx(coeffs, ring)).max() + 1) > 115, n
    with pytest.raises(ProtocolError, match="at least t = 2 distinct key holders"):
        hospitals["h0"].holder.party.decryption_share(comb.request.model_copy(update={"present": ("h0",)}))
    with pytest.raises(ProtocolError, match="with itself among"):
        hospitals["h0"].holder.party.decryption_share(comb.request.model_copy(update={"present": ("h1", "h2")}))


def test_t_of_n_a_share_under_a_wrong_key_share_is_refused_naming_the_present_set(tnet):
    server, enrolled, hospitals, transport, public = tnet
    party = hospitals["h2"].holder.party
    kept = party._shamir
    stale = np.random.default_rng(7).integers(0, 2**40, size=kept[0].shape, dtype=np.uint64)  # below every q_j
    party._shamir = (stale, kept[1], kept[2])  # a lost or swapped share, same index
    try:
        _, comb = _tcombiner(public, ("h1", "h2"))
        with pytest.raises(IntegrityError, match="share of one of h1, h2 is not made with its key share"):
            open_aggregate(transport, combiner=comb, identity=server, enrolled=enrolled, length=100)
        _, comb = _tcombiner(public, ("h0", "h1"))  # another present set without h2 opens the sum
        assert open_aggregate(transport, combiner=comb, identity=server, enrolled=enrolled, length=100).size == 100
    finally:
        party._shamir = kept


def test_t_of_n_keygen_needs_t_holders(net):
    server, ids, hospitals, transport = net
    with pytest.raises(ProtocolError, match="needs distribute=True"):
        _keygen(net, min_holders=1, threshold=2)
    parts = {"federation": FED.encode(), "preset": PRESET.value.encode(), "seed": bytes(32), "threshold": b"1"}
    with pytest.raises(ProtocolError, match="every holder would hold the whole key"):  # 1-of-N: no threshold at all
        hospitals["h0"].holder.on_setup("tckks/keygen", parts)


# -- a re-share X25519 key of low order (the class of the small-order Ed25519 keys of commit 77fa23b) -------

class _LowOrderKx(_Peer):
    """A holder that advertises the all-zero X25519 point (u = 0: every agreement with it is zero)."""

    change = {"x25519": bytes(32)}

    def __init__(self, identity: Identity, server: Identity, peers):
        super().__init__(identity, server, peers)
        self.identity = identity

    def on_setup(self, step, parts):
        from clinograph.secure.wire import seal

        out = self.holder.on_setup(step, parts)
        if step == "tckks/keygen":
            r = self.holder._resharer
            r.key = r.key.model_copy(update=self.change)
            out["kx"] = seal(r.key, self.identity)
        return out


class _OtherT(_LowOrderKx):
    """A holder whose signed re-share key is for another t than the one asked."""

    change = {"threshold": 3}


def test_t_of_n_a_holder_with_a_low_order_reshare_key_is_left_out_and_named_by_its_peers():
    """Before: the server relayed it, every honest holder's first wrap to it raised a bare ValueError
    and the server blamed them all ("h0, h1, h2 did not confirm ... not a Clinograph error")."""
    server = Identity.generate("server")
    ids = {f"h{i}": Identity.generate(f"h{i}") for i in range(3)}
    enrolled = {n: i.public for n, i in ids.items()}
    hospitals = {n: (_LowOrderKx if n == "h2" else _Peer)(i, server, enrolled) for n, i in ids.items()}
    step = {"federation": FED.encode(), "preset": PRESET.value.encode(), "seed": bytes(range(32)), "threshold": b"2"}
    answers = {n: h.on_setup("tckks/keygen", dict(step)) for n, h in hospitals.items()}
    relayed = {"seed": step["seed"], **{f"share/{n}": a["share"] for n, a in answers.items()},
               **{f"kx/{n}": a["kx"] for n, a in answers.items()}}
    for honest in ("h0", "h1"):  # a server that relays the key anyway: each holder refuses it, naming h2
        with pytest.raises(ProtocolError, match="re-share X25519 key of 'h2' is a low-order point"):
            hospitals[honest].on_setup("tckks/public", dict(relayed))
    # an honest server leaves h2 out at key generation; the two others hold a 2-of-2 key
    public, holders = run_threshold_keygen(InProcessTransport(hospitals), federation_id=FED, participants=tuple(ids),
                                           enrolled=enrolled, preset=PRESET, min_holders=2, distribute=True,
                                           threshold=2)
    assert holders == ("h0", "h1") and public.threshold == 2


def test_t_of_n_a_holder_whose_reshare_key_names_another_t_is_left_out_at_key_generation():
    """Before, the server relayed it and every peer refused it, so set-up failed for all holders."""
    server = Identity.generate("server")
    ids = {f"h{i}": Identity.generate(f"h{i}") for i in range(3)}
    enrolled = {n: i.public for n, i in ids.items()}
    hospitals = {n: (_OtherT if n == "h2" else _Peer)(i, server, enrolled) for n, i in ids.items()}
    _, holders = run_threshold_keygen(InProcessTransport(hospitals), federation_id=FED, participants=tuple(ids),
                                      enrolled=enrolled, preset=PRESET, min_holders=2, distribute=True, threshold=2)
    assert holders == ("h0", "h1")
