"""The server's one-sided noise test on distributed-DP aggregates (secure/dp/noise_check.py):
honest rounds never fail it whatever the signal; rounds with missing or shrunken shares do."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.dp.noise_check import ALPHA, check_noise, detection_power, threshold_ratio
from clinograph.secure.hazmat.discrete_noise import CsprngUniform, skellam
from hypothesis import given, settings
from hypothesis import strategies as st

DIM, SHARE = 4000, 2.5e5  # μ/h in integer units (σ·C·s ≈ 700 at h = 2)


def _check(z: np.ndarray, contributors: int):
    return check_noise([(z, contributors)], share_variance=SHARE)


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
            found = _check(_aggregate(signal.astype(np.int64), [SHARE] * 3, src), 3)
            assert found.passed, (found.energy_ratio, found.threshold_ratio)


def test_the_honest_ratio_is_near_one_without_signal():
    src = CsprngUniform()
    ratios = [_check(_aggregate(np.zeros(DIM, dtype=np.int64), [SHARE] * 3, src), 3).energy_ratio for _ in range(20)]
    assert abs(np.mean(ratios) - 1.0) < 0.02  # sd of one ratio ≈ sqrt(2/d) ≈ 0.022


def test_shares_a_million_times_too_small_fail():
    src = CsprngUniform()
    found = _check(_aggregate(np.zeros(DIM, dtype=np.int64), [SHARE * 1e-6] * 3, src), 3)
    assert not found.passed and found.energy_ratio < 1e-5


def test_one_of_three_hospitals_skipping_its_share_fails_when_the_signal_is_small():
    # 2/3 of the declared energy; the threshold at d = 4000 is 1 - sqrt(6·ln(2^40)/4000) ≈ 0.80
    src = CsprngUniform()
    assert threshold_ratio(dim=DIM, variance=3 * SHARE) == pytest.approx(1 - np.sqrt(2 * (3 + 1 / (3 * SHARE)) * 40 * np.log(2) / DIM), rel=1e-9)
    for _ in range(10):
        found = _check(_aggregate(np.zeros(DIM, dtype=np.int64), [SHARE, SHARE, 0.0], src), 3)
        assert not found.passed


def test_a_large_signal_can_hide_a_missing_share():
    # What the test cannot see (SECURITY.md): the signal's own energy adds to the statistic.
    src = CsprngUniform()
    big = np.full(DIM, int(np.sqrt(SHARE)), dtype=np.int64)  # ||x||² = d·μ/h: one share's worth
    found = _check(_aggregate(big, [SHARE, SHARE, 0.0], src), 3)
    assert found.passed


def test_modules_are_summed_over():
    src = CsprngUniform()
    z = _aggregate(np.zeros(DIM, dtype=np.int64), [SHARE] * 2, src)
    one = _check(z, 2)
    split = check_noise([(z[:1000], 2), (z[1000:], 2)], share_variance=SHARE)
    assert split.energy_ratio == pytest.approx(one.energy_ratio) and split.passed == one.passed
    assert split.threshold_ratio == pytest.approx(one.threshold_ratio) and split.dim == DIM


def test_each_module_is_held_to_its_own_contributor_count():
    """A module two hospitals sent carries two shares, one all three sent three: the expected
    energy is counted per module (a single count for the whole sum would under- or over-state it)."""
    src = CsprngUniform()
    two = _aggregate(np.zeros(DIM, dtype=np.int64), [SHARE] * 2, src)
    three = _aggregate(np.zeros(DIM, dtype=np.int64), [SHARE] * 3, src)
    found = check_noise([(two, 2), (three, 3)], share_variance=SHARE)
    assert found.passed and abs(found.energy_ratio - 1) < 0.05 and found.contributors == 2
    assert found.dim == 2 * DIM
    # the three-hospital module with one share missing: 5/6 of the declared energy overall,
    # below the threshold at 2·DIM coordinates (1 - sqrt(6·ln(2^40)/8000) ≈ 0.86)
    short = _aggregate(np.zeros(DIM, dtype=np.int64), [SHARE, 0.0, 0.0], src)
    assert not check_noise([(two, 2), (short, 3)], share_variance=SHARE).passed


def test_an_empty_or_countless_module_is_an_error_not_a_pass():
    for bad in ([], [(np.zeros(0), 2)], [(np.ones(5), 0)]):
        with pytest.raises(ValueError):
            check_noise(bad, share_variance=SHARE)


def test_power_matches_a_simulation_where_it_is_neither_0_nor_1():
    """detection_power's normal approximation against simulated rounds (seeded numpy Skellam =
    difference of Poissons; test-only randomness), one of K hospitals skipping its share."""
    rng = np.random.default_rng(7)
    for dim, k, share in ((10_000, 8, 1e6), (1000, 3, 1e6)):
        thr = threshold_ratio(dim=dim, variance=k * share)
        present = (k - 1) * share
        hits = [float(((n := rng.poisson(present / 2, dim) - rng.poisson(present / 2, dim)).astype(float) @ n)
                      / (dim * k * share) <= thr) for _ in range(600)]
        want = detection_power(dim=dim, contributors=k, skipping=1, share_variance=share)
        assert 0.003 < want < 0.6
        assert abs(np.mean(hits) - want) < 4 * np.sqrt(want * (1 - want) / 600) + 0.01, (dim, k)


def test_power_table_of_security_md():
    """The numbers SECURITY.md quotes ("What the aggregate's noise test can and cannot see")."""
    def power(dim, k, skipping=1, signal=0.0):
        return detection_power(dim=dim, contributors=k, skipping=skipping, share_variance=1e8, signal_ratio=signal)

    assert power(1000, 2) > 0.9999 and power(1000, 3) == pytest.approx(0.0062, abs=5e-4) and power(1000, 4) < 1e-5
    assert power(10_000, 6) > 0.999 and power(10_000, 7) == pytest.approx(0.874, abs=0.005)
    assert power(10_000, 8) == pytest.approx(0.374, abs=0.005) and power(10_000, 10) == pytest.approx(0.011, abs=0.002)
    assert power(10_000, 4, signal=0.1) == pytest.approx(0.961, abs=0.005)  # signal worth 10 % of the noise
    assert power(10_000, 4, signal=0.15) < 0.02  # 15 %: one of four is hidden
    assert power(1000, 5, skipping=2) == pytest.approx(0.385, abs=0.005)
    assert power(10_000, 4, skipping=0) < 1e-19 < ALPHA  # honest rounds: the approximate false-alarm rate


@settings(max_examples=40, deadline=None)
@given(dim=st.integers(1, 10**6), variance=st.floats(1e-3, 1e12))
def test_the_threshold_is_below_one_and_rises_with_the_dimension(dim, variance):
    r = threshold_ratio(dim=dim, variance=variance)
    assert r < 1 and threshold_ratio(dim=dim * 4, variance=variance) > r


def test_too_few_coordinates_can_never_fail():
    assert threshold_ratio(dim=50, variance=1e6) < 0  # 6·ln(2^40)/50 > 1: no aggregate is below it
    assert ALPHA == 2.0 ** -40


def test_every_module_must_be_counted_by_every_contributor():
    from clinograph.secure.dp.noise_check import coverage_problem

    assert coverage_problem({"a": 3, "b": 3}, contributors=3) is None
    problem = coverage_problem({"a": 3, "b": 1, "c": 4}, contributors=3)
    assert problem is not None and problem.startswith("2 module(s)") and "'b': 1, 'c': 4" in problem
