"""A lying server's plan or survivor set that weakens the masking below what the protocol fixes
(helper hadv3's adversarial pass): a hospital refuses it before it masks or signs anything."""

from __future__ import annotations

import pytest
from clinograph.secure.masking import MaskingClient
from clinograph.secure.masking.messages import ShareKeys
from clinograph.secure.masking.params import masked_defaults
from clinograph.secure.wire import load_payload, parse_envelope, seal
from masking_helpers import expected_sums, identities, identity, make_plan, make_updates, rel_err
from test_masking_consistency import show, to_consistency_stage
from test_masking_rejections import Round

from clinograph.core.errors import ConfigError, ProtocolError

SERVER = identity("server")


def test_a_plan_with_a_sparser_neighbour_graph_than_the_protocol_fixes_is_refused():
    # before: any even k in [2, n-1] passed, so a server could plan n = 10 with k = 2, t = 2 (each update masked
    # with two neighbours, one colluder enough against a lying server) instead of k = 4, t = 4, and hospitals masked
    plan = make_plan(10, threshold=4)
    assert plan.options["masked.neighbours"] == masked_defaults(10).neighbours == 4
    sparse = plan.model_copy(update={"options": {**plan.options, "masked.neighbours": 2, "masked.threshold": 2}})
    ids, updates = identities(plan), make_updates(plan, seed=3)
    peers = {c: i.public for c, i in ids.items()}
    with pytest.raises(ConfigError, match=r"masked.neighbours = 2 .* 10 participants: it must be 4 "):
        MaskingClient(plan=sparse, identity=ids["hosp00"], server=SERVER.public, peers=peers,
                      update=updates["hosp00"])
    MaskingClient(plan=plan, identity=ids["hosp00"], server=SERVER.public, peers=peers, update=updates["hosp00"])


def test_a_survivor_set_smaller_than_the_plans_min_clients_is_not_signed():
    # before: a client signed (and then unmasked for) any U3 of t members, so a server whose plan promised
    # min_clients = 4 could have a sum over 3 hospitals opened -- one more colluder and it is one update
    rnd = to_consistency_stage(n=5, threshold=3, min_clients=4)
    with pytest.raises(ProtocolError, match=r"U3 has 3 client\(s\), below the round's floor 4 \(min_clients of the signed plan\)"):
        show(rnd, "hosp02", ("hosp00", "hosp01", "hosp02"))
    show(rnd, "hosp03", ("hosp00", "hosp01", "hosp02", "hosp03"))  # the floor itself is signed


def _garbage_to(victims):
    """A tamper of stage 1: hosp01 deals ``victims`` shares that do not authenticate (encrypted under
    no key they hold -- as a share for another round or federation would be)."""
    def tamper(c, data):
        if c != DEALER:
            return [data]
        msg = load_payload(parse_envelope(data), ShareKeys)
        shares = tuple(s.model_copy(update={"ciphertext": bytes(len(s.ciphertext))}) if s.peer in victims else s
                       for s in msg.shares)
        return [seal(msg.model_copy(update={"shares": shares}), identity(DEALER))]
    return tamper


DEALER = "hosp01"


def test_a_share_that_does_not_authenticate_no_longer_drops_its_recipient():
    # before: hosp02 aborted at stage 2 on hosp01's bad share, so hosp01 silently kept an honest neighbour out of
    # every round (no one named; the sum went on without hosp02). Now hosp02 masks with hosp01 (its key is signed),
    # holds none of hosp01's secrets, and the round sums all five.
    rnd = Round(n=5, threshold=3)
    rnd.deliver()
    rnd.deliver(tamper=_garbage_to({"hosp02"}))
    res = rnd.finish()
    assert res.contributors == tuple(rnd.plan.participants) and rnd.server.rejected() == {}
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6


def test_a_dealer_whose_shares_reach_too_few_holders_voids_the_round_and_is_an_input():
    # garbage to every neighbour: only hosp01's own share of its self-mask is left, so its vector cannot be unmasked;
    # the holders answered without a share of it, so the round is voided with hosp01 among its inputs (group testing
    # names it, as for a bad share that does not rebuild) -- not aborted unattributed
    rnd = Round(n=5, threshold=3)
    rnd.deliver()
    rnd.deliver(tamper=_garbage_to(set(rnd.plan.participants) - {DEALER}))
    with pytest.raises(ProtocolError, match=r"self mask of 'hosp01': 1 of its 5 holders revealed one; 5 answered"):
        rnd.finish()
    assert set(rnd.server.voided_inputs) == set(rnd.plan.participants)
