"""The NS-FL model: a 2-layer relation-aware attention GNN (NS-FL eqs. 1-4) with feature masks.

Patients start from a fixed seeded random vector ε (shared by all patients, see below);
feature nodes from h_f^(0) = m_f · Emb(f) with a learnable m_f ∈ [0, 1] (sigmoid of a logit);
per layer h_u^(l+1) = ReLU(W_self h_u^(l) + Σ_r Σ_{v∈N_r(u)} α_uv^(r) m_uv^(r)) (eq. 1 plus
RGCN's self-connection); ŷ = σ(W_out h_p^(2) + b) (eq. 4), trained with BCE.

Two deliberate readings of the paper, both documented in docs/architecture.md:
- ε is one vector for all patients (the paper writes ε_p ~ N(0, I)): a per-patient random
  vector carries no information, and a shared one makes each patient's output depend only on
  its own features and on ``similar_to`` neighbours -- which is what makes the star model equal
  to the full graph without ``similar_to`` (tested) and patient-level DP possible.
- The self-connection W_self (Schlichtkrull et al. 2018, which NS-FL cites): without it a
  patient's layer-2 state would not see feature identities at all.

Wide & deep (``[model] linear_path``, on by default; research/real_tables/README.md measures why): a
per-feature linear term on the star's standardised values and observed indicators,
z_lin = Σ_{f∈star} (a_f · x_f + c_f), is added to the logit -- a skip connection from the
features to the output that the GNN need not learn. On small tables the GNN alone only tied a
logistic regression; with the linear path it starts as one and learns the rest. The rows
``linear/<f>`` are per feature like the embeddings, so Theorem 1 still holds (a hospital that
never observes f never changes a_f, c_f). Standardised values are clipped to ±``value_clip``.

Shape functions (``[model] linear_shape``): the wide term becomes a GAM (Hastie & Tibshirani
1986), z_lin = Σ_{f∈star} (a_f · x_f + c_f + Σ_k w_fk · B_k(x_f)), with B_k the piecewise-linear
"hat" basis over the fixed public knots :data:`SHAPE_KNOTS` (reference range = [-1, 1]; the
outer hats stay 1 beyond the last knot). ALARM's variables are discrete states rendered as
values, so risk is U-shaped or stepped in a value (SaO2 low vs normal vs high): a linear term
cannot fit that and the GNN fits it only slowly. The weights w_fk sit in the same rows
``linear/<f>`` (zero at round 0), so Theorem 1 and the module names are unchanged.

Value encoding in the messages (``[model] value_encoding = "piecewise"``): the valued relation
``of_patient`` of both layers adds Σ_k B_k(x) · U_k h_f to its message (the same knots; see
:class:`~clinograph.sdk.model.layers.RelationAttention`), so the GNN too sees each value through a
per-feature piecewise-linear curve instead of linearly (Gorishniy et al. 2022). U starts at zero
(the model at round 0 is the linear-encoding model) and sits in the shared modules
``gnn/layer<l>/of_patient``; no per-feature parameter is added, so Theorem 1 is unchanged.
``"piecewise_gated"`` is the factorised, cheaper form (G B(x) ⊙ h_f: d shared curves, each
feature reading them through its own state).

Two forward paths on the same parameters: :meth:`forward_graph` (HeteroData, with
``similar_to``) and :meth:`forward_star` (padded per-patient stars, Opacus-compatible).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch_geometric.data import HeteroData

from ..config import NSFLConfig
from ..graph.build import OF_PATIENT, SIMILAR_TO
from ..graph.star import StarBatch
from .layers import RelationAttention, hat_basis


class _RowsCache:
    """:meth:`NSFLModel._knot_rows`' last result; a copy or a pickle of the model starts empty (a weak
    reference neither pickles nor is state)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple | None = None

    def __reduce__(self) -> tuple:
        return (_RowsCache, ())


