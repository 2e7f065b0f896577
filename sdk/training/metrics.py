"""AUROC and AUPRC (the NS-FL paper's metrics), with the degenerate cases made explicit."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score


def binary_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """{'auroc', 'auprc', 'n', 'positives'}; AUROC/AUPRC are NaN when only one class is present."""
    y = np.asarray(y).astype(int)
    both = 0 < y.sum() < len(y)
    return {
        "auroc": float(roc_auc_score(y, p)) if both else float("nan"),
        "auprc": float(average_precision_score(y, p)) if both else float("nan"),
        "n": float(len(y)),
        "positives": float(y.sum()),
    }
