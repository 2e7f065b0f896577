"""Patient-level DP-SGD for concept models (sdk/concepts/dp.py, F-CMs appendix E.4 eq. 4)."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.concepts.dp import (
    clipped_sum,
    concept_clipper,
    dp_sgd_step,
    trainable_names,
)
from clinograph.sdk.concepts.model import ConceptModel, fcm_loss
from sdk_helpers import CONCEPT_CARDS, tiny_concept_model

CARDS = CONCEPT_CARDS
SUPERVISED = {"a", "b", "y"}


def model_of(kind: str) -> ConceptModel:
    return tiny_concept_model(kind).double()


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


def loop_gradients(m, names, x, labels, iv):
    """Each patient's gradient of its own F-CMs eq. (2) loss, one patient at a time (the reference)."""
    params = dict(m.named_parameters())
    rows = []
    for i in range(x.shape[0]):
        m.zero_grad(set_to_none=True)
        out = m(x[i:i + 1], interventions={v: t[i:i + 1] for v, t in iv.items()})
        fcm_loss(out, {v: y[i:i + 1] for v, y in labels.items()}, **kw()).backward()
        rows.append(torch.cat([params[n].grad.reshape(-1) if params[n].grad is not None
                               else torch.zeros(params[n].numel(), dtype=torch.float64) for n in names]))
    m.zero_grad(set_to_none=True)
    return torch.stack(rows)


def clip_rows(g, clip):
    """Opacus's flat-clipping factor min(1, C/(‖g_i‖ + 1e-6)), as the engine."""
    return g * (clip / (g.norm(dim=1, keepdim=True) + 1e-6)).clamp(max=1.0)


@pytest.mark.parametrize("kind", ["c2bm", "cbm", "cem", "cgm"])
def test_engine_per_patient_gradients_match_a_per_patient_loop(kind):
    m = model_of(kind)
    x, labels, iv = batch()
    names = trainable_names(m)
    engine = concept_clipper(m, names, like=x)  # the construction-time probe check passes
    y = _labels(labels)
    grads, _ = engine.per_sample(x, iv, labels=y)
    got = engine.flat(grads, x.shape[0], torch.float64)
    assert torch.allclose(got, loop_gradients(m, names, x, labels, iv), atol=1e-10)


def _labels(labels):
    from clinograph.sdk.concepts.dp import ConceptLabels

    k = kw()
    return ConceptLabels(labels, frozenset(k["supervised"]), k["has_task"], k["task"], k["gamma"])


@pytest.mark.parametrize("kind", ["c2bm", "cbm", "cem", "cgm"])
def test_clipped_sum_equals_clipping_each_patient(kind):
    m = model_of(kind)
    x, labels, iv = batch()
    names = trainable_names(m)
    clip = 0.05  # small enough that most rows are clipped
    g = loop_gradients(m, names, x, labels, iv)
    assert (g.norm(dim=1) > clip).sum() >= 3
    expected = clip_rows(g, clip).sum(0)
    got = clipped_sum(m, names, x, labels, iv, clip=clip, **kw())
    assert torch.allclose(got, expected, atol=1e-10)


def test_the_loop_comparison_can_fail_on_a_coupled_loss():
    """Negative control: an objective that couples rows (a batch-mean logit) gives per-patient
    gradients that differ from the loop, so the comparisons above can fail."""
    from clinograph.sdk.privacy.per_patient import PerPatientClipper

    m = model_of("c2bm")
    x, labels, iv = batch()

    def coupled(mo, inputs, y):
        out = mo(inputs[0], interventions=inputs[1])
        logits = out.logits["y"]
        return torch.nn.functional.cross_entropy(logits - logits.mean(0), y.labels["y"], reduction="sum")

    engine = PerPatientClipper(m, objective=coupled)
    grads, _ = engine.per_sample(x, iv, labels=_labels(labels))
    got = engine.flat(grads, x.shape[0], torch.float64)
    assert (got - loop_gradients(m, trainable_names(m), x, labels, iv)).abs().max() > 1e-3


def test_one_patients_contribution_is_bounded_by_the_clip():
    m = model_of("c2bm")
    x, labels, iv = batch()
    x[0] *= 500.0  # an outlier patient: its raw gradient is far above the clip
    names = trainable_names(m)
    clip = 1.0
    raw = loop_gradients(m, names, x[:1], {v: y[:1] for v, y in labels.items()}, {v: t[:1] for v, t in iv.items()})
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
    C/√G (the per-patient loop's gradients sliced by module), and one patient still moves the sum by ≤ C."""
    from clinograph.sdk.concepts.dp import module_groups

    m = model_of(kind)
    x, labels, iv = batch()
    names = trainable_names(m)
    groups = module_groups(m, names)
    assert len(groups) >= 3 and sorted(n for g in groups for n in g) == sorted(names)
    clip = 0.05
    g = loop_gradients(m, names, x, labels, iv)
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
