"""One relation's attention at one layer, NS-FL eqs. (1)-(3), on edge lists or dense stars.

Only ``nn.Linear`` (and its subclass :class:`KnotLinear`) and ``nn.Embedding`` leaves, each with a
rule in the per-patient engine (``sdk/privacy/part_rules.py``). The piecewise value encoding's
basis B_k(x) is a fixed function of the edge value (no parameters) that weights the input of
one more Linear, ``KnotLinear``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch_geometric.utils import softmax as segment_softmax

from .knot_sorted import KnotPairs, knot_pairs, knot_product


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
    # k + 1 = #{j: t_j < x}: bucketize's left side (a binary search; at 7 900 copies and 13 knots a third
    # of the time of comparing with every knot and summing, benchmarks/runtime_speed/README.md)
    k = (torch.bucketize(values.detach(), knots) - 1).clamp(0, m - 2)
    lo, hi = knots[k], knots[k + 1]
    return k, ((values - lo) / (hi - lo)).clamp(0.0, 1.0)


#: the attribute a per-copy KnotLinear call leaves on its basis tensor: (the basis's version then, its knot
#: sort). The two ``of_patient`` layers of a star forward take the same basis (:meth:`NSFLModel.embed_star`),
#: sorted once; the sort -- the batch's values as knot weights, patient data -- lives exactly as long as the
#: basis, never in a module global or on the model (two models in two threads never see each other's)
KNOT_SORT_ATTR = "_clinograph_knot_sort"


def _kept_sort(basis: torch.Tensor) -> tuple[bool, KnotPairs | None]:
    """(found, the sort a call left on ``basis``) if ``basis`` is unchanged since (its version)."""
    if basis.is_inference():  # an inference tensor has no version: nothing kept on it
        return False, None
    kept = basis.__dict__.get(KNOT_SORT_ATTR)
    if kept is not None and kept[0] == basis._version:
        return True, kept[1]
    return False, None


class KnotLinear(nn.Linear):
    """U of the piecewise value encoding: ``nn.Linear(d, M·d)`` whose row block k holds U_k [d, d]
    (the parameter and its state_dict entry are those of the plain Linear).

    ``U(h)``: the Linear, every U_k h (the table path, :meth:`RelationAttention._dense_rows`).
    ``U(h, B(x))``: Σ_k B_k(x) U_k h (the per-copy path), on a hat basis with the positions
    sorted by knot, one product with [U_k; U_{k+1}] a knot (:mod:`.knot_sorted`), else one product
    of the knot-weighted input B(x) ⊗ h [..., M·d] with [U_0 … U_{M-1}] [d, M·d]. B(x) is a fixed
    function of the data: no gradient is sent back to it. The per-patient engine reads that call
    as a Linear over B(x) ⊗ h whose ghost norm factorises, (e_t·e_s) = (h_t·h_s)(B_t·B_s)
    (:class:`clinograph.sdk.privacy.ghost.KnotWeight`). Shapes: [..., d] -> [..., M·d];
    [..., d], [..., M] -> [..., d]."""

    def __init__(self, hidden: int, n_knots: int):
        super().__init__(hidden, n_knots * hidden, bias=False)
        self.n_knots = n_knots

    def forward(self, h: torch.Tensor, basis: torch.Tensor | None = None) -> torch.Tensor:
        if basis is None:
            return super().forward(h)
        pairs = self.pairs_of(basis)  # another KnotLinear's sort of this very basis (both layers take one basis)
        if pairs is None:  # not a hat basis: the dense product
            e = (basis.detach().unsqueeze(-1) * h.unsqueeze(-2)).flatten(-2)  # B(x) ⊗ h, [..., M·d]
            return F.linear(e, self.blocks())
        out = knot_product(h.reshape(-1, h.shape[-1]), self.weight, pairs)
        return out.view(*h.shape[:-1], out.shape[-1])

    @staticmethod
    def pairs_of(basis: torch.Tensor) -> KnotPairs | None:
        """:func:`~.knot_sorted.knot_pairs` of ``basis``: the one an earlier call left on this very
        tensor when it is unchanged since (its version), else sorted now and left on it
        (:data:`KNOT_SORT_ATTR`: it goes when the basis goes)."""
        found, pairs = _kept_sort(basis)
        if found:
            return pairs
        pairs = knot_pairs(basis.detach())
        if not basis.is_inference():
            basis.__dict__[KNOT_SORT_ATTR] = (basis._version, pairs)
        return pairs

    def blocks(self) -> torch.Tensor:
        """[U_0 … U_{M-1}] [d_out, M·d_in]: column block k = U_k (the weight's row block k)."""
        d = self.in_features
        return self.weight.reshape(self.n_knots, -1, d).transpose(0, 1).reshape(-1, self.n_knots * d)


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
    instead of M·d² and about the cost of V (a DP step: the gated form ~1.2× the linear encoding's,
    the full form ~1.9-2.0× on the deployed step, bound by U's per-copy products on the star path the
    per-patient engine runs: benchmarks/runtime_speed/README.md, "Session 53").
    """

    def __init__(self, hidden: int, *, valued: bool, negative_slope: float = 0.2,
                 value_knots: tuple[float, ...] = (), value_gated: bool = False,
                 value_range: float | None = None):
        super().__init__()
        if value_knots and not valued:
            raise ValueError("value_knots needs a valued relation")
        if value_range is not None and not value_range > 0:
            raise ValueError(f"value_range must be > 0 (the values' bound), got {value_range}")
        self.W = nn.Linear(hidden, hidden, bias=False)
        self.V = nn.Linear(hidden, hidden, bias=False) if valued else None
        self.n_knots = len(value_knots)
        self.value_gated = bool(value_knots) and value_gated
        #: Σ_k B_k(x) U_k h (full) or the curves G B(x) (gated); zero-initialised by NSFLModel
        self.U: nn.Linear | None = None
        if value_knots:
            self.U = nn.Linear(self.n_knots, hidden, bias=False) if self.value_gated else KnotLinear(hidden, self.n_knots)
        # non-persistent: public constants, not state (the state_dict holds only U's weight)
        self.register_buffer("value_knots", torch.tensor(value_knots, dtype=torch.float32), persistent=False)
        #: the values' bound c (|x| <= c: the model clips them), or None. With it and the full piecewise
        #: encoding the table path folds W and V into the knot rows (:meth:`_dense_rows`): the knots
        #: extended to ±c where c lies beyond the outer ones (U flat there: the first and last U_k again)
        self.value_range = None if value_range is None or not value_knots or value_gated else float(value_range)
        ext = list(value_knots)
        #: (below, above): whether the knots are extended to −c, to +c
        self._extended = (False, False)
        if self.value_range is not None:
            self._extended = (-self.value_range < ext[0], self.value_range > ext[-1])
            ext = [-self.value_range] * self._extended[0] + ext + [self.value_range] * self._extended[1]
        self.register_buffer("folded_knots", torch.tensor(ext, dtype=torch.float32), persistent=False)
        # A_j = Σ_i fold[j, i]·[W; V; U_0 … U_{M-1}]_i: row j = [1, T_j, e_k] with U_k the knot's own (the first
        # or last one on an extension knot) -- the fold as one small product (its backward one more)
        fold = torch.zeros(len(ext), 2 + self.n_knots)
        for j, tj in enumerate(ext):
            fold[j, 0], fold[j, 1] = 1.0, tj
            fold[j, 2 + min(max(j - self._extended[0], 0), self.n_knots - 1)] = 1.0
        self.register_buffer("fold_matrix", fold, persistent=False)
        self.a_dst = nn.Linear(hidden, 1, bias=False)
        self.a_src = nn.Linear(hidden, 1, bias=False)
        self.negative_slope = negative_slope

    def value_basis(self, x: torch.Tensor) -> torch.Tensor | None:
        """B(x) [..., M] of the full piecewise encoding (:func:`hat_basis` on the knots), else None."""
        if self.U is None or self.value_gated:
            return None
        return hat_basis(x, self.value_knots.to(x.dtype))

    def message(self, h_src: torch.Tensor, x: torch.Tensor | None, basis: torch.Tensor | None = None) -> torch.Tensor:
        """m_uv; ``x`` broadcasts over the hidden dimension. ``basis``: :meth:`value_basis` of ``x`` when
        the caller has it (one basis, and one knot sort, for both layers of a star forward)."""
        m = self.W(h_src)
        if self.V is not None:
            if x is None:
                raise ValueError("valued relation needs edge values")
            m = m + x.unsqueeze(-1) * self.V(h_src)
            if self.U is not None and self.value_gated:
                m = m + self.U(hat_basis(x, self.value_knots.to(x.dtype)).to(h_src.dtype)) * h_src
            elif self.U is not None:  # Σ_k B_k(x) U_k h_v: one KnotLinear call on (h, B(x))
                b = (self.value_basis(x) if basis is None else basis).to(h_src.dtype)  # [..., M]
                m = m + self.U(h_src, b)
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
              mask: torch.Tensor, *, index: torch.Tensor | None = None,
              knot_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
              basis: torch.Tensor | None = None) -> torch.Tensor:
        """Same on padded stars. Shapes: h_src [B, K, d], h_dst [B, d], x, mask [B, K] -> [B, d].
        With ``index`` [B, K], ``h_src`` is a table [F, d] and the sources are ``h_src[index]``
        (:meth:`_dense_rows`: every linear map once per table row, a star's feature copies share their
        dictionary feature's state; the non-DP star path's saving. Opacus' hooks need the per-copy form).
        ``knot_rows``: :meth:`knot_rows` of ``(x, index, F)`` when the caller has it (the model keeps
        its stars' once: the values and the knots do not change from step to step); ``basis``:
        :meth:`value_basis` of ``x`` for the per-copy path (:meth:`message`)."""
        if index is not None:
            return self._dense_rows(h_src, h_dst, x, mask, index, knot_rows)
        m = self.message(h_src, x, basis)
        e = self.logits(h_dst.unsqueeze(1).expand(-1, m.shape[1], -1), m)
        e = e.masked_fill(~mask, -1e9)  # finite: a star with no feature must not give NaN gradients
        alpha = torch.softmax(e, dim=1)
        alpha = torch.where(mask, alpha, torch.zeros_like(alpha))  # rows with no feature -> all zero
        return (alpha.unsqueeze(-1) * m).sum(1)

    def knot_rows(self, x: torch.Tensor, index: torch.Tensor, n_f: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each copy's knot row in :meth:`_dense_rows`' stacked table (of its first knot k) and its
        interpolation weight t (B_k = 1 − t, B_{k+1} = t; :func:`hat_pair`) -- a function of the value,
        the feature and the fixed knots only: row f·M' + k on the folded rows (``value_range``: M' knots
        with the extension; t in float64), else row 2F + f·M + k (after the W and V rows). Shapes: x,
        index [...] -> [...] (int64), [...]."""
        if self.value_range is not None:
            if x.numel() and float(x.detach().abs().max()) > self.value_range:
                raise ValueError(f"values beyond value_range ±{self.value_range}: the folded knot rows hold "
                                 "only values within it (clip them first, as NSFLModel does)")
            # t in float64: (1 − t)·T_k + t·T_{k+1} stands for x in the V channel, so t is rounded once,
            # to the caller's dtype, not first to the values' (float32 values in a float64 model)
            k, t = hat_pair(x.double(), self.folded_knots.double())
            return index * self.folded_knots.shape[0] + k, t
        k, t = hat_pair(x, self.value_knots.to(x.dtype))
        return index * self.n_knots + k + 2 * n_f, t

    def folded_weight(self) -> torch.Tensor:
        """The folded knot maps A_j = W + T_j·V + U_j on the extended knots T (``value_range``; U_j the
        first or last U_k beyond the outer knots), stacked [M'·d, d]. On a hat basis (weights 1 − t and t
        summing to 1, and interpolating x exactly on [T_0, T_{M'-1}] ∋ every clipped value):
        W h + x·V h + Σ_k B_k(x) U_k h = (1 − t)·A_k h + t·A_{k+1} h, the whole message from two rows."""
        d, w = self.W.in_features, self.W.weight
        stacked = torch.cat([w.view(1, -1), self.V.weight.view(1, -1), self.U.weight.view(self.n_knots, -1)])
        return (self.fold_matrix.to(w.dtype) @ stacked).view(-1, d)

    def _dense_rows(self, table: torch.Tensor, h_dst: torch.Tensor, x: torch.Tensor | None, mask: torch.Tensor,
                    index: torch.Tensor, knot_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """:meth:`dense` with ``index`` (the non-DP star path), exactly, without a d-vector per copy.

        Every message is a combination of rows of per-feature tables: m_uv = c_W·(W h_f) + c_V·(V h_f)
        + c_k·(U_k h_f) + c_{k+1}·(U_{k+1} h_f) with per-copy scalars (c_W = 1, or s_uv for an unvalued
        relation with weights; c_V = x_uv; (c_k, c_{k+1}) = (1 − t, t) from :func:`hat_pair`). a_src has
        no bias, so e_uv needs the tables' rows only through a_src, gathered as scalars; and
        Σ_v α_uv m_uv = C_u · S with S the stacked table rows [R, d] and C_u [R] the per-patient sum of
        α_uv·c at the copies' rows (a [B, R] x [R, d] product). With ``value_range`` (NSFLModel: the
        values' clip) W and V are folded into the knot rows, m_uv = (1 − t)·A_k h_f + t·A_{k+1} h_f
        (:meth:`folded_weight`): two rows a copy, as many as the linear encoding's, and one table product;
        without it the U rows are stacked with W's and V's (four a copy). Either way U = 0 gives the
        linear encoding up to rounding, not bit for bit (benchmarks/runtime_speed/README.md, "Session
        53"). ``knot_rows``: :meth:`knot_rows` of (x, index, F), given by a caller that keeps it. A row
        no star holds gets a zero column of C, so exactly zero gradient (Theorem 1). ``value_gated``'s G B(x) ⊙ h_f is no
        table row: that term stays a d-vector per copy, added on its own (again: G = 0 gives the linear
        encoding exactly).
        Shapes: table [F, d], h_dst [B, d], x, mask, index [B, K] -> [B, d]."""
        n_f = table.shape[0]
        # (table rows S, per-copy row numbers, per-copy coefficients) of each product
        if self.V is None:
            one = torch.ones_like(index, dtype=table.dtype) if x is None else x.to(table.dtype)
            parts = [(self.W(table), [index], [one])]
        else:
            if x is None:
                raise ValueError("valued relation needs edge values")
            xs = x.to(table.dtype)
            if self.value_range is not None:  # the folded knot rows A_k h_f at row f·M' + k: two a copy
                first, t = self.knot_rows(x, index, n_f) if knot_rows is None else knot_rows
                t = t.to(table.dtype)
                s = F.linear(table, self.folded_weight()).reshape(-1, table.shape[1])
                parts = [(s, [first, first + 1], [1 - t, t])]
            elif self.U is not None and not self.value_gated:  # U_k h_f at row 2F + f·M + k
                first, t = self.knot_rows(x, index, n_f) if knot_rows is None else knot_rows
                t = t.to(table.dtype)
                s = torch.cat([self.W(table), self.V(table), self.U(table).reshape(n_f * self.n_knots, -1)])
                parts = [(s, [index, index + n_f, first, first + 1], [torch.ones_like(xs), xs, 1 - t, t])]
            else:
                parts = [(torch.cat([self.W(table), self.V(table)]), [index, index + n_f], [torch.ones_like(xs), xs])]
        gated = None
        if self.U is not None and self.value_gated and x is not None:
            gated = self.U(hat_basis(x, self.value_knots.to(x.dtype)).to(table.dtype)) * table[index]  # [B, K, d]
        rows = [torch.stack(r, -1) for _, r, _ in parts]  # [B, K, J] each
        coefs = [torch.stack(c, -1) for _, _, c in parts]
        src = sum((self.a_src(s).squeeze(-1)[r] * c).sum(-1) for (s, _, _), r, c in zip(parts, rows, coefs, strict=True))
        if gated is not None:
            src = src + self.a_src(gated).squeeze(-1)
        e = F.leaky_relu(self.a_dst(self.W(h_dst)) + src, self.negative_slope)  # eq. (2), [B, K]
        e = e.masked_fill(~mask, -1e9)  # finite: a star with no feature must not give NaN gradients
        alpha = torch.where(mask, torch.softmax(e, dim=1), torch.zeros_like(e))
        b = index.shape[0]
        out = None
        for (s, _, _), r, c in zip(parts, rows, coefs, strict=True):
            cu = table.new_zeros(b, s.shape[0]).scatter_add(1, r.reshape(b, -1), (alpha.unsqueeze(-1) * c).reshape(b, -1))
            out = cu @ s if out is None else out + cu @ s
        return out if gated is None else out + (alpha.unsqueeze(-1) * gated).sum(1)
