"""References for time-to-event targets on the same hospitals and splits as NS-FL's survival head.

- ``cox_pooled``: one Cox proportional-hazards model (lifelines ``CoxPHFitter``, Breslow
  baseline) on every hospital's training patients pooled -- a ceiling reference a federation
  may not fit -- on the union of features (missing = 0 plus an observed indicator), L2
  penalty chosen on the pooled validation partial log-likelihood.
- ``cox_standalone``: the same at each hospital alone, on its own features and validation split.
- ``horizon_baselines``: the binary horizon form on the same patients -- each hospital's
  patients whose status at the horizon is known, label = event by the horizon -- fed to the
  logistic-regression and gradient-boosting references of :mod:`.baselines` (standalone,
  FedAvg on aligned features, pooled), with the survival splits restricted to those patients.

Every method reports :func:`clinograph.sdk.training.survival.survival_metrics` at the horizon,
except the horizon-form ones, which see no censored patient and report AUROC/AUPRC/Brier on
the known-status test patients (the same patients as the survival metrics' ``auroc``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from clinograph.sdk.demo.baselines import (
    GBM_GRID,
    LR_GRID,
    _fit_lr,
    _nodes,
    _val_loss,
    _xs,
    fedavg_lr,
    pooled_gbm,
    pooled_lr,
    standalone_lr,
)
from clinograph.sdk.ingest.table import PatientTable
from clinograph.sdk.training.survival import concordance, horizon_labels, survival_metrics

COX_PENALTIES = (0.01, 0.1, 1.0)


@dataclasses.dataclass(frozen=True)
class _Split:
    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray


def _frame(x: np.ndarray, time: np.ndarray, event: np.ndarray, keep: np.ndarray) -> pd.DataFrame:
    df = pd.DataFrame(x[:, keep], columns=[f"x{i}" for i in range(int(keep.sum()))])
    return df.assign(T=np.maximum(time, 1e-3), E=event.astype(int))


def _fit_cox(xt, tt, et, xv, tv, ev):
    """Best CoxPHFitter over :data:`COX_PENALTIES` by validation partial log-likelihood."""
    from lifelines import CoxPHFitter
    from lifelines.exceptions import ConvergenceError

    keep = xt.std(axis=0) > 1e-9
    best, best_ll = None, -np.inf
    for pen in COX_PENALTIES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:  # a penalty that does not converge is skipped
                m = CoxPHFitter(penalizer=pen).fit(_frame(xt, tt, et, keep), duration_col="T", event_col="E")
                ll = m.score(_frame(xv, tv, ev, keep), scoring_method="log_likelihood") if ev.any() else 0.0
            except (ConvergenceError, np.linalg.LinAlgError, ValueError):
                m = None
        if m is not None and (best is None or ll > best_ll):
            best, best_ll = m, ll
    return best, keep


def _cox_metrics(model, keep, x, time, event, horizon) -> dict[str, float]:
    df = _frame(x, time, event, keep)
    risk = 1.0 - model.predict_survival_function(df, times=[horizon]).to_numpy()[0]
    return survival_metrics(time, event, risk, horizon=horizon)


def cox_standalone(tables: Sequence[PatientTable], splits: Sequence, *, horizon: float) -> dict[str, dict]:
    """Cox PH at each hospital alone (module docstring); ``horizon`` in days."""
    out = {}
    for t, s in zip(tables, splits, strict=True):
        x, sv = _xs([t], t.observed_nodes())[0], t.survival
        m, keep = _fit_cox(x[s.train], sv.time[s.train], sv.event[s.train], x[s.validation], sv.time[s.validation],
                           sv.event[s.validation])
        out[t.site] = (_cox_metrics(m, keep, x[s.test], sv.time[s.test], sv.event[s.test], horizon) if m is not None
                       else survival_metrics(sv.time[s.test], sv.event[s.test], np.zeros(len(s.test)), horizon=horizon))
    return out


def cox_pooled(tables: Sequence[PatientTable], splits: Sequence, *, horizon: float) -> dict[str, dict]:
    """Cox PH on the pooled training patients (module docstring); ``horizon`` in days."""
    nodes = _nodes(tables, "union")
    xs = _xs(tables, nodes)

    def cat(part):
        return (np.concatenate([x[getattr(s, part)] for x, s in zip(xs, splits, strict=True)]),
                np.concatenate([t.survival.time[getattr(s, part)] for t, s in zip(tables, splits, strict=True)]),
                np.concatenate([t.survival.event[getattr(s, part)] for t, s in zip(tables, splits, strict=True)]))

    m, keep = _fit_cox(*cat("train"), *cat("validation"))
    return {t.site: _cox_metrics(m, keep, xs[i][s.test], t.survival.time[s.test], t.survival.event[s.test], horizon)
            for i, (t, s) in enumerate(zip(tables, splits, strict=True))}


def horizon_form(tables: Sequence[PatientTable], splits: Sequence, *, horizon: float
                 ) -> tuple[list[PatientTable], list[_Split]]:
    """Each hospital's known-status patients with label = event by ``horizon`` (days), and the
    survival splits restricted to them."""
    out_t, out_s = [], []
    for t, s in zip(tables, splits, strict=True):
        known, y = horizon_labels(t.survival.time, t.survival.event, horizon)
        idx = np.flatnonzero(known)
        remap = -np.ones(t.n_patients, dtype=np.int64)
        remap[idx] = np.arange(len(idx))
        sub = dataclasses.replace(t.subset(idx), labels=y[idx].astype(np.int64))
        part = {k: remap[getattr(s, k)][remap[getattr(s, k)] >= 0] for k in ("train", "validation", "test")}
        out_t.append(sub)
        out_s.append(_Split(**part))
    return out_t, out_s


def _cindex_standalone_lr(tables, splits, ht, hs) -> dict[str, float]:
    """C-index over *all* test patients (censored ones included) of the standalone LR that
    :func:`standalone_lr` selects (the same deterministic fits and choice)."""
    out = {}
    for t, s, h, q in zip(tables, splits, ht, hs, strict=True):
        nodes = h.observed_nodes()
        xh, y, x = _xs([h], nodes)[0], h.labels, _xs([t], nodes)[0]
        if len(np.unique(y[q.train])) < 2:
            out[t.site] = float("nan")
            continue
        fits = [_fit_lr(xh[q.train], y[q.train], c) for c in LR_GRID]
        best = min(fits, key=lambda m: _val_loss(y[q.validation], m.predict_proba(xh[q.validation])[:, 1]))
        out[t.site] = concordance(t.survival.time[s.test], t.survival.event[s.test],
                                  best.predict_proba(x[s.test])[:, 1])
    return out


def _cindex_pooled(tables, splits, ht, hs, *, seed: int) -> dict[str, dict[str, float]]:
    """C-index over all test patients of the pooled LR and pooled GBM that :func:`pooled_lr` and
    :func:`pooled_gbm` select (same fits, same choice on the pooled validation loss)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    nodes = _nodes(ht, "union")
    xh, xf = _xs(ht, nodes), _xs(tables, nodes)
    cat = lambda xs, part: np.concatenate([x[getattr(q, part)] for x, q in zip(xs, hs, strict=True)])  # noqa: E731
    yt = np.concatenate([h.labels[q.train] for h, q in zip(ht, hs, strict=True)])
    yv = np.concatenate([h.labels[q.validation] for h, q in zip(ht, hs, strict=True)])
    lr = min((_fit_lr(cat(xh, "train"), yt, c) for c in LR_GRID),
             key=lambda m: _val_loss(yv, m.predict_proba(cat(xh, "validation"))[:, 1]))
    k = len(nodes)
    for x in (*xh, *xf):  # trees take missing as NaN natively
        x[:, :k][x[:, k:] == 0] = np.nan
    gbm = min((HistGradientBoostingClassifier(learning_rate=a, max_leaf_nodes=b, max_iter=c, random_state=seed,
                                              early_stopping=False).fit(cat(xh, "train"), yt) for a, b, c in GBM_GRID),
              key=lambda m: _val_loss(yv, m.predict_proba(cat(xh, "validation"))[:, 1]))
    xl = _xs(tables, nodes)
    return {name: {t.site: concordance(t.survival.time[s.test], t.survival.event[s.test],
                                       model.predict_proba(x[s.test])[:, 1])
                   for t, s, x in zip(tables, splits, xs, strict=True)}
            for name, model, xs in (("lr", lr, xl), ("gbm", gbm, xf))}


def horizon_baselines(tables: Sequence[PatientTable], splits: Sequence, *, horizon: float, seed: int
                      ) -> dict[str, dict]:
    """LR standalone, FedAvg LR, pooled LR and pooled GBM on the binary horizon form; the
    standalone and pooled ones also with the C-index of their risk over all test patients."""
    ht, hs = horizon_form(tables, splits, horizon=horizon)
    out = {"lr_standalone_horizon": standalone_lr(ht, hs), "lr_fedavg_aligned_horizon": fedavg_lr(ht, hs, seed=seed),
           "lr_pooled_horizon": pooled_lr(ht, hs), "gbm_pooled_horizon": pooled_gbm(ht, hs, seed=seed)}
    pooled = _cindex_pooled(tables, splits, ht, hs, seed=seed)
    for key, cidx in (("lr_standalone_horizon", _cindex_standalone_lr(tables, splits, ht, hs)),
                      ("lr_pooled_horizon", pooled["lr"]), ("gbm_pooled_horizon", pooled["gbm"])):
        for site, c in cidx.items():
            out[key][site]["cindex"] = c
    return out
