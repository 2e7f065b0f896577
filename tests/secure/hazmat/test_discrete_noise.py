"""Coins from the CSPRNG (secure/hazmat/discrete_noise.py): ``bernoulli`` draws U's 53 bits lazily
(top byte first, the low 45 bits only on a tie) and must stay exactly ``U < p``."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.hazmat.discrete_noise import CsprngUniform, RoundedRowSums, bernoulli


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


def test_raw_into_is_the_keystream_raw_gives():
    a, b = CsprngUniform(_key=b"k" * 32), CsprngUniform(_key=b"k" * 32)
    buf = np.empty((3, 70), np.uint8)
    assert a.raw_into(buf).tobytes() == b.raw(210) and a.raw(5) == b.raw(5)
    with pytest.raises(ValueError, match="uint8"):
        a.raw_into(np.empty(4))


def _reference_row_sums(x: np.ndarray, src: CsprngUniform) -> np.ndarray:
    """floor(x) + bernoulli(x − floor(x)): the rounding as distributed DP defined it, summed over rows."""
    lo = np.floor(x)
    return (lo + bernoulli(x - lo, source=src)).astype(np.int64).sum(axis=0)


@pytest.mark.parametrize("magnitude", [1.0, 3.0e4, 3.0e15])  # 3e15 x 4 rows > 2^52: the int64 sum
def test_rounded_row_sums_are_bernoulli_rounding_integer_for_integer(magnitude):
    """RoundedRowSums (in place, preallocated) must give the integers the bernoulli rounding gives
    on the same key and leave the keystream where it leaves it: same coins, same distribution
    (tests/sdk/privacy/test_distributed_dp.py tests that rounding's bias). Values include exact
    integers, fractions k/256 (top bytes that tie), x just below an integer (frac = 1 - 2^-53),
    x = -1e-20 (frac rounds to 1.0: T's top byte 256) and 1e-20."""
    rng = np.random.default_rng(4)  # test inputs, not secrets
    x = rng.normal(size=(4, 3000)) * magnitude
    x[:, :256] = np.arange(256) / 256 + np.floor(x[:, :256])
    x[:, 256:260] = [[3.0, 1 - 2.0 ** -53, -1e-20, 1e-20]] * 4
    rounder = RoundedRowSums(8, 3000)
    for key in (bytes(32), b"\x07" * 32):
        ref, new = CsprngUniform(_key=key), CsprngUniform(_key=key)
        want = _reference_row_sums(x, ref)
        got = rounder(x.copy(), source=new)
        assert got.dtype == np.int64 and np.array_equal(got, want)
        assert new.raw(16) == ref.raw(16)  # the same bytes drawn, ties included
    part = x[:3].copy()  # a shorter block than the buffers
    assert np.array_equal(rounder(part, source=CsprngUniform(_key=bytes(32))),
                          _reference_row_sums(x[:3], CsprngUniform(_key=bytes(32))))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rounded_row_sums_refuse_a_non_finite_value(bad):
    x = np.ones((2, 5))
    x[1, 3] = bad
    with pytest.raises(ValueError, match="finite"):
        RoundedRowSums(2, 5)(x, source=CsprngUniform(_key=bytes(32)))


def test_a_forked_process_draws_other_bytes_than_its_parent():
    """A fork copies the ChaCha20 state: before, parent and child drew the same bytes from one stream
    (the same DP noise, the same Poisson coins). Now the child rekeys from os.urandom; the parent's
    stream goes on as if there had been no fork."""
    import os

    key = bytes(range(32))
    src = CsprngUniform(_key=key)
    src.raw(8)  # a stream in use before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: draw from the inherited stream, report, leave without running pytest's exit code
        try:
            os.write(write, src.raw(32) + src.uniform(2).tobytes())
        finally:
            os._exit(0)
    os.close(write)
    child = b""
    while chunk := os.read(read, 64):
        child += chunk
    os.close(read)
    os.waitpid(pid, 0)
    parent = src.raw(32) + src.uniform(2).tobytes()
    expected = CsprngUniform(_key=key)
    expected.raw(8)
    assert parent == expected.raw(32) + expected.uniform(2).tobytes()  # the parent is not rekeyed
    assert len(child) == len(parent) == 48 and child != parent