#: knots of the shape functions, in standardised units (reference range = [-1, 1]); public, fixed
SHAPE_KNOTS: tuple[float, ...] = (-4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


class NSFLModel(nn.Module):
    """NS-FL over a dictionary of ``n_features`` feature nodes."""

    def __init__(self, n_features: int, config: NSFLConfig | None = None):
        super().__init__()
        cfg = config or NSFLConfig()
        d = cfg.hidden
        self.config = cfg
        self.n_features = n_features
        gen = torch.Generator().manual_seed(cfg.init_seed)
        self.register_buffer("epsilon", torch.randn(d, generator=gen))
        self.embedding = nn.Embedding(n_features, d)
        nn.init.normal_(self.embedding.weight, std=1.0, generator=gen)
        self.mask_logit = nn.Embedding(n_features, 1)
        nn.init.constant_(self.mask_logit.weight, cfg.mask_init_logit)
        s = cfg.negative_slope
        vk = SHAPE_KNOTS if cfg.value_encoding in ("piecewise", "piecewise_gated") else ()
        vg = cfg.value_encoding == "piecewise_gated"
        vr = float(cfg.value_clip)  # the values' bound: the table path folds W and V into the knot rows
        self.l1_of_patient = RelationAttention(d, valued=True, negative_slope=s, value_knots=vk, value_gated=vg,
                                               value_range=vr)
        self.l1_has_feature = RelationAttention(d, valued=False, negative_slope=s)
        self.l1_similar_to = RelationAttention(d, valued=False, negative_slope=s)
        self.l1_self_patient = nn.Linear(d, d)
        self.l1_self_feature = nn.Linear(d, d)
        self.l2_of_patient = RelationAttention(d, valued=True, negative_slope=s, value_knots=vk, value_gated=vg,
                                               value_range=vr)
        self.l2_similar_to = RelationAttention(d, valued=False, negative_slope=s)
        self.l2_self_patient = nn.Linear(d, d)
        self.head = nn.Linear(d, 1)
        # [model] deep = false: the head reads g · h_p with g = 0, so the logit's deep term is the bias
        # alone (non-persistent: the state_dict, the module map and Theorem 1 are unchanged; the GNN's
        # weights get exactly zero gradient, per sample too, through the same nn.Linear Opacus hooks)
        self.register_buffer("deep_gate", torch.tensor(1.0 if cfg.deep else 0.0), persistent=False)
        #: deep = false: no path computes the GNN (its term is exactly 0), so a DP step forms no per-patient
        #: gradient for it; :meth:`computing_gnn` turns it back on for the structural probe only
        self.skip_gnn: bool = not cfg.deep
        self.value_clip = float(cfg.value_clip)
        #: wide & deep: [a_f, c_f (, w_f1..w_fM)] per dictionary feature (zero-initialised: the GNN alone at round 0)
        shape = cfg.linear_path and cfg.linear_shape
        self.shape_knots: tuple[float, ...] = SHAPE_KNOTS if shape else ()
        # non-persistent: the state_dict (and so every saved model and module map) is unchanged
        self.register_buffer("knots", torch.tensor(self.shape_knots, dtype=torch.float32), persistent=False)
        self.linear = nn.Embedding(n_features, 2 + len(self.shape_knots)) if cfg.linear_path else None
        #: :meth:`_knot_rows`' last stars and their rows (not state: empty in a copy or a pickle)
        self._rows_cache = _RowsCache()
        for name, p in sorted(self.named_parameters()):  # deterministic: every hospital starts alike
            if name.startswith("linear.") or name.endswith("_of_patient.U.weight"):
                nn.init.zeros_(p)  # zero: every other weight is drawn exactly as without them
                continue
            if name.startswith(("embedding.", "mask_logit.")):
                continue
            if p.dim() == 2:
                nn.init.xavier_uniform_(p, generator=gen)
            else:
                nn.init.zeros_(p)

    def _head(self, h_p: torch.Tensor) -> torch.Tensor:
        """The deep logit W_head (g · h_p) + b, g = 1 (exactly the GNN's logit) or 0 with
        ``[model] deep = false`` (the bias alone). Shapes: [B, d] -> [B]."""
        return self.head(h_p * self.deep_gate.to(h_p.dtype)).squeeze(-1)

    def _wide_only(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The logit with ``[model] deep = false``: the head on g · h_p = 0 (its bias; exactly what
        :meth:`_head` gives on the GNN's output with g = 0) plus the wide term, the GNN not computed.
        The head is called as a module (not its bias read directly) so the per-patient engine sees
        the bias through its ``nn.Linear`` rule. Shapes: [B, K] x3 -> [B]."""
        zero = torch.zeros(feature_index.shape[0], self.config.hidden, dtype=self.head.weight.dtype)
        return self._head(zero) + self.linear_star(feature_index, self._clip(values), mask)

    @contextmanager
    def computing_gnn(self) -> Iterator[None]:
        """Meanwhile the star path computes the GNN even with deep = false (its output is unchanged:
        g = 0): the *structural* star path, which decides the released coordinates
        (:func:`~clinograph.sdk.privacy.trainer.unused_star_parameters`) -- the same with deep on or off,
        so the model spec's dimension and the server's noise test do not depend on it."""
        saved, self.skip_gnn = self.skip_gnn, False
        try:
            yield
        finally:
            self.skip_gnn = saved

    def _clip(self, values: torch.Tensor) -> torch.Tensor:
        return values.clamp(-self.value_clip, self.value_clip)

    def linear_star(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The wide part z_lin = Σ_f (a_f · x_f + c_f) over each star (0 without a linear path).

        Shapes: [B, K] x3 -> [B]."""
        if self.linear is None:
            return torch.zeros(feature_index.shape[0], dtype=values.dtype)
        return (self._wide(self.linear(feature_index), values) * mask.to(values.dtype)).sum(-1)

    def _wide(self, w: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """a_f · x + c_f (+ Σ_k w_fk B_k(x) with shape functions). Shapes: [..., 2+M], [...] -> [...]."""
        out = w[..., 0] * values + w[..., 1]
        if len(self.shape_knots):
            out = out + (w[..., 2:] * hat_basis(values, self.knots.to(values.dtype))).sum(-1)
        return out

    def feature_mask(self, index: torch.Tensor) -> torch.Tensor:
        """m_f ∈ [0, 1] for dictionary node indices ``index``."""
        return torch.sigmoid(self.mask_logit(index)).squeeze(-1)

    def feature_init(self, index: torch.Tensor) -> torch.Tensor:
        """h_f^(0) = m_f · Emb(f)."""
        return self.feature_mask(index).unsqueeze(-1) * self.embedding(index)

    # -- full graph ----------------------------------------------------------------------
    def forward_graph(self, data: HeteroData, *, use_similar: bool = True) -> torch.Tensor:
        """Logits for every patient node. Shapes: -> [n_patients]."""
        n_p, n_f = data["patient"].num_nodes, data["feature"].num_nodes
        h_p0 = self.epsilon.expand(n_p, -1)
        h_f0 = self.feature_init(data["feature"].feature_index)
        e_fp, x_fp = data[OF_PATIENT].edge_index, self._clip(data[OF_PATIENT].edge_weight)
        e_pf = e_fp.flip(0)
        sim = data[SIMILAR_TO] if use_similar and SIMILAR_TO in data.edge_types else None
        agg = self.l1_of_patient.edges(h_f0, h_p0, e_fp, x_fp, n_p)
        if sim is not None:
            agg = agg + self.l1_similar_to.edges(h_p0, h_p0, sim.edge_index, sim.edge_weight, n_p)
        h_p1 = torch.relu(self.l1_self_patient(h_p0) + agg)
        h_f1 = torch.relu(self.l1_self_feature(h_f0) + self.l1_has_feature.edges(h_p0, h_f0, e_pf, None, n_f))
        agg = self.l2_of_patient.edges(h_f1, h_p1, e_fp, x_fp, n_p)
        if sim is not None:
            agg = agg + self.l2_similar_to.edges(h_p1, h_p1, sim.edge_index, sim.edge_weight, n_p)
        h_p2 = torch.relu(self.l2_self_patient(h_p1) + agg)
        out = self._head(h_p2)
        if self.linear is not None:
            w = self.linear(data["feature"].feature_index[e_fp[0]])
            out = out.index_add(0, e_fp[1], self._wide(w, x_fp.to(w.dtype)))
        return out

    # -- per-patient stars (+ similar_to neighbours) ----------------------------------------
    def _sim1(self, h_p0: torch.Tensor, nb_weight: torch.Tensor | None, nb_mask: torch.Tensor | None) -> torch.Tensor:
        """Layer-1 ``similar_to`` aggregate: neighbours all send s·W ε (their h^(0) is ε)."""
        if nb_weight is None or nb_mask is None:
            return torch.zeros_like(h_p0)
        h_nb = h_p0.unsqueeze(1).expand(-1, nb_weight.shape[1], -1)
        return self.l1_similar_to.dense(h_nb, h_p0, nb_weight, nb_mask)

    def _layer1(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                nb_weight: torch.Tensor | None = None, nb_mask: torch.Tensor | None = None,
                basis: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_p^(1) [B, d], h_f^(1) of the star's feature copies [B, K, d]). ``basis``: B(x) of the clipped
        values when the caller has it (:meth:`embed_star`)."""
        b = feature_index.shape[0]
        values = self._clip(values)
        h_p0 = self.epsilon.expand(b, -1)
        h_f0 = self.feature_init(feature_index)
        agg = (self.l1_of_patient.dense(h_f0, h_p0, values, mask, basis=basis)
               + self._sim1(h_p0, nb_weight, nb_mask))
        h_p1 = torch.relu(self.l1_self_patient(h_p0) + agg)
        # Each feature copy has one patient neighbour here; on the full graph all of a feature's
        # patients send the identical message W ε, so attention is uniform and the aggregate is W ε.
        h_f1 = torch.relu(self.l1_self_feature(h_f0) + self.l1_has_feature.W(h_p0).unsqueeze(1))
        return h_p1, h_f1

    def _layer1_indexed(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                        nb_weight: torch.Tensor | None = None, nb_mask: torch.Tensor | None = None,
                        knot_rows: tuple[torch.Tensor, torch.Tensor] | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_layer1` with the feature copies' states as one table: (h_p^(1) [B, d], h_f^(1)
        per dictionary feature [F, d]; a copy's state is ``table[feature_index]``). Exact: h_f^(0)
        = m_f · Emb(f) and h_f^(1) = ReLU(W_self h_f^(0) + W ε) depend on f alone, so every linear
        map runs once per feature instead of once per copy (the non-DP path; Opacus' per-sample
        hooks need :meth:`_layer1`). A feature no star holds gets no gradient (Theorem 1)."""
        b = feature_index.shape[0]
        values = self._clip(values)
        h_p0 = self.epsilon.expand(b, -1)
        t0 = self.feature_init(torch.arange(self.embedding.num_embeddings, device=feature_index.device))
        agg = (self.l1_of_patient.dense(t0, h_p0, values, mask, index=feature_index, knot_rows=knot_rows)
               + self._sim1(h_p0, nb_weight, nb_mask))
        h_p1 = torch.relu(self.l1_self_patient(h_p0) + agg)
        t1 = torch.relu(self.l1_self_feature(t0) + self.l1_has_feature.W(self.epsilon))
        return h_p1, t1

    def embed_star(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The patient embedding h_p^(2) from padded stars, no ``similar_to`` -- what the F-CMs
        concept modules take as their encoder output. Shapes: [B, K] x3 -> [B, d]."""
        values = self._clip(values)
        # one basis for both layers (the same knots and values), so one knot sort (KnotLinear)
        basis = self.l1_of_patient.value_basis(values)
        h_p1, h_f1 = self._layer1(feature_index, values, mask, basis=basis)
        return torch.relu(self.l2_self_patient(h_p1) + self.l2_of_patient.dense(h_f1, h_p1, values, mask, basis=basis))

    def forward_star(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits from padded stars, no ``similar_to`` (the DP path). Shapes: [B, K] x3 -> [B].
        With ``[model] deep = false`` the GNN is not computed (:meth:`_wide_only`; same logits)."""
        if self.skip_gnn:
            return self._wide_only(feature_index, values, mask)
        return (self._head(self.embed_star(feature_index, values, mask))
                + self.linear_star(feature_index, self._clip(values), mask))

    def forward_neighbourhood(self, stars: StarBatch, batch: torch.Tensor) -> torch.Tensor:
        """Exact full-graph logits for patients ``batch``, computed from their stars and their
        ``similar_to`` neighbours' stars only (the 2-hop receptive field). Shapes: [b] -> [b].
        With ``[model] deep = false`` the GNN is not computed at all (its term is 0 on every path;
        non-DP training and prediction come here, so the wide-only candidates cost the wide path)."""
        if self.skip_gnn:
            return self._wide_only(stars.feature_index[batch], stars.values[batch], stars.mask[batch])
        fi, x, m = stars.feature_index[batch], stars.values[batch], stars.mask[batch]
        xc = self._clip(x)
        if stars.neighbours is None and type(self).forward_star is not NSFLModel.forward_star:
            return self.forward_star(fi, x, m)  # a subclass's star path (temporal, modalities, survival)
        rows = self._knot_rows(stars)  # both layers' U rows and weights, every star's, kept (None: no U)
        if stars.neighbours is None:  # forward_star, feature states as a table (_layer1_indexed)
            kb = None if rows is None else (rows[0][batch], rows[1][batch])
            h_p1, t1 = self._layer1_indexed(fi, x, m, knot_rows=kb)
            agg = self.l2_of_patient.dense(t1, h_p1, xc, m, index=fi, knot_rows=kb)
        else:  # the batch's and its similar_to neighbours' layer-1 states, then layer 2 for the batch
            nb, nw, nm = stars.neighbours[batch], stars.neighbour_weight[batch], stars.neighbour_mask[batch]
            need, inverse = torch.unique(torch.cat([batch, nb.reshape(-1)]), return_inverse=True)
            h_need, t1 = self._layer1_indexed(stars.feature_index[need], stars.values[need], stars.mask[need],
                                              stars.neighbour_weight[need], stars.neighbour_mask[need],
                                              knot_rows=None if rows is None else (rows[0][need], rows[1][need]))
            h_p1 = h_need[inverse[: len(batch)]]
            kb = None if rows is None else (rows[0][batch], rows[1][batch])
            agg = (self.l2_of_patient.dense(t1, h_p1, xc, m, index=fi, knot_rows=kb)
                   + self.l2_similar_to.dense(h_need[inverse[len(batch):].reshape(nb.shape)], h_p1, nw, nm))
        h_p2 = torch.relu(self.l2_self_patient(h_p1) + agg)
        return self._head(h_p2) + self.linear_star(fi, xc, m)

    def _knot_rows(self, stars: StarBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`RelationAttention.knot_rows` of every star's clipped values (both ``of_patient`` layers
        have the same knots and row layout), or None without the full piecewise encoding. Kept between
        calls while the stars' value and feature tensors are the same, unchanged tensors (weak references
        and versions, as :class:`~.layers.KnotLinear` keeps its sort): a training step then gathers its
        batch's rows instead of searching the knots again (benchmarks/runtime_speed/README.md, "Session
        53"). Not kept for inference tensors or values that take a gradient. Shapes: -> [n, K] each."""
        ra = self.l1_of_patient
        if ra.U is None or ra.value_gated:
            return None
        v, fi = stars.values, stars.feature_index
        keep = not (v.requires_grad or v.is_inference() or fi.is_inference() or torch.is_inference_mode_enabled())
        dtype = self.embedding.weight.dtype  # the table's: the weights t are rounded to it once, here
        key = (v._version, fi._version, v.dtype, dtype) if keep else None
        last = self._rows_cache.last
        if keep and last is not None and last[0]() is v and last[1]() is fi and last[2] == key:
            return last[3]
        first, t = ra.knot_rows(self._clip(v), fi, self.embedding.num_embeddings)
        rows = (first, t.to(dtype))
        self._rows_cache.last = (weakref.ref(v), weakref.ref(fi), key, rows) if keep else None
        return rows

    def forward(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The star path (what Opacus wraps)."""
        return self.forward_star(feature_index, values, mask)

    def forward_batch(self, stars: StarBatch, batch: torch.Tensor | None = None, *, chunk: int = 512) -> torch.Tensor:
        """Logits for ``batch`` (default: every patient), with ``similar_to`` if the stars carry neighbours."""
        idx = torch.arange(len(stars)) if batch is None else batch
        return torch.cat([self.forward_neighbourhood(stars, idx[i:i + chunk]) for i in range(0, len(idx), chunk)])
