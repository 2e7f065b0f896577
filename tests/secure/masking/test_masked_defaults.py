"""masked_defaults(): the default (k, t) follow the stated bounds; two hospitals work."""

from __future__ import annotations

import dataclasses

import pytest
from clinograph.secure.masking.params import (
    MaskedDefaults,
    MaskingParams,
    masked_defaults,
    masked_plan_options,
    neighbour_count,
    neighbour_graph,
)
from clinograph.secure.transport import run_aggregation
from hypothesis import given, settings
from hypothesis import strategies as st
from masking_helpers import expected_sums, identities, identity, make_plan, make_updates, rel_err

from clinograph.core.errors import ConfigError

SERVER = identity("server")


def test_defaults_are_a_frozen_dataclass_with_the_documented_fields():
    d = masked_defaults(4)
    assert isinstance(d, MaskedDefaults)
    assert {f.name for f in dataclasses.fields(d)} == {"neighbours", "threshold", "tolerated_dropouts",
                                                        "max_colluders", "reason"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.threshold = 3  # type: ignore[misc]


def test_four_hospital_demo_is_a_4_cycle_with_one_tolerated_dropout():
    d = masked_defaults(4)
    assert (d.neighbours, d.threshold, d.tolerated_dropouts, d.max_colluders) == (2, 2, 1, 0)
    plan = make_plan(4, threshold=d.threshold)
    graph = neighbour_graph(plan, d.neighbours)
    assert all(len(v) == 2 for v in graph.values())  # a cycle, not the complete graph
    assert "1 with an honest-but-curious server" in d.reason


@given(st.integers(min_value=3, max_value=5000))
@settings(max_examples=60, deadline=None)
def test_default_threshold_is_the_largest_that_survives_one_dropout(n):
    d = masked_defaults(n)
    k, t = d.neighbours, d.threshold
    assert k == neighbour_count(n)
    assert t == k and d.tolerated_dropouts == k + 1 - t == 1
    # k - 2 on the complete graph; on a sparse one k - 2 colluders and a split view expose a hospital
    # (test_masking_consistency.py::test_documented_limit_at_the_default_t_two_colluding_neighbours_...)
    assert d.max_colluders == (k - 2 if k == n - 1 else max(0, k - 3))
    assert d.max_colluders < k  # all k neighbours always reveal: never claimed
    opts = masked_plan_options(n_clients=n, threshold=t, clip=1.0)
    assert opts["masked.neighbours"] == k and opts["masked.threshold"] == t


def test_defaults_are_not_the_minimum_allowed_threshold():
    for n in (10, 100, 1000):
        k = neighbour_count(n)
        assert masked_defaults(n).threshold > (k + 1) // 2 + 1


def test_t_equal_k_plus_one_never_claims_all_neighbours_are_safe():
    # server + all k neighbours recover an update, whatever t: the bound is c < k, not c < k + 1.
    from clinograph.secure.masking import params

    assert "c = k always reveals" in params.__doc__
    assert "c < min(2t - (k+1), k)" in params.__doc__


def test_two_hospitals_work_in_the_default_masked_mode():
    d = masked_defaults(2)
    assert (d.neighbours, d.threshold, d.tolerated_dropouts, d.max_colluders) == (1, 2, 0, 0)
    assert "the other hospital's update" in d.reason and "aggregate minus your own update" in d.reason
    plan = make_plan(2, threshold=d.threshold)
    params = MaskingParams.from_plan(plan)
    assert params.neighbours == 1
    updates = make_updates(plan, seed=5)
    res, rej = run_aggregation(mode="masked", plan=plan, server_identity=SERVER, client_identities=identities(plan),
                               updates=updates)
    assert rej == {} and res.contributors == tuple(plan.participants)
    for name, v in expected_sums(updates, plan.participants).items():
        assert rel_err(res.sums[name], v) < 1e-6


def test_a_bad_neighbour_count_names_the_valid_values():
    plan = make_plan(2, threshold=2)
    bad = plan.model_copy(update={"options": {**plan.options, "masked.neighbours": 2}})
    with pytest.raises(ConfigError, match=r"masked.neighbours = 2 is invalid for 2 participants: it must be 1 "):
        MaskingParams.from_plan(bad)
    plan5 = make_plan(5, threshold=3)
    bad5 = plan5.model_copy(update={"options": {**plan5.options, "masked.neighbours": 3}})
    with pytest.raises(ConfigError, match=r"masked.neighbours = 3 is invalid for 5 participants: it must be 4 "):
        MaskingParams.from_plan(bad5)


@pytest.mark.parametrize("n", [0, 1, True, 2.0])
def test_fewer_than_two_or_non_integer_participants_are_refused(n):
    with pytest.raises(ConfigError):
        masked_defaults(n)


def test_groups_cut_at_wide_gaps_are_the_breadth_first_groups():
    """NeighbourGraph.component finds a member's group by cutting the sorted positions at gaps wider than
    k/2 (no neighbour set built: the search built all n, ~0.1 ms a hospital at n = 100); it must give the
    very sets a breadth-first search over the graph's edges gives, for every n, k, member set and member
    (seen failing with the wrap-around run taken as two, and with a gap of exactly k/2 cut)."""
    import random

    from clinograph.secure.masking.params import NeighbourGraph

    def search(g, me, members):
        inside, seen, todo = set(members) | {me}, {me}, [me]
        while todo:
            for v in g[todo.pop()]:
                if v in inside and v not in seen:
                    seen.add(v)
                    todo.append(v)
        return frozenset(seen)

    rng = random.Random(53)
    for _ in range(3000):
        n = rng.randint(2, 40)
        k = rng.choice([k for k in range(2, n) if k % 2 == 0] or [n - 1])
        people = [f"h{i:02d}" for i in range(n)]
        rng.shuffle(people)
        g = NeighbourGraph(people, k)
        members = [p for p in people if rng.random() < 0.6]
        me = rng.choice(people)
        assert g.component(me, members) == search(g, me, members), (n, k)
