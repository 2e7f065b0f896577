"""Discrimination and calibration of a binary risk: AUROC and AUPRC (the NS-FL paper's
metrics), Brier score, expected calibration error and log loss, with the degenerate cases
made explicit."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

#: probabilities are clipped to [EPS, 1 − EPS] for the log loss
EPS = 1e-7


def brier(y: np.ndarray, p: np.ndarray) -> float:
    """Mean squared error of the probability: (1/n) Σ (p_i − y_i)² (NaN for no patients)."""
    y, p = np.asarray(y, float), np.asarray(p, float)
    return float(np.mean((p - y) ** 2)) if y.size else float("nan")


def expected_calibration_error(y: np.ndarray, p: np.ndarray, *, bins: int = 10) -> float:
    """ECE with ``bins`` equal-width bins: Σ_b (n_b / n) · |mean(y_b) − mean(p_b)|
    (Naeini et al. 2015; Guo et al. 2017). NaN for no patients."""
    y, p = np.asarray(y, float), np.asarray(p, float)
    if y.size == 0:
        return float("nan")
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in np.unique(which):
        sel = which == b
        total += sel.sum() / y.size * abs(y[sel].mean() - p[sel].mean())
    return float(total)


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities (NaN for no patients)."""
    y, p = np.asarray(y, float), np.clip(np.asarray(p, float), EPS, 1 - EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))) if y.size else float("nan")


def binary_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """{'auroc', 'auprc', 'brier', 'ece', 'loss', 'n', 'positives'}; AUROC/AUPRC are NaN when
    only one class is present."""
    y = np.asarray(y).astype(int)
    p = np.asarray(p, float)
    both = 0 < y.sum() < len(y)
    return {
        "auroc": float(roc_auc_score(y, p)) if both else float("nan"),
        "auprc": float(average_precision_score(y, p)) if both else float("nan"),
        "brier": brier(y, p),
        "ece": expected_calibration_error(y, p),
        "loss": log_loss(y, p),
        "n": float(len(y)),
        "positives": float(y.sum()),
    }
