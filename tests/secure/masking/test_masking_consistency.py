"""The signed consistency check (Bonawitz et al. 2017, round 4): a server that shows clients
different survivor sets, or forwards forged, foreign, repeated or too few signatures, gets no
share; the honest path, with dropouts at the new stage, still equals the plaintext sum."""

from __future__ import annotations

import pytest
from clinograph.secure.masking.consistency import survivors_digest
from clinograph.secure.masking.messages import (
    ConsistencyRequest,
    ConsistencySignature,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
)
from clinograph.secure.transport import run_aggregation
from clinograph.secure.wire import load_payload, parse_envelope, seal
from masking_helpers import expected_sums, identities, identity, make_plan, make_updates, rel_err
from test_masking_rejections import Round

from clinograph.core.errors import ProtocolError
from clinograph.core.labels import SIG_MESSAGE

SERVER = identity("server")
VICTIM = "hosp01"


def to_consistency_stage(n=5, threshold=3, **kw):
    """A round whose masked inputs are in; the server's own U3 requests are not delivered."""
    rnd = Round(n=n, threshold=threshold, **kw)
    rnd.deliver()
    rnd.deliver()
    rnd.deliver(answer=False)
    return rnd


def show(rnd, client, u3):
    """The (lying) server shows ``client`` the survivor set ``u3``; returns its signature."""
    req = ConsistencyRequest(federation_id=rnd.plan.federation_id, round=rnd.plan.round, recipient=client,
                             survivors=tuple(u3))
    env = parse_envelope(rnd.clients[client].handle(seal(req, SERVER)))
    assert load_payload(env, ConsistencySignature).survivors_digest == survivors_digest(rnd.plan, u3)
    return SurvivorSignature(client=client, payload=env.payload, signature=env.signature)


def vouch(plan, client, u3, *, kind=None):
    """``client``'s consistency signature on ``u3`` for ``plan``'s federation and round, made
    directly (a colluder's, or a forgery harness); ``kind``: sign it as another message kind."""
    msg = ConsistencySignature(federation_id=plan.federation_id, round=plan.round, client=client,
                               spec_digest=plan.spec.digest(), dictionary_hash=plan.dictionary_hash,
                               global_state_digest=plan.global_state_digest, plan_digest=plan.digest(),
                               survivors_digest=survivors_digest(plan, u3))
    env = parse_envelope(seal(msg, identity(client)))
    sig = env.signature if kind is None else identity(client).sign(kind.encode() + b"\x00" + env.payload,
                                                                     context=SIG_MESSAGE)
    return SurvivorSignature(client=client, payload=env.payload, signature=sig)


def unmask(rnd, client, u3, sigs, dropped=()):
    req = UnmaskRequest(federation_id=rnd.plan.federation_id, round=rnd.plan.round, recipient=client,
                        survivors=tuple(sorted(u3)), dropped=tuple(dropped), signatures=tuple(sigs))
    return rnd.clients[client].handle(seal(req, SERVER))


def assert_stopped(rnd, client):
    """A client that refused reveals nothing later in the round, even for an honest-looking request."""
    with pytest.raises(ProtocolError, match="expects no server message"):
        unmask(rnd, client, rnd.plan.participants, ())


def honest_signatures(rnd):
    u3 = rnd.plan.participants
    return u3, [show(rnd, c, u3) for c in u3]


def test_honest_consistency_round_reveals_shares():
    """Positive control for the harness below: t signatures on the U3 a client signed are enough."""
    rnd = to_consistency_stage()
    u3, sigs = honest_signatures(rnd)
    resp = load_payload(parse_envelope(unmask(rnd, "hosp02", u3, sigs[:3])), UnmaskResponse)
    assert {r.owner for r in resp.shares} == set(u3) and all(r.secret == "self_mask" for r in resp.shares)


