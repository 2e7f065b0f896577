"""Patient-level DP-SGD for concept models (sdk/concepts/dp.py, F-CMs appendix E.4 eq. 4)."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.concepts.dp import (
    clip_rows,
    clipped_sum,
    dp_sgd_step,
    per_sample_gradients,
    trainable_names,
)
from clinograph.sdk.concepts.encoders import MLPEncoder
from clinograph.sdk.concepts.graph import ConceptGraph
from clinograph.sdk.concepts.model import ConceptModel, fcm_loss
from clinograph.sdk.concepts.modules import ConceptHParams

CARDS = {"a": 2, "b": 3, "y": 2}
SUPERVISED = {"a", "b", "y"}


def model_of(kind: str) -> ConceptModel:
    torch.manual_seed(0)
    if kind in ("c2bm", "cgm"):
        g = ConceptGraph.from_edges(nodes=["a", "b", "y"], edges=[("a", "b"), ("b", "y"), ("a", "y")], task="y",
                                    cards=CARDS)
    else:
        g = ConceptGraph.bipartite(concepts=["a", "b"], task="y", cards=CARDS, with_task=True)
    return ConceptModel(kind=kind, encoder=MLPEncoder(5, 8, (16,)), graph=g, z_dim=8,
                        hp=ConceptHParams(hidden=8, emb=4)).double()


def batch(b: int = 6):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(b, 5, generator=gen, dtype=torch.float64)
    labels = {"a": torch.randint(0, 2, (b,), generator=gen), "b": torch.randint(0, 3, (b,), generator=gen),
              "y": torch.randint(0, 2, (b,), generator=gen)}
    labels["b"][1] = -1  # a missing label contributes nothing
    iv = {"a": torch.tensor([0, -1, 1, -1, -1, 0][:b])}
    return x, labels, iv


def kw():
    return {"supervised": SUPERVISED, "has_task": True, "task": "y", "gamma": 0.8}


@pytest.mark.parametrize("kind", ["c2bm", "cem"])
def test_per_sample_gradients_match_a_per_patient_loop(kind):
    m = model_of(kind)
    x, labels, iv = batch()
    names = trainable_names(m)
    g = per_sample_gradients(m, names, x, labels, iv, **kw())
    params = dict(m.named_parameters())
    for i in range(x.shape[0]):
        m.zero_grad()
        out = m(x[i:i + 1], interventions={v: t[i:i + 1] for v, t in iv.items()})
        fcm_loss(out, {v: y[i:i + 1] for v, y in labels.items()}, **kw()).backward()
        ref = torch.cat([params[n].grad.reshape(-1) if params[n].grad is not None else torch.zeros(params[n].numel(),
                         dtype=torch.float64) for n in names])
        assert torch.allclose(g[i], ref, atol=1e-10)


@pytest.mark.parametrize("kind", ["c2bm", "cbm", "cem", "cgm"])
def test_ghost_clipped_sum_equals_clipping_each_patient(kind):
    m = model_of(kind)
    x, labels, iv = batch()
    names = trainable_names(m)
    clip = 0.05  # small enough that most rows are clipped
    g = per_sample_gradients(m, names, x, labels, iv, **kw())
    assert (g.norm(dim=1) > clip).sum() >= 3
    expected = clip_rows(g, clip).sum(0)
    got = clipped_sum(m, names, x, labels, iv, clip=clip, **kw())
    assert torch.allclose(got, expected, atol=1e-10)


def test_one_patients_contribution_is_bounded_by_the_clip():
    m = model_of("c2bm")
    x, labels, iv = batch()
    x[0] *= 500.0  # an outlier patient: its raw gradient is far above the clip
    names = trainable_names(m)
    clip = 1.0
    raw = per_sample_gradients(m, names, x[:1], {v: y[:1] for v, y in labels.items()},
                               {v: t[:1] for v, t in iv.items()}, **kw())
    assert float(raw.norm()) > 3 * clip
    with_p = clipped_sum(m, names, x, labels, iv, clip=clip, **kw())
    without = clipped_sum(m, names, x[1:], {v: y[1:] for v, y in labels.items()},
                          {v: t[1:] for v, t in iv.items()}, clip=clip, **kw())
    assert float((with_p - without).norm()) <= clip * (1 + 1e-9)


def test_frozen_modules_get_no_update_and_noise_reaches_trained_ones():
    m = model_of("cbm")
    for n, p in m.named_parameters():
        p.requires_grad_(not n.startswith("nodes.n_b"))
    names = trainable_names(m)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    x, labels, iv = batch()
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
    dp_sgd_step(m, opt, names, x[:0], {v: y[:0] for v, y in labels.items()}, {}, noise_multiplier=1.0, clip=1.0,
                expected_batch=4.0, **kw())  # an empty Poisson batch: noise only, still a step
    after = dict(m.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before if n.startswith("nodes.n_b"))
    assert any(not torch.equal(before[n], after[n]) for n in names)


@pytest.mark.parametrize("kind", ["c2bm", "cem"])
def test_per_module_clipping_equals_clipping_each_patients_module_parts(kind):
    """groups=module_groups(...): each patient's gradient restricted to a module is clipped to
    C/√G (per_sample_gradients sliced by module), and one patient still moves the sum by ≤ C."""
    from clinograph.sdk.concepts.dp import module_groups

    m = model_of(kind)
    x, labels, iv = batch()
    names = trainable_names(m)
    groups = module_groups(m, names)
    assert len(groups) >= 3 and sorted(n for g in groups for n in g) == sorted(names)
    clip = 0.05
    g = per_sample_gradients(m, names, x, labels, iv, **kw())
    sizes = dict((n, p.numel()) for n, p in m.named_parameters())
    at, cols = 0, {}
    for n in names:
        cols[n] = slice(at, at + sizes[n])
        at += sizes[n]
    expected = torch.zeros(g.shape[1], dtype=torch.float64)
    for grp in groups:
        idx = torch.cat([torch.arange(cols[n].start, cols[n].stop) for n in grp])
        expected[idx] = clip_rows(g[:, idx], clip / len(groups) ** 0.5).sum(0)
    got = clipped_sum(m, names, x, labels, iv, clip=clip, groups=groups, **kw())
    assert torch.allclose(got, expected, atol=1e-10)
    assert not torch.allclose(got, clipped_sum(m, names, x, labels, iv, clip=clip, **kw()), atol=1e-6)
