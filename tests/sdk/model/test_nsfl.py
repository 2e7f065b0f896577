"""NS-FL model: equations' paths agree; Theorem 1 (schema invariance) as tests; modules."""

import numpy as np
import pytest
import torch
from clinograph.sdk.graph import build_graph, star_batch
from clinograph.sdk.model import NSFLConfig, NSFLModel, nsfl_modules
from clinograph.sdk.training import bce
from sdk_helpers import small_tables

from clinograph.core.spec import ModuleKind


def model_for(t, seed=0):
    return NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8, init_seed=seed)).double()


def test_star_model_equals_full_graph_without_similar_to(f64):
    t = small_tables()[0]
    m = model_for(t)
    full = m.forward_graph(build_graph(t, k_similar=0), use_similar=False)
    star = m.forward_batch(star_batch(t))
    assert torch.allclose(full, star, atol=1e-10)


def test_neighbourhood_computation_equals_full_graph_with_similar_to(f64):
    t = small_tables()[1]
    m = model_for(t)
    full = m.forward_graph(build_graph(t, k_similar=4))
    part = m.forward_batch(star_batch(t, k_similar=4), torch.tensor([0, 5, 17, 50]))
    assert torch.allclose(full[[0, 5, 17, 50]], part, atol=1e-10)
    assert not torch.allclose(full, m.forward_graph(build_graph(t, k_similar=4), use_similar=False))


def test_theorem1_isolated_unobserved_feature_nodes_change_nothing(f64):
    t = small_tables()[2]  # lacks the blood-gas block
    m = model_for(t)
    g, gc = build_graph(t, k_similar=3), build_graph(t, k_similar=3, complete_schema=True)
    assert gc["feature"].num_nodes > g["feature"].num_nodes
    y = g["patient"].y
    out, outc = m.forward_graph(g), m.forward_graph(gc)
    assert torch.allclose(out, outc, atol=1e-12)
    grads = []
    for graph in (g, gc):
        m.zero_grad()
        bce(m.forward_graph(graph), y).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-12), n


def test_theorem1_gradient_of_an_unobserved_feature_embedding_is_exactly_zero():
    t = small_tables()[2]
    m = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8))
    m.zero_grad()
    bce(m.forward_graph(build_graph(t, k_similar=3)), torch.tensor(t.labels, dtype=torch.float32)).backward()
    idx = t.dictionary.node_index()
    observed = set(t.observed_nodes().tolist())
    for name in ("sao2", "svo2", "paco2"):
        assert idx[name] not in observed
        assert torch.count_nonzero(m.embedding.weight.grad[idx[name]]) == 0
        assert torch.count_nonzero(m.mask_logit.weight.grad[idx[name]]) == 0
    assert torch.count_nonzero(m.embedding.weight.grad[idx["heart_rate"]]) > 0


def test_models_built_from_the_same_config_are_identical():
    a, b = NSFLModel(10, NSFLConfig(init_seed=3)), NSFLModel(10, NSFLConfig(init_seed=3))
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    assert torch.equal(a.epsilon, b.epsilon)


def test_modules_round_trip_and_kinds():
    t = small_tables()[0]
    ids = t.dictionary.node_ids()
    m = NSFLModel(len(ids), NSFLConfig(hidden=8))
    mm = nsfl_modules(m, ids)
    names = mm.names()
    assert "feature_embedding/heart_rate" in names and "gnn/layer1/of_patient" in names and "head/task" in names
    assert mm.kind("mask/heart_rate") == ModuleKind.PERSONAL and mm.kind("head/task") == ModuleKind.SHARED
    spec = mm.spec()
    assert sum(s.size for s in spec.modules) == sum(p.numel() for p in m.parameters())
    v = mm.get("gnn/layer2/of_patient")
    mm.set("gnn/layer2/of_patient", v + 1.0)
    np.testing.assert_allclose(mm.get("gnn/layer2/of_patient"), v + 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="module .head/task. has 9 values, got 3"):
        mm.set("head/task", np.zeros(3))
    personal = nsfl_modules(NSFLModel(len(ids), NSFLConfig(hidden=8)), ids, personal_head=True)
    assert personal.kind("head/task") == ModuleKind.PERSONAL
