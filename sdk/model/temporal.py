"""NS-FL over time: the shared GNN on every snapshot's star, then attention over the snapshots.

NS-FL's "Extension to Time-Series Data" gives a sequence of symbolic graphs G_1..G_T; it does
not say how a patient's per-snapshot states are combined. Ours (``[model] temporal =
"attention"``):

1. h_t = the NS-FL patient embedding h_p^(2) of snapshot t's star (eqs. 1-3, the same shared
   GNN, computed for all snapshots in one pass: :meth:`TemporalNSFL.embed_sequence`);
2. additive attention over time (Bahdanau et al. 2015) with a learned embedding P_τ of the
   number of snapshots τ before the prediction time: e_t = v^T tanh(W_a h_t + P_τ(t)),
   α = softmax over the patient's non-empty snapshots, c = Σ_t α_t h_t;
3. z = ReLU(W_now h_T + W_ctx c) and ŷ = σ(W_out z + b + z_lin + z_trend) (eq. 4 on z), where
   z_lin is the static model's wide path on the latest snapshot and z_trend = Σ_f d_f · Δx_f a
   per-feature trend term (Δx_f: the latest standardised value minus the earliest in the
   window), shared per feature like ``linear/<f>`` so Theorem 1 holds for it too.

Why attention and not a GRU: (a) every leaf stays ``nn.Linear``/``nn.Embedding``, so Opacus's
hooks-mode per-sample gradients are exact for the whole sequence -- one patient's sequence is
one DP unit, clipped as a whole (tested against a per-patient loop); ``nn.GRU`` would need
Opacus's DPGRU re-implementation; (b) irregular, hospital-specific sampling: a snapshot with no
relation is masked out instead of being fed as a zero step, and hospitals with 3 or 12
snapshots share one set of weights (positions count back from the prediction time); (c) with
W_now = I and W_ctx = 0, d = 0 at initialisation the model *is* the static NS-FL model on the
latest snapshot (carry-forward makes it the static star), so it starts where the static model
is and learns what time adds.

Modules (:func:`add_temporal_modules`): the NS-FL modules, plus ``temporal/attention``
(P, W_a, v), ``temporal/combine`` (W_now, W_ctx) and ``trend/<f>`` (shared). A hospital with a
single snapshot does not train or send ``temporal/attention`` (its gradient is exactly zero).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from clinograph.core.spec import ModuleKind

from ..config import NSFLConfig
from ..graph.temporal import SnapshotBatch
from .layers import RelationAttention
from .modules import ModuleMap, Piece
from .nsfl import NSFLModel


def dense_any(rel: RelationAttention, h_src: torch.Tensor, h_dst: torch.Tensor, x: torch.Tensor | None,
              mask: torch.Tensor) -> torch.Tensor:
    """:meth:`RelationAttention.dense` over any leading shape.
    Shapes: h_src [..., K, d], h_dst [..., d], x, mask [..., K] -> [..., d]."""
    m = rel.message(h_src, x)
    e = rel.logits(h_dst.unsqueeze(-2).expand_as(m), m)
    e = e.masked_fill(~mask, -1e9)
    alpha = torch.softmax(e, dim=-1)
    alpha = torch.where(mask, alpha, torch.zeros_like(alpha))
    return (alpha.unsqueeze(-1) * m).sum(-2)


class TemporalNSFL(NSFLModel):
    """NS-FL with attention over per-snapshot patient embeddings (module docstring)."""

    def __init__(self, n_features: int, config: NSFLConfig | None = None):
        cfg = config or NSFLConfig(temporal="attention")
        super().__init__(n_features, cfg)
        d, w = cfg.hidden, cfg.temporal_window
        self.window = w
        gen = torch.Generator().manual_seed(cfg.init_seed + 1)
        self.t_position = nn.Embedding(w, d)
        self.t_key = nn.Linear(d, d)
        self.t_score = nn.Linear(d, 1, bias=False)
        self.t_now = nn.Linear(d, d)
        self.t_context = nn.Linear(d, d, bias=False)
        self.trend = nn.Embedding(n_features, 1) if cfg.linear_path and cfg.temporal_trend else None
        with torch.no_grad():
            nn.init.normal_(self.t_position.weight, std=0.1, generator=gen)
            nn.init.xavier_uniform_(self.t_key.weight, generator=gen)
            nn.init.zeros_(self.t_key.bias)
            nn.init.xavier_uniform_(self.t_score.weight, generator=gen)
            self.t_now.weight.copy_(torch.eye(d))
            nn.init.zeros_(self.t_now.bias)
            nn.init.zeros_(self.t_context.weight)
            if self.trend is not None:
                nn.init.zeros_(self.trend.weight)

    def embed_sequence(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """h_p^(2) of every snapshot's star, as :meth:`NSFLModel.embed_star` per snapshot.
        Shapes: [B, T, K] x3 -> [B, T, d]."""
        b, t, _ = feature_index.shape
        values = self._clip(values)
        h_p0 = self.epsilon.expand(b, t, -1)
        h_f0 = self.feature_init(feature_index)
        h_p1 = torch.relu(self.l1_self_patient(h_p0) + dense_any(self.l1_of_patient, h_f0, h_p0, values, mask))
        h_f1 = torch.relu(self.l1_self_feature(h_f0) + self.l1_has_feature.W(h_p0).unsqueeze(-2))
        return torch.relu(self.l2_self_patient(h_p1) + dense_any(self.l2_of_patient, h_f1, h_p1, values, mask))

    def attend(self, h: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(c [B, d], α [B, T]): attention over the non-empty snapshots, positions counted back
        from the latest (τ = 0)."""
        b, t, _ = h.shape
        tau = torch.arange(t - 1, -1, -1).clamp_max(self.window - 1).expand(b, t)
        e = self.t_score(torch.tanh(self.t_key(h) + self.t_position(tau))).squeeze(-1)
        e = e.masked_fill(~present, -1e9)
        alpha = torch.where(present, torch.softmax(e, dim=-1), torch.zeros_like(e))
        return (alpha.unsqueeze(-1) * h).sum(1), alpha

    def trend_star(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """z_trend = Σ_f d_f (x_f,latest − x_f,earliest) over the latest star's features (0
        without a linear path). Shapes: [B, T, K] x3 -> [B]."""
        b, t, _ = feature_index.shape
        if self.trend is None:
            return values.new_zeros(b)
        x = self._clip(values) * mask.to(values.dtype)
        dense = values.new_zeros(b, t, self.n_features).scatter_add(-1, feature_index, x)
        seen = values.new_zeros(b, t, self.n_features).scatter_add(-1, feature_index, mask.to(values.dtype)) > 0
        first = torch.argmax(seen.to(torch.int8), dim=1, keepdim=True)  # earliest snapshot with the feature
        earliest = dense.gather(1, first).squeeze(1)
        fi_last, m_last = feature_index[:, -1], mask[:, -1]
        delta = x[:, -1] - earliest.gather(1, fi_last)
        return (self.trend(fi_last).squeeze(-1) * delta * m_last.to(values.dtype)).sum(-1)

    def forward_sequence(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits from each patient's sequence of stars. Shapes: [B, T, K] x3 -> [B]."""
        h = self.embed_sequence(feature_index, values, mask)
        c, _ = self.attend(h, mask.any(-1))
        z = torch.relu(self.t_now(h[:, -1]) + self.t_context(c))
        last = (feature_index[:, -1], self._clip(values[:, -1]), mask[:, -1])
        return self.head(z).squeeze(-1) + self.linear_star(*last) + self.trend_star(feature_index, values, mask)

    def forward_star(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One snapshot (a static table, or the export path): a sequence of length 1."""
        return self.forward_sequence(feature_index.unsqueeze(1), values.unsqueeze(1), mask.unsqueeze(1))

    def forward(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Sequences [B, T, K] (what Opacus wraps: one example a patient) or stars [B, K]."""
        if feature_index.dim() == 3:
            return self.forward_sequence(feature_index, values, mask)
        return self.forward_star(feature_index, values, mask)

    def forward_batch(self, stars, batch: torch.Tensor | None = None, *, chunk: int = 512) -> torch.Tensor:
        """Logits for ``batch`` of a :class:`SnapshotBatch` (or a StarBatch: one snapshot each)."""
        if not isinstance(stars, SnapshotBatch):
            return super().forward_batch(stars, batch, chunk=chunk)
        idx = torch.arange(len(stars)) if batch is None else batch
        return torch.cat([self.forward_sequence(stars.feature_index[i], stars.values[i], stars.mask[i])
                          for i in (idx[j:j + chunk] for j in range(0, len(idx), chunk))])


def build_nsfl_model(n_features: int, config: NSFLConfig) -> NSFLModel:
    """The NS-FL model ``[model]`` asks for: static, or temporal (``temporal = "attention"``)."""
    return TemporalNSFL(n_features, config) if config.temporal == "attention" else NSFLModel(n_features, config)


TEMPORAL_PREFIXES = ("temporal/", "trend/")


def add_temporal_modules(mm: ModuleMap, model: NSFLModel, node_ids: Sequence[str]) -> ModuleMap:
    """Declare ``temporal/attention``, ``temporal/combine`` and ``trend/<f>`` (shared) on ``mm``
    (unchanged for a static model)."""
    if not isinstance(model, TemporalNSFL):
        return mm
    attention = [model.t_position, model.t_key, model.t_score]
    mm.add("temporal/attention", ModuleKind.SHARED, [Piece(p) for m in attention for _, p in sorted(m.named_parameters())])
    mm.add("temporal/combine", ModuleKind.SHARED,
           [Piece(p) for m in (model.t_now, model.t_context) for _, p in sorted(m.named_parameters())])
    if model.trend is not None:
        for i, nid in enumerate(node_ids):
            mm.add(f"trend/{nid}", ModuleKind.SHARED, [Piece(model.trend.weight, i)])
    return mm


def temporal_task_model(n_features: int, config) -> TemporalNSFL:
    """The temporal model of a hospital's ``config`` (a :class:`~clinograph.sdk.config.HospitalConfig`).

    Raises:
        ConfigError: with the survival head or ``similar_to`` (not built per snapshot).
    """
    from clinograph.core.errors import ConfigError

    if config.model.temporal == "none":
        raise ConfigError("temporal_task_model needs [model] temporal = 'attention'.")
    target = getattr(config, "target", None)
    if target is not None and target.kind != "binary":
        raise ConfigError(f"[model] temporal = {config.model.temporal!r} with [target] kind = {target.kind!r}: the "
                          "temporal model has a binary head only. Use kind = 'binary' or temporal = 'none'.")
    if config.graph.k_similar:
        raise ConfigError(f"[model] temporal = {config.model.temporal!r} with [graph] k_similar = "
                          f"{config.graph.k_similar}: per-snapshot similar_to edges are not built (the temporal "
                          "model runs on each patient's sequence of stars). Set [graph] k_similar = 0.")
    return TemporalNSFL(n_features, config.model)


@torch.no_grad()
def sequence_risk(model: TemporalNSFL, table, *, dictionary, calibration=None) -> np.ndarray:  # noqa: ANN001
    """Risk per patient of ``table`` (``table.patient_ids`` order) from each patient's sequence of
    snapshot stars (the window and carry-forward of ``model.config``), Platt-calibrated when
    ``calibration`` is given -- the temporal counterpart of
    :func:`clinograph.sdk.model.export.star_risk`.

    Raises:
        SchemaError: ``table`` is mapped onto another dictionary than the model's.
    """
    from ..graph.temporal import snapshot_batch
    from .export import _check_dictionary

    _check_dictionary(table, dictionary.digest())
    cfg = model.config
    batch = snapshot_batch(table, window=cfg.temporal_window, carry_forward=cfg.temporal_carry_forward)
    model.eval()
    z = model.forward_batch(batch).double()
    if calibration is not None:
        z = calibration.a * z + calibration.b
    return torch.sigmoid(z).numpy()