def test_server_showing_clients_different_survivor_sets_gets_no_share():
    rnd = to_consistency_stage()
    view_a = tuple(rnd.plan.participants)                   # the victim survived
    view_b = tuple(c for c in view_a if c != VICTIM)        # the victim dropped
    sigs_a = [show(rnd, c, view_a) for c in (VICTIM, "hosp02")]
    sigs_b = [show(rnd, c, view_b) for c in ("hosp03", "hosp04")]
    everything = sigs_a + sigs_b
    with pytest.raises(ProtocolError, match=r"Only 2 valid consistency signature\(s\)"):
        unmask(rnd, VICTIM, view_a, sigs_a)
    with pytest.raises(ProtocolError, match="'hosp03' does not verify"):
        unmask(rnd, "hosp02", view_a, everything)
    with pytest.raises(ProtocolError, match=r"Only 2 valid consistency signature\(s\)"):
        unmask(rnd, "hosp03", view_b, sigs_b, dropped=(VICTIM,))
    with pytest.raises(ProtocolError, match="differs from the survivor set U3 this client signed"):
        unmask(rnd, "hosp04", view_a, sigs_a)  # another client's view, with that view's signatures
    for c in (VICTIM, "hosp02", "hosp03", "hosp04"):
        assert_stopped(rnd, c)


def test_a_view_other_clients_signed_is_refused_even_with_t_signatures():
    """hosp02 signed U3 with the victim; t valid signatures on U3 without it do not move it."""
    rnd = to_consistency_stage()
    view_a = tuple(rnd.plan.participants)
    view_b = tuple(c for c in view_a if c != VICTIM)
    show(rnd, "hosp02", view_a)
    sigs_b = [show(rnd, c, view_b) for c in ("hosp00", "hosp03", "hosp04")]
    with pytest.raises(ProtocolError, match="differs from the survivor set U3 this client signed"):
        unmask(rnd, "hosp02", view_b, sigs_b, dropped=(VICTIM,))
    assert_stopped(rnd, "hosp02")


def _flip(sig):
    return sig.model_copy(update={"signature": bytes([sig.signature[0] ^ 1]) + sig.signature[1:]})


@pytest.mark.parametrize(("tamper", "match"), [
    (lambda s: [_flip(s[0]), *s[1:]], "'hosp00' does not verify"),
    (lambda s: s[:2], r"Only 2 valid consistency signature\(s\) on U3; the threshold is 3"),
    (lambda s: [s[0], s[1], s[0]], "list 'hosp00' twice"),
    (lambda s: [s[0], s[1], s[3].model_copy(update={"client": "hosp02"})], "'hosp02' does not verify"),
    (lambda s: [*s[:2], vouch(make_plan(5, threshold=3), "stranger", [f"hosp{i:02d}" for i in range(5)])],
     "'stranger', who is not in the survivor set U3"),
], ids=["forged", "too_few", "duplicate", "misattributed", "outsider"])
def test_bad_signature_sets_are_refused(tamper, match):
    rnd = to_consistency_stage()
    u3, sigs = honest_signatures(rnd)
    with pytest.raises(ProtocolError, match=match):
        unmask(rnd, "hosp02", u3, tamper(sigs))
    assert_stopped(rnd, "hosp02")


@pytest.mark.parametrize(("other", "kind", "ok"), [
    ({}, None, True),  # control: the forging harness itself is sound
    ({"round": 8}, None, False),
    ({"federation_id": "fed-other"}, None, False),
    ({}, "masked_advertise_keys", False),  # the same bytes signed as another message kind
], ids=["same_round", "other_round", "other_federation", "other_kind"])
def test_signatures_for_another_round_federation_or_purpose_are_refused(other, kind, ok):
    rnd = to_consistency_stage()
    u3, _ = honest_signatures(rnd)
    plan = rnd.plan.model_copy(update=other)
    sigs = [vouch(plan, c, u3, kind=kind) for c in u3]
    if ok:
        assert unmask(rnd, "hosp02", u3, sigs)
    else:
        with pytest.raises(ProtocolError, match="'hosp00' does not verify on this federation, round"):
            unmask(rnd, "hosp02", u3, sigs)


@pytest.mark.parametrize(("u3", "match"), [
    (("hosp00", "hosp01", "hosp03", "hosp04"), "does not list 'hosp02' itself"),
    (("hosp00", "hosp02"), "below the threshold 3"),
    (("hosp00", "hosp02", "hosp02", "hosp03"), "repeats a client"),
    (("hosp00", "hosp02", "hosp03", "stranger"), "1 client\\(s\\) that are not participants"),
])
def test_client_refuses_to_sign_a_bad_survivor_set(u3, match):
    rnd = to_consistency_stage()
    with pytest.raises(ProtocolError, match=match):
        show(rnd, "hosp02", u3)
    assert_stopped(rnd, "hosp02")


