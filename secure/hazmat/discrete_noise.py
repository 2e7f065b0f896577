"""Integer noise and coin flips from a cryptographic source, for distributed DP (hazmat).

Every draw starts from a fresh 32-byte key from ``os.urandom`` expanded by the ChaCha20
keystream (``cryptography``) into 53-bit uniforms; numpy's RNG is never used (house style 13).
:class:`CsprngUniform` is the only source; tests may pass a fixed key (``_key``) to get
reproducible streams, never a global seed.

- :func:`bernoulli`: ``U < p`` elementwise, drawing U's bits lazily (Poisson sampling of
  patients, randomised rounding).
- :func:`poisson`: exact-in-distribution Poisson samplers up to float64 arithmetic: Knuth's
  product method for λ < 10, Hörmann's PTRS transformed rejection (Hörmann 1993, the
  algorithm numpy uses) for λ >= 10, vectorised (rejected draws are redrawn).
- :func:`skellam`: the symmetric Skellam Sk(μ) = Pois(μ/2) − Pois(μ/2), variance μ, integer
  valued; a sum of independent Sk(μ_i) is Sk(Σ μ_i) (Agarwal, Kairouz, Liu 2021, sec. 3), which
  is what lets n hospitals each add a share of the noise.

What it is not: a constant-time sampler, nor one free of floating point (PTRS compares
float64 logs; at λ = 1e8 their absolute error is ~1e-7, far below the acceptance margin).
The distribution is exact up to that arithmetic; the floating-point attacks on Gaussian
samplers (Mironov 2012) target real-valued outputs and low-order bits, and the outputs here
are integers.
"""

from __future__ import annotations

import math
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

_TWO53 = 2.0 ** -53


class CsprngUniform:
    """A stream of uniforms in [0, 1) (53 bits each) from ChaCha20 under a one-use random key."""

    def __init__(self, *, _key: bytes | None = None):
        key = os.urandom(32) if _key is None else _key
        if len(key) != 32:
            raise ValueError("key must be 32 bytes")
        self._enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()

    def raw(self, n: int) -> bytes:
        """The next ``n`` bytes of the keystream."""
        if n < 0:
            raise ValueError("n must be >= 0")
        return self._enc.update(bytes(n))

    def uniform(self, n: int) -> np.ndarray:
        """``n`` float64 uniforms in [0, 1)."""
        if n < 0:
            raise ValueError("n must be >= 0")
        words = np.frombuffer(self._enc.update(bytes(8 * n)), dtype="<u8") >> np.uint64(11)
        return words.astype(np.float64) * _TWO53


#: a coin's uniform is k / 2^53 with k = k_hi·2^45 + k_lo: its top byte is drawn first and settles
#: the coin unless it ties the threshold's top byte (probability 2^-8); only then are the low 45 bits drawn
_LOW_BITS = 45


def bernoulli(p: np.ndarray | float, n: int | None = None, *, source: CsprngUniform | None = None) -> np.ndarray:
    """Boolean array: True with probability ``p`` (elementwise; ``n`` draws if ``p`` is a scalar).

    Exactly ``U < p`` for U = k / 2^53, k uniform on [0, 2^53) -- i.e. ``k < T`` with
    T = ceil(p·2^53) (exact in float64: a power-of-two scaling) -- but k is drawn lazily: its top
    8 bits decide the coin unless they equal T's top 8 bits, and only those ties (probability
    2^-8 a coin) draw the low 45 bits. Same distribution as drawing all 53 bits, about 1/8 of the
    keystream (randomised rounding flips one coin a patient and coordinate). NaN or p <= 0 is
    False, p >= 1 is True.
    """
    src = source or CsprngUniform()
    pa = np.asarray(p, dtype=np.float64)
    size = int(n) if pa.ndim == 0 and n is not None else pa.size
    shape = pa.shape if pa.ndim else (size,)
    # T and its top byte as float64: exact (integers below 2^54, power-of-two scalings); NaN
    # compares False everywhere, p <= 0 gives T_hi <= 0 (never True), p >= 1 gives T_hi >= 256
    t = np.ceil(np.broadcast_to(pa, shape).reshape(-1) * 2.0 ** 53)
    t_hi = np.floor(t * 2.0 ** -_LOW_BITS)
    k_hi = np.frombuffer(src.raw(size), dtype=np.uint8)
    out = k_hi < t_hi
    tie = np.flatnonzero(k_hi == t_hi)
    if tie.size:
        k_lo = np.frombuffer(src.raw(8 * tie.size), dtype="<u8") >> np.uint64(64 - _LOW_BITS)
        out[tie] = k_lo.astype(np.float64) < t[tie] - t_hi[tie] * 2.0 ** _LOW_BITS
    return out.reshape(shape)


def _poisson_small(lam: float, n: int, src: CsprngUniform) -> np.ndarray:
    """Knuth: the number of uniforms whose running product stays above e^-λ (λ < 10)."""
    limit = math.exp(-lam)
    out = np.zeros(n, dtype=np.int64)
    prod = np.ones(n)
    live = np.arange(n)
    while live.size:
        prod[live] *= src.uniform(live.size)
        more = prod[live] > limit
        out[live[more]] += 1
        live = live[more]
    return out


def _log_factorial(k: np.ndarray) -> np.ndarray:
    return np.array([math.lgamma(float(x) + 1.0) for x in k.reshape(-1)]).reshape(k.shape)


def _poisson_ptrs(lam: float, n: int, src: CsprngUniform) -> np.ndarray:
    """Hörmann (1993) PTRS for λ >= 10, vectorised over ``n`` draws."""
    slam, loglam = math.sqrt(lam), math.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    invalpha = 1.1239 + 1.1328 / (b - 3.4)
    vr = 0.9277 - 3.6224 / (b - 2)
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        m = todo.size
        u = src.uniform(m) - 0.5
        v = src.uniform(m)
        us = 0.5 - np.abs(u)
        k = np.floor((2 * a / np.maximum(us, 1e-300) + b) * u + lam + 0.43)
        fast = (us >= 0.07) & (v <= vr)
        ok = fast.copy()
        slow = ~fast & ~((k < 0) | ((us < 0.013) & (v > us)))
        if slow.any():
            ks, vs, uss = k[slow], v[slow], us[slow]
            lhs = np.log(vs) + math.log(invalpha) - np.log(a / (uss * uss) + b)
            rhs = -lam + ks * loglam - _log_factorial(ks)
            ok[np.flatnonzero(slow)[lhs <= rhs]] = True
        out[todo[ok]] = k[ok].astype(np.int64)
        todo = todo[~ok]
    return out


def poisson(lam: float, n: int, *, source: CsprngUniform | None = None) -> np.ndarray:
    """``n`` independent Poisson(λ) integers (int64). λ = 0 gives zeros."""
    if not (math.isfinite(lam) and lam >= 0) or lam > 2.0 ** 50:
        raise ValueError("lam must be finite, >= 0 and <= 2^50")
    src = source or CsprngUniform()
    if lam == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    return _poisson_small(lam, n, src) if lam < 10 else _poisson_ptrs(lam, n, src)


def skellam(variance: float, n: int, *, source: CsprngUniform | None = None) -> np.ndarray:
    """``n`` symmetric Skellam integers of the given variance: Pois(v/2) − Pois(v/2) (int64)."""
    src = source or CsprngUniform()
    half = float(variance) / 2.0
    return poisson(half, n, source=src) - poisson(half, n, source=src)
