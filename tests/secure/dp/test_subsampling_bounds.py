"""The subsampled Skellam curve: every bound it takes the min of stays above the exact sampled
Gaussian (Opacus, Mironov et al. 2019), and eq. (J) removes the floor of Zhu & Wang's eq. (Z)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from clinograph.secure.dp import (
    ORDERS,
    SkellamRound,
    calibrate_noise_multiplier,
    epsilon,
    gaussian_rdp,
    sensitivities,
)
from clinograph.secure.dp.skellam import joint_convexity_rdp, subsampled_rdp
from opacus.accountants.analysis import rdp as opacus_rdp

SCALE, DIM = 2.0 ** 24, 64


@pytest.mark.parametrize(("q", "sigma"), [(0.05, 1.0), (0.05, 8.0), (0.2, 3.0), (0.5, 20.0), (0.01, 50.0)])
def test_skellam_round_never_below_the_exact_sampled_gaussian(q, sigma):
    """σ_int = sqrt(μ)/Δ2 is the Gaussian the Skellam curve tends to; a bound below its exact
    sampled RDP at any order would claim more than the limit mechanism gives (a sign of an
    unsound bound), so ours must sit at or above it at every order."""
    l2, _ = sensitivities(clip=1.0, scale=SCALE, dim=DIM)
    sigma_int = sigma * SCALE / l2
    ours = SkellamRound(q, sigma, 1.0, SCALE, DIM).rdp()
    exact = np.asarray(opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma_int, steps=1, orders=list(ORDERS)))
    assert np.all(ours >= exact * (1 - 1e-9))


@pytest.mark.parametrize(("q", "sigma"), [(0.05, 2.0), (0.2, 10.0), (0.5, 30.0)])
def test_joint_convexity_bound_is_above_the_exact_sampled_gaussian(q, sigma):
    """Eq. (J) alone, on the Gaussian's curve, must upper-bound the exact sampled Gaussian."""
    exact = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(ORDERS))
    for a, e in zip(ORDERS, exact, strict=True):
        assert joint_convexity_rdp(a, q=q, eps=gaussian_rdp(a, noise_multiplier=sigma)) >= e * (1 - 1e-9)


def test_joint_convexity_removes_the_floor_of_the_general_bound():
    """As σ grows, (Z) tends to log(1 + 2·P[Bin(α, q) >= 3])/(α − 1) > 0; the min tends to 0."""
    q, a = 0.05, 32
    p_ge3 = 1 - sum(math.comb(a, k) * q ** k * (1 - q) ** (a - k) for k in range(3))
    floor = math.log1p(2 * p_ge3) / (a - 1)
    base = [0.0, 0.0] + [gaussian_rdp(k, noise_multiplier=1e4) for k in range(2, a + 1)]
    lq, l1q = math.log(q), math.log1p(-q)
    terms = [(a - 1) * l1q + math.log(a * q - q + 1), math.log(math.comb(a, 2)) + 2 * lq + (a - 2) * l1q + base[2]]
    terms += [math.log(3 * math.comb(a, j)) + j * lq + (a - j) * l1q + (j - 1) * base[j] for j in range(3, a + 1)]
    general = math.log(sum(math.exp(t) for t in terms)) / (a - 1)
    assert general == pytest.approx(floor, rel=1e-3)
    assert subsampled_rdp(a, q=q, base=base) < floor / 1000


@pytest.mark.parametrize("target", [1.0, 3.0])
def test_full_batch_distributed_noise_is_the_central_gaussians(target):
    """At q = 1 (the distributed-DP operating point) the calibrated σ is the Gaussian's within 1%."""
    from opacus.accountants.utils import get_noise_multiplier

    ours = calibrate_noise_multiplier(target_epsilon=target, delta=1e-5, rounds=30, sample_rate=1.0, clip=1.0,
                                      scale=13421.0, dim=1000)
    gauss = get_noise_multiplier(target_epsilon=target, target_delta=1e-5, sample_rate=1.0, steps=30,
                                 accountant="rdp", epsilon_tolerance=0.01)
    assert gauss <= ours <= 1.01 * gauss
    assert epsilon([(SkellamRound(1.0, ours, 1.0, 13421.0, 1000), 30)], delta=1e-5) <= target
