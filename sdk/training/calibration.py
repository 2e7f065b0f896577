"""Platt scaling of a hospital's final model on its own validation split (personal).

p = σ(a · z + b) with z the model's logit; (a, b) minimise the validation log loss (Platt
1999; with a alone it is temperature scaling, Guo et al. 2017). Fitted per hospital, after
model selection, on the validation patients: the two numbers are personal -- they never leave
the hospital and absorb its own base rate, which a shared head cannot. Ranking metrics (AUROC,
AUPRC) are unchanged when a > 0; a fit that would invert the ranking is refused (a = 1, b = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from .metrics import EPS


def logit(p: np.ndarray) -> np.ndarray:
    """log(p / (1 − p)) with p clipped to [EPS, 1 − EPS]."""
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


@dataclass(frozen=True)
class Platt:
    """p = σ(a · z + b). The identity is ``Platt()``."""

    a: float = 1.0
    b: float = 0.0

    def __call__(self, z: np.ndarray) -> np.ndarray:
        return expit(self.a * np.asarray(z, dtype=np.float64) + self.b)

    def apply_to_probabilities(self, p: np.ndarray) -> np.ndarray:
        """The calibrated probability for uncalibrated probabilities ``p``."""
        return self(logit(p))


def fit_platt(z: np.ndarray, y: np.ndarray, *, l2: float = 1e-2, steps: int = 100) -> Platt:
    """Damped Newton's method on the validation log loss (+ ``l2``/2 · ((a − 1)² + b²), which keeps
    a fit on a few dozen patients near the identity). Every step is backtracked until the objective
    decreases (plain Newton overshoots on saturated logits -- measured: a DP model whose logits sat
    near −5 was "calibrated" to a constant 0). Identity if only one class is present, or if the
    fit is not better than the identity."""
    z, y = np.asarray(z, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if y.size == 0 or y.min() == y.max():
        return Platt()
    ident = np.array([1.0, 0.0])
    x = np.stack([z, np.ones_like(z)], axis=1)
    n = len(y)

    def objective(theta: np.ndarray) -> float:
        s = x @ theta  # log loss from logits, stable for large |s|
        return float(np.mean(np.logaddexp(0.0, s) - y * s) + 0.5 * l2 * np.sum((theta - ident) ** 2))

    theta, f = ident.copy(), objective(ident)
    for _ in range(steps):
        p = expit(x @ theta)
        grad = x.T @ (p - y) / n + l2 * (theta - ident)
        hess = (x * (p * (1 - p))[:, None]).T @ x / n + l2 * np.eye(2)
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            break
        t = 1.0
        while t > 1e-9:
            candidate = theta - t * step
            fc = objective(candidate)
            if np.isfinite(fc) and fc <= f - 1e-4 * t * float(grad @ step):
                break
            t /= 2
        else:
            break
        theta, f = candidate, fc
        if np.abs(t * step).max() < 1e-10:
            break
    if not np.all(np.isfinite(theta)) or theta[0] <= 0 or f >= objective(ident):
        return Platt()
    return Platt(a=float(theta[0]), b=float(theta[1]))
