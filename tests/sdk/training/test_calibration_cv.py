"""Platt scaling with its pull towards the identity chosen by cross-validation on the validation
patients (sdk/training/calibration.py fit_platt_cv): it calibrates when the model is off on
patients the fit did not see, and keeps (near) the identity when the model is already calibrated
and a free fit on a few dozen patients would fit noise."""

import numpy as np
import pytest
from clinograph.sdk.training.calibration import Platt, cv_folds, fit_platt, fit_platt_cv
from scipy.special import expit


def _log_loss(cal: Platt, z, y):
    s = cal.a * z + cal.b
    return float(np.mean(np.logaddexp(0.0, s) - y * s))


def _draw(rng, n, scale, shift=0.0):
    """Patients whose true logit is t; the model reports z = scale·t + shift."""
    t = rng.normal(0.0, 1.5, n)
    y = (rng.random(n) < expit(t)).astype(float)
    return scale * t + shift, y


def test_an_overconfident_model_is_calibrated():
    rng = np.random.default_rng(0)
    z, y = _draw(rng, 120, scale=3.0, shift=1.0)
    cal = fit_platt_cv(z, y)
    assert cal != Platt() and 0 < cal.a < 0.7  # shrinks the logits back
    zt, yt = _draw(np.random.default_rng(1), 20_000, scale=3.0, shift=1.0)
    assert _log_loss(cal, zt, yt) < _log_loss(Platt(), zt, yt) - 0.05


def test_a_calibrated_model_on_few_patients_is_not_made_worse_on_average():
    """30 validation patients of an already calibrated model: the free fit (fixed weak pull)
    fits noise and raises the expected test loss; the cross-validated choice does not."""
    test_z, test_y = _draw(np.random.default_rng(99), 20_000, scale=1.0)
    base, free, cv = [], [], []
    for seed in range(40):
        z, y = _draw(np.random.default_rng(seed), 30, scale=1.0)
        base.append(_log_loss(Platt(), test_z, test_y))
        free.append(_log_loss(fit_platt(z, y), test_z, test_y))
        cv.append(_log_loss(fit_platt_cv(z, y), test_z, test_y))
    assert np.mean(free) > np.mean(base) + 0.005  # the problem this solves is real
    assert np.mean(cv) < np.mean(free)
    assert np.mean(cv) <= np.mean(base) + 0.005


def test_folds_are_stratified_deterministic_and_too_few_patients_give_the_identity():
    y = np.array([1, 0, 0, 1, 0, 0, 1, 0, 0, 0])
    f = cv_folds(y, 3)
    assert np.array_equal(f, cv_folds(y, 3))
    for k in range(3):
        assert (y[f == k] == 1).sum() == 1
    assert fit_platt_cv(np.array([0.5, -0.2, 1.0]), np.array([1.0, 0.0, 1.0])) == Platt()  # one negative
    with pytest.raises(AssertionError):  # the assertion above can fail: a real fit is not the identity
        assert fit_platt_cv(*_draw(np.random.default_rng(0), 200, scale=4.0, shift=2.0)) == Platt()
