"""One relation's attention at one layer, NS-FL eqs. (1)-(3), on edge lists or dense stars.

Only ``nn.Linear`` and ``nn.Embedding`` leaves, so Opacus computes exact per-sample gradients
in hooks mode for the dense (star) path (privacy.md). The piecewise value encoding keeps that:
its basis B_k(x) is a fixed function of the edge value (no parameters) that scales the outputs
of one more ``nn.Linear``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch_geometric.utils import softmax as segment_softmax


def hat_basis(values: torch.Tensor, knots: torch.Tensor) -> torch.Tensor:
    """B_k(x): piecewise-linear interpolation weights of ``values`` on ``knots`` t_0 < ... < t_{M-1}
    (each row sums to 1; B_0 and B_{M-1} stay 1 beyond the outer knots). Shapes: [...], [M] -> [..., M]."""
    x = values.unsqueeze(-1)
    gaps = knots[1:] - knots[:-1]
    far = torch.full_like(x, 2.0)  # > 1: no bound on that side
    rise = torch.cat([far, (x - knots[:-1]) / gaps], -1)  # (x - t_{k-1}) / (t_k - t_{k-1})
    fall = torch.cat([(knots[1:] - x) / gaps, far], -1)  # (t_{k+1} - x) / (t_{k+1} - t_k)
    return torch.minimum(rise, fall).clamp(0.0, 1.0)


def hat_pair(values: torch.Tensor, knots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two non-zero entries of :func:`hat_basis`: (k, t) with B_k(x) = 1 − t, B_{k+1}(x) = t and
    every other B_j(x) = 0 (a hat basis interpolates between two adjacent knots; beyond the outer
    knots t is 0 or 1). Shapes: [...], [M] -> [...] (int64), [...]."""
    m = knots.shape[0]
    k = (torch.searchsorted(knots, values.detach().contiguous()) - 1).clamp(0, m - 2)
    lo, hi = knots[k], knots[k + 1]
    return k, ((values - lo) / (hi - lo)).clamp(0.0, 1.0)


