"""Integer noise and coin flips from a cryptographic source, for distributed DP (hazmat).

Every draw starts from a fresh 32-byte key from ``os.urandom`` expanded by the ChaCha20
keystream (``cryptography``) into 53-bit uniforms; numpy's RNG is never used (house style 13).
:class:`CsprngUniform` is the only source; tests may pass a fixed key (``_key``) to get
reproducible streams, never a global seed.

- :func:`bernoulli`: ``U < p`` elementwise, drawing U's bits lazily (Poisson sampling of
  patients, randomised rounding).
- :class:`RoundedRowSums`: unbiased randomised rounding of a block of rows, summed over the rows,
  the coins exactly :func:`bernoulli`'s on the fractional parts (the same keystream bytes in the
  same order), in preallocated buffers (distributed DP's per-patient rounding).
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


def _chacha20(key: bytes):
    return Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()


class CsprngUniform:
    """A stream of uniforms in [0, 1) (53 bits each) from ChaCha20 under a one-use random key.

    Fork-safe: a process that did not make the stream (a fork of the one that did) rekeys it from
    ``os.urandom`` before its first draw, so parent and child never draw the same bytes (a fork
    copies the cipher state: both would otherwise add the same noise and flip the same coins)."""

    def __init__(self, *, _key: bytes | None = None):
        key = os.urandom(32) if _key is None else _key
        if len(key) != 32:
            raise ValueError("key must be 32 bytes")
        self._enc = _chacha20(key)
        self._pid = os.getpid()
        self._zeros = b""

    def _stream(self):
        """The keystream's cipher, rekeyed once in a forked process (see the class)."""
        if self._pid != os.getpid():
            self._enc, self._pid = _chacha20(os.urandom(32)), os.getpid()
        return self._enc

    def raw(self, n: int) -> bytes:
        """The next ``n`` bytes of the keystream."""
        if n < 0:
            raise ValueError("n must be >= 0")
        return self._stream().update(bytes(n))

    def raw_into(self, out: np.ndarray) -> np.ndarray:
        """``out`` (a C-contiguous uint8 array) filled with the next ``out.size`` bytes of the
        keystream -- what :meth:`raw` gives, without allocating."""
        if out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise ValueError("out must be a C-contiguous uint8 array")
        if len(self._zeros) < out.size:
            self._zeros = bytes(out.size)
        if out.size:
            self._stream().update_into(memoryview(self._zeros)[:out.size], out.reshape(-1))
        return out

    def uniform(self, n: int) -> np.ndarray:
        """``n`` float64 uniforms in [0, 1)."""
        if n < 0:
            raise ValueError("n must be >= 0")
        words = np.frombuffer(self._stream().update(bytes(8 * n)), dtype="<u8") >> np.uint64(11)
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
    _settle_ties(out, k_hi, t, t_hi, src)
    return out.reshape(shape)


def _settle_ties(out: np.ndarray, k_hi: np.ndarray, t: np.ndarray, t_hi: np.ndarray, src: CsprngUniform,
                 tie: np.ndarray | None = None) -> None:
    """The coins whose top byte ties T's (``k_hi == t_hi``), settled in ``out`` by the low 45 bits
    of k drawn now, in index order (flat arrays of one length; ``tie``: a bool buffer for the test)."""
    eq = np.equal(k_hi, t_hi, out=tie)
    idx = np.flatnonzero(eq)
    if idx.size:
        k_lo = np.frombuffer(src.raw(8 * idx.size), dtype="<u8") >> np.uint64(64 - _LOW_BITS)
        out[idx] = k_lo.astype(np.float64) < t[idx] - t_hi[idx] * 2.0 ** _LOW_BITS


class RoundedRowSums:
    """Σ over the rows of the randomised rounding of a [r, d] block (r <= ``rows``, d = ``cols``):
    each x rounded to floor(x) + 1 with probability x − floor(x), else floor(x) (unbiased), its coin
    exactly :func:`bernoulli` (x − floor(x)) -- the same keystream bytes in the same order, hence
    the same integers -- computed in place in buffers allocated once (a fresh temporary a pass
    made every block of a 25 M-coin round a round of page faults)."""

    def __init__(self, rows: int, cols: int):
        shape = (int(rows), int(cols))
        self._lo = np.empty(shape)
        self._t_hi = np.empty(shape, np.int16)
        self._k_hi = np.empty(shape, np.uint8)
        self._coins = np.empty(shape, bool)
        self._tie = np.empty(shape, bool)

    def __call__(self, x: np.ndarray, *, source: CsprngUniform) -> np.ndarray:
        """int64 [d]: Σ_rows round(x) (``x``: C-contiguous float64 [r, d], finite; overwritten).

        Raises:
            ValueError: ``x`` is not finite, or not of this block's shape.
        """
        r, d = x.shape
        if x.dtype != np.float64 or not x.flags.c_contiguous or r > self._lo.shape[0] or d != self._lo.shape[1]:
            raise ValueError("x must be a C-contiguous float64 block of at most (rows, cols)")
        hi, low = float(x.max(initial=0.0)), float(x.min(initial=0.0))  # NaN propagates
        if not (math.isfinite(hi) and math.isfinite(low)):
            raise ValueError("x must be finite")
        top = max(hi, -low)
        lo, t_hi, k_hi, coins, tie = (b[:r] for b in (self._lo, self._t_hi, self._k_hi, self._coins, self._tie))
        np.floor(x, out=lo)
        np.subtract(x, lo, out=x)  # the coin's probability p = x - floor(x), in [0, 1]
        np.multiply(x, 2.0 ** 53, out=x)
        np.ceil(x, out=x)  # T = ceil(p·2^53), exact (as in bernoulli)
        np.multiply(x, 2.0 ** -_LOW_BITS, out=t_hi, casting="unsafe")  # floor(T / 2^45) in [0, 256]: truncation
        source.raw_into(k_hi)
        np.less(k_hi, t_hi, out=coins)
        _settle_ties(coins.reshape(-1), k_hi.reshape(-1), x.reshape(-1), t_hi.reshape(-1), source,
                     tie=tie.reshape(-1))
        np.add(lo, coins, out=lo)  # round(x), integers in float64
        if r * (top + 1.0) < 2.0 ** 52:  # every partial sum of a column is an integer below 2^52: exact
            return lo.sum(axis=0).astype(np.int64)
        return lo.astype(np.int64).sum(axis=0)


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
