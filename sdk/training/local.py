"""Local training of the NS-FL model at one hospital (NS-FL eq. 7), without DP.

Minibatches of patients; each patient's logit is computed exactly as on the full graph from
its star and its ``similar_to`` neighbours' stars (:meth:`NSFLModel.forward_neighbourhood`),
transductively (held-out patients are in the graph, their labels are not used). DP training
lives in :mod:`clinograph.sdk.privacy` and uses the star path without ``similar_to``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from ..config import TrainConfig
from ..graph.star import StarBatch
from ..model.nsfl import NSFLModel
from .optim import adam


def bce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy on logits (NS-FL: 'trained end-to-end using binary cross-entropy')."""
    return F.binary_cross_entropy_with_logits(logits, y)


def train_epochs(model: NSFLModel, *, epochs: int, train_idx: np.ndarray, config: TrainConfig,
                 stars: StarBatch, round_: int = 0,
                 proximal: tuple[float, Mapping[str, torch.Tensor]] | None = None,
                 objective: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> float:
    """Run ``epochs`` epochs of minibatch Adam over ``train_idx``; returns the last epoch's mean loss.

    ``proximal = (μ, θ_global)`` adds FedProx's (μ/2)·||θ − θ_global||² (Li et al. 2020).
    ``objective(outputs, batch)``: the loss of the model's outputs for patient indices ``batch``
    (default: BCE against the binary labels; the survival head's is
    :func:`clinograph.sdk.training.survival.hazard_objective`).
    """
    gen = torch.Generator().manual_seed(config.seed * 100_003 + round_)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    masks = [p for n, p in named if n.startswith("mask_logit")]
    wide = [p for n, p in named if n.startswith("linear.")]
    rest = [p for n, p in named if not n.startswith(("mask_logit", "linear."))]
    opt = adam([{"params": rest}, {"params": masks, "lr": config.lr * config.mask_lr_factor},
                {"params": wide, "lr": config.lr * config.wide_lr_factor}],
               lr=config.lr, weight_decay=config.weight_decay)
    idx = torch.as_tensor(train_idx, dtype=torch.long)
    y_all = stars.labels
    model.train()
    last = 0.0
    for _ in range(epochs):
        perm = idx[torch.randperm(len(idx), generator=gen)]
        losses = []
        for start in range(0, len(perm), config.batch_size):
            b = perm[start:start + config.batch_size]
            logits = model.forward_batch(stars, b)
            loss = bce(logits, y_all[b]) if objective is None else objective(logits, b)
            if proximal is not None:
                mu, ref = proximal
                named = dict(model.named_parameters())
                loss = loss + 0.5 * mu * sum(((named[k] - v) ** 2).sum() for k, v in ref.items())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        last = float(np.mean(losses)) if losses else 0.0
    return last


@torch.no_grad()
def predict(model: NSFLModel, stars: StarBatch) -> np.ndarray:
    """Probabilities for every patient."""
    model.eval()
    return torch.sigmoid(model.forward_batch(stars)).numpy()
