"""Output heads of NS-FL: the binary head (NS-FL eq. 4) and the discrete-time survival head.

The survival head (``[target] kind = "survival"``) gives K hazard logits, one per interval of
``[target] breaks``: z_ik = β_k + r_i, with r_i the NS-FL logit of eq. 4 (GNN head plus the
linear path) read as a risk score and β_k a per-interval baseline (the module
``head/hazard_baseline``, shared unless listed under ``[personal] modules`` -- personal gives
a stratified model: one baseline hazard a hospital, one shared risk score). This is the
proportional-odds variant of Gensheimer & Narasimhan (2019, nnet-survival, §2.3): one risk
score a patient, so the ranking of patients is the same at every horizon (the C-index and the
horizon AUROC score the same order), and only K parameters more than the binary model --
which matters on tables of 50-250 patients a hospital. The likelihood is in
:mod:`clinograph.sdk.training.survival`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import HospitalConfig, NSFLConfig
from ..graph.star import StarBatch
from .nsfl import NSFLModel


class HazardBaseline(nn.Module):
    """β_k, k = 1..K, initialised to logit(1/(K+1)) -- an event spread evenly over K+1
    intervals (a public prior, no data)."""

    def __init__(self, k: int):
        super().__init__()
        self.bias = nn.Parameter(torch.full((k,), math.log(1.0 / k)))

    def forward(self, risk: torch.Tensor) -> torch.Tensor:
        """[B] -> [B, K]."""
        return risk.unsqueeze(-1) + self.bias


class SurvivalNSFLModel(NSFLModel):
    """NS-FL with the survival head: ``forward_batch`` and ``forward_star`` give [B, K] hazard
    logits; :meth:`risk_score` the scalar r_i."""

    def __init__(self, n_features: int, config: NSFLConfig | None = None, *, intervals: int):
        super().__init__(n_features, config)
        if intervals < 1:
            raise ValueError(f"intervals must be ≥ 1, got {intervals}")
        self.hazard_baseline = HazardBaseline(intervals)

    def risk_score(self, stars: StarBatch, batch: torch.Tensor | None = None) -> torch.Tensor:
        """r_i for ``batch`` (default all patients). Shapes: -> [b]."""
        return super().forward_batch(stars, batch)

    def forward_batch(self, stars: StarBatch, batch: torch.Tensor | None = None, *, chunk: int = 512) -> torch.Tensor:
        """Hazard logits. Shapes: -> [b, K]."""
        return self.hazard_baseline(super().forward_batch(stars, batch, chunk=chunk))

    def forward_neighbourhood(self, stars: StarBatch, batch: torch.Tensor) -> torch.Tensor:
        """The risk score r_i (the base model's logit; :meth:`forward_star` adds the baseline)."""
        if stars.neighbours is None:
            return NSFLModel.forward_star(self, stars.feature_index[batch], stars.values[batch], stars.mask[batch])
        return super().forward_neighbourhood(stars, batch)

    def forward_star(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Hazard logits from padded stars. Shapes: [B, Kf] x3 -> [B, K]."""
        return self.hazard_baseline(super().forward_star(feature_index, values, mask))


def nsfl_model(n_features: int, config: HospitalConfig) -> NSFLModel:
    """The NS-FL model ``config`` asks for: binary head, or the survival head over ``[target] breaks``."""
    if config.target.kind == "survival":
        return SurvivalNSFLModel(n_features, config.model, intervals=config.target.outputs)
    return NSFLModel(n_features, config.model)
