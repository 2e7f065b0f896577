"""RDP accountant of the distributed Skellam mechanism with Poisson-sampled patients. Torch-free.

The aggregate mechanism of one distributed-DP round (docs/privacy.md, "Distributed DP"):
every honest hospital Poisson-samples its patients at rate q, clips each sampled patient's
gradient to L2 norm C, scales it by the masked ring's fixed-point scale s and rounds it
randomly to integers; the masked sum of all hospitals' integer vectors carries the Skellam
noise of at least h honest shares, Sk(μ) with μ = (σ·C·s)² per coordinate.

Sensitivity (add/remove one patient), in integer units, deterministically: the patient's
rounded vector differs from its scaled clipped gradient by less than 1 per coordinate, so

    Δ2 <= C·s + sqrt(d),      Δ1 <= min(sqrt(d)·Δ2, Δ2²)                          (S)

(L1 <= sqrt(d)·L2 always; L1 <= L2² for integer vectors). With s ≈ 1.3e4 and d ≈ 1e3 the
rounding costs a factor 1 + sqrt(d)/(C·s) ≈ 1.002 in sensitivity.

RDP of one unsampled release (Agarwal, Kairouz, Liu, NeurIPS 2021, Thm 3.5 / Cor. 3.6;
the same bound as google-research/federated ``distributed_dp``), integer α > 1:

    ε(α) <= α·Δ2²/(2μ) + min( ((2α − 1)·Δ2² + 6·Δ1) / (4μ²),  3·Δ1/(2μ) )        (K)

The first term is the Gaussian mechanism's with σ_int = sqrt(μ); the rest vanishes as μ grows.

Poisson subsampling at rate q (Zhu & Wang, ICML 2019, Thm 6: the general upper bound for any
mechanism with an RDP curve at integer orders), integer α >= 2:

    ε_q(α) <= 1/(α−1) · log( (1−q)^(α−1)·(αq − q + 1) + C(α,2)·q²·(1−q)^(α−2)·e^ε(2)
                               + 3·Σ_{l=3..α} C(α,l)·q^l·(1−q)^(α−l)·e^((l−1)·ε(l)) )  (Z)

Joint convexity (any mechanism, both directions of add/remove): exp((α−1)·D_α(P‖Q)) = Σ q·f(p/q)
with f(t) = t^α (convex for α > 1) is an f-divergence, hence jointly convex in (P, Q) (Csiszár
1967; Liese & Vajda 2006, joint convexity of f-divergences), so for the mixture M = (1−q)·Q + q·P of a Poisson-sampled step

    ε_q(α) <= 1/(α−1) · log(1 − q + q·e^((α−1)·ε(α)))                                     (J)

(the add direction bounds D_α(M‖Q), the remove direction D_α(Q‖M); ε(α) bounds both).
The round's curve is min(ε_q^Z(α), ε_q^J(α), ε(α)): each term is a valid upper bound.

Why this is looser than the sampled Gaussian (issue 14): (Z) carries the factor 3 on every
l >= 3 term, so as the noise grows its right side tends to log(1 + 2·P[Bin(α, q) >= 3])/(α − 1),
not to 0 -- a floor of ~0.01 per round at q = 0.05, α = 32. Over 100 rounds that floor alone
costs ε ≈ 1, which is why ε = 1 at q = 0.05 needed σ ≈ 8.4 (the exact sampled Gaussian of
Mironov, Talwar, Zhang 2019: 2.3). The factor-free formula is proven only for the Gaussian
and Laplace mechanisms (Zhu & Wang 2019, §3; Mironov et al. 2019, Thm 5); nothing proves it
for Skellam, so we do not use it. (J) removes the floor (it tends to q·ε(α)) but amplifies only
to first order in q. Without sampling (q = 1) neither bound is needed and eq. (K) is within
1e-3 of the Gaussian's ε: distributed DP costs what central DP costs at q = 1. Full-batch
rounds (q = 1) are therefore the operating point for distributed DP (docs/privacy.md); at the
demo's sizes they also beat q = 0.05 for central DP (noise on the mean gradient σ/(q·n)).

RDP adds over rounds; (ε, δ) by the conversion Opacus uses
(Balle et al. 2020): ε = min_α [RDP(α) + log((α−1)/α) − (log δ + log α)/(α − 1)].

Only numpy and the standard library: the server (a lean install without scipy or torch)
checks the same numbers the hospitals compute.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: integer Rényi orders (Z needs integers); 2..64 dense, then sparse up to 512
ORDERS: tuple[int, ...] = tuple(range(2, 65)) + (72, 80, 96, 112, 128, 160, 192, 256, 384, 512)


def sensitivities(*, clip: float, scale: float, dim: int) -> tuple[float, float]:
    """(Δ2, Δ1) of one patient's randomly rounded, scaled, clipped gradient, eq. (S)."""
    if not (clip > 0 and scale > 0 and dim >= 1):
        raise ValueError("need clip > 0, scale > 0, dim >= 1")
    l2 = clip * scale + math.sqrt(dim)
    return l2, min(math.sqrt(dim) * l2, l2 * l2)


def skellam_rdp(order: int, *, l2: float, l1: float, mu: float) -> float:
    """RDP at integer ``order`` of adding Sk(μ) per coordinate to an integer sum, eq. (K)."""
    a = float(order)
    return a * l2 * l2 / (2 * mu) + min(((2 * a - 1) * l2 * l2 + 6 * l1) / (4 * mu * mu), 3 * l1 / (2 * mu))