def test_client_signs_one_survivor_set_per_round():
    rnd = to_consistency_stage()
    show(rnd, "hosp02", rnd.plan.participants)
    with pytest.raises(ProtocolError):
        show(rnd, "hosp02", tuple(c for c in rnd.plan.participants if c != VICTIM))
    assert_stopped(rnd, "hosp02")


def test_server_refuses_a_signature_on_another_survivor_set_and_completes_without_it():
    rnd = Round()
    rnd.deliver()
    rnd.deliver()
    msgs = rnd.deliver(answer=False)
    for c, data in msgs.items():  # hosp03 signs a U3 without the victim; everybody else the honest one
        rnd.outgoing[c] = rnd.clients[c].handle(data) if c != "hosp03" else seal(ConsistencySignature(
            **rnd.clients[c]._header(), survivors_digest=survivors_digest(
                rnd.plan, [x for x in rnd.plan.participants if x != VICTIM])), identity(c))
    res = rnd.finish()
    assert "does not verify" in rnd.server.rejected()["hosp03"]
    assert res.contributors == tuple(rnd.plan.participants)  # hosp03's masked input still counts
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6


@pytest.mark.parametrize(("n", "t", "silent"), [(5, 3, ("hosp00", "hosp04")), (7, 3, ("hosp01", "hosp05"))])
def test_dropouts_at_the_consistency_check_still_give_the_plaintext_sum(n, t, silent):
    plan = make_plan(n, threshold=t)
    updates = make_updates(plan, seed=21)
    ids = identities(plan)
    masked, _ = run_aggregation(mode="masked", plan=plan, server_identity=SERVER, client_identities=ids,
                                updates=updates, drop=dict.fromkeys(silent, 3))
    plain, _ = run_aggregation(mode="insecure_plaintext", plan=plan.model_copy(update={"secure_mode": "insecure_plaintext"}),
                               server_identity=SERVER, client_identities=ids, updates=updates)
    assert masked.contributors == plain.contributors == tuple(plan.participants)  # inputs were in before the check
    assert masked.counts == plain.counts
    for name in plain.sums:
        assert rel_err(masked.sums[name], plain.sums[name]) < 1e-6
        assert masked.weights[name] == pytest.approx(plain.weights[name], rel=1e-6)


def test_documented_limit_a_split_view_with_2t_minus_k_plus_1_colluders_still_unmasks():
    """What the check does NOT give (params.py, SECURITY.md): with n = 5 (complete graph, k+1 = 5)
    and t = 3, ONE colluding hospital (2t - (k+1) = 1) lets a lying server split the honest
    clients into two camps that each collect t valid signatures on their own U3 -- so the
    collusion bound against a lying server stays 2t - (k+1), not t."""
    import numpy as np
    from clinograph.secure.hazmat import fixedpoint
    from clinograph.secure.hazmat.masking_prg import add_mask
    from clinograph.secure.hazmat.shamir import combine_shares
    from clinograph.secure.hazmat.x25519 import agree, hkdf, private_from_bytes
    from clinograph.secure.masking.messages import MaskedInput
    from clinograph.secure.masking.stages import pair_context, pairwise_sign, round_context

    from clinograph.core.labels import KDF_PAIRWISE_MASK, KDF_SELF_MASK

    rnd = to_consistency_stage()
    colluder = "hosp04"
    camps = {(VICTIM, "hosp02"): ("hosp00", "hosp03"), ("hosp00", "hosp03"): (VICTIM, "hosp02")}
    b_shares, s_shares = [], []
    for camp, dropped in camps.items():
        view = (*camp, colluder)
        sigs = [show(rnd, c, view) for c in camp]
        sigs.append(vouch(rnd.plan, colluder, view))
        for c in camp:
            resp = load_payload(parse_envelope(unmask(rnd, c, view, sigs, dropped)), UnmaskResponse)
            for r in resp.shares:
                if r.owner == VICTIM:
                    (b_shares if r.secret == "self_mask" else s_shares).append((r.index, r.share))
    idx, b_sh, s_sh = rnd.clients[colluder]._held[VICTIM]  # the colluder hands over what it holds
    b_shares.append((idx, b_sh))
    s_shares.append((idx, s_sh))
    assert len(b_shares) == len(s_shares) == 3
    y = np.frombuffer(load_payload(parse_envelope(rnd.sent[2][VICTIM]), MaskedInput).words,
                      dtype="<u4").copy()
    b, sk = combine_shares(b_shares), private_from_bytes(combine_shares(s_shares))
    add_mask(y, hkdf(b, label=KDF_SELF_MASK, context=round_context(rnd.plan, VICTIM)), sign=-1)
    for v in rnd.plan.participants:
        if v != VICTIM:
            seed = agree(sk, rnd.server._keys[v].s_pk, label=KDF_PAIRWISE_MASK, context=pair_context(rnd.plan, VICTIM, v))
            add_mask(y, seed, sign=-pairwise_sign(VICTIM, v))
    first = rnd.plan.spec.shared[0]
    np.testing.assert_allclose(fixedpoint.decode(y[:first.size], scale=rnd.server.params.scale),
                               rnd.updates[VICTIM].modules[first.name], atol=1e-7)


