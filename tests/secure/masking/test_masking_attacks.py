"""The double-listing attack (a server lists a client as both surviving and dropped) and the
out-of-range policy (error, or an explicitly configured and counted clip)."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.aggregation import LocalUpdate
from clinograph.secure.hazmat import fixedpoint
from clinograph.secure.hazmat.masking_prg import add_mask
from clinograph.secure.hazmat.shamir import combine_shares
from clinograph.secure.hazmat.x25519 import agree, hkdf, private_from_bytes
from clinograph.secure.masking import MaskingClient
from clinograph.secure.masking.messages import MaskedInput, UnmaskRequest, UnmaskResponse
from clinograph.secure.masking.stages import pair_context, pairwise_sign, round_context
from clinograph.secure.transport import run_aggregation
from clinograph.secure.wire import load_payload, parse_envelope, seal
from masking_helpers import (
    SPEC,
    expected_sums,
    identities,
    identity,
    make_plan,
    make_updates,
    rel_err,
)
from test_masking_rejections import Round

from clinograph.core.errors import ProtocolError
from clinograph.core.labels import KDF_PAIRWISE_MASK, KDF_SELF_MASK

SERVER = identity("server")
VICTIM = "hosp01"


def _to_unmask_stage():
    rnd = Round(n=5, threshold=3)
    rnd.deliver()
    rnd.deliver()
    rnd.deliver()  # masked inputs are in; every client signs the honest survivor set U3
    msgs = rnd.deliver(answer=False)  # honest unmask requests (with the U3 signatures) are not answered
    victim_input = load_payload(parse_envelope(rnd.sent[2][VICTIM]), MaskedInput)
    rnd.signatures = load_payload(parse_envelope(msgs[VICTIM]), UnmaskRequest).signatures
    return rnd, np.frombuffer(victim_input.words, dtype="<u4").copy()


def _double_listing(rnd, recipient):
    everyone = tuple(rnd.plan.participants)
    return UnmaskRequest(federation_id=rnd.plan.federation_id, round=rnd.plan.round, recipient=recipient,
                         survivors=everyone, dropped=(VICTIM,), signatures=rnd.signatures)


def test_without_the_check_the_server_rebuilds_one_clients_update():
    """Why the check exists: shares of both secrets of the victim unmask its vector alone."""
    rnd, y = _to_unmask_stage()
    t = rnd.server.params.threshold
    helpers = [c for c in rnd.plan.participants if c != VICTIM][:t]
    req = _double_listing(rnd, helpers[0])
    b_shares, s_shares = [], []
    for c in helpers:  # bypass the consistency check by calling the private reveal step directly
        for r in rnd.clients[c]._reveal(set(req.survivors), set(req.dropped)):
            if r.owner == VICTIM:
                (b_shares if r.secret == "self_mask" else s_shares).append((r.index, r.share))
    assert len(b_shares) == len(s_shares) == t
    b, sk = combine_shares(b_shares), private_from_bytes(combine_shares(s_shares))
    add_mask(y, hkdf(b, label=KDF_SELF_MASK, context=round_context(rnd.plan, VICTIM)), sign=-1)
    for v in rnd.plan.participants:
        if v != VICTIM:
            seed = agree(sk, rnd.server._keys[v].s_pk, label=KDF_PAIRWISE_MASK,
                         context=pair_context(rnd.plan, VICTIM, v))
            add_mask(y, seed, sign=-pairwise_sign(VICTIM, v))
    name = SPEC.shared[0].name
    leaked = fixedpoint.decode(y[:SPEC.shared[0].size], scale=rnd.server.params.scale)
    np.testing.assert_allclose(leaked, rnd.updates[VICTIM].modules[name], atol=1e-7)


def test_with_the_check_every_client_refuses_and_the_server_gets_nothing():
    rnd, _ = _to_unmask_stage()
    for c in rnd.plan.participants:
        if c == VICTIM:
            continue
        with pytest.raises(ProtocolError, match=r"\['hosp01'\] as both surviving and dropped"):
            rnd.clients[c].handle(seal(_double_listing(rnd, c), SERVER))
        honest_looking = _double_listing(rnd, c).model_copy(update={"survivors": tuple(
            x for x in rnd.plan.participants if x != VICTIM)})
        with pytest.raises(ProtocolError, match="expects no server message"):  # no second try
            rnd.clients[c].handle(seal(honest_looking, SERVER))


def test_other_inconsistent_unmask_requests_are_refused():
    rnd, _ = _to_unmask_stage()
    p = rnd.plan
    cases = [  # (recipient, survivors, dropped, expected refusal)
        ("hosp02", ("hosp00", "hosp01", "hosp03", "hosp04"), (), "does not list 'hosp02' itself"),
        ("hosp03", ("hosp02", "hosp03", "hosp04"), (), "neither as surviving nor as dropped"),
        ("hosp04", ("hosp02", "hosp04"), ("hosp00", "hosp01", "hosp03"), "below the threshold"),
    ]
    for recipient, surv, dropped, match in cases:
        req = UnmaskRequest(federation_id=p.federation_id, round=p.round, recipient=recipient,
                            survivors=surv, dropped=dropped, signatures=rnd.signatures)
        with pytest.raises(ProtocolError, match=match):
            rnd.clients[recipient].handle(seal(req, SERVER))


def test_an_honest_unmask_request_reveals_one_secret_per_owner():
    rnd = Round(n=5, threshold=3)
    rnd.deliver()
    rnd.deliver()
    rnd.deliver(tamper=lambda c, d: [] if c == VICTIM else [d])  # the victim's masked input never arrives
    msgs = rnd.deliver(answer=False)
    req = load_payload(parse_envelope(msgs["hosp02"]), UnmaskRequest)
    assert (req.survivors, req.dropped) == (tuple(c for c in rnd.plan.participants if c != VICTIM), (VICTIM,))
    resp = load_payload(parse_envelope(rnd.clients["hosp02"].handle(seal(req, SERVER))), UnmaskResponse)
    kinds = {r.owner: r.secret for r in resp.shares}
    assert len(kinds) == len(resp.shares) == 5
    assert kinds[VICTIM] == "pairwise_key" and all(k == "self_mask" for o, k in kinds.items() if o != VICTIM)


def _updates_with_outlier(plan, value):
    updates = make_updates(plan, seed=5)
    name = SPEC.shared[0].name
    mods = dict(updates["hosp00"].modules)
    vec = np.array(mods[name])
    vec[3] = value
    mods[name] = vec
    updates["hosp00"] = LocalUpdate(modules=mods, weight=updates["hosp00"].weight)
    return updates, name


def test_out_of_range_value_is_an_error_by_default_and_names_no_value():
    plan = make_plan(5, threshold=3, clip=1.0)
    updates, name = _updates_with_outlier(plan, 1.2345)
    ids = identities(plan)
    client = MaskingClient(plan=plan, identity=ids["hosp00"], server=SERVER.public,
                           peers={c: i.public for c, i in ids.items()}, update=updates["hosp00"])
    with pytest.raises(ProtocolError, match=rf"Module '{name}': 1 of 16 value\(s\) are outside \[-1.0, 1.0\]") as e:
        client.first_message()
    assert "1.2345" not in str(e.value)
    res, rej = run_aggregation(mode="masked", plan=plan, server_identity=SERVER, client_identities=ids, updates=updates)
    assert rej["hosp00"].startswith("client: Module") and "hosp00" not in res.contributors


def test_configured_clip_clips_and_counts():
    plan = make_plan(5, threshold=3, clip=1.0, out_of_range="clip")
    updates, name = _updates_with_outlier(plan, 3.0)
    rnd = Round(n=5, threshold=3, clip=1.0, out_of_range="clip", updates=updates)
    res = rnd.finish()
    assert rnd.clients["hosp00"].clipped == {name: 1}
    assert all(not rnd.clients[c].clipped for c in plan.participants if c != "hosp00")
    exp = expected_sums(updates, plan.participants)
    exp[name][3] += 1.0 - 3.0
    for n, v in exp.items():
        assert rel_err(res.sums[n], v) < 1e-6


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_values_are_refused_even_with_clip(value):
    plan = make_plan(5, threshold=3, out_of_range="clip")
    updates, _ = _updates_with_outlier(plan, value)
    ids = identities(plan)
    client = MaskingClient(plan=plan, identity=ids["hosp00"], server=SERVER.public,
                           peers={c: i.public for c, i in ids.items()}, update=updates["hosp00"])
    with pytest.raises(ProtocolError, match="NaN or infinite"):
        client.first_message()


def test_weight_above_max_weight_is_refused():
    plan = make_plan(5, threshold=3, clip=1.0, max_weight=0.5)
    ids = identities(plan)
    upd = LocalUpdate(modules={SPEC.shared[0].name: np.zeros(16)}, weight=0.75)
    client = MaskingClient(plan=plan, identity=ids["hosp00"], server=SERVER.public,
                           peers={c: i.public for c, i in ids.items()}, update=upd)
    with pytest.raises(ProtocolError, match=r"weight is outside \(0, 0.5\]"):
        client.first_message()
