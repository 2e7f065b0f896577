"""Set-up sums under local DP: the federated histograms and the feature coverage as Gaussian releases (issue 30).

The run's set-up sums (:mod:`clinograph.sdk.federation.setup`) sum, before training, a vector
of counts per hospital: the per-bin counts of every numeric feature (``[scaling] source =
"federated"``) or which features a hospital observes (``[model] features = "shared"``). Exact,
one patient can change them (a feature seen in one patient); under ``[privacy]`` each hospital
releases instead:

1. **Per-patient vectors, clipped.** Patient i's own count vector h_i (its observations' bins;
   or the features it observes) scaled to L2 norm at most 1: h̄_i = h_i · min(1, 1/‖h_i‖₂). Adding
   or removing one patient moves Σ_i h̄_i by at most 1 in L2 (the sensitivity).
2. **Gaussian noise.** Σ_i h̄_i + N(0, σ_set² I) (CSPRNG), one release of the Gaussian
   mechanism at noise multiplier σ_set: RDP α/(2σ_set²), recorded in the hospital's ledger with
   purpose ``setup`` and composed with everything else it spends (refused past the budget
   before anything is computed from the noise).
3. **Post-processing only.** Histogram: negative noisy counts become 0, and the sum goes
   through the secure mode as before; the quantiles come from the summed noisy histogram.
   Coverage: the hospital sends 1 for a feature whose noisy weighted count is at least
   τ = :data:`COVERAGE_THRESHOLD` · σ_set (a feature absent from every patient passes with
   probability 0.13 %), so the sum still counts hospitals.

What it costs: the weights 1/‖h_i‖₂ leave the *shape* of each feature's histogram unchanged
when patients observe the same number of features (quantiles are scale-free), but the noise is
σ_set per bin: with hundreds of patients spread over many bins, the quantiles become noisy, and a
feature seen in fewer than about τ·√(features a patient has) patients counts as unobserved. The
reference ranges (``source = "dictionary"``) cost no ε.
"""

from __future__ import annotations

import math

import numpy as np

from clinograph.core.errors import PrivacyError

from .accountant import PrivacyLedger
from .noise import csprng_normal

PURPOSE = "setup"
#: a feature counts as observed when its noisy weighted count reaches this many σ_set
COVERAGE_THRESHOLD = 3.0


def clipped_sum(patient: np.ndarray, cell: np.ndarray, *, cells: int) -> np.ndarray:
    """Σ_i h̄_i over the per-patient count vectors given as (patient, cell) observation pairs:
    patient i's vector counts its pairs per cell and is scaled to L2 norm ≤ 1."""
    patient = np.asarray(patient, dtype=np.int64)
    cell = np.asarray(cell, dtype=np.int64)
    out = np.zeros(cells)
    if patient.size == 0:
        return out
    pairs, counts = np.unique(np.stack([patient, cell]), axis=1, return_counts=True)
    _, inverse = np.unique(pairs[0], return_inverse=True)
    norm2 = np.bincount(inverse, weights=counts.astype(np.float64) ** 2)
    weight = np.minimum(1.0, 1.0 / np.sqrt(norm2))
    np.add.at(out, pairs[1], counts * weight[inverse])
    return out


class SetupRelease:
    """A hospital's DP release of a set-up sum's vector, accounted in its ledger.

    Args:
        ledger: the hospital's :class:`PrivacyLedger`. noise_multiplier: σ_set.
    """

    def __init__(self, ledger: PrivacyLedger, *, noise_multiplier: float):
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise PrivacyError(f"Hospital {ledger.site!r}: a set-up release needs σ_set > 0 (got {noise_multiplier!r}).")
        self.ledger, self.noise_multiplier = ledger, float(noise_multiplier)

    def release(self, clipped: np.ndarray, *, round_: int) -> np.ndarray:
        """Σ_i h̄_i + N(0, σ_set²) per coordinate, recorded as one release of round ``round_``."""
        self.ledger.check_release(round_=round_, noise_multiplier=self.noise_multiplier, purpose=PURPOSE)
        vec = np.asarray(clipped, dtype=np.float64)
        noisy = vec + self.noise_multiplier * csprng_normal(vec.size).reshape(vec.shape)
        self.ledger.commit_release(round_=round_, noise_multiplier=self.noise_multiplier, purpose=PURPOSE)
        return noisy

    def histogram(self, clipped: np.ndarray, *, round_: int) -> np.ndarray:
        """The noisy histogram, negative counts set to 0 (post-processing)."""
        return np.maximum(self.release(clipped, round_=round_), 0.0)

    def coverage(self, clipped: np.ndarray, *, round_: int) -> np.ndarray:
        """1 where the noisy weighted count reaches τ = COVERAGE_THRESHOLD · σ_set, else 0."""
        return (self.release(clipped, round_=round_) >= COVERAGE_THRESHOLD * self.noise_multiplier).astype(np.float64)

    def __repr__(self) -> str:
        return f"SetupRelease(site={self.ledger.site!r}, sigma_set={self.noise_multiplier:g})"
