"""Brier, ECE and log loss; Platt scaling fitted on validation."""

import numpy as np
import pytest
from clinograph.sdk.training.calibration import Platt, fit_platt, logit
from clinograph.sdk.training.metrics import (
    binary_metrics,
    brier,
    expected_calibration_error,
    log_loss,
)


def test_metrics_on_known_values():
    y, p = np.array([0, 1, 1, 0]), np.array([0.1, 0.9, 0.6, 0.4])
    assert brier(y, p) == pytest.approx((0.01 + 0.01 + 0.16 + 0.16) / 4)
    # bins: 0.1 -> b1 (y 0), 0.4 -> b4 (y 0), 0.6 -> b6 (y 1), 0.9 -> b9 (y 1)
    assert expected_calibration_error(y, p) == pytest.approx((0.1 + 0.4 + 0.4 + 0.1) / 4)
    assert log_loss(y, p) == pytest.approx(-np.mean(np.log([0.9, 0.9, 0.6, 0.6])))
    m = binary_metrics(y, p)
    assert set(m) == {"auroc", "auprc", "brier", "ece", "loss", "n", "positives"} and m["auroc"] == 1.0


def test_a_perfectly_calibrated_score_has_small_ece():
    rng = np.random.default_rng(0)
    p = rng.random(200_000)
    y = (rng.random(p.size) < p).astype(int)
    assert expected_calibration_error(y, p) < 0.01


def test_platt_recovers_a_miscalibrated_logit_and_keeps_the_ranking():
    rng = np.random.default_rng(1)
    z = rng.normal(size=20_000)
    y = (rng.random(z.size) < 1 / (1 + np.exp(-(0.5 * z - 1.0)))).astype(int)
    fit = fit_platt(z * 1.0, y, l2=0.0)
    assert fit.a == pytest.approx(0.5, abs=0.05) and fit.b == pytest.approx(-1.0, abs=0.05)
    before, after = 1 / (1 + np.exp(-z)), fit(z)
    assert expected_calibration_error(y, after) < expected_calibration_error(y, before)
    assert np.array_equal(np.argsort(before, kind="stable"), np.argsort(after, kind="stable"))
    np.testing.assert_allclose(fit.apply_to_probabilities(before), after, atol=1e-9)


def test_platt_is_the_identity_for_one_class_or_an_inverted_fit():
    assert fit_platt(np.array([0.1, 0.2]), np.array([1, 1])) == Platt()
    z = np.linspace(-3, 3, 200)
    assert fit_platt(z, (z < 0).astype(int), l2=0.0) == Platt()  # would invert the ranking
    np.testing.assert_allclose(logit(np.array([0.5])), [0.0])
