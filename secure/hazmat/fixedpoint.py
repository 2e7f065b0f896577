"""Fixed-point encoding of floats into the ring Z_{2^32} (4 bytes a parameter on the wire).

A value ``x`` with ``|x| <= clip`` is encoded as ``q = round(x * scale) mod 2^32`` (two's
complement). Sums are taken in the ring and decoded by reading the 32-bit word as a signed
integer and dividing by ``scale``.

No-wrap condition (why the scale is what it is). Each client contributes
``|q_i| <= clip*scale + 1/2``, so ``n`` contributions sum to at most ``n*clip*scale + n/2``
in absolute value. Decoding is exact as long as that stays below ``2^31``. We choose

    scale = (2^31 - 1 - n) / (n * clip)                                   (1)

so that ``n*clip*scale + n/2 = 2^31 - 1 - n/2 < 2^31``: the sum of any ``n`` in-range
values never wraps. The rounding error of the decoded sum is at most ``n / (2*scale)``
= ``n^2 * clip / (2 * (2^31 - 1 - n))``; e.g. 2.3e-8 absolute for n = 10, clip = 1.

Out-of-range values are never clamped silently: :func:`encode` raises, or, when the caller
explicitly asks for it, clips them and returns how many it clipped.
"""

from __future__ import annotations

import numpy as np

RING_BITS = 32
RING = 1 << RING_BITS
HALF = 1 << (RING_BITS - 1)


def scale_for(*, n_clients: int, bound: float) -> float:
    """The largest wrap-free scale for ``n_clients`` values each within ``[-bound, bound]``, eq. (1)."""
    if n_clients < 1 or not bound > 0 or not np.isfinite(bound):
        raise ValueError("need n_clients >= 1 and a finite bound > 0")
    return (HALF - 1 - n_clients) / (n_clients * bound)


def wrap_free(*, n_clients: int, bound: float, scale: float) -> bool:
    """Whether ``n_clients`` encoded values in ``[-bound, bound]`` sum without wrapping."""
    return n_clients * (bound * scale + 0.5) < HALF


def encode(values: np.ndarray, *, scale: float, bound: float, clip: bool) -> tuple[np.ndarray, int]:
    """Encode float ``values`` as uint32 ring elements; return ``(words, n_clipped)``.

    Raises ValueError naming how many values are out of ``[-bound, bound]`` unless ``clip``,
    in which case they are clipped and counted. NaN or infinity is always an error.
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{int(np.count_nonzero(~np.isfinite(x)))} value(s) are NaN or infinite")
    out = np.abs(x) > bound
    n_out = int(np.count_nonzero(out))
    if n_out:
        if not clip:
            raise ValueError(f"{n_out} of {x.size} value(s) are outside [-{bound}, {bound}]")
        x = np.clip(x, -bound, bound)
    q = np.rint(x * scale).astype(np.int64)
    return q.astype(np.uint32), n_out


def decode(words: np.ndarray, *, scale: float) -> np.ndarray:
    """Signed reading of ring words divided by ``scale`` (float64)."""
    return np.asarray(words, dtype=np.uint32).view(np.int32).astype(np.float64) / scale


def encode_int(values: np.ndarray) -> np.ndarray:
    """Small non-negative integers (contributor counts) as ring words, unscaled."""
    return np.asarray(values, dtype=np.int64).astype(np.uint32)
