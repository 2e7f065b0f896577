"""The piecewise encoding's per-copy product by knot groups (sdk/model/knot_sorted.py) is the dense
product of B(x) ⊗ h with [U_0 … U_{M-1}]: output, input gradient and weight gradient, float64."""

import gc
import weakref

import torch
from clinograph.sdk.model.knot_sorted import knot_pairs
from clinograph.sdk.model.layers import KNOT_SORT_ATTR, KnotLinear, hat_basis
from clinograph.sdk.model.nsfl import SHAPE_KNOTS


def _count_sorts(monkeypatch) -> list[int]:
    """A list that grows by one at every knot sort a KnotLinear makes."""
    import clinograph.sdk.model.layers as layers

    sorts, real = [], layers.knot_pairs
    monkeypatch.setattr(layers, "knot_pairs", lambda b: sorts.append(1) or real(b))
    return sorts


def _dense(layer: KnotLinear, h: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    e = (basis.unsqueeze(-1) * h.unsqueeze(-2)).flatten(-2)
    return torch.nn.functional.linear(e, layer.blocks())


def test_knot_sorted_product_equals_the_dense_product_with_its_gradients(f64):
    gen = torch.Generator().manual_seed(4)
    knots = torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
    layer = KnotLinear(6, len(knots)).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen, dtype=torch.float64))
    x = 0.5 * torch.randn(7, 9, generator=gen, dtype=torch.float64)
    # on every knot but 2 and beyond the outer ones: no value in [2, 3), an empty knot group
    x.view(-1)[:14] = torch.tensor([k for k in SHAPE_KNOTS if k != 2.0] + [-9.0, 9.0], dtype=torch.float64)
    basis = hat_basis(x, knots)
    pairs = knot_pairs(basis)
    assert pairs is not None and pairs.counts[10] == 0 and sum(pairs.counts) == x.numel()
    h = torch.randn(7, 9, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 9, 6, generator=gen, dtype=torch.float64)
    got, want = layer(h, basis), _dense(layer, h, basis)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    g_got = torch.autograd.grad((got * w).sum(), [h, layer.weight])
    g_want = torch.autograd.grad((want * w).sum(), [h, layer.weight])
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    assert float(g_got[1].abs().max()) > 0


def test_a_basis_not_of_the_hat_form_takes_the_dense_product(f64):
    basis = torch.zeros(3, 5, dtype=torch.float64)
    basis[:, 1] = 0.5
    basis[:, 2] = 0.5
    assert knot_pairs(basis) is not None
    basis[1, 4] = 0.1  # a third non-zero: no two-knot form
    assert knot_pairs(basis) is None
    layer = KnotLinear(4, 5).double()
    h = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(h, basis), _dense(layer, h, basis), atol=1e-12, rtol=0)


