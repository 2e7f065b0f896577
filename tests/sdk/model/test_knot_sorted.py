"""The piecewise encoding's per-copy product by knot groups (sdk/model/knot_sorted.py) is the dense
product of B(x) ⊗ h with [U_0 … U_{M-1}]: output, input gradient and weight gradient, float64."""

import torch
from clinograph.sdk.model.knot_sorted import knot_pairs
from clinograph.sdk.model.layers import KnotLinear, hat_basis
from clinograph.sdk.model.nsfl import SHAPE_KNOTS


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
