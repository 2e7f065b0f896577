"""A one-sided test the server runs on every distributed-DP aggregate: is the noise the shares
declared in it? Torch-free; SECURITY.md ("What the aggregate's noise test can and cannot see").

The masked sum of a distributed-DP round, in integer ring units, is ``z = x + n``: ``x`` every
contributor's signal (randomly rounded, scaled, clipped gradients -- or anything a dishonest
hospital sends) and ``n`` the noise shares. If all K contributors added their declared share
Sk(μ/h) on the d declared coordinates, ``n`` is, per coordinate, Skellam of variance
V = K·μ/h (independent Skellams add), independent of ``x``.

The test rejects when ``S = ||z||²`` falls below ``d·V − t``:

1. **Sound for every signal (Anderson's theorem, lattice form).** Skellam is symmetric and
   unimodal on the integers, so for any integer shift ``x_i`` and any interval I centred on 0,
   ``P(n_i + x_i ∈ I) <= P(n_i ∈ I)``. A centred ball is, along every coordinate, a centred
   interval given the other coordinates, so by induction over coordinates
   ``P(||x + n||² <= c) <= P(||n||² <= c)`` for every ``x`` independent of ``n`` (Anderson 1955,
   Thm 1, for symmetric unimodal product measures). The signal can only make a false alarm
   rarer; coordinates without noise only add non-negative terms.
2. **Lower tail of ||n||².** ``n_i²`` are independent and non-negative with mean V and
   ``E[n_i⁴] = 3V² + V`` (Skellam's fourth cumulant equals its variance). For independent
   non-negative Y_i, ``P(ΣY_i <= ΣE[Y_i] − t) <= exp(−t² / (2·ΣE[Y_i²]))`` (Maurer 2003, Thm 1;
   Boucheron, Lugosi, Massart 2013, Exercise 2.9). With ``t = sqrt(2·d·(3V² + V)·ln(1/α))`` the
   false-alarm probability of an honest round is at most α = 2⁻⁴⁰ whatever the signal.

So a failed test proves, except with probability α, that the aggregate carries less noise than
its contributors declared: the round is voided (``round_aborted``) and nothing of it is released.

What it cannot see: *which* hospital under-noised (the server sees only the sum); a deficit the
signal's own energy hides (``||x||²`` adds to S); a deficit smaller than ``t`` -- about
``sqrt(6·ln(1/α)/d)`` of the declared noise energy, 9 % at d = 10⁴, 29 % at d = 10³; and
whether ``h`` of the shares are honest (the promise needs only h honest shares of the K, so a
passed test is more than the promise needs only when K = h). It is a check on the declared
total, never a substitute for the trust assumption of docs/privacy.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

#: false-alarm probability of an honest round
ALPHA = 2.0 ** -40


@dataclass(frozen=True)
class NoiseCheck:
    """The test's numbers, for the audit trail: S/(d·V) and the threshold (d·V − t)/(d·V)."""

    energy_ratio: float
    threshold_ratio: float
    dim: int
    contributors: int
    share_variance: float

    @property
    def passed(self) -> bool:
        return self.energy_ratio > self.threshold_ratio

    def payload(self, round_: int) -> dict[str, float | int | bool]:
        return {"round": int(round_), "passed": self.passed, "energy_ratio": float(self.energy_ratio),
                "threshold_ratio": float(self.threshold_ratio), "dim": int(self.dim),
                "contributors": int(self.contributors), "share_variance": float(self.share_variance),
                "false_alarm_bound": ALPHA}


def threshold_ratio(*, dim: int, variance: float, alpha: float = ALPHA) -> float:
    """(d·V − t)/(d·V) with t from Maurer's bound (module docstring, step 2); may be negative
    (then no aggregate can fail: too few coordinates or too little noise to tell)."""
    if dim < 1 or not variance > 0:
        raise ValueError("need dim >= 1 and variance > 0")
    t = math.sqrt(2.0 * dim * (3.0 * variance * variance + variance) * math.log(1.0 / alpha))
    return 1.0 - t / (dim * variance)


def check_noise(integer_sums: Iterable[np.ndarray], *, dim: int, contributors: int, share_variance: float,
                alpha: float = ALPHA) -> NoiseCheck:
    """The test on an aggregate given as integer ring units (module docstring).

    Args:
        integer_sums: the masked sums of every released module, times the ring scale.
        dim: the noised coordinates every contributor declared (the smallest declared).
        contributors: K, the hospitals whose shares are in the sum (the smallest module count).
        share_variance: μ/h, each share's declared Skellam variance in integer units.
    """
    variance = contributors * share_variance
    energy = float(sum(float(np.dot(v.ravel(), v.ravel())) for v in integer_sums))
    return NoiseCheck(energy_ratio=energy / (dim * variance),
                      threshold_ratio=threshold_ratio(dim=dim, variance=variance, alpha=alpha), dim=int(dim),
                      contributors=int(contributors), share_variance=float(share_variance))
