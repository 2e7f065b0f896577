"""The alignment augmentation layer (AGAT eqs. 3-4).

AGAT eq. (3): a client k that observes m of the n features draws the n − m it lacks from a
normal distribution, S_new ~ N(μ_(k), σ²_(k)); eq. (4) concatenates them with its own
features into the n-dimensional view F_new = S_new || F the global model expects.

The paper leaves open which Gaussian fills which feature. Here (documented in docs/agat.md)
there is one Gaussian per dictionary feature f, (μ_f, log σ_f) in public-range standardised
units, and it is a *shared module* ``augmentation/<f>``:

- a hospital that observes f estimates (μ_f, σ_f) on its own training patients -- its
  per-client Gaussian N(μ_(k),f, σ²_(k),f) of eq. (3) -- and that estimate is its local value
  of the module, so its update is Δ = θ_global − estimate and the secure mode sums the
  estimates of the hospitals that observe f (the server never sees one hospital's);
- a hospital that lacks f draws its patients' values of f from the global Gaussian and never
  touches ``augmentation/<f>``: nothing is sent for it (module-wise, like NS-FL's embeddings).

The draws are reparameterised, S = μ + σ·z with z fixed per hospital (seeded), so a patient's
augmented vector changes only when the Gaussian does, and the kNN graph over it is stable
within a round. The layer has no gradient: μ and σ are estimated, never trained.

A categorical feature's levels are one-hot (:func:`one_hot_levels`): a recorded level makes the
others 0, so only a patient with the whole feature unrecorded draws its levels.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..ontology.dictionary import FeatureDictionary, FeatureKind


def level_groups(dictionary: FeatureDictionary) -> list[np.ndarray]:
    """The node columns of every categorical feature (one group a feature, its levels in order)."""
    index = dictionary.node_index()
    return [np.array([index[nid] for nid in f.node_ids()], dtype=np.int64)
            for f in dictionary.features if f.kind == FeatureKind.CATEGORICAL]


def one_hot_levels(values: np.ndarray, observed: np.ndarray, groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A categorical feature's level nodes are one-hot: a patient with one level recorded has the
    other levels *absent* (0, observed), not missing. Only a patient with no level of the feature
    recorded keeps its levels missing (drawn by eq. 3). Without this the absent levels would be
    drawn from the levels' Gaussians, whose observed values are all 1 (μ = 1, σ at its floor):
    every patient would carry every level and the feature would carry nothing.

    Shapes:
        values, observed: [N, n] (values NaN where missing) -> the same, completed
    """
    v, o = values.copy(), observed.copy()
    for g in groups:
        recorded = observed[:, g].any(axis=1, keepdims=True)
        v[:, g] = np.where(recorded & ~observed[:, g], 0.0, values[:, g])
        o[:, g] = observed[:, g] | recorded
    return v, o


#: smallest σ an estimate may take (a constant feature would otherwise give log σ = −inf)
MIN_SIGMA = 1e-2
#: fewest observed training values a hospital needs to estimate a feature's Gaussian
MIN_OBSERVED = 2


class AlignmentAugmentation(nn.Module):
    """Per-feature Gaussians (μ_f, log σ_f) that fill missing features (eqs. 3-4).

    Shapes:
        values, observed, z: [N, n] -> augmented: [N, n]
    """

    def __init__(self, n_features: int):
        super().__init__()
        self.n_features = n_features
        #: row f = (μ_f, log σ_f); starts at N(0, 1), the reference range's centre and scale
        self.gaussian = nn.Parameter(torch.zeros(n_features, 2, dtype=torch.float64), requires_grad=False)

    def forward(self, values: torch.Tensor, observed: torch.Tensor, z: torch.Tensor,
                gaussian: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. (4): observed cells as they are, the others drawn from eq. (3) as μ_f + σ_f·z.
        ``gaussian``: the [n, 2] rows (μ_f, log σ_f) to draw from instead of the module's own."""
        g = self.gaussian if gaussian is None else gaussian
        mu, log_sigma = g[:, 0], g[:, 1]
        drawn = mu + torch.exp(log_sigma) * z.to(mu.dtype)
        return torch.where(observed, values.to(mu.dtype), drawn).float()

    @torch.no_grad()
    def estimate(self, values: np.ndarray, observed: np.ndarray, rows: np.ndarray) -> list[int]:
        """Set (μ_f, log σ_f) to this hospital's estimate on patients ``rows`` for every feature it
        observes at least :data:`MIN_OBSERVED` times there; returns those features' indices."""
        out = []
        for f in range(self.n_features):
            seen = observed[rows, f]
            if seen.sum() < MIN_OBSERVED:
                continue
            v = values[rows, f][seen]
            self.gaussian[f, 0] = float(v.mean())
            self.gaussian[f, 1] = float(np.log(max(float(v.std()), MIN_SIGMA)))
            out.append(f)
        return out