def test_the_weight_gradient_is_computed_only_when_asked_for(f64, monkeypatch):
    """The per-patient engine asks autograd for the layers' output gradients only: the knot-sorted
    weight gradient (M − 1 products a call) is not computed then; .backward() still gets it exactly."""
    import clinograph.sdk.model.knot_sorted as ks

    runs = []
    real = ks.sorted_weight_grad
    monkeypatch.setattr(ks, "sorted_weight_grad", lambda *a: runs.append(1) or real(*a))
    gen = torch.Generator().manual_seed(5)
    knots = torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
    layer = KnotLinear(3, len(knots)).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen, dtype=torch.float64))
    basis = hat_basis(torch.randn(4, 5, generator=gen, dtype=torch.float64), knots)
    h0 = torch.randn(4, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    h = 2 * h0  # not a leaf: like the engine's recorded inputs
    w = torch.randn(4, 5, 3, generator=gen, dtype=torch.float64)
    got = layer(h, basis)
    (g_h,) = torch.autograd.grad((got * w).sum(), [h], retain_graph=True)
    assert runs == []  # the input gradient alone: no weight gradient formed
    torch.testing.assert_close(g_h, torch.autograd.grad((_dense(layer, h, basis) * w).sum(), [h])[0],
                               atol=1e-12, rtol=0)
    weighted = []
    real_weighted = ks.knot_weighted
    monkeypatch.setattr(ks, "knot_weighted", lambda *a: weighted.append(1) or real_weighted(*a))
    for upstream in (w, -3 * w.flip(0)):  # twice on one graph: each backward with its own output gradient
        layer.weight.grad = h0.grad = None
        (got * upstream).sum().backward(retain_graph=True)
        dense = (_dense(layer, h, basis) * upstream).sum()
        want = torch.autograd.grad(dense, [layer.weight, h0], retain_graph=True)
        torch.testing.assert_close(layer.weight.grad, want[0], atol=1e-12, rtol=0)
        torch.testing.assert_close(h0.grad, want[1], atol=1e-12, rtol=0)
    assert runs == [1, 1]
    assert weighted == [1, 1]  # B(x) ⊗ g formed once a backward, for the input's and the weight's gradient


def test_the_forwards_knot_sort_is_reused_only_for_the_same_unchanged_basis(f64):
    """KnotLinear.pairs_of (what the engine's clipped sum takes): the forward's sort for the tensor
    that forward took, while it is unchanged; another tensor, or the same one changed in place
    since, is sorted again."""
    knots = torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
    layer = KnotLinear(3, len(knots)).double()
    x = torch.linspace(-5, 5, 12, dtype=torch.float64).reshape(3, 4)
    b1, b2 = hat_basis(x, knots), hat_basis(x.flip(1), knots)
    h = torch.randn(3, 4, 3, dtype=torch.float64)
    layer(h, b1)
    shared = layer.pairs_of(b1)
    assert shared is b1.__dict__[KNOT_SORT_ATTR][1] and shared is not None
    layer(h, b2)  # a later call on another basis: b1's sort stays b1's
    assert layer.pairs_of(b1) is shared
    clone = b1.clone()
    got, want = layer.pairs_of(clone), knot_pairs(clone)
    assert got is not shared
    assert torch.equal(got.order, want.order) and got.counts == want.counts
    b1[0] = b1[0].flip(0)  # changed in place after the forward
    got, want = layer.pairs_of(b1), knot_pairs(b1)
    assert got is not shared
    assert torch.equal(got.order, want.order) and torch.equal(got.weights, want.weights)
    with torch.inference_mode():  # an inference tensor has no version: nothing kept
        bi = hat_basis(x, knots)
        layer(h, bi)
    assert KNOT_SORT_ATTR not in bi.__dict__


def test_a_knot_sort_lives_no_longer_than_its_basis(f64):
    """The sort holds a batch's values as knot weights (patient data): once the basis and the output
    built on it are gone, nothing keeps it -- no module global, nothing on the layer. (A module-level
    one-slot cache kept the last batch's sort until the next call, after training had ended.)"""
    knots = torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
    layer = KnotLinear(3, len(knots)).double()
    basis = hat_basis(torch.linspace(-5, 5, 12, dtype=torch.float64).reshape(3, 4), knots)
    out = layer(torch.randn(3, 4, 3, dtype=torch.float64), basis)
    out.sum().backward()
    sort = weakref.ref(layer.pairs_of(basis).weights)
    assert sort() is not None
    del basis, out
    gc.collect()
    assert sort() is None


def test_two_layers_on_one_basis_sort_it_once_and_a_changed_basis_again(f64, monkeypatch):
    """A star forward hands both layers' KnotLinear the same B(x) (NSFLModel.embed_star): the second
    call takes the first's sort; after an in-place change of the basis it sorts again, and either way
    each output is the dense product's."""
    knots = torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
    gen = torch.Generator().manual_seed(4)
    l1, l2 = KnotLinear(3, len(knots)).double(), KnotLinear(3, len(knots)).double()
    for layer in (l1, l2):
        torch.nn.init.normal_(layer.weight, generator=gen)
    basis = hat_basis(torch.linspace(-6, 6, 20, dtype=torch.float64).reshape(4, 5), knots)
    h = torch.randn(4, 5, 3, generator=gen, dtype=torch.float64)
    sorts = _count_sorts(monkeypatch)
    for layer in (l1, l2):
        torch.testing.assert_close(layer(h, basis), _dense(layer, h, basis), atol=1e-12, rtol=0)
    assert len(sorts) == 1  # one sort for both
    basis[1] = basis[1].flip(-1)  # changed in place: the kept sort is stale
    torch.testing.assert_close(l2(h, basis), _dense(l2, h, basis), atol=1e-12, rtol=0)
    assert len(sorts) == 2


def test_a_star_forward_sorts_its_basis_once_with_the_same_logits(f64, monkeypatch):
    """NSFLModel.embed_star: one basis and one knot sort for both of_patient layers; the logits are
    those of each layer computing its own basis (bit for bit)."""
    from clinograph.sdk.model import NSFLConfig, NSFLModel

    gen = torch.Generator().manual_seed(6)
    m = NSFLModel(7, NSFLConfig(hidden=4, value_encoding="piecewise")).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    fi = torch.randint(0, 7, (5, 6), generator=gen)
    x = 3 * torch.randn(5, 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(5, 6, generator=gen) < 0.8
    sorts = _count_sorts(monkeypatch)
    z = m.forward_star(fi, x, mask)
    assert len(sorts) == 1  # both layers' U on one sort
    h_p1, h_f1 = m._layer1(fi, x, mask)  # each layer its own basis (no basis given)
    xc = m._clip(x)
    h_p2 = torch.relu(m.l2_self_patient(h_p1) + m.l2_of_patient.dense(h_f1, h_p1, xc, mask))
    assert len(sorts) == 3
    assert torch.equal(z, m._head(h_p2) + m.linear_star(fi, xc, mask))