def gaussian_rdp(order: int, *, noise_multiplier: float) -> float:
    """RDP of the unsampled Gaussian mechanism, α/(2σ²) (the limit of eq. (K))."""
    return order / (2 * noise_multiplier ** 2)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def subsampled_rdp(order: int, *, q: float, base: Sequence[float]) -> float:
    """min of Zhu & Wang's upper bound, eq. (Z), and eq. (J). ``base[l]`` is the unsampled RDP at
    order l (l >= 2)."""
    a = int(order)
    if a < 2:
        raise ValueError("order must be an integer >= 2")
    if q >= 1:
        return base[a]
    if q <= 0:
        return 0.0
    lq, l1q = math.log(q), math.log1p(-q)
    terms = [(a - 1) * l1q + math.log(a * q - q + 1),
             _log_comb(a, 2) + 2 * lq + (a - 2) * l1q + base[2]]
    for j in range(3, a + 1):
        terms.append(math.log(3) + _log_comb(a, j) + j * lq + (a - j) * l1q + (j - 1) * base[j])
    t = np.array(terms)
    m = float(t.max())
    return min((m + math.log(float(np.exp(t - m).sum()))) / (a - 1), joint_convexity_rdp(a, q=q, eps=base[a]),
               base[a])


def joint_convexity_rdp(order: int, *, q: float, eps: float) -> float:
    """Eq. (J): log(1 − q + q·e^((α−1)·ε(α)))/(α − 1), valid for any mechanism at rate ``q``."""
    a = int(order)
    x = (a - 1) * eps
    if x > 700:  # log(1 − q + q·e^x) = x + log(q) + log1p((1 − q)·e^−x / q)
        return (x + math.log(q) + math.log1p((1 - q) * math.exp(-x) / q)) / (a - 1)
    return math.log1p(q * math.expm1(x)) / (a - 1)


@dataclass(frozen=True)
class SkellamRound:
    """One round of the aggregate mechanism: Poisson rate q, noise multiplier σ over the honest
    set (μ = (σ·C·s)²), clip C, ring scale s, dimension d (coordinates released)."""

    sample_rate: float
    noise_multiplier: float
    clip: float
    scale: float
    dim: int

    @property
    def honest_variance(self) -> float:
        """μ: the Skellam variance per coordinate that h honest shares add together (integer units)."""
        return (self.noise_multiplier * self.clip * self.scale) ** 2

    def rdp(self, orders: Sequence[int] = ORDERS) -> np.ndarray:
        """RDP of one such round at ``orders``."""
        return _round_rdp(self.sample_rate, self.noise_multiplier, self.clip, self.scale, self.dim, tuple(orders))


@lru_cache(maxsize=512)
def _round_rdp(q: float, sigma: float, clip: float, scale: float, dim: int, orders: tuple[int, ...]) -> np.ndarray:
    if sigma <= 0:
        return np.full(len(orders), np.inf)
    l2, l1 = sensitivities(clip=clip, scale=scale, dim=dim)
    mu = (sigma * clip * scale) ** 2
    top = max(orders)
    base = [0.0, 0.0] + [skellam_rdp(a, l2=l2, l1=l1, mu=mu) for a in range(2, top + 1)]
    out = np.array([subsampled_rdp(a, q=q, base=base) for a in orders])
    out.setflags(write=False)
    return out


def rdp_to_epsilon(rdp: np.ndarray, *, delta: float, orders: Sequence[int] = ORDERS) -> float:
    """(ε at δ) from an RDP curve, the conversion Opacus uses (Balle et al. 2020)."""
    a = np.asarray(orders, dtype=np.float64)
    eps = np.asarray(rdp) + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return float(max(np.nanmin(eps), 0.0))


def epsilon(rounds: Iterable[tuple[SkellamRound, int]], *, delta: float, orders: Sequence[int] = ORDERS) -> float:
    """ε at δ after the composition of ``(round, times)`` pairs (RDP adds)."""
    total = np.zeros(len(orders))
    any_round = False
    for r, times in rounds:
        if times > 0:
            total = total + times * r.rdp(orders)
            any_round = True
    return rdp_to_epsilon(total, delta=delta, orders=orders) if any_round else 0.0


def calibrate_noise_multiplier(*, target_epsilon: float, delta: float, rounds: int, sample_rate: float, clip: float,
                               scale: float, dim: int, tolerance: float = 0.01) -> float:
    """The smallest σ (to ``tolerance`` in ε) whose ``rounds`` rounds give ε <= ``target_epsilon``.

    Raises:
        ValueError: not reachable with σ <= 1000.
    """
    def eps(sigma: float) -> float:
        return epsilon([(SkellamRound(sample_rate, sigma, clip, scale, dim), rounds)], delta=delta)

    lo, hi = 0.0, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, 2 * hi
        if hi > 1000:
            raise ValueError(f"ε = {target_epsilon} over {rounds} rounds at q = {sample_rate} needs σ > 1000")
    while True:
        mid = (lo + hi) / 2
        e = eps(mid)
        if e > target_epsilon:
            lo = mid
        else:
            hi = mid
            if target_epsilon - e <= tolerance:
                return hi
        if hi - lo < 1e-6:
            return hi
