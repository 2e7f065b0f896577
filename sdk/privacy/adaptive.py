"""Adaptive clipping on the per-patient engine (Andrew, Thakkar, McMahan, Ramaswamy 2021,
"Differentially private learning with adaptive clipping", Algorithm 1 with Theorem 1's noise split).

The clip C follows a target quantile γ of the per-patient gradient norms: each step counts the
patients whose gradient was not clipped, releases that count with Gaussian noise
N(0, σ_b²), and moves C ← C · exp(−η (b̃ − γ)), b̃ = noisy count / expected batch, kept in
[min_clipbound, max_clipbound]. The gradient sum gets noise σ_Δ·C with
σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (Theorem 1), so the pair (gradient, count) costs what one Gaussian
mechanism of multiplier σ costs: the accountant steps with σ, unchanged.

What Opacus's ``AdaClipDPOptimizer`` did, on the engine's clipped sum, with two differences: the
count's noise comes from the CSPRNG (:func:`~.noise.secure_gaussian`, not an OS-seeded Mersenne
Twister), and b̃ divides by the expected batch ⌊q·n⌋ (public) rather than the Poisson batch's
actual size, as in the paper.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from clinograph.core.errors import PrivacyError

from .noise import secure_gaussian
from .per_patient import ClippedSum, PerPatientClipper, dp_sgd_step

#: the paper's and Opacus's defaults, as ``[privacy]`` has them (max_clipbound: the flat clip C)
ADAPTIVE_DEFAULTS = {"target_unclipped_quantile": 0.5, "clipbound_learning_rate": 0.2, "min_clipbound": 0.01,
                     "unclipped_num_std": 10.0}


class AdaptiveClip:
    """The clip bound of one hospital's run and its update (module docstring).

    Args: noise_multiplier: σ (accounted). clip: the starting C (the maximum by default).
    target_unclipped_quantile: γ. clipbound_learning_rate: η. max_clipbound, min_clipbound: C's
    range. unclipped_num_std: σ_b, the count's noise.

    Raises:
        PrivacyError: σ ≥ 2σ_b (Theorem 1 needs σ < 2σ_b), or min_clipbound ≥ max_clipbound.
    """

    def __init__(self, *, noise_multiplier: float, clip: float, target_unclipped_quantile: float,
                 clipbound_learning_rate: float, max_clipbound: float, min_clipbound: float,
                 unclipped_num_std: float):
        if max_clipbound <= min_clipbound:
            raise PrivacyError(f"[privacy] adaptive clipping: max_clipbound ({max_clipbound:g}) must be above "
                               f"min_clipbound ({min_clipbound:g}). Fix the two in the hospital config.")
        if noise_multiplier >= 2 * unclipped_num_std:
            raise PrivacyError(f"[privacy] adaptive clipping: noise_multiplier ({noise_multiplier:g}) must be below "
                               f"2 × unclipped_num_std ({unclipped_num_std:g}) (Andrew et al. 2021, Theorem 1). "
                               "Raise unclipped_num_std.")
        self.noise_multiplier = float(noise_multiplier)
        self.gamma, self.eta = float(target_unclipped_quantile), float(clipbound_learning_rate)
        self.max_clip, self.min_clip = float(max_clipbound), float(min_clipbound)
        self.count_std = float(unclipped_num_std)
        self.clip = min(max(float(clip), self.min_clip), self.max_clip)
        #: σ_Δ of the gradient sum (Theorem 1)
        self.gradient_multiplier = (self.noise_multiplier ** -2 - (2 * self.count_std) ** -2) ** -0.5 \
            if self.noise_multiplier > 0 else 0.0

    def step(self, clipper: PerPatientClipper, optimizer: torch.optim.Optimizer, inputs: Sequence[Any], *,
             labels: Any, expected_batch: float,
             noise: Callable[[float, torch.Size, torch.dtype], torch.Tensor] | None = None) -> ClippedSum:
        """One DP-SGD step at the current C (:func:`~.per_patient.dp_sgd_step` with σ_Δ), then
        C updated from the noisy unclipped count."""
        clip = self.clip
        out = dp_sgd_step(clipper, optimizer, inputs, labels=labels, noise_multiplier=self.gradient_multiplier,
                          clip_norm=clip, expected_batch=expected_batch, noise=noise)
        unclipped = float(((out.norms + 1e-6) <= clip).sum()) if out.norms.numel() else 0.0
        draw = noise or secure_gaussian
        noisy = unclipped + float(draw(self.count_std, torch.Size([1]), torch.float64)[0])
        frac = noisy / max(float(expected_batch), 1e-12)
        self.clip = min(max(clip * math.exp(-self.eta * (frac - self.gamma)), self.min_clip), self.max_clip)
        return out

    def __repr__(self) -> str:
        return f"AdaptiveClip(clip={self.clip:.4g}, quantile={self.gamma:g}, range=[{self.min_clip:g}, {self.max_clip:g}])"
