"""Client views of a ground-truth DAG (F-CMs appendix D.1)."""

from __future__ import annotations

import numpy as np
from clinograph.sdk.concepts.views import _is_acyclic, make_client_views, perturb_edges
from clinograph.secure.dag_voting import ancestor_matrix
from hypothesis import given, settings
from hypothesis import strategies as st

NODES = ["asia", "smoke", "tub", "lung", "bronc", "either", "xray", "dysp"]
EDGES = [("asia", "tub"), ("smoke", "lung"), ("smoke", "bronc"), ("tub", "either"), ("lung", "either"),
         ("either", "xray"), ("either", "dysp"), ("bronc", "dysp")]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(0, 1))
def test_perturbed_graphs_stay_acyclic(seed, frac):
    rng = np.random.default_rng(seed)
    out = perturb_edges(NODES, EDGES, fraction=frac, rng=rng)
    assert _is_acyclic(NODES, set(out))
    idx = {v: i for i, v in enumerate(NODES)}
    a = np.zeros((8, 8), dtype=int)
    for u, v in out:
        a[idx[u], idx[v]] = 1
    assert not np.diag(ancestor_matrix(a)).any()


def test_views_cover_everything_and_hold_out_concepts_from_the_initial_cohort():
    rng = np.random.default_rng(3)
    views = make_client_views(nodes=NODES, edges=EDGES, task="dysp", n_clients=20, rng=rng,
                              held_out=["xray", "asia"], n_initial=10, perturb_clients=0.2, perturb_edges_frac=0.3)
    assert set().union(*(v.nodes for v in views)) == set(NODES)
    assert not any({"xray", "asia"} & set(v.nodes) for v in views[:10])
    assert any(v.has_task for v in views)
    assert sum(v.perturbed for v in views) == 4
    for v in views:
        assert v.has_task == ("dysp" in v.nodes)
        if not v.perturbed:  # unperturbed clients report the ground truth induced on their nodes
            assert set(v.edges) == {(a, b) for a, b in EDGES if a in v.nodes and b in v.nodes}
