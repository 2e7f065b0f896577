"""Concept modules (F-CMs 4.3 / appendix C): shapes, interventions, freezing, eq. (2)."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.concepts import (
    ConceptGraph,
    ConceptModel,
    EmbeddingAdapter,
    MLPEncoder,
    fcm_loss,
    freeze_unsupervised,
    get_module_vector,
    list_modules,
    model_spec,
    module_parameters,
    random_interventions,
    set_module_vector,
)

from clinograph.core.errors import ConfigError, RegistryError

CARDS = {"a": 2, "b": 3, "c": 2, "d": 4, "y": 2}
EDGES = [("a", "b"), ("b", "y"), ("c", "y"), ("a", "d")]


def make(kind: str, seed: int = 0) -> ConceptModel:
    torch.manual_seed(seed)
    if kind in ("cbm", "cem"):
        g = ConceptGraph.bipartite(concepts=["a", "b", "c", "d"], task="y", cards=CARDS)
    else:
        g = ConceptGraph.from_edges(nodes=["a", "b", "c", "d", "y"], edges=EDGES, task="y", cards=CARDS)
    return ConceptModel(kind=kind, encoder=MLPEncoder(7, 12, (16,)), graph=g, z_dim=12)


@pytest.mark.parametrize("kind", ["cbm", "cem", "cgm", "c2bm"])
def test_shapes_and_module_names(kind):
    m = make(kind)
    out = m(torch.randn(5, 7))
    assert {v: tuple(t.shape) for v, t in out.logits.items()} == {v: (5, c) for v, c in CARDS.items()}
    for p in out.probs.values():
        torch.testing.assert_close(p.sum(1), torch.ones(5))
    names = [n for n, _ in list_modules(m)]
    assert names == ["encoder/mlp", "concept/a", "concept/b", "concept/c", "concept/d", "head/task"]
    spec = model_spec(m, version=3)
    assert spec.module("concept/b").size == sum(p.numel() for p in m.module_of("b").parameters())


@pytest.mark.parametrize("kind", ["cbm", "cem", "cgm", "c2bm"])
def test_module_vectors_round_trip(kind):
    m, other = make(kind, 0), make(kind, 1)
    for name in module_parameters(m):
        set_module_vector(other, name, get_module_vector(m, name))
    x = torch.randn(4, 7)
    for v in CARDS:
        torch.testing.assert_close(m(x).logits[v], other(x).logits[v])
    with pytest.raises(ConfigError, match="has .* parameters; got a vector of 3"):
        set_module_vector(m, "concept/a", get_module_vector(m, "concept/a")[:3])


@pytest.mark.parametrize("kind", ["cgm", "c2bm"])
def test_intervention_changes_only_descendants_along_the_dag(kind):
    m = make(kind)
    x = torch.randn(6, 7)
    base = m(x)
    iv = {"a": torch.full((6,), 1, dtype=torch.long)}
    iv["a"][0] = -1  # row 0 is left alone
    after = m(x, interventions=iv)
    torch.testing.assert_close(after.probs["a"][1:], torch.nn.functional.one_hot(iv["a"][1:], 2).float())
    for v in ("c",):  # not downstream of a
        torch.testing.assert_close(after.logits[v], base.logits[v])
    for v in ("b", "d", "y"):  # downstream of a: row 0 unchanged, others recomputed
        torch.testing.assert_close(after.logits[v][0], base.logits[v][0])
    flipped = {"a": 1 - base.probs["a"].argmax(1)}
    changed = m(x, interventions=flipped)
    for v in ("b", "d", "y"):
        assert not torch.allclose(changed.logits[v], base.logits[v]), v
    torch.testing.assert_close(changed.logits["c"], base.logits["c"])


@pytest.mark.parametrize("kind", ["cbm", "cem"])
def test_bipartite_intervention_reaches_only_the_task(kind):
    m = make(kind)
    x = torch.randn(6, 7)
    base = m(x)
    after = m(x, interventions={"b": 2 - base.probs["b"].argmax(1).clamp(max=1)})
    for v in ("a", "c", "d"):
        torch.testing.assert_close(after.logits[v], base.logits[v])
    assert not torch.allclose(after.logits["y"], base.logits["y"])


def test_frozen_modules_get_no_gradient():
    m = make("c2bm")
    names = freeze_unsupervised(m, supervised={"b"}, has_task=False)
    assert names == ["encoder/mlp", "concept/b"]
    x = torch.randn(8, 7)
    labels = {v: torch.randint(0, c, (8,)) for v, c in CARDS.items()}
    loss = fcm_loss(m(x), labels, supervised={"b", "a", "y"}, has_task=True, task="y")
    loss.backward()
    groups = module_parameters(m)
    for name, ps in groups.items():
        got = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in ps]
        if name in names:
            assert any(got), name
        else:
            assert not any(got), name


def test_loss_is_eq2():
    m = make("cbm")
    x = torch.randn(8, 7)
    labels = {v: torch.randint(0, c, (8,)) for v, c in CARDS.items()}
    labels["a"][:4] = -1
    out = m(x)
    ce = torch.nn.functional.cross_entropy
    expected = 0.8 * (ce(out.logits["a"][4:], labels["a"][4:]) + ce(out.logits["b"], labels["b"])) \
        + 0.2 * ce(out.logits["y"], labels["y"])
    got = fcm_loss(out, labels, supervised={"a", "b"}, has_task=True, task="y", gamma=0.8)
    torch.testing.assert_close(got, expected)
    no_task = fcm_loss(out, labels, supervised={"a", "b"}, has_task=False, task="y", gamma=0.8)
    torch.testing.assert_close(no_task, expected - 0.2 * ce(out.logits["y"], labels["y"]))


def test_random_interventions_only_use_labelled_rows():
    g = torch.Generator().manual_seed(0)
    y = torch.tensor([0, 1, -1, 1] * 250)
    iv = random_interventions({"a": y}, nodes=["a"], p=0.25, generator=g)["a"]
    assert bool(((iv == -1) | (iv == y)).all()) and bool((iv[y == -1] == -1).all())
    rate = float((iv >= 0).float().sum() / (y >= 0).float().sum())
    assert 0.18 < rate < 0.32


def test_adapter_wraps_any_embedding_module_and_unknown_kind_is_listed():
    inner = torch.nn.Sequential(torch.nn.Linear(7, 12), torch.nn.Tanh())
    enc = EmbeddingAdapter(inner, 12)
    g = ConceptGraph.bipartite(concepts=["a"], task="y", cards=CARDS)
    m = ConceptModel(kind="cem", encoder=enc, graph=g, z_dim=12)
    assert [n for n, _ in list_modules(m)][:1] == ["encoder/0"]
    assert m(torch.randn(3, 7)).logits["y"].shape == (3, 2)
    tupled = EmbeddingAdapter(inner, 12, embed=lambda mod, batch: mod(batch[0]) * batch[1])
    m2 = ConceptModel(kind="cbm", encoder=tupled, graph=g, z_dim=12)
    assert m2((torch.randn(3, 7), 2.0)).logits["a"].shape == (3, 2)
    with pytest.raises(ConfigError, match=r"expected \[B, 5\]"):
        EmbeddingAdapter(inner, 5)(torch.randn(3, 7))
    with pytest.raises(RegistryError, match="Registered: c2bm, cbm, cem, cgm"):
        ConceptModel(kind="cmb", encoder=enc, graph=g, z_dim=12)
