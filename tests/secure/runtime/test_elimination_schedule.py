"""Early elimination's schedule and rule (secure/runtime/elimination.py): pure functions of the
candidate count, the run's rounds and the federated validation losses."""

import math
from itertools import pairwise

import pytest
from clinograph.secure.runtime.elimination import EliminationRule, Rung, rank, schedule, survivors
from clinograph.secure.runtime.run import choose


def test_four_candidates_halve_twice_within_twice_one_model():
    s = schedule(4, rounds=30, rule=EliminationRule())
    assert s.eta == 2
    assert s.rungs == (Rung(rounds=7, keep=2), Rung(rounds=15, keep=1), Rung(rounds=30, keep=1))
    assert s.cost == 4 * 7 + 2 * 8 + 1 * 15 == 59 <= 2 * 30


@pytest.mark.parametrize("count", range(1, 17))
@pytest.mark.parametrize("rounds", [8, 15, 30, 60])
def test_every_schedule_ends_at_the_run_length_and_keeps_fewer_each_rung(count, rounds):
    s = schedule(count, rounds=rounds, rule=EliminationRule())
    assert s.rungs[-1].rounds == rounds
    assert all(a.rounds < b.rounds for a, b in pairwise(s.rungs))
    assert all(a.keep >= b.keep for a, b in pairwise(s.rungs))
    assert s.rungs[-2].keep == 1 if len(s.rungs) > 1 else s.rungs[0].keep == 1
    assert all(r.rounds >= 2 for r in s.rungs)  # a first cut after 1 round would compare initial models only
    if rounds >= 2 * count or count <= 4:
        assert s.cost <= 2 * rounds, (count, rounds, s)


def test_the_bound_is_the_rule_s_and_eta_grows_to_meet_it():
    assert schedule(8, rounds=30, rule=EliminationRule()).eta > 2  # η = 2 would cost 71 > 60
    loose = schedule(8, rounds=30, rule=EliminationRule(max_cost=3.0))
    assert loose.eta == 2 and loose.cost <= 90
    assert schedule(1, rounds=30, rule=EliminationRule()).cost == 30


def test_survivors_are_the_best_by_the_choice_s_own_rule():
    losses = [0.60, 0.59995, 0.50, None, 0.55, math.nan]
    order = rank(losses, min_delta=1e-4)
    assert order == [2, 4, 0, 1, 3, 5]  # 0.59995 does not beat 0.60 by more than min_delta: the earlier first
    assert order[0] == choose(losses, min_delta=1e-4)
    assert survivors(losses, keep=2, min_delta=1e-4) == [2, 4]
    assert survivors(losses, keep=3, min_delta=1e-4) == [0, 2, 4]  # in candidate order
    assert survivors([None, None], keep=1, min_delta=0.0) == [0]  # no loss at all: the first, like a tie
    # the first of the rest is always what choose picks among the rest
    for k in range(1, len(order)):
        rest = [losses[i] if i not in order[:k] else None for i in range(len(losses))]
        if any(x is not None and x == x for x in rest):
            assert order[k] == choose(rest, min_delta=1e-4)
