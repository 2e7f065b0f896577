"""Shamir t-out-of-m sharing of 32-byte secrets with pycryptodome (no hand-rolled field).

``Crypto.Protocol.SecretSharing.Shamir`` shares 16-byte secrets over GF(2^128); a 32-byte
secret is split into two 16-byte halves shared with the same indices, as Flower does.
A share is ``(index, 32 bytes)``: the two halves' shares concatenated. Indices are 1..m.
"""

from __future__ import annotations

from collections.abc import Sequence

from Crypto.Protocol.SecretSharing import Shamir

SECRET_BYTES = 32
SHARE_BYTES = 32


def split_secret(secret: bytes, *, threshold: int, n_shares: int) -> list[tuple[int, bytes]]:
    """Split ``secret`` (32 bytes) into ``n_shares`` shares, any ``threshold`` of which rebuild it."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= n_shares:
        raise ValueError(f"need 1 <= threshold <= n_shares, got {threshold}, {n_shares}")
    lo = Shamir.split(threshold, n_shares, secret[:16], ssss=False)
    hi = Shamir.split(threshold, n_shares, secret[16:], ssss=False)
    return [(i, a + b) for (i, a), (j, b) in zip(lo, hi, strict=True) if i == j]


def combine_shares(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """Rebuild the 32-byte secret from shares (at least the threshold, distinct indices).

    With fewer shares than the threshold the result is a wrong secret, not an error: the
    caller must check it (e.g. against a public key). Raises ValueError on malformed shares.
    """
    if any(len(s) != SHARE_BYTES for _, s in shares):
        raise ValueError(f"every share must be {SHARE_BYTES} bytes")
    idx = [i for i, _ in shares]
    if len(set(idx)) != len(idx):
        raise ValueError("share indices must be distinct")
    lo = Shamir.combine([(i, s[:16]) for i, s in shares], ssss=False)
    hi = Shamir.combine([(i, s[16:]) for i, s in shares], ssss=False)
    return lo + hi
