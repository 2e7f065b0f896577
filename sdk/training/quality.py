"""Client-side data-quality metrics for PFGL-Net's DQ weighting (PFGL-Net §3.2, eqs. 1-2).

A hospital computes two numbers after local training and releases them in its signed report
(its task's ``quality()``, released when ``[release] metrics = "quality"``); the server's ``dq_weighted`` strategy turns them into
aggregation weights (:mod:`clinograph.secure.strategies.dq`).

- ``perf``: performance of the local model on a local *validation* split (never the test
  split). PFGL-Net uses Micro-F1 (eq. 1). For a binary task, micro-averaged F1 over both
  classes equals accuracy, which at ALARM's 10 % shunt prevalence rewards always answering
  "no shunt"; so the default here is eq. (1) literally -- F1 of the positive class
  (2TP / (2TP + FP + FN), 0 when there is nothing to score). ``metric="micro_f1"`` gives the
  paper's micro average (= accuracy), ``metric="auroc"`` a threshold-free alternative.
- ``missing_rate``: PFGL-Net eq. (2), MissingRate = 1 − Π_d (1 − ω_d · p_miss(d)), over every
  feature of the dictionary (a feature the hospital never records has p_miss = 1). ω_d is the
  model's own feature relevance: the NS-FL feature masks m_f = σ(mask logit), normalised to
  sum to 1 (importance shares, as normalised |SHAP| values are; without normalisation 23
  features at m_f ≈ 0.9 would push every hospital's MissingRate to ≈ 1). SHAP-free and
  dynamic: the masks are trained every round.

Privacy: both numbers are computed from patient data (validation labels, missingness) and are
*not* covered by the DP-SGD guarantee; releasing them is a separate release, off unless the
hospital sets ``[release] metrics = "quality"``. They are rounded to ``decimals`` places, which
is not a privacy mechanism.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

from clinograph.core.errors import ConfigError

from ..ingest.table import PatientTable
from ..model.nsfl import NSFLModel

Metric = Literal["f1", "micro_f1", "auroc"]


def f1_positive(y: np.ndarray, p: np.ndarray, *, threshold: float = 0.5) -> float:
    """PFGL-Net eq. (1) for the positive class: 2TP / (2TP + FP + FN); 0 if the denominator is 0."""
    y = np.asarray(y).astype(bool)
    yhat = np.asarray(p) >= threshold
    tp = int(np.sum(y & yhat))
    fp = int(np.sum(~y & yhat))
    fn = int(np.sum(y & ~yhat))
    den = 2 * tp + fp + fn
    return 2 * tp / den if den else 0.0


def micro_f1(y: np.ndarray, p: np.ndarray, *, threshold: float = 0.5) -> float:
    """Micro-averaged F1 over both classes (= accuracy for a single-label task)."""
    y = np.asarray(y).astype(bool)
    if y.size == 0:
        return 0.0
    return float(np.mean(y == (np.asarray(p) >= threshold)))


def performance(y: np.ndarray, p: np.ndarray, *, metric: Metric, threshold: float = 0.5) -> float:
    """The performance dimension Perf ∈ [0, 1] (AUROC is 0.5 when only one class is present)."""
    if metric == "f1":
        return f1_positive(y, p, threshold=threshold)
    if metric == "micro_f1":
        return micro_f1(y, p, threshold=threshold)
    if metric == "auroc":
        from sklearn.metrics import roc_auc_score

        y = np.asarray(y).astype(int)
        return float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else 0.5
    raise ConfigError(f"Unknown quality metric {metric!r}. Use one of: f1, micro_f1, auroc.")


def missing_probabilities(table: PatientTable) -> np.ndarray:
    """p_miss(d) for every dictionary feature d: the share of this hospital's patients without it.

    Shapes: -> [n_dictionary_features].
    """
    _, observed = table.dense()
    if observed.shape[0] == 0:
        return np.ones(observed.shape[1])
    return 1.0 - observed.mean(axis=0)


def mask_importance(model: NSFLModel) -> np.ndarray:
    """ω_d: the NS-FL feature masks m_f, normalised to sum to 1. Shapes: -> [n_features]."""
    with torch.no_grad():
        m = model.feature_mask(torch.arange(model.n_features)).double().numpy()
    total = m.sum()
    return m / total if total > 0 else np.full(len(m), 1.0 / len(m))


def weighted_missing_rate(p_miss: np.ndarray, omega: np.ndarray) -> float:
    """PFGL-Net eq. (2): 1 − Π_d (1 − ω_d · p_miss(d)). Needs ω_d · p_miss(d) ∈ [0, 1]."""
    p_miss, omega = np.asarray(p_miss, float), np.asarray(omega, float)
    if p_miss.shape != omega.shape:
        raise ValueError(f"p_miss has shape {p_miss.shape}, omega {omega.shape}; they must match.")
    prod = np.clip(omega * p_miss, 0.0, 1.0)
    return float(1.0 - np.prod(1.0 - prod))


def quality_evaluator(*, model: NSFLModel, table: PatientTable, val_idx: np.ndarray,
                      predict: Callable[[], np.ndarray], metric: Metric = "f1", threshold: float = 0.5,
                      decimals: int = 4) -> Callable[[], dict[str, float]]:
    """An ``evaluate`` callable for :class:`HospitalClient`: ``{"perf", "missing_rate"}``.

    ``predict()`` returns probabilities for every patient of ``table`` with the current model;
    ``perf`` is scored on ``val_idx`` only. p_miss is a property of the table (computed once);
    ω follows the masks, so ``missing_rate`` is recomputed each call.
    """
    val_idx = np.asarray(val_idx, dtype=np.int64)
    if val_idx.size == 0:
        raise ConfigError(f"Hospital {table.site!r} has an empty validation split; raise the validation fraction.")
    performance(np.zeros(1), np.zeros(1), metric=metric)  # validates the metric name up front
    p_miss = missing_probabilities(table)
    labels = np.asarray(table.labels)

    def evaluate() -> dict[str, float]:
        p = np.asarray(predict())
        perf = performance(labels[val_idx], p[val_idx], metric=metric, threshold=threshold)
        mr = weighted_missing_rate(p_miss, mask_importance(model))
        return {"perf": round(perf, decimals), "missing_rate": round(mr, decimals)}

    return evaluate
