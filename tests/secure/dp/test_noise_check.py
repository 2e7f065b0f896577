"""The server's one-sided noise test on distributed-DP aggregates (secure/dp/noise_check.py):
honest rounds never fail it whatever the signal; rounds with missing or shrunken shares do."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.dp.noise_check import ALPHA, check_noise, threshold_ratio
from clinograph.secure.hazmat.discrete_noise import CsprngUniform, skellam
from hypothesis import given, settings
from hypothesis import strategies as st

DIM, SHARE = 4000, 2.5e5  # μ/h in integer units (σ·C·s ≈ 700 at h = 2)


def _aggregate(signal: np.ndarray, shares: list[float], src: CsprngUniform) -> np.ndarray:
    noise = sum((skellam(v, DIM, source=src) if v > 0 else np.zeros(DIM, dtype=np.int64)) for v in shares)
    return signal + noise


def test_honest_rounds_pass_for_every_signal_we_try():
    src = CsprngUniform()
    rng = np.random.default_rng(0)
    signals = [np.zeros(DIM), rng.integers(-3000, 3000, DIM), np.full(DIM, 10**6),
               -np.sign(rng.standard_normal(DIM)) * 2000]  # a large constant, an adversarially signed one
    for signal in signals:
        for _ in range(25):
            found = check_noise([_aggregate(signal.astype(np.int64), [SHARE] * 3, src)], dim=DIM, contributors=3,
                                share_variance=SHARE)
            assert found.passed, (found.energy_ratio, found.threshold_ratio)


def test_the_honest_ratio_is_near_one_without_signal():
    src = CsprngUniform()
    ratios = [check_noise([_aggregate(np.zeros(DIM, dtype=np.int64), [SHARE] * 3, src)], dim=DIM, contributors=3,
                          share_variance=SHARE).energy_ratio for _ in range(20)]
    assert abs(np.mean(ratios) - 1.0) < 0.02  # sd of one ratio ≈ sqrt(2/d) ≈ 0.022


def test_shares_a_million_times_too_small_fail():
    src = CsprngUniform()
    found = check_noise([_aggregate(np.zeros(DIM, dtype=np.int64), [SHARE * 1e-6] * 3, src)], dim=DIM,
                        contributors=3, share_variance=SHARE)
    assert not found.passed and found.energy_ratio < 1e-5


def test_one_of_three_hospitals_skipping_its_share_fails_when_the_signal_is_small():
    # 2/3 of the declared energy; the threshold at d = 4000 is 1 - sqrt(6·ln(2^40)/4000) ≈ 0.80
    src = CsprngUniform()
    assert threshold_ratio(dim=DIM, variance=3 * SHARE) == pytest.approx(1 - np.sqrt(2 * (3 + 1 / (3 * SHARE)) * 40 * np.log(2) / DIM), rel=1e-9)
    for _ in range(10):
        found = check_noise([_aggregate(np.zeros(DIM, dtype=np.int64), [SHARE, SHARE, 0.0], src)], dim=DIM,
                            contributors=3, share_variance=SHARE)
        assert not found.passed


def test_a_large_signal_can_hide_a_missing_share():
    # What the test cannot see (SECURITY.md): the signal's own energy adds to the statistic.
    src = CsprngUniform()
    big = np.full(DIM, int(np.sqrt(SHARE)), dtype=np.int64)  # ||x||² = d·μ/h: one share's worth
    found = check_noise([_aggregate(big, [SHARE, SHARE, 0.0], src)], dim=DIM, contributors=3, share_variance=SHARE)
    assert found.passed


def test_modules_are_summed_over_and_coordinates_without_noise_only_add():
    src = CsprngUniform()
    z = _aggregate(np.zeros(DIM, dtype=np.int64), [SHARE] * 2, src)
    one = check_noise([z], dim=DIM, contributors=2, share_variance=SHARE)
    split = check_noise([z[:1000], z[1000:], np.zeros(50)], dim=DIM, contributors=2, share_variance=SHARE)
    assert split.energy_ratio == pytest.approx(one.energy_ratio) and split.passed == one.passed


@settings(max_examples=40, deadline=None)
@given(dim=st.integers(1, 10**6), variance=st.floats(1e-3, 1e12))
def test_the_threshold_is_below_one_and_rises_with_the_dimension(dim, variance):
    r = threshold_ratio(dim=dim, variance=variance)
    assert r < 1 and threshold_ratio(dim=dim * 4, variance=variance) > r


def test_too_few_coordinates_can_never_fail():
    assert threshold_ratio(dim=50, variance=1e6) < 0  # 6·ln(2^40)/50 > 1: no aggregate is below it
    assert ALPHA == 2.0 ** -40
