"""Dynamic architecture adaptation (F-CMs 4.2.2, E1/E2) and the E.3 fraction-changed report."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts import (
    ConceptGraph,
    ConceptModel,
    MLPEncoder,
    adapt_model,
    fraction_changed,
    get_module_vector,
    state_vectors,
)
from clinograph.sdk.concepts.layers import BlockLinear

CARDS = {"a": 2, "b": 3, "c": 2, "d": 2, "y": 2}


def graph(kind, nodes, edges):
    if kind in ("cbm", "cem"):
        return ConceptGraph.bipartite(concepts=[v for v in nodes if v != "y"], task="y", cards=CARDS)
    return ConceptGraph.from_edges(nodes=nodes, edges=edges, task="y", cards=CARDS)


@pytest.mark.parametrize("kind", ["cbm", "cem", "cgm", "c2bm"])
def test_new_concept_and_new_edge_warm_start(kind):
    torch.manual_seed(0)
    old_g = graph(kind, ["a", "b", "c", "y"], [("a", "b"), ("b", "y"), ("c", "y")])
    new_g = graph(kind, ["a", "b", "c", "d", "y"], [("a", "b"), ("b", "y"), ("c", "y"), ("a", "c"), ("d", "y")])
    old = ConceptModel(kind=kind, encoder=MLPEncoder(6, 8, (8,)), graph=old_g, z_dim=8)
    before = state_vectors(old)
    new, rep = adapt_model(old, new_g)
    assert rep.added == ["d"]
    expected_rewired = ["y"] if kind in ("cbm", "cem") else ["c", "y"]
    assert rep.rewired == expected_rewired
    # modules whose interface did not change keep their parameters bit-exactly
    for v in rep.kept:
        name = f"concept/{v}"
        assert np.array_equal(get_module_vector(new, name), before[name]), v
    assert np.array_equal(get_module_vector(new, "encoder/mlp"), before["encoder/mlp"])
    # the old model is untouched
    assert all(np.array_equal(state_vectors(old)[n], before[n]) for n in before)
    # new inputs start at zero weight, so every old node computes what it computed before
    x = torch.randn(9, 6)
    with torch.no_grad():
        o_old, o_new = old(x), new(x)
    for v in old_g.nodes:
        torch.testing.assert_close(o_new.logits[v], o_old.logits[v], atol=1e-6, rtol=0)
    for v in rep.rewired:
        for layer in new.module_of(v).modules():
            if isinstance(layer, BlockLinear):
                starts = np.cumsum([0] + [w for _, w in layer.in_blocks])[:-1]
                cols = dict(zip([n for n, _ in layer.in_blocks], starts, strict=True))
                for name, width in layer.in_blocks:
                    if name in {"d", "a"} and name not in dict(old.module_of(v).parent_blocks):
                        w = layer.weight[:, cols[name]:cols[name] + width]
                        assert torch.count_nonzero(w) == 0, (v, name)
    assert 0 < rep.fraction_changed < 1


def test_removed_edge_drops_input_and_fraction_changed():
    torch.manual_seed(1)
    g1 = graph("cgm", ["a", "b", "y"], [("a", "b"), ("b", "y"), ("a", "y")])
    g2 = graph("cgm", ["a", "b", "y"], [("a", "b"), ("b", "y")])
    m1 = ConceptModel(kind="cgm", encoder=MLPEncoder(6, 8, (8,)), graph=g1, z_dim=8)
    m2, rep = adapt_model(m1, g2)
    assert rep.rewired == ["y"] and rep.kept == ["a", "b"] and not rep.added
    assert dict(m2.module_of("y").parent_blocks) == {"b": 16}
    s1, s2 = state_vectors(m1), state_vectors(m2)
    assert fraction_changed(s1, s1) == 0.0
    frac_heads = fraction_changed(s1, s2, prefixes=("concept/", "head/"))
    assert 0 < frac_heads < 1
    unchanged, same_graph = adapt_model(m2, g2)
    assert not same_graph.changed and same_graph.fraction_changed == 0.0
