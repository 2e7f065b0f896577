"""One relation's attention at one layer, NS-FL eqs. (1)-(3), on edge lists or dense stars.

Only ``nn.Linear`` and ``nn.Embedding`` leaves, so Opacus computes exact per-sample gradients
in hooks mode for the dense (star) path (privacy.md).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch_geometric.utils import softmax as segment_softmax


class RelationAttention(nn.Module):
    """Messages and attention of relation r.

    e_uv = LeakyReLU(a^(r)T [W^(r) h_u ‖ m_uv])  (eq. 2), α = softmax over N_r(u) (eq. 3),
    with the message m_uv = W^(r) h_v for unvalued relations, m_uv = s_uv · W^(r) h_v for
    ``similar_to`` (similarity weight) and m_uv = W^(r) h_v + x_uv · V^(r) h_v for valued
    relations (the observed value x_uv on the edge: value-scaled channel plus a presence channel,
    so a reference-midpoint value is not confused with an absent feature).
    """

    def __init__(self, hidden: int, *, valued: bool, negative_slope: float = 0.2):
        super().__init__()
        self.W = nn.Linear(hidden, hidden, bias=False)
        self.V = nn.Linear(hidden, hidden, bias=False) if valued else None
        self.a_dst = nn.Linear(hidden, 1, bias=False)
        self.a_src = nn.Linear(hidden, 1, bias=False)
        self.negative_slope = negative_slope

    def message(self, h_src: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        """m_uv; ``x`` broadcasts over the hidden dimension."""
        m = self.W(h_src)
        if self.V is not None:
            if x is None:
                raise ValueError("valued relation needs edge values")
            m = m + x.unsqueeze(-1) * self.V(h_src)
        elif x is not None:
            m = x.unsqueeze(-1) * m
        return m

    def logits(self, h_dst: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """e_uv, eq. (2)."""
        return F.leaky_relu(self.a_dst(self.W(h_dst)) + self.a_src(m), self.negative_slope).squeeze(-1)

    def edges(self, h_src: torch.Tensor, h_dst: torch.Tensor, edge_index: torch.Tensor,
              x: torch.Tensor | None, n_dst: int) -> torch.Tensor:
        """Σ_v α_uv m_uv per destination node, on an edge list (full graph). Shapes: -> [n_dst, d]."""
        out = h_dst.new_zeros(n_dst, self.W.out_features)
        if edge_index.numel() == 0:
            return out
        src, dst = edge_index
        m = self.message(h_src[src], x)
        alpha = segment_softmax(self.logits(h_dst[dst], m), dst, num_nodes=n_dst)
        return out.index_add(0, dst, alpha.unsqueeze(-1) * m)

    def dense(self, h_src: torch.Tensor, h_dst: torch.Tensor, x: torch.Tensor | None,
              mask: torch.Tensor) -> torch.Tensor:
        """Same on padded stars. Shapes: h_src [B, K, d], h_dst [B, d], x, mask [B, K] -> [B, d]."""
        m = self.message(h_src, x)
        e = self.logits(h_dst.unsqueeze(1).expand(-1, m.shape[1], -1), m)
        e = e.masked_fill(~mask, -1e9)  # finite: a star with no feature must not give NaN gradients
        alpha = torch.softmax(e, dim=1)
        alpha = torch.where(mask, alpha, torch.zeros_like(alpha))  # rows with no feature -> all zero
        return (alpha.unsqueeze(-1) * m).sum(1)