class RelationAttention(nn.Module):
    """Messages and attention of relation r.

    e_uv = LeakyReLU(a^(r)T [W^(r) h_u ‖ m_uv])  (eq. 2), α = softmax over N_r(u) (eq. 3),
    with the message m_uv = W^(r) h_v for unvalued relations, m_uv = s_uv · W^(r) h_v for
    ``similar_to`` (similarity weight) and m_uv = W^(r) h_v + x_uv · V^(r) h_v for valued
    relations (the observed value x_uv on the edge: value-scaled channel plus a presence channel,
    so a reference-midpoint value is not confused with an absent feature).

    With ``value_knots`` (a valued relation, ``[model] value_encoding = "piecewise"``) the message
    is also non-linear in the value: m_uv = W h_v + x_uv · V h_v + Σ_k B_k(x_uv) · U_k h_v, B_k the
    piecewise-linear hat basis on the fixed public knots (:func:`hat_basis`; the piecewise-linear
    encoding of Gorishniy et al. 2022, "On Embeddings for Numerical Features in Tabular Deep
    Learning", sec. 3.2, with hats instead of ramps: the same span). h_v of a feature node carries
    the feature's identity (its embedding), so U_k h_v is a per-feature vector at knot k and the
    message a per-feature piecewise-linear curve in x; the per-feature parameters stay in the
    feature's own embedding row (NS-FL Theorem 1), U is shared like W and V.

    ``value_gated`` (``value_encoding = "piecewise_gated"``) is the cheap factorised form:
    m_uv = W h_v + x_uv · V h_v + G B(x_uv) ⊙ h_v, i.e. U_k = diag(G_k): d shared curves
    g_j(x) = Σ_k G_jk B_k(x), each channel j of feature v scaled by its own state h_vj, so a
    read-out of the message is a per-feature combination of the shared curves. Parameters M·d
    instead of M·d² and about the cost of V (the full form is ~3× slower per step at d = 32).
    """

    def __init__(self, hidden: int, *, valued: bool, negative_slope: float = 0.2,
                 value_knots: tuple[float, ...] = (), value_gated: bool = False):
        super().__init__()
        if value_knots and not valued:
            raise ValueError("value_knots needs a valued relation")
        self.W = nn.Linear(hidden, hidden, bias=False)
        self.V = nn.Linear(hidden, hidden, bias=False) if valued else None
        self.n_knots = len(value_knots)
        self.value_gated = bool(value_knots) and value_gated
        #: Σ_k B_k(x) U_k h (full) or the curves G B(x) (gated); zero-initialised by NSFLModel
        self.U = nn.Linear(self.n_knots if self.value_gated else hidden,
                           hidden if self.value_gated else self.n_knots * hidden, bias=False) if value_knots else None
        # non-persistent: public constants, not state (the state_dict holds only U's weight)
        self.register_buffer("value_knots", torch.tensor(value_knots, dtype=torch.float32), persistent=False)
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
            if self.U is not None and self.value_gated:
                m = m + self.U(hat_basis(x, self.value_knots.to(x.dtype)).to(h_src.dtype)) * h_src
            elif self.U is not None:
                u = self.U(h_src)
                u = u.reshape(u.shape[:-1] + (self.n_knots, -1))  # [..., M, d]: U_k h_v
                b = hat_basis(x, self.value_knots.to(x.dtype))  # [..., M]; all M knots: per copy, a dense
                m = m + (b.unsqueeze(-1) * u).sum(-2)  # sum beats a two-row gather (benchmarks/runtime_speed/nsfl_step.py)
        elif x is not None:
            m = x.unsqueeze(-1) * m
        return m

    def message_indexed(self, table: torch.Tensor, index: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        """:meth:`message` of ``h_src = table[index]``, exactly, with every linear map applied once
        per table row and then read at ``index`` (a star's feature copies share their dictionary
        feature's state: the non-DP star path's saving; Opacus' hooks need :meth:`message`).
        Shapes: table [F, d], index [...] -> [..., d]."""
        m = self.W(table)[index]
        if self.V is None:
            return m if x is None else x.unsqueeze(-1) * m
        if x is None:
            raise ValueError("valued relation needs edge values")
        m = m + x.unsqueeze(-1) * self.V(table)[index]
        if self.U is not None and self.value_gated:
            m = m + self.U(hat_basis(x, self.value_knots.to(x.dtype)).to(table.dtype)) * table[index]
        elif self.U is not None:  # Σ_k B_k(x) U_k h_v read at the two knots B is non-zero on (hat_pair)
            u = self.U(table).reshape(table.shape[0], self.n_knots, -1)  # [F, M, d]
            k, t = hat_pair(x, self.value_knots.to(x.dtype))
            w = t.unsqueeze(-1).to(u.dtype)
            m = m + (1 - w) * u[index, k] + w * u[index, k + 1]
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
              mask: torch.Tensor, *, index: torch.Tensor | None = None) -> torch.Tensor:
        """Same on padded stars. Shapes: h_src [B, K, d], h_dst [B, d], x, mask [B, K] -> [B, d].
        With ``index`` [B, K], ``h_src`` is a table [F, d] and the sources are ``h_src[index]``
        (:meth:`message_indexed`)."""
        m = self.message(h_src, x) if index is None else self.message_indexed(h_src, index, x)
        e = self.logits(h_dst.unsqueeze(1).expand(-1, m.shape[1], -1), m)
        e = e.masked_fill(~mask, -1e9)  # finite: a star with no feature must not give NaN gradients
        alpha = torch.softmax(e, dim=1)
        alpha = torch.where(mask, alpha, torch.zeros_like(alpha))  # rows with no feature -> all zero
        return (alpha.unsqueeze(-1) * m).sum(1)
