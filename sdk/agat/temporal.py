"""The temporal embedding of the previous step (AGAT section 3.4, eqs. 7-8).

Eq. (7): e_i(t) = MLP(F_i(t − 1)); eq. (8): F'_i(t) = F_i(t) + e_i(t). The attention layers
then run on F'(t). One MLP is shared across time steps (appendix, Fig. A1). A static table
has one step and no previous one: the embedding is not used there and a hospital with a
static table neither trains nor sends ``temporal/mlp``.
"""

from __future__ import annotations

import torch
from torch import nn


class TemporalEmbedding(nn.Module):
    """Eq. (7): a two-layer MLP over the previous step's augmented features.

    Shapes:
        previous: [N, n] -> e: [N, n]
    """

    def __init__(self, n_features: int, *, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_features))

    def forward(self, previous: torch.Tensor) -> torch.Tensor:
        return self.mlp(previous)


def with_previous_step(current: torch.Tensor, previous: torch.Tensor | None,
                       embedding: TemporalEmbedding) -> torch.Tensor:
    """Eq. (8): F'(t) = F(t) + e(t); unchanged when there is no previous step."""
    return current if previous is None else current + embedding(previous)
