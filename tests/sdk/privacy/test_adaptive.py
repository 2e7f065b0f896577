"""Adaptive clipping on the per-patient engine (sdk/privacy/adaptive.py, Andrew et al. 2021)."""

from __future__ import annotations

import math

import pytest
import torch
from clinograph.sdk.privacy.adaptive import AdaptiveClip
from clinograph.sdk.privacy.per_patient import PerPatientClipper
from torch import nn

from clinograph.core.errors import PrivacyError


def _zero(std, shape, dtype):
    return torch.zeros(shape, dtype=dtype)


def _setup(scale: float):
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()

    def objective(mo, inputs, y):
        return 0.5 * (mo(inputs[0]).squeeze(-1) - y).pow(2).sum()  # a gradient that grows with |x|

    x = scale * torch.randn(8, 3, dtype=torch.float64)
    y = torch.full((8,), 1e-3, dtype=torch.float64)
    return model, PerPatientClipper(model, objective=objective), x, y


@pytest.mark.parametrize(("scale", "direction"), [(1e-3, "down"), (1e3, "up")])
def test_the_clip_follows_the_unclipped_fraction(scale, direction):
    """All patients unclipped (tiny gradients): C ← C·exp(−η(1 − γ)); all clipped: C ← C·exp(ηγ), capped."""
    model, engine, x, y = _setup(scale)
    ada = AdaptiveClip(noise_multiplier=1.0, clip=1.5, target_unclipped_quantile=0.5, clipbound_learning_rate=0.2,
                       max_clipbound=4.0, min_clipbound=0.01, unclipped_num_std=10.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = ada.step(engine, opt, (x,), labels=y, expected_batch=8, noise=_zero)
    frac = 1.0 if direction == "down" else 0.0
    assert ((out.norms + 1e-6) <= 1.5).float().mean().item() == frac
    assert ada.clip == pytest.approx(1.5 * math.exp(-0.2 * (frac - 0.5)))


def test_the_gradient_noise_is_split_as_theorem_1_says():
    ada = AdaptiveClip(noise_multiplier=1.0, clip=1.0, target_unclipped_quantile=0.5, clipbound_learning_rate=0.2,
                       max_clipbound=1.0, min_clipbound=0.01, unclipped_num_std=10.0)
    assert ada.gradient_multiplier == pytest.approx((1.0 - 1 / 400) ** -0.5)
    with pytest.raises(PrivacyError, match=r"must be below 2 × unclipped_num_std"):
        AdaptiveClip(noise_multiplier=20.0, clip=1.0, target_unclipped_quantile=0.5, clipbound_learning_rate=0.2,
                     max_clipbound=1.0, min_clipbound=0.01, unclipped_num_std=10.0)