def test_a_survivor_set_padded_with_hospitals_outside_the_sum_is_refused(monkeypatch):
    """Bonawitz et al. 2017: U3 lies within U2. Before (session 52), a lying server that let hosp03 and hosp04
    'drop' at stage 1 for the others, then listed hosp03 in U3, met a plan's min_clients = 4 with three masked
    inputs: all three signed and revealed their self-mask shares (seen), so the server learnt a sum of three
    updates where the plan promised at least four. A neighbour in U3 must be one the client masked with."""
    from clinograph.secure.masking import server as masking_server

    real = masking_server.check_header  # the lying server keeps books other than the plan it signed: it skips
    monkeypatch.setattr(masking_server, "check_header",  # its own check of the hospitals' plan digest
                        lambda plan, **kw: real(plan, **{k: v for k, v in kw.items() if k != "plan_digest"}))
    books = Round(n=5, threshold=3, min_clients=3)  # the lying server's own floor: 3 suffice
    promised = books.plan.model_copy(update={"min_clients": 4})  # what every hospital's signed plan says
    rnd = Round(n=5, threshold=3, min_clients=3, client_plans=dict.fromkeys(books.plan.participants, promised))
    rnd.deliver()
    rnd.deliver(tamper=lambda c, data: [] if c in ("hosp03", "hosp04") else [data])  # no shares from them
    rnd.deliver(answer=False)  # three masked inputs are in; the server's own U3 of three is not sent
    for c in ("hosp00", "hosp01", "hosp02"):  # n = 5: the complete graph, hosp03 is everyone's neighbour
        with pytest.raises(ProtocolError, match=rf"U3 lists 1 neighbour\(s\) of '{c}' whose shares never reached "
                                                r"it \('hosp03'\)"):
            show(rnd, c, ("hosp00", "hosp01", "hosp02", "hosp03"))
        assert_stopped(rnd, c)


def _cut_off_round():
    """n = 8, k = 4, t = 3, min_clients = 4: the circulant graph's hospitals o_0 ... o_7 in its order.
    o_0 neighbours none of o_3, o_4, o_5 (they neighbour one another). Everyone keys and shares, but the
    (lying) server forwards o_3, o_4, o_5 only one another's shares -- so they mask within their group --
    and o_0 all its neighbours'; only o_0, o_3, o_4, o_5 send masked inputs (the rest 'drop'). U3 =
    {o_0, o_3, o_4, o_5} meets the floor by count but falls into two groups sharing no pairwise mask, of
    1 and 3. Returns the round at its consistency stage, o_0 and the group."""
    from clinograph.secure.masking.messages import ForwardShares
    from clinograph.secure.masking.params import neighbour_graph

    rnd = Round(n=8, threshold=3, min_clients=4)
    order = list(neighbour_graph(rnd.plan, 4))
    lone, group = order[0], order[3:6]
    assert not rnd.server._graph[lone] & set(group)  # the graph as the docstring says
    rnd.deliver()
    for c, data in rnd.deliver(answer=False).items():
        fwd = load_payload(parse_envelope(data), ForwardShares)
        if c in group:
            fwd = fwd.model_copy(update={"shares": tuple(s for s in fwd.shares if s.peer in group)})
        rnd.outgoing[c] = rnd.clients[c].handle(seal(fwd, SERVER))
    rnd.deliver(tamper=lambda c, data: [data] if c in (lone, *group) else [], answer=False)
    return rnd, lone, group


