"""Shamir t-out-of-m sharing of 32-byte secrets over the prime field GF(p), p = 2^256 + 297.

Shamir 1979: the secret s is the constant term of a random polynomial f of degree t - 1,
share i is (i, f(i)); any t shares rebuild s = f(0) by Lagrange interpolation,

    s = sum_{i in S} y_i * prod_{j in S, j != i} x_j / (x_j - x_i)   (mod p),      (1)

and any t - 1 shares are independent of s (information-theoretically). p is the smallest
prime above 2^256, so every 32-byte secret (read big-endian) is a field element and the
coefficients are uniform in GF(p) (``os.urandom`` through ``secrets.randbelow``'s rejection
sampling, never ``random``). Python's
integers do the field arithmetic: a split or a combine at t <= 10 costs tens of
microseconds, against milliseconds for pycryptodome's pure-Python GF(2^128), which this
replaced (profiling showed Shamir combine as the largest cost of a small masked round).

A share is ``(index, 33 bytes)``: f(index) big-endian (values below p need 257 bits).
Indices are 1..m.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache

#: The field modulus: the smallest prime above 2^256 (2^256 + 297).
PRIME = (1 << 256) + 297
SECRET_BYTES = 32
SHARE_BYTES = 33


def split_secret(secret: bytes, *, threshold: int, n_shares: int) -> list[tuple[int, bytes]]:
    """Split ``secret`` (32 bytes) into ``n_shares`` shares, any ``threshold`` of which rebuild it."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= n_shares:
        raise ValueError(f"need 1 <= threshold <= n_shares, got {threshold}, {n_shares}")
    if n_shares >= PRIME:  # unreachable in practice; keeps the indices distinct field elements
        raise ValueError("too many shares")
    coefficients = [int.from_bytes(secret, "big"), *_field_elements(threshold - 1)]
    out = []
    for x in range(1, n_shares + 1):
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % PRIME
        out.append((x, y.to_bytes(SHARE_BYTES, "big")))
    return out


#: Bits of a candidate field element: PRIME's bit length, so at least half the candidates are below it.
_BITS = PRIME.bit_length()  # 257


def _field_elements(count: int) -> list[int]:
    """``count`` independent uniform elements of GF(p) from the OS's cryptographic random source:
    ``secrets.randbelow(PRIME)``'s rejection sampling (a 257-bit candidate, kept if below p, else
    drawn again), with the candidates' bytes read in one ``os.urandom`` call instead of one a
    candidate (about half are refused, so a split of t - 1 coefficients made ~2 (t - 1) calls)."""
    out: list[int] = []
    while len(out) < count:
        pool = os.urandom(SHARE_BYTES * 2 * (count - len(out)))  # 33 bytes a candidate, two a value expected
        for i in range(0, len(pool), SHARE_BYTES):
            candidate = int.from_bytes(pool[i:i + SHARE_BYTES], "big") >> (8 * SHARE_BYTES - _BITS)
            if candidate < PRIME:
                out.append(candidate)
                if len(out) == count:
                    break
    return out


def combine_shares(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """Rebuild the 32-byte secret from shares (at least the threshold, distinct indices), eq. (1).

    With fewer shares than the threshold, or a wrong share, the result is a wrong secret, not
    an error: the caller must check it (e.g. against a public key). Raises ValueError on
    malformed shares, or when the interpolated value is not a 32-byte secret (then some share
    is wrong).
    """
    if not shares:
        raise ValueError("no shares")
    if any(len(s) != SHARE_BYTES for _, s in shares):
        raise ValueError(f"every share must be {SHARE_BYTES} bytes")
    xs = [i for i, _ in shares]
    if len(set(xs)) != len(xs) or any(not 1 <= i < PRIME for i in xs):
        raise ValueError("share indices must be distinct and >= 1")
    ys = [int.from_bytes(s, "big") for _, s in shares]
    if any(y >= PRIME for y in ys):
        raise ValueError("a share is not a field element")
    secret = sum(yi * li for yi, li in zip(ys, _lagrange_at_zero(tuple(xs)), strict=True)) % PRIME
    if secret >> 256:
        raise ValueError("the shares do not interpolate to a 32-byte secret (a share is wrong)")
    return secret.to_bytes(SECRET_BYTES, "big")


@lru_cache(maxsize=1024)
def _lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """The coefficients of eq. (1), prod_{j != i} x_j / (x_j - x_i) mod p, for distinct indices
    ``xs``: public, and the same for every secret rebuilt from shares at these indices (a server
    rebuilds one secret a hospital, mostly from the same few index sets), so computed once."""
    out = []
    for i, xi in enumerate(xs):
        num = den = 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)
