"""The engine's part rules (sdk/privacy/part_rules.py): per-patient gradients equal a per-patient
loop for strided, padded and dilated convolutions (the windowed-view and the unfold paths) and for every
Linear call form, whose one-position layers' norms and clipped sums the engine takes together
(``OnePositionLayers``: a layer with and one without a bias)."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.model.knot_sorted import KnotPairs
from clinograph.sdk.privacy.per_patient import PerPatientClipper
from torch import nn


def _objective(model, inputs, labels):
    return (model(inputs[0]) * labels).sum()


@pytest.mark.parametrize(("channels", "stride", "padding", "dilation"),
                         [(2, 2, 3, 1), (1, 2, 3, 1), (2, 1, 0, 1), (2, 2, 2, 2)],
                         ids=["strided-padded", "one-channel", "plain", "dilated"])
def test_conv1d_per_patient_gradients_equal_a_per_patient_loop(channels, stride, padding, dilation):
    """Both conv paths: the windowed view (copied as [B, C_in·k, L_out], read transposed; with one input
    channel its reshape alone is still a view) and the unfold of a dilated one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(channels, 3, 5, stride=stride, padding=padding, dilation=dilation),
                          nn.Flatten(), nn.LazyLinear(1)).double()
    x = torch.randn(4, channels, 17, dtype=torch.float64)
    model(x)  # materialise the lazy layer
    y = torch.randn(4, 1, dtype=torch.float64)
    engine = PerPatientClipper(model, objective=_objective)
    grads, _ = engine.per_sample(x, labels=y)
    for i in range(4):
        model.zero_grad(set_to_none=True)
        _objective(model, (x[i:i + 1],), y[i:i + 1]).backward()
        for p, g in zip(engine.params, grads, strict=True):
            torch.testing.assert_close(g[i], p.grad)
    assert isinstance(engine.leaves[0], nn.Conv1d)


class _Mixed(nn.Module):
    """Linear calls in every form the Linear rule tells apart: one call on [B, d] (weight and bias
    kept 2-D), one without bias, one with a frozen weight, a layer called twice on [B, d] (its calls'
    positions joined), one called on [B, 1, d] (one position, 3-D) and one on [B, T, d]."""

    def __init__(self):
        super().__init__()
        self.a, self.nob = nn.Linear(3, 4), nn.Linear(4, 4, bias=False)
        self.frozen_w, self.twice = nn.Linear(4, 4), nn.Linear(4, 4)
        self.one_pos, self.seq = nn.Linear(4, 2), nn.Linear(3, 2)
        self.frozen_w.weight.requires_grad_(False)

    def forward(self, x, s):
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.twice(self.frozen_w(self.nob(h))) + self.twice(h))
        return self.one_pos(h.unsqueeze(1)).sum((1, 2)) + self.seq(s).sum((1, 2))


def test_linear_rule_gives_each_patients_gradient_and_clipped_sum_in_every_call_form():
    torch.manual_seed(0)
    model = _Mixed().double()
    x, s = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 6, 3, dtype=torch.float64)
    y = torch.randn(5, dtype=torch.float64)
    engine = PerPatientClipper(model, objective=lambda m, inp, lab: (m(*inp) * lab).sum())
    grads, _ = engine.per_sample(x, s, labels=y)
    rows = []
    for i in range(5):
        model.zero_grad(set_to_none=True)
        (model(x[i:i + 1], s[i:i + 1]) * y[i:i + 1]).sum().backward()
        for p, g in zip(engine.params, grads, strict=True):
            torch.testing.assert_close(g[i], p.grad)
        rows.append(torch.cat([p.grad.reshape(-1) for p in engine.params]))
    per = torch.stack(rows)
    c = (0.5 / (per.norm(dim=1) + 1e-6)).clamp(max=1.0)
    out = engine.clipped_sum(x, s, labels=y, clip_norm=0.5)
    torch.testing.assert_close(out.norms, per.norm(dim=1))
    torch.testing.assert_close(out.summed, c @ per)


