"""Mask expansion: a full 32-byte seed -> uniform ring words via the ChaCha20 keystream.

Bonawitz et al. 2017, sec. 4: masks are ``PRG(seed)`` over Z_R; here R = 2^32 (or 2^16 for
the values of the quantised mode) and PRG is the ChaCha20 keystream (RFC 8439) from
``cryptography``, counter 0, all-zero nonce. A masked vector made of several parts (16-bit
values, then 32-bit weight and count slots) takes consecutive slices of one keystream, so
every byte of the stream is used once. The all-zero
nonce is safe because every seed is single-use: pairwise seeds are derived per round and per
pair with HKDF, self-mask seeds are fresh per round. numpy's RNG is never used.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

_NONCE = bytes(16)  # 4-byte little-endian block counter 0 || 12-byte nonce 0


def expand_mask(seed: bytes, n_words: int) -> np.ndarray:
    """``n_words`` little-endian uint32 words of the ChaCha20 keystream under key ``seed``.

    Raises ValueError unless ``seed`` is exactly 32 bytes and ``n_words`` >= 0.
    """
    if len(seed) != 32:
        raise ValueError(f"mask seed must be 32 bytes, got {len(seed)}")
    if n_words < 0:
        raise ValueError("n_words must be >= 0")
    enc = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor()
    stream = enc.update(bytes(4 * n_words))
    return np.frombuffer(stream, dtype="<u4")


def add_mask(acc: np.ndarray, seed: bytes, *, sign: int) -> None:
    """``acc += sign * PRG(seed)`` in Z_{2^32}, in place (``acc`` is uint32)."""
    add_mask_parts([acc], seed, sign=sign)


#: Keystream is produced and added this many bytes at a time, so masking a vector of P words
#: needs no P-sized temporary (server memory stays O(one vector), docs: SECURITY.md).
CHUNK_BYTES = 1 << 20


def add_mask_parts(parts: list[np.ndarray], seed: bytes, *, sign: int, chunk_bytes: int = CHUNK_BYTES) -> None:
    """``part += sign * PRG(seed)`` for consecutive slices of one keystream, in place.

    Each part is a contiguous uint16 (ring 2^16) or uint32 (ring 2^32) array; with one uint32
    part this is :func:`add_mask`. The keystream is generated ``chunk_bytes`` at a time (a
    multiple of 4); the result does not depend on it. Raises ValueError for any other input.
    """
    if len(seed) != 32:
        raise ValueError(f"mask seed must be 32 bytes, got {len(seed)}")
    if any(p.dtype not in (np.uint16, np.uint32) or not p.flags.c_contiguous for p in parts):
        raise ValueError("mask parts must be contiguous uint16 or uint32 arrays")
    if chunk_bytes <= 0 or chunk_bytes % 4:
        raise ValueError("chunk_bytes must be a positive multiple of 4")
    enc = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor()
    zeros = memoryview(bytes(min(chunk_bytes, sum(p.nbytes for p in parts))))
    op = np.add if sign > 0 else np.subtract
    for p in parts:
        flat = p.reshape(-1)
        size = p.dtype.itemsize
        step = chunk_bytes // size
        for lo in range(0, flat.shape[0], step):
            seg = flat[lo:lo + step]
            mask = np.frombuffer(enc.update(zeros[:seg.nbytes]), dtype="<u2" if size == 2 else "<u4")
            op(seg, mask, out=seg)
