"""Graph attention layers (AGAT eqs. 5-6) and the task head.

Eq. (5): H_i^(l+1) = σ(Σ_{u ∈ N(i)} α_iu W^(l) H_u^(l)); eq. (6): α_iu is the softmax over
N(i) of LeakyReLU(a^T [W H_i || W H_u]) -- exactly PyG's ``GATConv`` (Veličković et al. 2018),
which also adds the self-loop i ∈ N(i). Appendix B: GATConv(128 units, 1 head) → ReLU →
dropout 0.25 → GATConv; "after attention layers, the node embedding is mapped to predict
outputs using fully-connected layers" (section 3.3.1): here a second GATConv to the hidden
width and a linear head to one logit.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GATConv


class GATEncoder(nn.Module):
    """Two attention layers, eqs. (5)-(6).

    Shapes:
        x: [N, n], edge_index: [2, E] -> [N, hidden]
    """

    def __init__(self, n_in: int, *, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.layer1 = GATConv(n_in, hidden, heads=heads, concat=False)
        self.layer2 = GATConv(hidden, hidden, heads=heads, concat=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = self.dropout(torch.relu(self.layer1(x, edge_index)))
        return torch.relu(self.layer2(h, edge_index))


class TaskHead(nn.Module):
    """The fully connected layer from a patient's embedding to its logit.

    Shapes:
        h: [N, hidden] -> [N]
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h).squeeze(-1)
