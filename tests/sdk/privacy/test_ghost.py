"""The engine's per-layer parts (sdk/privacy/ghost.py): ghost norms and formed per-patient
gradients agree with each patient's gradient written out, in every branch the cost rule picks."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.privacy.ghost import (
    INDEX_ADD_WIDTH,
    EmbeddingWeight,
    Formed,
    LinearWeight,
    positions,
)

B = 5


def _gen():
    return torch.Generator().manual_seed(3)


def _linear_reference(calls):
    """g_i = Σ_calls Σ_t b_{i,t} a_{i,t}ᵀ, one patient and one position at a time."""
    d_in, d_out = calls[0][0].shape[-1], calls[0][1].shape[-1]
    out = torch.zeros(B, d_out, d_in, dtype=torch.float64)
    for a, b in calls:
        for i in range(B):
            for t in range(a.shape[1]):
                out[i] += torch.outer(b[i, t], a[i, t])
    return out.reshape(B, -1)


@pytest.mark.parametrize(("positions", "d_in", "d_out", "formed"), [
    ((1,), 6, 4, False),  # one position: ‖a‖²‖b‖²
    ((3,), 40, 30, False),  # few positions, wide layer: the ghost norm Σ_{t,s}(a_t·a_s)(b_t·b_s)
    ((2, 2), 40, 30, False),  # two calls of one layer (ghost, their positions joined)
    ((12,), 3, 2, True),  # many positions, narrow layer: g_i formed
    ((7, 1), 3, 2, True),  # two calls, formed: one product a call, summed
    ((1, 7, 6), 3, 2, True),  # three calls, formed: the first an outer product, the others added in place
])
def test_linear_weight_part_equals_the_written_out_gradient(positions, d_in, d_out, formed):
    g = _gen()
    calls = [(torch.randn(B, t, d_in, generator=g, dtype=torch.float64),
              torch.randn(B, t, d_out, generator=g, dtype=torch.float64)) for t in positions]
    part = LinearWeight(calls)
    assert (part.formed is not None) == formed
    ref = _linear_reference(calls)
    c = torch.rand(B, generator=g, dtype=torch.float64)
    torch.testing.assert_close(part.norm2(), ref.pow(2).sum(1))
    torch.testing.assert_close(part.clipped(c), c @ ref)
    torch.testing.assert_close(part.per_sample(), ref)


@pytest.mark.parametrize(("expand", "t"), [((B, 3, 4, 6), 12), ((B, 3, 1, 6), 3), ((B, 1, 1, 6), 1), ((1, 1, 1, 6), 1)],
                         ids=["not-broadcast", "per-time-step", "per-patient", "one-vector"])
def test_an_input_broadcast_over_positions_gives_the_gradient_of_every_position(expand, t):
    """A [B, T, K, d] input read with stride 0 along some axes (a vector per time step over the
    features, one per patient, or one for all): its positions are summed first, exactly."""
    g = _gen()
    a = torch.randn(expand, generator=g, dtype=torch.float64).expand(B, 3, 4, 6)
    out = torch.randn(B, 3, 4, 2, generator=g, dtype=torch.float64)
    a3, b3 = positions(a, out, B)
    assert a3.shape[1] == t == b3.shape[1]
    ref = _linear_reference([(a.reshape(B, 12, 6), out.reshape(B, 12, 2))])
    torch.testing.assert_close(LinearWeight([(a3, b3)]).per_sample(), ref)


@pytest.mark.parametrize(("rows", "formed", "d"), [(50, False, 3), (4, True, 3), (4, True, INDEX_ADD_WIDTH)],
                         ids=["ghost", "formed-scatter", "formed-index-add"])
def test_embedding_part_equals_the_written_out_gradient(rows, formed, d):
    g = _gen()
    t = 5
    index = torch.randint(0, min(rows, 4), (B, t), generator=g)  # repeated rows within a patient
    grad = torch.randn(B, t, d, generator=g, dtype=torch.float64)
    part = EmbeddingWeight(index, grad, rows)
    assert (part.formed is not None) == formed
    ref = torch.zeros(B, rows, d, dtype=torch.float64)
    for i in range(B):
        for s in range(t):
            ref[i, index[i, s]] += grad[i, s]
    ref = ref.reshape(B, -1)
    c = torch.rand(B, generator=g, dtype=torch.float64)
    torch.testing.assert_close(part.norm2(), ref.pow(2).sum(1))
    torch.testing.assert_close(part.clipped(c), c @ ref)
    torch.testing.assert_close(part.per_sample(), ref)


def test_formed_part_and_a_wrong_reference_disagree():
    """Negative control: the comparison sees a wrong gradient (one patient's row changed)."""
    g = torch.randn(B, 4, generator=_gen(), dtype=torch.float64)
    part = Formed(g)
    wrong = g.clone()
    wrong[2] *= 1.5
    assert not torch.allclose(part.norm2(), wrong.pow(2).sum(1))


@pytest.mark.parametrize("basis_kind", ["hat", "hat_on_and_beyond_knots", "any"])
@pytest.mark.parametrize("positions", [1, 6])
def test_knot_part_equals_the_piecewise_layers_own_per_patient_gradient(positions, basis_kind):
    """The piecewise encoding's U (KnotLinear called on (h, B(x))): the factorised ghost norm,
    the clipped sum and the formed gradient against each patient's own autograd gradient. A hat
    basis (two adjacent non-zeros) takes the knot-sorted clipped sum, values exactly on the knots and
    beyond them included (one non-zero, at an outer knot); any other basis the dense product."""
    from clinograph.sdk.model.knot_sorted import knot_pairs
    from clinograph.sdk.model.layers import KnotLinear, hat_basis
    from clinograph.sdk.privacy.ghost import KnotWeight

    g = _gen()
    d, knots = 4, torch.tensor([-1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
    layer = KnotLinear(d, len(knots)).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64))
    h = torch.randn(B, positions, d, generator=g, dtype=torch.float64)
    x = 2 * torch.rand(B, positions, generator=g, dtype=torch.float64) - 1
    if basis_kind == "hat_on_and_beyond_knots":  # on every knot, below the first, above the last
        x.view(-1)[:6] = torch.tensor([-3.0, -1.0, 0.0, 0.5, 1.0, 3.0], dtype=torch.float64)[:x.numel()]
    basis = hat_basis(x, knots) if basis_kind != "any" else torch.rand(B, positions, len(knots), generator=g,
                                                                      dtype=torch.float64)
    w_out = torch.randn(B, positions, d, generator=g, dtype=torch.float64)  # Σ_t w_t·out_t: patient i's loss
    ref = torch.stack([torch.autograd.grad((layer(h[i:i + 1], basis[i:i + 1]) * w_out[i:i + 1]).sum(),
                                           layer.weight)[0].reshape(-1) for i in range(B)])
    # the same map as U h followed by the basis-weighted sum (the form it replaces)
    u = layer(h).reshape(B, positions, len(knots), d)
    torch.testing.assert_close(layer(h, basis), (basis.unsqueeze(-1) * u).sum(-2))
    part = KnotWeight(h, basis, w_out)
    assert (knot_pairs(basis) is None) == (basis_kind == "any")  # the path meant is the path taken
    c = torch.rand(B, generator=g, dtype=torch.float64)
    torch.testing.assert_close(part.norm2(), ref.pow(2).sum(1))
    torch.testing.assert_close(part.clipped(c), c @ ref)
    torch.testing.assert_close(part.per_sample(), ref)


def test_a_workspace_buffer_taken_in_inference_mode_is_not_handed_out_for_writing_outside_it():
    from clinograph.sdk.privacy.ghost import Workspace

    ws = Workspace()
    with torch.inference_mode():
        inside = ws.take((4, 3), torch.float32)
        inside.zero_()
    ws.rewind()
    outside = ws.take((4, 3), torch.float32)  # a step computed outside inference mode
    assert not outside.is_inference()
    outside.zero_()  # raised "Inplace update to inference tensor outside InferenceMode" when reused
    ws.rewind()
    with torch.inference_mode():
        assert ws.take((4, 3), torch.float32).is_inference()
