"""X25519 key agreement and HKDF-SHA256 seed derivation (raw primitives, hazmat).

Only :mod:`clinograph.secure.masking` imports this (and threshold CKKS's re-share, for
:func:`check_public` alone). Every derivation takes a purpose label
from :mod:`.labels` and a context that binds it to a federation, round and ordered pair, so a
seed for one purpose, round or pair never equals a seed for another.
"""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEED_BYTES = 32


def encode_context(parts: Iterable[str | bytes | int]) -> bytes:
    """Unambiguous, length-prefixed encoding of context fields (no concatenation collisions)."""
    out: list[bytes] = []
    for p in parts:
        raw = p.encode() if isinstance(p, str) else (p.to_bytes(8, "big") if isinstance(p, int) else p)
        out += (len(raw).to_bytes(4, "big"), raw)  # u32 big-endian length, then the bytes
    return b"".join(out)


def generate_keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 private key (OS randomness) and its 32 raw public bytes."""
    sk = X25519PrivateKey.generate()
    return sk, public_bytes(sk)


def public_bytes(sk: X25519PrivateKey) -> bytes:
    """The 32 raw public-key bytes of ``sk``."""
    return sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_bytes(sk: X25519PrivateKey) -> bytes:
    """The 32 raw private-key bytes (only ever Shamir-shared, never logged or sent whole)."""
    return sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())


def private_from_bytes(raw: bytes) -> X25519PrivateKey:
    """Rebuild a private key from 32 raw bytes."""
    return X25519PrivateKey.from_private_bytes(raw)


def hkdf(secret: bytes, *, label: bytes, context: bytes, length: int = SEED_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869) with ``info = label || 0x00 || context`` and no salt."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                info=label + b"\x00" + context).derive(secret)


_P = 2**255 - 19
#: u-coordinates (mod p) of every point of small order, on Curve25519 (order dividing 8: the
#: cofactor) and on its twist (order dividing 4): u = 0 (order 2), 1 (order 4), p - 1 (order 4,
#: twist) and the two of order 8 (the list libsodium's ``has_small_order`` refuses).
LOW_ORDER_U = frozenset({0, 1, _P - 1,
                         int.from_bytes(bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
                                        "little"),
                         int.from_bytes(bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
                                        "little")})


def check_public(raw: bytes) -> None:
    """Raise ValueError unless ``raw`` is a usable X25519 public key: 32 bytes, not a low-order
    point. A low-order point makes every agreement with it the all-zero secret (RFC 7748 section 6.1:
    X25519 clamps scalars to multiples of the cofactor 8), and a point of large order makes none
    (a clamped scalar is below the prime order). X25519 reads u little-endian with the top bit
    masked and works mod p (RFC 7748 section 5), so the key is refused exactly when that u mod p
    is in :data:`LOW_ORDER_U`: the same keys an agreement with any fixed key refuses (what this
    did before, at one X25519 agreement a key; the test compares the two), without the agreement.
    Used where a key is *accepted* (the masked server at stage 0), so that a hospital advertising
    one is refused there, by name, not found out by its peers later."""
    if len(raw) != 32:
        raise ValueError(f"an X25519 public key is 32 bytes, got {len(raw)}")
    if (int.from_bytes(raw, "little") & ((1 << 255) - 1)) % _P in LOW_ORDER_U:
        raise ValueError("low-order X25519 public key (every agreement with it is zero)")


def agree(sk: X25519PrivateKey, peer_public: bytes, *, label: bytes, context: bytes) -> bytes:
    """X25519(sk, peer) then HKDF with a purpose label: a 32-byte seed or key.

    Raises ValueError if ``peer_public`` is malformed or a low-order point (all-zero secret).
    """
    shared = sk.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return hkdf(shared, label=label, context=context)
