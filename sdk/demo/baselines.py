"""The simple baselines the demo reports beside NS-FL: the NS-FL paper's (a standalone network
per hospital, FedAvg of an MLP on the manually aligned feature subset, i.e. the features every
hospital has) and the linear and tree references (:func:`reference_baselines`: logistic
regression standalone, FedAvg and pooled; pooled gradient boosting).

Inputs are the public-range standardised values with missing cells at 0 (the reference
midpoint) plus a missingness indicator per feature.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..ingest.table import PatientTable
from ..seeding import torch_seeded
from ..training.local import TrainConfig, bce
from ..training.metrics import binary_metrics


def mlp_inputs(table: PatientTable, nodes: np.ndarray) -> torch.Tensor:
    """[n_patients, 2·|nodes|]: values (0 where missing) and observed indicators."""
    dense, observed = table.dense()
    x = np.where(observed, dense, 0.0)[:, nodes]
    return torch.tensor(np.concatenate([x, observed[:, nodes]], axis=1), dtype=torch.float32)


def make_mlp(n_in: int, hidden: int, seed: int) -> nn.Module:
    """Two hidden layers, ReLU."""
    with torch_seeded(seed):
        return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: np.ndarray, *, epochs: int,
           config: TrainConfig, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    ii = torch.as_tensor(idx)
    for _ in range(epochs):
        perm = ii[torch.randperm(len(ii), generator=gen)]
        for s in range(0, len(perm), config.batch_size):
            b = perm[s:s + config.batch_size]
            loss = bce(model(x[b]).squeeze(-1), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()


@torch.no_grad()
def _eval(model: nn.Module, x: torch.Tensor, y: np.ndarray, idx: np.ndarray) -> dict[str, float]:
    return binary_metrics(y[idx], torch.sigmoid(model(x[idx]).squeeze(-1)).numpy())


def standalone(tables: Sequence[PatientTable], splits: Sequence[tuple[np.ndarray, np.ndarray]], *,
               epochs: int, hidden: int, config: TrainConfig, seed: int) -> dict[str, dict[str, float]]:
    """Each hospital alone, on all of its own features."""
    out = {}
    for i, (t, (tr, te)) in enumerate(zip(tables, splits, strict=True)):
        nodes = t.observed_nodes()
        x, y = mlp_inputs(t, nodes), torch.tensor(t.labels, dtype=torch.float32)
        model = make_mlp(x.shape[1], hidden, seed + i)
        _train(model, x, y, tr, epochs=epochs, config=config, seed=seed + i)
        out[t.site] = _eval(model, x, t.labels, te)
    return out


def fedavg_aligned(tables: Sequence[PatientTable], splits: Sequence[tuple[np.ndarray, np.ndarray]], *,
                   rounds: int, local_epochs: int, hidden: int, config: TrainConfig, seed: int
                   ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """FedAvg (McMahan et al. 2017) of one MLP on the features every hospital has.

    Returns per-hospital metrics and the aligned feature-node ids.
    """
    common = set(tables[0].observed_nodes().tolist())
    for t in tables[1:]:
        common &= set(t.observed_nodes().tolist())
    nodes = np.array(sorted(common), dtype=np.int64)
    xs = [mlp_inputs(t, nodes) for t in tables]
    ys = [torch.tensor(t.labels, dtype=torch.float32) for t in tables]
    global_model = make_mlp(xs[0].shape[1], hidden, seed)
    sizes = np.array([len(tr) for tr, _ in splits], dtype=float)
    for r in range(rounds):
        states = []
        for i, (tr, _) in enumerate(splits):
            local = make_mlp(xs[0].shape[1], hidden, seed)
            local.load_state_dict(global_model.state_dict())
            _train(local, xs[i], ys[i], tr, epochs=local_epochs, config=config, seed=seed + 1000 * r + i)
            states.append(local.state_dict())
        avg = {k: sum(w * s[k] for w, s in zip(sizes / sizes.sum(), states, strict=True)) for k in states[0]}
        global_model.load_state_dict(avg)
    ids = tables[0].dictionary.node_ids()
    return ({t.site: _eval(global_model, xs[i], t.labels, splits[i][1]) for i, t in enumerate(tables)},
            [ids[n] for n in nodes])


# -- linear and tree references (issue: "NS-FL only ties a logistic regression") --------------
#: inverse L2 strengths tried for every logistic regression (chosen on validation log loss)
LR_GRID = (0.01, 0.1, 1.0, 10.0)
#: (learning rate, max leaf nodes, iterations) tried for gradient boosting
GBM_GRID = ((0.03, 4, 200), (0.05, 8, 200), (0.1, 4, 100), (0.03, 16, 300))


def _xs(tables: Sequence[PatientTable], nodes: np.ndarray) -> list[np.ndarray]:
    return [mlp_inputs(t, nodes).numpy().astype(np.float64) for t in tables]


def _nodes(tables: Sequence[PatientTable], how: str) -> np.ndarray:
    sets = [set(t.observed_nodes().tolist()) for t in tables]
    out = set.intersection(*sets) if how == "common" else set.union(*sets)
    return np.array(sorted(out), dtype=np.int64)


def _val_loss(y: np.ndarray, p: np.ndarray) -> float:
    from ..training.metrics import log_loss

    return log_loss(y, p)


def _fit_lr(x: np.ndarray, y: np.ndarray, c: float):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=2000).fit(x, y)


def standalone_lr(tables: Sequence[PatientTable], splits: Sequence) -> dict[str, dict[str, float]]:
    """Logistic regression at each hospital alone, on its own features, C tuned on its validation split.

    ``splits``: per hospital an object with ``train``, ``validation``, ``test`` index arrays."""
    out = {}
    for t, s in zip(tables, splits, strict=True):
        x, y = _xs([t], t.observed_nodes())[0], t.labels
        if len(np.unique(y[s.train])) < 2:
            out[t.site] = binary_metrics(y[s.test], np.full(len(s.test), y[s.train].mean()))
            continue
        fits = [_fit_lr(x[s.train], y[s.train], c) for c in LR_GRID]
        best = min(fits, key=lambda m: _val_loss(y[s.validation], m.predict_proba(x[s.validation])[:, 1]))
        out[t.site] = binary_metrics(y[s.test], best.predict_proba(x[s.test])[:, 1])
    return out


def pooled_lr(tables: Sequence[PatientTable], splits: Sequence) -> dict[str, dict[str, float]]:
    """Ceiling reference: one logistic regression on every hospital's training patients pooled
    (union of features, missing = 0 plus indicators), C tuned on the pooled validation split."""
    nodes = _nodes(tables, "union")
    xs, ys = _xs(tables, nodes), [t.labels for t in tables]
    cat = lambda part: (np.concatenate([x[getattr(s, part)] for x, s in zip(xs, splits, strict=True)]),  # noqa: E731
                        np.concatenate([y[getattr(s, part)] for y, s in zip(ys, splits, strict=True)]))
    (xt, yt), (xv, yv) = cat("train"), cat("validation")
    best = min((_fit_lr(xt, yt, c) for c in LR_GRID), key=lambda m: _val_loss(yv, m.predict_proba(xv)[:, 1]))
    return {t.site: binary_metrics(ys[i][s.test], best.predict_proba(xs[i][s.test])[:, 1])
            for i, (t, s) in enumerate(zip(tables, splits, strict=True))}


def pooled_gbm(tables: Sequence[PatientTable], splits: Sequence, *, seed: int) -> dict[str, dict[str, float]]:
    """Ceiling reference: gradient boosting (scikit-learn's HistGradientBoosting) on the pooled
    training patients, its settings (:data:`GBM_GRID`) chosen on the pooled validation loss."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    nodes = _nodes(tables, "union")
    xs, ys = _xs(tables, nodes), [t.labels for t in tables]
    for x in xs:  # trees take missing as NaN natively
        k = len(nodes)
        x[:, :k][x[:, k:] == 0] = np.nan
    xt = np.concatenate([x[s.train] for x, s in zip(xs, splits, strict=True)])
    yt = np.concatenate([y[s.train] for y, s in zip(ys, splits, strict=True)])
    xv = np.concatenate([x[s.validation] for x, s in zip(xs, splits, strict=True)])
    yv = np.concatenate([y[s.validation] for y, s in zip(ys, splits, strict=True)])
    fits = [HistGradientBoostingClassifier(learning_rate=lr, max_leaf_nodes=leaves, max_iter=it, random_state=seed,
                                           early_stopping=False).fit(xt, yt) for lr, leaves, it in GBM_GRID]
    best = min(fits, key=lambda m: _val_loss(yv, m.predict_proba(xv)[:, 1]))
    return {t.site: binary_metrics(ys[i][s.test], best.predict_proba(xs[i][s.test])[:, 1])
            for i, (t, s) in enumerate(zip(tables, splits, strict=True))}


def fedavg_lr(tables: Sequence[PatientTable], splits: Sequence, *, rounds: int = 60, local_epochs: int = 1,
              lr: float = 0.05, seed: int) -> dict[str, dict[str, float]]:
    """FedAvg (McMahan et al. 2017) of a logistic regression on the aligned features (those every
    hospital has), full-batch local gradient steps; L2 strength and round chosen on the
    federated validation loss (Σ loss·n / Σ n)."""
    from scipy.special import expit

    nodes = _nodes(tables, "common")
    xs = [np.hstack([x, np.ones((len(x), 1))]) for x in _xs(tables, nodes)]
    ys = [t.labels.astype(float) for t in tables]
    sizes = np.array([len(s.train) for s in splits], float)
    best: tuple[float, np.ndarray] = (np.inf, np.zeros(xs[0].shape[1]))
    for l2 in (0.0, 1e-3, 1e-2, 1e-1):
        w = np.zeros(xs[0].shape[1])
        for _ in range(rounds):
            locals_ = []
            for x, y, s in zip(xs, ys, splits, strict=True):
                v = w.copy()
                for _ in range(local_epochs * 10):  # 10 full-batch steps an epoch
                    g = x[s.train].T @ (expit(x[s.train] @ v) - y[s.train]) / len(s.train) + l2 * v
                    v -= lr * 10 * g
                locals_.append(v)
            w = sum(n * v for n, v in zip(sizes / sizes.sum(), locals_, strict=True))
            loss = (sum(_val_loss(y[s.validation], expit(x[s.validation] @ w)) * len(s.validation)
                        for x, y, s in zip(xs, ys, splits, strict=True)) / sum(len(s.validation) for s in splits))
            if loss < best[0]:
                best = (loss, w.copy())
    w = best[1]
    return {t.site: binary_metrics(ys[i][s.test], expit(xs[i][s.test] @ w))
            for i, (t, s) in enumerate(zip(tables, splits, strict=True))}


def reference_baselines(tables: Sequence[PatientTable], splits: Sequence, *, seed: int) -> dict[str, dict]:
    """The linear and tree references on the same splits (``splits``: the hospitals' ``Split``s)."""
    return {"lr_standalone": standalone_lr(tables, splits), "lr_fedavg_aligned": fedavg_lr(tables, splits, seed=seed),
            "lr_pooled": pooled_lr(tables, splits), "gbm_pooled": pooled_gbm(tables, splits, seed=seed)}
