"""Platt scaling never turns a ranking model into a constant (the damped fit on saturated logits)."""

import numpy as np
from clinograph.sdk.training.calibration import Platt, fit_platt
from clinograph.sdk.training.metrics import binary_metrics


def test_saturated_negative_logits_are_calibrated_not_collapsed():
    rng = np.random.default_rng(0)
    y = (rng.random(300) < 0.1).astype(float)
    z = -5.3 + 0.3 * y + 0.1 * rng.normal(size=300)  # a DP model: every probability near 0.005, ranking kept
    cal = fit_platt(z, y)
    p = cal(z)
    assert cal.a > 0 and np.std(p) > 1e-3  # not a constant
    assert binary_metrics(y, p)["auroc"] > 0.9
    assert abs(p.mean() - y.mean()) < 0.05  # the base rate is absorbed


def test_a_fit_no_better_than_the_identity_is_the_identity():
    y = np.array([0.0, 1.0, 0.0, 1.0])
    z = np.array([-1.0, 1.0, -1.0, 1.0]) * 50  # separable: the penalised fit stays the identity or better
    cal = fit_platt(z, y)
    assert isinstance(cal, Platt) and cal.a > 0
