"""A hundred hospitals in one masked round, with a dropout at every stage (issue 19, item 5).

n = 100 gives k = 8 neighbours and the default threshold t = k = 8 (masked_defaults): each
hospital's secrets have 9 holders and survive one lost holder. The dropouts are therefore
spread over the neighbour graph so that no hospital loses two of its holders (a 2-packing of
the graph); the round must then complete with exactly the survivors' sum.
"""

from __future__ import annotations

from clinograph.secure.masking.params import masked_defaults, neighbour_graph
from clinograph.secure.transport import run_aggregation
from masking_helpers import expected_sums, identities, identity, make_plan, make_updates, rel_err

N = 100


def spread(graph: dict[str, frozenset[str]], count: int) -> list[str]:
    """``count`` hospitals no two of which share a holder set (pairwise graph distance >= 3)."""
    chosen: list[str] = []
    blocked: set[str] = set()
    for c in sorted(graph):
        if c in blocked:
            continue
        chosen.append(c)
        for v in graph[c] | {c}:  # everything within distance 2 of c
            blocked |= graph[v] | {v}
        if len(chosen) == count:
            return chosen
    raise AssertionError("graph too small for that many spread dropouts")


def test_hundred_hospitals_with_a_dropout_at_every_stage():
    d = masked_defaults(N)
    assert (d.neighbours, d.threshold, d.tolerated_dropouts) == (8, 8, 1)
    plan = make_plan(N, threshold=d.threshold, min_clients=N // 2)
    graph = neighbour_graph(plan, d.neighbours)
    victims = spread(graph, 5)
    drop = {v: stage for stage, v in enumerate(victims)}  # silent from stage 0 (no keys) ... 4 (no unmask reply)
    updates = make_updates(plan, seed=3)
    res, rejected = run_aggregation(mode="masked", plan=plan, server_identity=identity("server"),
                                    client_identities=identities(plan), updates=updates, drop=drop)
    # hospitals that dropped after sending their masked input (stages 3, 4) are in the sum
    assert set(res.contributors) == set(plan.participants) - set(victims[:3])
    assert not rejected
    for name, want in expected_sums(updates, res.contributors).items():
        assert rel_err(res.sums[name], want) < 1e-6
        assert res.counts[name] == sum(name in updates[c].modules for c in res.contributors)
    assert all(w > 0 for w in res.weights.values())
