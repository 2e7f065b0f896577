"""A lying server's plan or survivor set that weakens the masking below what the protocol fixes
(helper hadv3's adversarial pass): a hospital refuses it before it masks or signs anything."""

from __future__ import annotations

import pytest
from clinograph.secure.masking import MaskingClient
from clinograph.secure.masking.params import masked_defaults
from masking_helpers import identities, identity, make_plan, make_updates
from test_masking_consistency import show, to_consistency_stage

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
