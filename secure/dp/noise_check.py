"""A one-sided test the server runs on every distributed-DP aggregate: is the noise the shares
declared in it? Torch-free; SECURITY.md ("What the aggregate's noise test can and cannot see").

The masked sum of a distributed-DP round, in integer ring units, is ``z = x + n``: ``x`` every
contributor's signal (randomly rounded, scaled, clipped gradients -- or anything a dishonest
hospital sends) and ``n`` the noise shares. If all K contributors added their share Sk(μ/h) on
every coordinate of the modules they sent, ``n`` is, per coordinate, Skellam of variance
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

**The server's numbers, never a hospital's.** d is the number of coordinates of the modules in
the aggregate (the model spec's sizes), K the hospitals whose masked inputs are in the sum (the
protocol's survivors), and μ/h the policy's share variance at the plan's published ``masked.scale``;
nothing a hospital declares about its share (its dimension, scale or variance) enters the test,
so no declaration can blind it (a share declared over one coordinate would make d = 1, where no
aggregate can fail). A model that trains only part of its released modules (``[model] deep =
false``: the wide path; the GNN frozen) still releases, and noises, every module of its spec --
zero-signal coordinates, where the test is strongest -- so d does not shrink with what is trained.
Each module's count slot must say K (:func:`coverage_problem`): every
contributor adds its share to every released coordinate -- a module with fewer shares than the
promise's h would be released under-noised -- and the count slots are the one part of the sum
a hospital writes freely (one that skips its noise and zeroes its count would otherwise lower
the noise the test expects by exactly its missing share). :func:`check_noise` accepts per-module
counts K_m: with V_m = K_m·μ/h the expectation is Σ_m d_m·V_m and
``t = sqrt(2·Σ_m d_m·(3·V_m² + V_m)·ln(1/α))``, the same two steps coordinate by coordinate.

**Power** (:func:`detection_power`; SECURITY.md has the table). Without signal the statistic
is about normal with mean d·V' and variance d·(2V'² + V') when the shares present add V' per
coordinate, so one of K hospitals skipping its share (V' = (K−1)/K·V) is found when
1/K clearly exceeds ``t/(d·V) ≈ sqrt(6·ln(2⁴⁰)/d)``: 41 % of the declared energy at d = 10³
(only K = 2 is caught), 13 % at d = 10⁴ (K <= 7), 4 % at d = 10⁵.

What it cannot see: *which* hospital under-noised (the server sees only the sum); a deficit the
signal's own energy hides (``||x||²`` adds to S; an aligned batch of B clipped gradients can add
up to B²·h/(d·K·σ²) of the declared energy); a deficit below the margin above; noise a
colluder knows (its own share, or shares colluders draw from one seed: they carry the declared
energy and pass, yet protect nobody against the colluders; shares drawn to cancel, n and −n,
are a deficit like a skipped share); and whether ``h`` of the shares are honest (the promise needs only h honest shares of
the K, so a passed test is more than the promise needs only when K = h). It is a check on the
declared total, never a substitute for the trust assumption of docs/privacy.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
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
    return _threshold(((dim, variance),), alpha=alpha)


def _threshold(blocks: Iterable[tuple[int, float]], *, alpha: float) -> float:
    """(E − t)/E over blocks of (coordinates, variance): E = Σ d_m·V_m, t² = 2·Σ d_m·(3V_m² + V_m)·ln(1/α)."""
    blocks = tuple(blocks)
    expected = sum(d * v for d, v in blocks)
    t = math.sqrt(2.0 * sum(d * (3.0 * v * v + v) for d, v in blocks) * math.log(1.0 / alpha))
    return 1.0 - t / expected


def coverage_problem(counts: Mapping[str, int], *, contributors: int) -> str | None:
    """Why the sum's per-module contributor counts break distributed DP (None: every module in
    the sum is counted by all ``contributors``, the hospitals whose inputs are in it)."""
    off = {name: c for name, c in sorted(counts.items()) if c != contributors}
    if not off:
        return None
    shown = ", ".join(f"{n!r}: {c}" for n, c in list(off.items())[:5]) + (" ..." if len(off) > 5 else "")
    return (f"{len(off)} module(s) of the sum are counted by other than the {contributors} hospitals whose inputs are "
            f"in it ({shown}); under distributed DP every contributor adds its noise share to every released "
            "module, so a count slot that says otherwise is a hospital hiding a missing share or releasing a module "
            "under fewer shares than the promise needs")


def check_noise(modules: Iterable[tuple[np.ndarray, int]], *, share_variance: float,
                alpha: float = ALPHA) -> NoiseCheck:
    """The test on an aggregate given as (integer ring units, contributor count) per module.

    Args:
        modules: each released module's masked sum times the ring scale, with its contributor
            count K_m (the sum's own count slot).
        share_variance: μ/h, the policy's Skellam variance per share at the plan's published
            scale (integer units) -- the server's number, never a hospital's declaration.

    Raises:
        ValueError: no module, a module without coordinates or contributors, or μ/h <= 0.
    """
    if not share_variance > 0:
        raise ValueError("share_variance must be > 0")
    energy, blocks, counts = 0.0, [], []
    for values, count in modules:
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size == 0 or count < 1:
            raise ValueError("every module needs coordinates and at least one contributor")
        energy += float(np.dot(v, v))
        blocks.append((int(v.size), count * share_variance))
        counts.append(int(count))
    if not blocks:
        raise ValueError("no module to test")
    expected = sum(d * v for d, v in blocks)
    return NoiseCheck(energy_ratio=energy / expected, threshold_ratio=_threshold(blocks, alpha=alpha),
                      dim=sum(d for d, _ in blocks), contributors=min(counts), share_variance=float(share_variance))


def detection_power(*, dim: int, contributors: int, skipping: int, share_variance: float,
                    signal_ratio: float = 0.0, alpha: float = ALPHA) -> float:
    """P(the test fails) when ``skipping`` of the K ``contributors`` add no share, by the normal
    approximation of S (module docstring, "Power"); ``signal_ratio`` = ||x||²/(d·V), the signal's
    energy relative to the declared noise (0: the best case for the test). With ``skipping`` = 0
    it is the approximate false-alarm rate (the proven bound is α)."""
    if not 0 <= skipping <= contributors or contributors < 1:
        raise ValueError("need 0 <= skipping <= contributors and contributors >= 1")
    declared = contributors * share_variance
    present = (contributors - skipping) * share_variance
    limit = threshold_ratio(dim=dim, variance=declared, alpha=alpha) * dim * declared
    mean = dim * present + signal_ratio * dim * declared
    sd = math.sqrt(dim * (2.0 * present * present + present) + 4.0 * signal_ratio * dim * declared * present)
    if sd == 0:
        return float(mean <= limit)
    return 0.5 * math.erfc((mean - limit) / (sd * math.sqrt(2.0)))
