"""The compact ciphertext encoding: bit packing and c0 rounding against Python integers."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.hazmat import ckks_compact as C

PRIMES = (1152921504606683137, 1152921504606748673)  # the threshold preset's data primes


@pytest.mark.parametrize("bits", [4, 52, 60, 64])
def test_pack_round_trips_and_takes_bits_over_4_bytes_a_pair(bits):
    rng = np.random.default_rng(bits)
    words = rng.integers(0, 2 ** 63, 1000, dtype=np.uint64) >> np.uint64(64 - bits) if bits < 64 else \
        rng.integers(0, 2 ** 63, 1000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    raw = C.pack_words(words, bits)
    assert len(raw) == 500 * bits // 4
    assert np.array_equal(C.unpack_words(raw, bits, 1000), words)


def test_pack_refuses_words_too_wide_and_unpack_wrong_lengths():
    with pytest.raises(ValueError, match="does not fit in 52 bits"):
        C.pack_words(np.array([1 << 52, 0], dtype=np.uint64), 52)
    with pytest.raises(ValueError, match="expected 130"):
        C.unpack_words(bytes(129), 52, 20)
    with pytest.raises(ValueError, match="multiple of 4"):
        C.pack_words(np.zeros(2, dtype=np.uint64), 50)


def test_rounded_c0_lifts_back_within_the_stated_error():
    """sum_j x_j - lift(sum_j round(x_j)) is small mod Q: |error_j| <= q0/2 + q0*2^(drop-1)."""
    q0, q1 = PRIMES
    big_q, drop, n = q0 * q1, 8, 5
    rng = np.random.default_rng(0)
    xs = [[int(v) for v in rng.integers(0, 2 ** 62, 64)] for _ in range(n)]
    xs = [[(a * 2 ** 58 + a) % big_q for a in x] for x in xs]  # spread over [0, Q)
    highs = [C.round_c0(np.array([[v % q0 for v in x], [v % q1 for v in x]], dtype=np.uint64), PRIMES, drop=drop)
             for x in xs]
    assert all(int(h.max()) < 2 ** (60 - drop) for h in highs)
    lifted = C.lift_c0_sum(highs, PRIMES, drop=drop)
    for k in range(64):
        r0, r1 = int(lifted[0, k]), int(lifted[1, k])
        got = (r0 + q0 * ((r1 - r0) * pow(q0, -1, q1) % q1)) % big_q  # CRT with Python integers
        err = (sum(x[k] for x in xs) - got) % big_q
        err = err - big_q if err > big_q // 2 else err
        assert abs(err) <= n * (q0 // 2 + q0 * 2 ** (drop - 1))
