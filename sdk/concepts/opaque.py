"""OpaqNN, the opaque baseline of F-CMs Table 1: the shared encoder and an MLP head on the task.

Trained centrally (the "Cent." row): all training data pooled, Adam, batch 512, up to 200
epochs with early stopping on the validation loss, patience 10 (appendix D.3). It is the
upper bound the paper measures every regime against, and the reference
``research/fcm_bnlearn/fcm_calibration.py`` uses to calibrate the input noise of the bnlearn data.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from clinograph.core.errors import ConfigError

from ..seeding import torch_seeded
from .encoders import MLPEncoder


@dataclass(frozen=True)
class OpaqueResult:
    """The selected network, its validation loss and the epoch it was selected at."""

    model: nn.Module
    val_loss: float
    best_epoch: int

    @torch.no_grad()
    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Fraction of rows whose argmax matches ``y`` (labels ``-1`` are skipped)."""
        keep = y >= 0
        self.model.eval()
        pred = self.model(x[keep]).argmax(1)
        return float((pred == y[keep]).float().mean()) if bool(keep.any()) else float("nan")


def opaque_network(in_dim: int, card: int, *, z_dim: int = 64, hidden: tuple[int, ...] = (128,)) -> nn.Module:
    """``x -> MLPEncoder -> Linear(card)``: the same encoder the concept models use."""
    return nn.Sequential(MLPEncoder(in_dim, z_dim, hidden), nn.Linear(z_dim, card))


def train_centralised(x_train: torch.Tensor, y_train: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, *,
                      card: int, seed: int, lr: float = 1e-3, batch_size: int = 512, max_epochs: int = 200,
                      patience: int = 10) -> OpaqueResult:
    """Train OpaqNN on pooled data with early stopping on the validation cross-entropy.

    Shapes:
        x_*: (n, d) float; y_*: (n,) int64 state codes in ``[0, card)``.

    Raises:
        ConfigError: empty data, mismatched lengths, or labels outside ``[0, card)``.
    """
    for nm, x, y in (("train", x_train, y_train), ("validation", x_val, y_val)):
        if len(x) == 0 or len(x) != len(y):
            raise ConfigError(f"OpaqNN {nm} data: {len(x)} inputs and {len(y)} labels; need the same, non-zero count.")
        if bool((y < 0).any()) or bool((y >= card).any()):
            raise ConfigError(f"OpaqNN {nm} labels must lie in [0, {card}); fix the state encoding.")
    gen = torch.Generator().manual_seed(seed)
    with torch_seeded(seed):  # the initial weights (no layer of OpaqNN draws after them)
        net = opaque_network(x_train.shape[1], card)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    best_loss, best_epoch, best_state, bad = float("inf"), -1, None, 0
    for epoch in range(max_epochs):
        net.train()
        perm = torch.randperm(len(x_train), generator=gen)
        for start in range(0, len(perm), batch_size):
            idx = perm[start:start + batch_size]
            loss = nn.functional.cross_entropy(net(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            val = float(nn.functional.cross_entropy(net(x_val), y_val))
        if val < best_loss:
            best_loss, best_epoch, best_state, bad = val, epoch, copy.deepcopy(net.state_dict()), 0
        else:
            bad += 1
            if bad >= patience:
                break
    net.load_state_dict(best_state)
    return OpaqueResult(net, best_loss, best_epoch)