def test_a_survivor_set_that_falls_apart_into_groups_below_the_floor_is_refused():
    """Before (session 53): all four signed U3 and revealed their shares -- the self-mask shares of
    o_3, o_4, o_5 (each has its two group neighbours and itself as holders: t = 3) and the pairwise-key
    shares of their dropped neighbours -- so a server could open the sum of those three alone under a
    plan promising at least four (seen: the scratch check decoded o_3 + o_4 + o_5's update sum), and
    the honest server, unable to open o_0 (its self-mask's holders all dropped), stopped only after
    that. Now each refuses to sign: its group in U3 is below max(t, min_clients)."""
    rnd, lone, group = _cut_off_round()
    u3 = (lone, *group)
    for c, size in ((lone, 1), *((g, 3) for g in group)):
        with pytest.raises(ProtocolError, match=rf"only {size} of them \(this client included\) are joined to "
                                                rf"'{c}' by masking neighbours.*fewer than 4 hospitals"):
            show(rnd, c, u3)
        assert_stopped(rnd, c)


def test_the_honest_server_aborts_a_round_whose_survivors_fall_apart():
    """The honest server, which keeps the same books, sends no consistency request and says why."""
    rnd, _, _ = _cut_off_round()
    assert rnd.server.stage == "done"
    with pytest.raises(ProtocolError, match=r"fall apart into groups that share no pairwise mask; the smallest has 1 "
                                            r"\(the round needs 4"):
        rnd.server.result()


def test_survivors_of_a_sparse_graph_that_stay_joined_still_give_the_sum():
    """The same graph with o_1 and o_2 dropped instead: the six left are one group (a circulant graph
    C_8(1, 2) without two adjacent hospitals stays connected), and the round opens their exact sum."""
    from clinograph.secure.masking.params import neighbour_graph

    rnd = Round(n=8, threshold=3, min_clients=4)
    order = list(neighbour_graph(rnd.plan, 4))
    rnd.deliver()
    rnd.deliver()
    keep = set(order) - {order[1], order[2]}
    result = rnd.finish(tamper_at=2, tamper=lambda c, data: [data] if c in keep else [])
    assert set(result.contributors) == keep
    for name, v in expected_sums(rnd.updates, keep).items():
        assert rel_err(result.sums[name], v) < 1e-6


def _half_edge_round():
    """n = 10, k = 4, t = 3, min_clients = 7: hospitals o_0 ... o_9 in the circulant graph's order. Everyone
    keys and shares; o_1, o_2, o_6 then 'drop' (their masked inputs are not kept). The (lying) server
    forwards x = o_7 every share but its neighbour y = o_5's, so x does not mask with y. U3 = {o_0, o_3,
    o_4, o_5, o_7, o_8, o_9} is one group of seven by the graph's edges (only x-y joins {o_0, o_7, o_8,
    o_9} to {o_3, o_4, o_5}), so every hospital but x signs it; x refuses (y is in U3), which the server
    does not need. Returns the round at its unmask stage, the signatures on U3, U3, the dropped and the
    four-hospital side S."""
    from clinograph.secure.masking.messages import ForwardShares
    from clinograph.secure.masking.params import neighbour_graph

    rnd = Round(n=10, threshold=3, min_clients=7)
    o = list(neighbour_graph(rnd.plan, 4))
    u3, dropped, side = [o[i] for i in (0, 3, 4, 5, 7, 8, 9)], [o[1], o[2], o[6]], {o[0], o[7], o[8], o[9]}
    x, y = o[7], o[5]
    rnd.deliver()
    for c, data in rnd.deliver(answer=False).items():
        fwd = load_payload(parse_envelope(data), ForwardShares)
        if c == x:
            fwd = fwd.model_copy(update={"shares": tuple(s for s in fwd.shares if s.peer != y)})
        rnd.outgoing[c] = rnd.clients[c].handle(seal(fwd, SERVER))
    rnd.deliver(tamper=lambda c, data: [data] if c in u3 else [], answer=False)
    with pytest.raises(ProtocolError, match="whose shares never reached it"):
        show(rnd, x, u3)
    sigs = [show(rnd, c, u3) for c in u3 if c != x]
    return rnd, sigs, u3, dropped, side


