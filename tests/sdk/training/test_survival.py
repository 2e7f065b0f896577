"""The discrete-time hazard likelihood and the survival metrics (sdk/training/survival.py):
censored patients contribute survival terms, the loss is a per-patient sum, the horizon AUROC
leaves patients censored before t out of the controls, the C-index is lifelines'."""

import numpy as np
import pytest
import torch
from clinograph.sdk.training.survival import (
    concordance,
    hazard_nll,
    hazard_nll_sum,
    horizon_auroc_ipcw,
    interval_targets,
    risk_at,
    survival_curves,
    survival_metrics,
)
from sklearn.metrics import roc_auc_score

BREAKS = np.array([10.0, 20.0, 30.0])


def test_interval_targets_keep_censored_patients():
    time = np.array([5.0, 15.0, 12.0, 18.0, 45.0, 45.0])
    event = np.array([1, 1, 0, 0, 1, 0])
    s, e = interval_targets(time, event, BREAKS)
    np.testing.assert_array_equal(e, [[1, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(s[0], [0, 0, 0])  # event in the first interval
    np.testing.assert_array_equal(s[1], [1, 0, 0])  # survived the first, event in the second
    np.testing.assert_array_equal(s[2], [1, 0, 0])  # censored at 12: less than half of (10, 20] seen
    np.testing.assert_array_equal(s[3], [1, 1, 0])  # censored at 18: more than half seen (Gensheimer's rule)
    np.testing.assert_array_equal(s[4], [1, 1, 1])  # an event past the last break: censored at b_K
    np.testing.assert_array_equal(s[5], [1, 1, 1])
    assert s[2].sum() > 0  # a censored patient contributes, it is not dropped


def test_loss_is_a_sum_over_patients_and_matches_numpy():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(7, 3))
    s, e = interval_targets(rng.uniform(0, 40, 7), rng.integers(0, 2, 7), BREAKS)
    whole = float(hazard_nll(torch.tensor(z), torch.tensor(s), torch.tensor(e)))
    per = [float(hazard_nll(torch.tensor(z[i:i + 1]), torch.tensor(s[i:i + 1]), torch.tensor(e[i:i + 1])))
           for i in range(7)]
    assert whole == pytest.approx(np.mean(per))  # decomposes: minibatches and per-patient DP clipping work
    assert hazard_nll_sum(z, s, e) == pytest.approx(7 * whole)
    h = 1 / (1 + np.exp(-z))
    assert hazard_nll_sum(z, s, e) == pytest.approx(-np.sum(s * np.log(1 - h) + e * np.log(h)))


def test_curves_and_risk_at_the_horizon():
    z = np.array([[-2.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    curves = survival_curves(z)
    assert np.all(np.diff(curves, axis=1) < 0)
    np.testing.assert_allclose(curves[1], [0.5, 0.25, 0.125])
    np.testing.assert_allclose(risk_at(z, BREAKS, 20.0), 1 - curves[:, 1])
    assert 1 - curves[1, 0] < risk_at(z, BREAKS, 15.0)[1] < 1 - curves[1, 1]


def test_horizon_auroc_excludes_patients_censored_before_t():
    time = np.array([1.0, 2.0, 3.0, 8.0, 9.0, 4.0])
    event = np.array([1, 1, 1, 0, 0, 0])
    risk = np.array([0.9, 0.8, 0.2, 0.3, 0.1, 0.95])
    # patient 5 is censored at 4 < t = 5: not a control although it has the top risk
    known = np.array([1, 1, 1, 1, 1, 0], bool)
    y = np.array([1, 1, 1, 0, 0, 0])
    m = survival_metrics(time, event, risk, horizon=5.0)
    assert m["auroc"] == pytest.approx(roc_auc_score(y[known], risk[known]))
    assert m["known"] == 5
    # without censoring before t the IPCW weights are all 1
    assert horizon_auroc_ipcw(time[:5], event[:5], risk[:5], 5.0) == pytest.approx(roc_auc_score(y[:5], risk[:5]))


def test_concordance_is_harrells():
    from lifelines.utils import concordance_index

    rng = np.random.default_rng(1)
    t, e, r = rng.exponential(10, 40), rng.integers(0, 2, 40), rng.normal(size=40)
    assert concordance(t, e, r) == pytest.approx(concordance_index(t, -r, e))
    assert concordance(np.array([1.0, 2, 3]), np.array([1, 1, 1]), np.array([3.0, 2, 1])) == 1.0
