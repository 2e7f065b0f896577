"""Client-side quality metrics: eq. (1) F1, eq. (2) importance-weighted missing rate from the masks."""

import numpy as np
import pytest
import torch
from clinograph.sdk.model.nsfl import NSFLModel
from clinograph.sdk.training.quality import (
    f1_positive,
    mask_importance,
    micro_f1,
    missing_probabilities,
    performance,
    quality_evaluator,
    weighted_missing_rate,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError


def test_f1_and_micro_f1_by_hand():
    y = np.array([1, 1, 0, 0, 0, 1])
    p = np.array([0.9, 0.2, 0.7, 0.1, 0.3, 0.6])  # TP=2, FN=1, FP=1, TN=2
    assert f1_positive(y, p) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))  # 0.6667
    assert micro_f1(y, p) == pytest.approx(4 / 6)
    assert f1_positive(np.zeros(4), np.zeros(4)) == 0.0  # nothing to score -> 0, no division error
    assert performance(np.zeros(3), np.array([0.2, 0.3, 0.9]), metric="auroc") == 0.5
    with pytest.raises(ConfigError, match="Unknown quality metric 'acc'"):
        performance(y, p, metric="acc")


def test_eq2_weighted_missing_rate_by_hand():
    # 1 - (1 - 0.5*0.2)(1 - 0.5*0.6) = 1 - 0.9*0.7 = 0.37
    assert weighted_missing_rate(np.array([0.2, 0.6]), np.array([0.5, 0.5])) == pytest.approx(0.37)
    assert weighted_missing_rate(np.zeros(3), np.full(3, 1 / 3)) == 0.0
    # an irrelevant feature (ω = 0) does not count however missing it is
    assert weighted_missing_rate(np.array([1.0, 0.1]), np.array([0.0, 1.0])) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="must match"):
        weighted_missing_rate(np.zeros(2), np.zeros(3))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.01, 1)), min_size=1, max_size=30))
def test_missing_rate_is_in_0_1_and_at_most_the_weighted_mean(pairs):
    p = np.array([a for a, _ in pairs])
    w = np.array([b for _, b in pairs])
    w = w / w.sum()
    mr = weighted_missing_rate(p, w)
    assert 0.0 <= mr <= 1.0
    assert mr <= float(np.dot(w, p)) + 1e-12  # Weierstrass: 1 - Π(1 - x_d) <= Σ x_d


def test_missing_probabilities_follow_the_table_and_absent_features_count_as_missing():
    east = small_tables()[2]  # lacks the blood-gas block entirely
    p = missing_probabilities(east)
    ids = east.dictionary.node_ids()
    assert p.shape == (len(ids),)
    for f in ("sao2", "svo2", "paco2"):
        assert p[ids.index(f)] == 1.0
    observed = east.observed_nodes()
    assert np.all(p[observed] < 0.2)  # the demo's 5 % MCAR cells


def test_mask_importance_tracks_the_trained_masks():
    model = NSFLModel(4)
    w = mask_importance(model)
    assert w == pytest.approx(np.full(4, 0.25)) and w.sum() == pytest.approx(1.0)
    with torch.no_grad():
        model.mask_logit.weight[0] = -20.0  # feature 0 judged irrelevant
    w = mask_importance(model)
    assert w[0] < 1e-6 and w[1:] == pytest.approx(np.full(3, 1 / 3), rel=1e-5)
    # then missingness of feature 0 no longer lowers the structural quality
    assert weighted_missing_rate(np.array([1.0, 0, 0, 0]), w) < 1e-6


def test_evaluator_scores_the_validation_split_only():
    table = small_tables()[0]
    model = NSFLModel(len(table.dictionary.node_ids()))
    val = np.arange(20)
    truth = table.labels.astype(float)
    perfect_on_val = truth.copy()
    perfect_on_val[20:] = 1 - perfect_on_val[20:]  # wrong everywhere else
    ev = quality_evaluator(model=model, table=table, val_idx=val, predict=lambda: perfect_on_val, metric="micro_f1")
    out = ev()
    assert set(out) == {"perf", "missing_rate"}
    assert out["perf"] == 1.0
    assert 0 < out["missing_rate"] < 0.2
    with pytest.raises(ConfigError, match="empty validation split"):
        quality_evaluator(model=model, table=table, val_idx=np.array([], int), predict=lambda: truth)