def test_a_hospital_kept_from_masking_with_a_neighbour_does_not_let_its_side_of_u3_be_opened():
    """Before (session 53, after the group check): the six signers checked their group by the graph's
    edges (seven), revealed their self-mask shares of all seven and the pairwise-key shares of o_1, o_2,
    o_6, and the server decoded the sum of S = {o_0, o_7, o_8, o_9} alone (x's input has no mask with y;
    seen: relative error 8e-8 against the plaintext sum of the four) under min_clients = 7, no colluder.
    Now a hospital counts its group through hospitals whose signatures on U3 the request carries: x did
    not sign, so each signer's group is S or {o_3, o_4, o_5, o_7} (four) -- every signer refuses, even
    with all six signatures forwarded."""
    rnd, sigs, u3, dropped, side = _half_edge_round()
    for c in sorted(s.client for s in sigs):
        with pytest.raises(ProtocolError, match=r"only 4 member\(s\) of U3 \(this client included\) are joined to "
                                                r".* through hospitals that confirmed U3.*fewer than 7 hospitals"):
            unmask(rnd, c, u3, sigs, dropped=dropped)
    assert side < set(u3)



def test_a_forged_signature_the_confirmed_walk_goes_through_is_refused():
    """The server lists, after t valid signatures (which check_signatures verifies), one for x made of
    another signer's payload and signature: the walk would go through x and reach seven; the hospital
    verifies x's signature when it gets there and refuses the request."""
    rnd, sigs, u3, dropped, side = _half_edge_round()
    x = next(c for c in u3 if c in side and c not in {s.client for s in sigs})
    forged = sigs[0].model_copy(update={"client": x})
    me = sorted(side - {x})[0]
    with pytest.raises(ProtocolError, match=rf"Consistency signature of '{x}' does not verify"):
        unmask(rnd, me, u3, [*sigs, forged], dropped=dropped)


def test_the_honest_server_aborts_when_a_signers_confirmed_group_is_below_the_floor():
    """n = 10, k = 4, t = 3, min_clients = 5: o_0, o_1, o_5 drop before their masked inputs and o_6 does not
    sign U3, the one hospital joining {o_7, o_8, o_9} to {o_2, o_3, o_4} through confirmed hospitals.
    Six signers, every secret with t holders among them: before, the round completed; but each signer
    now refuses (its confirmed group is four, below five), so the honest server sends no unmask request
    and says why."""
    from clinograph.secure.masking.params import neighbour_graph

    rnd = Round(n=10, threshold=3, min_clients=5)
    o = list(neighbour_graph(rnd.plan, 4))
    rnd.deliver()
    rnd.deliver()
    rnd.deliver(tamper=lambda c, data: [] if c in (o[0], o[1], o[5]) else [data])
    rnd.deliver(tamper=lambda c, data: [] if c == o[6] else [data])
    assert rnd.server.stage == "done"
    with pytest.raises(ProtocolError, match=r"Only 4 of the survivors are joined to .* through hospitals that "
                                            r"confirmed the survivor set \(the round needs 5"):
        rnd.server.result()


