"""The NS-FL paper's baselines: a standalone network per hospital, and FedAvg of an MLP on the
manually aligned feature subset (the features every hospital has).

Inputs are the public-range standardised values with missing cells at 0 (the reference
midpoint) plus a missingness indicator per feature.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..ingest.table import PatientTable
from ..training.local import TrainConfig, bce
from ..training.metrics import binary_metrics


def mlp_inputs(table: PatientTable, nodes: np.ndarray) -> torch.Tensor:
    """[n_patients, 2·|nodes|]: values (0 where missing) and observed indicators."""
    dense, observed = table.dense()
    x = np.where(observed, dense, 0.0)[:, nodes]
    return torch.tensor(np.concatenate([x, observed[:, nodes]], axis=1), dtype=torch.float32)


def make_mlp(n_in: int, hidden: int, seed: int) -> nn.Module:
    """Two hidden layers, ReLU."""
    torch.manual_seed(seed)
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
