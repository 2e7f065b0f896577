"""Logistic-regression baselines beside research/fcm_bnlearn/fcm_dp.py (issue 14): the same Asia task,
inputs, splits and clients, without concepts.

- ``lr_standalone``: one L2 logistic regression per client that has task labels, on its own
  training rows (C chosen on the global validation split per client); reported as the mean,
  min and max test accuracy over those clients.
- ``lr_pooled``: one logistic regression on every task-labelled training row of the
  federation (C chosen on validation).
- ``dplr_pooled@ε`` (central DP): DP-SGD on the pooled rows, the same mechanism as the F-CMs
  local-DP rows (F-CMs appendix E.4): Poisson batches of expected size B = 512, per-patient
  gradient clipped to C = 1 (eq. 4), Gaussian noise σ·C from the CSPRNG
  (:func:`clinograph.sdk.privacy.noise.secure_gaussian`), the sum divided by the expected
  batch, Adam; σ from Opacus's RDP accountant (:func:`clinograph.sdk.privacy.calibration.calibrate_noise_multiplier`)
  for the planned steps. A logistic regression's per-patient gradient is closed-form,
  (σ(wᵀx̃) − y)·x̃ with x̃ = (x, 1), so no per-sample machinery is needed.
- ``dplr_standalone@ε``: the same DP-SGD at each task-labelled client on its own rows
  (q = B/n_k, what F-CMs' local DP gives one client); mean over clients.

DP rows: (Adam lr, epochs) chosen per seed on validation loss from a small grid (the grid's
own privacy cost is not accounted, as for the F-CM rows). Asserts nothing.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from clinograph.sdk.concepts.dp import poisson_rows
from clinograph.sdk.privacy.calibration import calibrate_noise_multiplier
from clinograph.sdk.privacy.noise import secure_gaussian
from sklearn.linear_model import LogisticRegression

C_GRID = (0.01, 0.1, 1.0, 10.0)
DP_GRID = ((0.01, 10), (0.03, 10), (0.1, 10), (0.03, 30), (0.1, 30))


def _loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _fit_lr(x, y, xv, yv):
    """L2 logistic regression, C chosen on validation loss; None if y has one class."""
    if len(np.unique(y)) < 2:
        return None
    fits = [LogisticRegression(C=c, max_iter=2000).fit(x, y) for c in C_GRID]
    return min(fits, key=lambda m: _loss(m.predict_proba(xv)[:, 1], yv))


def _acc(p: np.ndarray, y: np.ndarray) -> float:
    return 100.0 * float(((p > 0.5).astype(int) == y).mean())


def dp_sgd_lr(x: np.ndarray, y: np.ndarray, *, epsilon: float, delta: float, batch: int, clip: float, lr: float,
              epochs: int) -> tuple[np.ndarray, dict]:
    """DP-SGD logistic regression (weights incl. bias last); returns (w, σ/q/steps)."""
    n, d = x.shape
    q = min(1.0, batch / n)
    per_epoch = max(1, round(1 / q))
    steps = epochs * per_epoch
    sigma = _sigma(epsilon, delta, q, steps)
    xt = np.concatenate([x, np.ones((n, 1))], axis=1).astype(np.float64)
    w = np.zeros(d + 1)
    m, v = np.zeros_like(w), np.zeros_like(w)
    b1, b2, eps_adam = 0.9, 0.999, 1e-8
    for t in range(1, steps + 1):
        rows = poisson_rows(n, q)
        xb, yb = xt[rows], y[rows]
        g = (1.0 / (1.0 + np.exp(-xb @ w)) - yb)[:, None] * xb
        g *= np.minimum(1.0, clip / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300))
        noisy = (g.sum(0) + secure_gaussian(sigma * clip, torch.Size([d + 1]), torch.float64).numpy()) / (q * n)
        m = b1 * m + (1 - b1) * noisy
        v = b2 * v + (1 - b2) * noisy ** 2
        w -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps_adam)
    return w, {"sigma": sigma, "sample_rate": q, "steps": steps}


@functools.lru_cache(maxsize=256)
def _sigma(epsilon: float, delta: float, q: float, steps: int) -> float:
    return calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=q, steps=steps)


def _dp_best(x, y, xv, yv, *, epsilon, delta, batch, clip):
    """The DP grid point with the lowest validation loss: (w, info)."""
    best = None
    for lr, epochs in DP_GRID:
        w, info = dp_sgd_lr(x, y, epsilon=epsilon, delta=delta, batch=batch, clip=clip, lr=lr, epochs=epochs)
        val = _loss(_proba(w, xv), yv)
        if best is None or val < best[0]:
            best = (val, w, {**info, "lr": lr, "epochs": epochs, "val_loss": val})
    return best[1], best[2]


def _proba(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(x @ w[:-1] + w[-1])))


def lr_rows(*, x: np.ndarray, codes: np.ndarray, task_col: int, splits, parts, has_task, epsilons, delta: float,
            batch: int, clip: float, seed: int) -> list[dict]:
    """Every baseline row for one seed (``parts``: each client's training rows; ``has_task``:
    whether the client labels the task)."""
    tr, va, te = splits
    y = codes[:, task_col].astype(int)
    xv, yv, xte, yte = x[va], y[va], x[te], y[te]
    rows: list[dict] = []
    labelled = [p for p, h in zip(parts, has_task, strict=True) if h]
    accs = []
    for p in labelled:
        m = _fit_lr(x[p], y[p], xv, yv)
        if m is not None:
            accs.append(_acc(m.predict_proba(xte)[:, 1], yte))
    rows.append({"baseline": "lr_standalone", "seed": seed, "epsilon": None, "task_acc": float(np.mean(accs)),
                 "task_acc_min": float(np.min(accs)), "task_acc_max": float(np.max(accs)), "clients": len(accs)})
    pooled = np.concatenate(labelled)
    m = _fit_lr(x[pooled], y[pooled], xv, yv)
    rows.append({"baseline": "lr_pooled", "seed": seed, "epsilon": None, "n_train": int(len(pooled)),
                 "task_acc": _acc(m.predict_proba(xte)[:, 1], yte)})
    for eps in epsilons:
        w, info = _dp_best(x[pooled], y[pooled], xv, yv, epsilon=eps, delta=delta, batch=batch, clip=clip)
        rows.append({"baseline": "dplr_pooled", "seed": seed, "epsilon": eps, "n_train": int(len(pooled)),
                     "task_acc": _acc(_proba(w, xte), yte), **info})
        accs, infos = [], []
        for p in labelled:
            w, info = _dp_best(x[p], y[p], xv, yv, epsilon=eps, delta=delta, batch=batch, clip=clip)
            accs.append(_acc(_proba(w, xte), yte))
            infos.append(info)
        rows.append({"baseline": "dplr_standalone", "seed": seed, "epsilon": eps, "task_acc": float(np.mean(accs)),
                     "task_acc_min": float(np.min(accs)), "task_acc_max": float(np.max(accs)), "clients": len(accs),
                     "sigma_median": float(np.median([i["sigma"] for i in infos])),
                     "chosen": sorted({(i["lr"], i["epochs"]) for i in infos})})
    for r in rows:
        print({k: (round(v, 3) if isinstance(v, float) and not math.isnan(v) else v) for k, v in r.items()},
              flush=True)
    return rows