def test_documented_limit_colluders_that_cut_u3_open_the_sum_of_one_side():
    """SecAgg+ on a sparse graph (Bell et al. 2020 need the honest survivors to stay joined once the
    colluders are taken out): n = 10 (k = 4, t = 4, the default), min_clients = 8. o_4 and o_9 drop
    before their masked inputs (or a lying server ignores them), and o_0, o_3 collude: they are then
    the only links between {o_1, o_2} and the other five. Every check passes (U3 is one group of
    eight, confirmed through the colluders' own signatures) and the round completes; but with the
    colluders' pairwise-key secrets the server opens o_1 + o_2 alone -- a sum of two honest updates,
    not of min_clients - 2 = 6. SECURITY.md ("Who decides k and t") states it."""
    from clinograph.secure.hazmat.x25519 import private_bytes
    from clinograph.secure.masking.messages import MaskedInput
    from clinograph.secure.masking.params import neighbour_graph
    from clinograph.secure.masking.stages import from_words, split_modules

    rnd = Round(n=10, threshold=4, min_clients=8)
    o = list(neighbour_graph(rnd.plan, 4))
    colluders, side = {o[0], o[3]}, {o[1], o[2]}
    for _ in range(2):
        rnd.deliver()
    masked = {c: d for c, d in rnd.outgoing.items() if c not in (o[4], o[9])}
    rnd.deliver(tamper=lambda c, data: [data] if c in masked else [])
    rnd.deliver()
    srv = rnd.server
    assert len(rnd.outgoing) == 8  # every hospital of U3 signed and revealed: no check refused
    for c, data in rnd.outgoing.items():  # the unmask answers, as the honest server takes them
        srv.receive_bytes(c, data)
    total = None
    for c in side:
        words = load_payload(parse_envelope(masked[c]), MaskedInput).words
        parts = split_modules(from_words(words, layout=srv._layout, params=srv.params, sender=c), layout=srv._layout)
        total = parts if total is None else [a + b for a, b in zip(total, parts, strict=True)]
    own = srv._secret  # the colluders hand over their pairwise-key secrets
    srv._secret = lambda v, kind: private_bytes(rnd.clients[v]._s_sk) if v in colluders else own(v, kind)
    srv._sum, srv._alive[1], srv._alive[2] = total, side | colluders | {o[4], o[9]}, side
    srv._alive.append(set(rnd.outgoing))
    srv._unmask()
    res = srv.result()
    assert set(res.contributors) == side and rnd.plan.min_clients == 8
    for name, v in expected_sums(rnd.updates, side).items():
        assert rel_err(res.sums[name], v) < 1e-6


def _split_view_update(rnd, views, victim, colluders=()):
    """Play a lying server from the consistency stage on: each (U3, honest signers) view is shown to its
    signers and vouched for by every colluder, and each signer gets an unmask request for its own view
    (U3, everyone else dropped, all the view's signatures). Then decode ``victim``'s update alone from
    the revealed shares, the colluders' own share holdings and pairwise-key secrets, and its masked
    input. Returns the decoded ModuleSums."""
    from clinograph.secure.hazmat.masking_prg import add_masks
    from clinograph.secure.hazmat.shamir import combine_shares
    from clinograph.secure.hazmat.x25519 import agree, hkdf, private_from_bytes
    from clinograph.secure.masking.messages import MaskedInput
    from clinograph.secure.masking.stages import (
        decode_sum,
        from_words,
        pair_context,
        pairwise_sign,
        round_context,
        split_modules,
    )

    from clinograph.core.labels import KDF_PAIRWISE_MASK, KDF_SELF_MASK

    rnd.deliver()
    rnd.deliver()
    masked = dict(rnd.outgoing)
    rnd.deliver(answer=False)  # every masked input is in; the server's own U3 requests are not delivered
    shares: dict[tuple[str, str], set] = {}
    for c in colluders:  # a colluder hands over every share it holds
        for owner, (idx, b_share, s_share) in rnd.clients[c]._held.items():
            shares.setdefault((owner, "self_mask"), set()).add((idx, b_share))
            shares.setdefault((owner, "pairwise_key"), set()).add((idx, s_share))
    for u3, signers in views:
        sigs = [show(rnd, c, u3) for c in signers] + [vouch(rnd.plan, c, u3) for c in colluders]
        dropped = sorted(set(rnd.plan.participants) - set(u3))
        for c in signers:
            for r in load_payload(parse_envelope(unmask(rnd, c, u3, sigs, dropped=dropped)), UnmaskResponse).shares:
                shares.setdefault((r.owner, r.secret), set()).add((r.index, r.share))
    srv, t = rnd.server, rnd.server.params.threshold
    b = combine_shares(sorted(shares[(victim, "self_mask")])[:t])
    seeds = [(hkdf(b, label=KDF_SELF_MASK, context=round_context(rnd.plan, victim)), -1)]
    for v in sorted(srv._graph[victim]):
        sk = rnd.clients[v]._s_sk if v in colluders else private_from_bytes(
            combine_shares(sorted(shares[(v, "pairwise_key")])[:t]))
        seeds.append((agree(sk, srv._keys[victim].s_pk, label=KDF_PAIRWISE_MASK,
                            context=pair_context(rnd.plan, victim, v)), -pairwise_sign(victim, v)))
    words = load_payload(parse_envelope(masked[victim]), MaskedInput).words
    y = [p.copy() for p in split_modules(from_words(words, layout=srv._layout, params=srv.params, sender=victim),
                                         layout=srv._layout)]
    add_masks(y, seeds)
    return decode_sum(y, layout=srv._layout, params=srv.params, contributors=(victim,), consume=True)


