"""Coins from the CSPRNG (secure/hazmat/discrete_noise.py): ``bernoulli`` draws U's 53 bits lazily
(top byte first, the low 45 bits only on a tie) and must stay exactly ``U < p``."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.hazmat.discrete_noise import CsprngUniform, bernoulli


class _Counting(CsprngUniform):
    def __init__(self):
        super().__init__(_key=bytes(range(32)))
        self.used = 0

    def raw(self, n: int) -> bytes:
        self.used += n
        return super().raw(n)


def test_edge_probabilities_are_exact():
    src = CsprngUniform(_key=b"e" * 32)
    assert not bernoulli(0.0, 10_000, source=src).any()
    assert bernoulli(1.0, 10_000, source=src).all()
    assert bernoulli(7.0, 100, source=src).all() and not bernoulli(-3.0, 100, source=src).any()
    assert not bernoulli(np.array([np.nan] * 100), source=src).any()
    assert not bernoulli(2.0 ** -53, 100_000, source=src).any()  # True only for k = 0: probability 2^-53
    assert bernoulli(1.0 - 2.0 ** -53, 100_000, source=src).all()


@pytest.mark.parametrize("top", [0, 128, 255])
def test_a_threshold_whose_top_byte_ties_one_coin_in_256_keeps_its_probability(top):
    """p = (top + 1/2)/256: every tie (k_hi == top) must be settled by the low bits, half of them
    True. Treating ties as all-False (or all-True) moves the frequency by 1/512 = 0.00195, about
    7 standard errors at 4 million coins."""
    p = (top + 0.5) / 256
    n = 4_000_000
    got = bernoulli(p, n, source=CsprngUniform(_key=bytes([top]) * 32)).mean()
    assert abs(got - p) < 4.5 * np.sqrt(p * (1 - p) / n)


def test_elementwise_probabilities_and_shape():
    rng = np.random.default_rng(0)  # test inputs, not secrets
    p = rng.uniform(size=(400, 50))
    draws = np.stack([bernoulli(p, source=CsprngUniform(_key=bytes([i]) * 32)) for i in range(40)])
    assert draws.shape == (40, 400, 50) and draws.dtype == bool
    z = (draws.mean(0) - p) / np.sqrt(np.maximum(p * (1 - p), 1e-12) / 40)
    assert np.abs(z.mean()) < 0.05 and 0.9 < z.std() < 1.1  # unbiased, binomial spread


def test_about_one_keystream_byte_a_coin():
    src = _Counting()
    bernoulli(np.full(100_000, 0.3), source=src)
    assert 100_000 <= src.used < 100_000 * 1.1  # 53 bits a coin would be 800 000 bytes
