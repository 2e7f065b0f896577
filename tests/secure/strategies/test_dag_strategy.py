"""The dag_voting strategy: votes are a summed module, the tally accumulates in the state, the
decision is audited through the server's strategy hook, the inner strategy sees the rest."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.aggregation.base import ModuleSums
from clinograph.secure.dag_voting import VOTE_MODULE, encode_vote, vote_length
from clinograph.secure.strategies import create_strategy

from clinograph.core.errors import ConfigError, RegistryError

C = ("a", "b", "y")


def _vote(nodes, edges, w):
    idx = {v: i for i, v in enumerate(nodes)}
    a = np.zeros((len(nodes), len(nodes)))
    for u, v in edges:
        a[idx[u], idx[v]] = 1
    return encode_vote(concepts=C, local_nodes=nodes, scores=a, weight=w)


def _sums(votes: dict[str, np.ndarray], extra=None):
    sums = {VOTE_MODULE: sum(votes.values())}
    weights = {VOTE_MODULE: 1.0 * len(votes)}
    counts = {VOTE_MODULE: len(votes)}
    for k, (s, w, n) in (extra or {}).items():
        sums[k], weights[k], counts[k] = s, w, n
    return ModuleSums(sums=sums, weights=weights, counts=counts, contributors=tuple(sorted(votes)))


def test_registered_and_options_round_trip_through_the_plan():
    s = create_strategy("dag_voting", concepts="a,b,y", task="y", seed=4)
    opts = s.constructor_options()
    assert opts == {"concepts": "a,b,y", "task": "y", "seed": 4, "inner": "fedavg"}
    assert create_strategy("dag_voting", **opts).constructor_options() == opts


def test_tally_accumulates_decision_is_audited_once_and_inner_strategy_applies():
    s = create_strategy("dag_voting", concepts="a,b,y", task="y", seed=0)
    state = {VOTE_MODULE: np.zeros(vote_length(3)), "head/task": np.ones(2)}
    v1 = _vote(("a", "b", "y"), [("a", "b"), ("b", "y")], 30.0)
    v2 = _vote(("a", "b", "y"), [("a", "b"), ("b", "y")], 10.0)
    s.observe(round_=0, metrics={})
    # Δ = global − local; fedavg: θ − Σ w Δ / Σ w
    out = s.apply(state, _sums({"h1": v1, "h2": v2}, {"head/task": (np.full(2, 4.0), 40.0, 2)}))
    np.testing.assert_allclose(out["head/task"], np.full(2, 0.9))
    np.testing.assert_allclose(out[VOTE_MODULE], v1 + v2)
    assert s.outcome is not None and s.outcome.edges() == [("a", "b"), ("b", "y")]
    records = s.audit_records(0)
    assert [k for k, _ in records] == ["dag_outcome"] and records[0][1]["round"] == 0
    assert s.audit_records(0) == []
    s.observe(round_=1, metrics={})
    out2 = s.apply(out, _sums({"h1": v1}))
    np.testing.assert_allclose(out2[VOTE_MODULE], 2 * v1 + v2)


def test_masked_noise_on_a_tie_does_not_change_the_decision():
    tie = _vote(("a", "b"), [("a", "b")], 5.0) + _vote(("a", "b"), [("b", "a")], 5.0)
    decisions = []
    for noise in (0.0, 4e-5, -4e-5):
        s = create_strategy("dag_voting", concepts="a,b,y", seed=1)
        s.observe(round_=0, metrics={})
        s.apply({VOTE_MODULE: np.zeros(vote_length(3))}, _sums({"h": tie + noise}))
        decisions.append(s.outcome.adjacency)
    assert decisions[0] == decisions[1] == decisions[2]


def test_bad_options_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="repeats a name"):
        create_strategy("dag_voting", concepts="a,a,y")
    with pytest.raises(ConfigError, match="task 'z' is not in the concept list"):
        create_strategy("dag_voting", concepts="a,b,y", task="z")
    with pytest.raises(ConfigError, match="Registered: fedavg, fedsgd"):
        create_strategy("dag_voting", concepts="a,b", inner="fedprox")
    with pytest.raises(RegistryError, match="dag_voting"):
        create_strategy("dag_votin")
    s = create_strategy("dag_voting", concepts="a,b,y")
    with pytest.raises(ConfigError, match="needs the module"):
        s.apply({"head/task": np.ones(2)}, _sums({"h": np.zeros(vote_length(3))}))


def test_the_concept_list_may_be_a_toml_array_and_is_read_as_names_not_as_its_repr():
    """concepts = ["a", "b"] was str()-ed: the names "['a'" and "'b']"."""
    from clinograph.secure.strategies.dag import DagVoting

    from clinograph.core.errors import ConfigError

    assert DagVoting(concepts=["smoker", "cancer"]).concepts == ("smoker", "cancer")
    assert DagVoting(concepts="smoker, cancer").concepts == ("smoker", "cancer")
    with pytest.raises(ConfigError, match="array of strings"):
        DagVoting(concepts=["smoker", 3])