class _Knots(nn.Module):
    """A KnotLinear on (h, B(x)) after an input layer, once or twice a forward (the engine takes the
    forward's knot sort for one call, sorts again for joined calls)."""

    def __init__(self, calls: int):
        super().__init__()
        from clinograph.sdk.model.layers import KnotLinear
        from clinograph.sdk.model.nsfl import SHAPE_KNOTS

        self.calls, self.knots = calls, torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
        self.inp, self.U = nn.Linear(2, 3), KnotLinear(3, len(SHAPE_KNOTS))

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # z [B, T, 3]: two input features, a value
        from clinograph.sdk.model.layers import hat_basis

        h = self.inp(z[..., :2])
        out = self.U(h, hat_basis(4 * z[..., 2], self.knots)).sum((1, 2))
        if self.calls == 2:
            out = out + self.U(h.flip(1), hat_basis(-4 * z[..., 2], self.knots)).sum((1, 2))
        return out


@pytest.mark.parametrize("calls", [1, 2])
def test_knot_rule_with_the_forwards_sort_gives_each_patients_gradient_and_clipped_sum(calls, monkeypatch):
    torch.manual_seed(1)
    model = _Knots(calls).double()
    with torch.no_grad():
        model.U.weight.normal_()
    z = torch.randn(5, 6, 3, dtype=torch.float64)
    z[0, :, 2] = torch.linspace(-2, 2, 6)  # across every knot and beyond the outer ones
    y = torch.randn(5, dtype=torch.float64)
    engine = PerPatientClipper(model, objective=_objective)
    per = []
    for i in range(5):
        model.zero_grad(set_to_none=True)
        _objective(model, (z[i:i + 1],), y[i:i + 1]).backward()
        per.append(torch.cat([p.grad.reshape(-1) for p in engine.params]))
    want = torch.stack(per)
    grads, _ = engine.per_sample(z, labels=y)
    torch.testing.assert_close(engine.flat(grads, 5, torch.float64), want)
    out = engine.clipped_sum(z, labels=y, clip_norm=1.0)
    factor = (1.0 / (want.norm(dim=1) + 1e-6)).clamp(max=1.0)
    assert float(factor.min()) < 1
    torch.testing.assert_close(out.summed, factor @ want)
    import clinograph.sdk.model.layers as layers

    sorts, real = [], layers.knot_pairs
    monkeypatch.setattr(layers, "knot_pairs", lambda b: sorts.append(1) or real(b))
    parts, _ = engine._parts((z,), y)
    (knot,) = [p for p in parts.values() if hasattr(p, "pairs")]
    assert isinstance(knot.pairs, KnotPairs) == (calls == 1)  # the forward's sort, for one call
    assert len(sorts) == calls  # the forward's calls sorted; the rule sorted nothing again


@pytest.mark.parametrize("small_part", [64, 0], ids=["small-parts-together", "each-on-its-own"])
def test_small_formed_parts_taken_together_give_the_loops_norms_and_clipped_sum(monkeypatch, small_part):
    """The formed parts of at most ghost.SMALL_PART elements a patient (here the [B, 6, 3] layer's weight
    and bias, the twice-called layer's, the bias of a frozen weight and of the [B, 1, d] call) take their norms and clipped sums as one concatenation
    (ghost.SmallParts); the one-position layers as one OnePositionLayers; both against the loop, and the
    same with the small parts one by one."""
    from clinograph.sdk.privacy import ghost

    monkeypatch.setattr(ghost, "SMALL_PART", small_part)
    torch.manual_seed(2)
    model = _Mixed().double()
    x, s = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 6, 3, dtype=torch.float64)
    y = torch.randn(6, dtype=torch.float64)
    engine = PerPatientClipper(model, objective=lambda m, inp, lab: (m(*inp) * lab).sum())
    grads, _ = engine.per_sample(x, s, labels=y)
    per = engine.flat(grads, 6, torch.float64)
    parts, _ = engine._parts((x, s), y, inference=True)
    one, small, rest = engine._together(parts, torch.float64)
    index = {id(p): i for i, p in enumerate(engine.params)}
    want_small = {index[id(p)] for p in (model.seq.weight, model.seq.bias, model.twice.weight, model.twice.bias,
                                         model.frozen_w.bias, model.one_pos.bias)}
    assert (set(small[1]) == want_small) if small_part else small is None
    assert one is not None and {index[id(model.a.weight)], index[id(model.a.bias)]} <= one[1]
    assert set(rest) | one[1] | (set(small[1]) if small else set()) == set(parts)  # every part once
    for clip in (0.3, 100.0):  # clipped and not
        c = (clip / (per.norm(dim=1) + 1e-6)).clamp(max=1.0)
        out = engine.clipped_sum(x, s, labels=y, clip_norm=clip)
        torch.testing.assert_close(out.norms, per.norm(dim=1))
        torch.testing.assert_close(out.summed, c @ per)
