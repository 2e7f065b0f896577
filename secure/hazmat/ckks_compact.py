"""The compact upload of a public-key CKKS ciphertext at two primes (threshold CKKS). Hazmat;
only :mod:`clinograph.secure.ckks.threshold_upload` imports it.

A fresh encryption ``(c0, c1)`` under the collective key lives mod Q = q0*q1 (two 60-bit primes).
What each half needs, and why:

* ``c1 = a*u + e1`` carries the encryption randomness ``u`` and cannot be seeded (``u`` is
  secret; only a *symmetric* encryption's ``c1 = a`` can be, which is what TenSEAL's single-key
  mode sends instead). Its low bits cannot be dropped either: every key holder multiplies it by
  its secret share, so a rounding error ``r1`` becomes ``r1*s`` in the decrypted noise, a
  *secret-dependent* term that the smudging (uniform on [-2^68, 2^68)) would then have to hide:
  at the preset's statistical distance N*B/2^69 <= 2^-43 that allows |r1*s| <= B = 2^13, and
  ``r1*s`` for one dropped bit already reaches N*n/2 (2^17 at n = 32) in the worst case. So c1
  travels whole, NTT form, each residue in its 60 bits (:func:`pack_words`): 2*60 bits a
  coefficient.
* ``c0 = p0*u + e0 + Delta*m`` is used only by the combiner, which adds it to the decryption
  shares; the shares ``d_i = c1*s_i + e_i`` do not involve c0. Rounding c0 is therefore
  post-processing of what the server already sees: it adds an error independent of every key
  and costs precision only. :func:`round_c0` keeps the Garner digit ``t`` of the CRT value
  ``x = r0 + q0*t`` (0 <= r0 < q0, 0 <= t < q1) without its ``drop`` low bits; :func:`lift_c0_sum`
  puts ``x' = q0*(t_high*2^drop + 2^(drop-1)) + floor(q0/2)`` back. Then
  |x - x'| <= q0/2 + q0*2^(drop-1) ~ 2^(59+drop), roughly uniform, standard deviation
  q0*2^drop/sqrt(12). At ``drop = 8`` this is half the standard deviation of one holder's
  smudging (2^68/sqrt(3)), so the aggregate's slot error grows by sqrt(1 + 1/4) ~ 1.12 over the
  smudging alone (tested). c0 travels in coefficient form, (60 - drop) bits a coefficient.

Bytes per coefficient at ``drop = 8``: 15 (c1) + 6.5 (c0) = 21.5, i.e. 43 bytes a CKKS slot at
N/2 slots per ciphertext, against SEAL's 32 bytes a coefficient (64 a slot) for the same
ciphertext saved as 64-bit words.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_U64 = np.uint64


def pack_words(words: np.ndarray, bits: int) -> bytes:
    """Little-endian ``bits``-bit packing of an even number of uint64 words below 2^bits
    (``bits`` a multiple of 4 in 4..64): two words take ``bits/4`` bytes."""
    if bits % 4 or not 4 <= bits <= 64:
        raise ValueError("bits must be a multiple of 4 in 4..64")
    flat = np.ascontiguousarray(words, dtype=_U64).reshape(-1, 2)
    if bits < 64 and np.any(flat >> _U64(bits)):
        raise ValueError(f"a word does not fit in {bits} bits")
    pairs = np.empty((flat.shape[0], 2), dtype="<u8")
    pairs[:, 0] = flat[:, 0] | (flat[:, 1] << _U64(bits % 64)) if bits < 64 else flat[:, 0]
    pairs[:, 1] = flat[:, 1] >> _U64(64 - bits) if bits < 64 else flat[:, 1]
    return pairs.view(np.uint8).reshape(-1, 16)[:, :bits // 4].tobytes()


def unpack_words(data: bytes, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_words`: ``count`` (even) words. Raises ValueError on a wrong length."""
    if bits % 4 or not 4 <= bits <= 64 or count % 2:
        raise ValueError("bits must be a multiple of 4 in 4..64 and count even")
    width = bits // 4
    if len(data) != width * count // 2:
        raise ValueError(f"{len(data)} bytes; expected {width * count // 2} for {count} words of {bits} bits")
    lohi = np.zeros((count // 2, 2), dtype="<u8")
    lohi.view(np.uint8).reshape(-1, 16)[:, :width] = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
    if bits == 64:
        return lohi.astype(_U64).reshape(-1)
    lo, hi, mask = lohi[:, 0], lohi[:, 1], _U64((1 << bits) - 1)
    out = np.empty(count, dtype=_U64)
    out[0::2] = lo & mask
    out[1::2] = ((lo >> _U64(bits)) | (hi << _U64(64 - bits))) & mask
    return out


def _mulmod_scalar(x: np.ndarray, c: int, q: int) -> np.ndarray:
    """(x * c) mod q for uint64 x < q < 2^62, exact (longdouble quotient, as in :mod:`.seal_polys`)."""
    quo = (x.astype(np.longdouble) * np.longdouble(c) / np.longdouble(q)).astype(_U64)
    r = (x * _U64(c) - quo * _U64(q)).astype(np.int64)
    r = np.where(r < 0, r + np.int64(q), r)
    r = np.where(r >= np.int64(q), r - np.int64(q), r)
    return r.astype(_U64)


def round_c0(c0: np.ndarray, primes: Sequence[int], *, drop: int) -> np.ndarray:
    """The high ``60 - drop`` bits of the Garner digit t of a coefficient-form (2, N) c0:
    x = r0 + q0*t, t = (r1 - r0) * q0^-1 mod q1."""
    q0, q1 = primes[0], primes[1]
    r0 = c0[0] % _U64(q1)
    diff = np.where(c0[1] >= r0, c0[1] - r0, c0[1] + _U64(q1) - r0)
    t = _mulmod_scalar(diff, pow(q0, -1, q1), q1)
    return t >> _U64(drop)


def lift_c0_sum(highs: Sequence[np.ndarray], primes: Sequence[int], *, drop: int) -> np.ndarray:
    """Coefficient-form (2, N) residues of sum_j x'_j mod Q, x'_j = q0*(h_j*2^drop + 2^(drop-1)) +
    floor(q0/2) for the rounded digits h_j of :func:`round_c0` (n <= 2^(64 - 60 + drop) terms)."""
    q0, q1 = primes[0], primes[1]
    n = len(highs)
    total = np.zeros_like(highs[0]) if n else np.zeros(0, dtype=_U64)
    for h in highs:
        total = total + h  # < n * 2^(60 - drop) < 2^64
    t = (_mulmod_scalar(total % _U64(q1), (1 << drop) % q1, q1) + _U64(n * (1 << (drop - 1)) % q1)) % _U64(q1)
    half = q0 // 2
    limb0 = np.full_like(t, n * half % q0)
    limb1 = (_mulmod_scalar(t, q0 % q1, q1) + _U64(n * half % q1)) % _U64(q1)
    return np.stack([limb0, limb1])