def test_documented_limit_below_the_default_t_a_split_view_exposes_one_update_without_colluders():
    """n = 10 (k = 4) with t = 3, below the default t = k (a hospital accepts it only if its config says
    so), min_clients = 3, no colluder. Everyone sends its masked input; the server then shows two
    disjoint sets of signers two survivor sets: in view A (o_1, o_4, o_5, o_8, o_9 sign) the victim
    o_6 and its neighbours o_4, o_5, o_8 survive and o_7 dropped; in view B (o_0, o_2, o_3, o_6, o_7
    sign) o_4, o_5, o_8 dropped. Every check of every signer passes in its own view. View A gives
    o_6's self-mask seed (from o_4, o_5, o_8) and o_7's pairwise-key secret; view B the pairwise-key
    secrets of o_4, o_5, o_8 -- all of o_6's pairwise masks: its update alone. With t = k the route
    is closed (o_6's self-mask needs every neighbour in one view, a neighbour's key all of that
    neighbour's other neighbours in the other, and in the circulant graph they share some).
    SECURITY.md ("Active server that lies about who dropped") states it."""
    from clinograph.secure.masking.params import neighbour_graph


    rnd = Round(n=10, threshold=3, min_clients=3)
    o = list(neighbour_graph(rnd.plan, 4))
    views = (([o[i] for i in (0, 1, 3, 4, 5, 6, 8, 9)], [o[i] for i in (1, 4, 5, 8, 9)]),
             ([o[i] for i in (0, 1, 2, 3, 6, 7, 9)], [o[i] for i in (0, 2, 3, 6, 7)]))
    alone = _split_view_update(rnd, views, o[6])
    for name, v in expected_sums(rnd.updates, [o[6]]).items():
        assert rel_err(alone.sums[name], v) < 1e-6


def test_documented_limit_at_the_default_t_two_colluding_neighbours_and_a_split_view_expose_one_update():
    """n = 10 with the default k = t = 4, min_clients = 4: SECURITY.md's table said a lying server needs
    three colluding neighbours of o_8 (min(2t - (k+1), k)); two suffice, o_6 and o_9, with two views.
    View A: U3 = {o_1, o_2, o_3, o_5, o_6, o_8, o_9}, the honest o_1, o_2, o_3, o_5, o_8 sign, o_0 and
    o_7 dropped -- their pairwise-key secrets (holders o_8, o_9, o_1, o_2 and o_5, o_6, o_8, o_9). View
    B: U3 = everyone but o_2, the honest o_0, o_4, o_7 sign -- o_8's self-mask seed from o_0, o_7 and
    the colluders. With the colluders' own pairwise secrets, all four masks of o_8 come off."""
    from clinograph.secure.masking.params import neighbour_graph

    rnd = Round(n=10, threshold=4, min_clients=4)
    o = list(neighbour_graph(rnd.plan, 4))
    views = (([o[i] for i in (1, 2, 3, 5, 6, 8, 9)], [o[i] for i in (1, 2, 3, 5, 8)]),
             ([o[i] for i in (0, 1, 3, 4, 5, 6, 7, 8, 9)], [o[i] for i in (0, 4, 7)]))
    alone = _split_view_update(rnd, views, o[8], colluders=(o[6], o[9]))
    for name, v in expected_sums(rnd.updates, [o[8]]).items():
        assert rel_err(alone.sums[name], v) < 1e-6
