"""Key wrapping for the CKKS key ceremony: X25519 ECDH -> HKDF-SHA256 -> ChaCha20-Poly1305.
Hazmat: no signatures and no protocol checks (:mod:`clinograph.secure.ckks.keys` adds them).

One wrap per recipient, each with a fresh ephemeral X25519 key, so the wrapping key is used
for exactly one message (a random 96-bit nonce is then more than enough). ``context`` is bound
twice: in the HKDF ``info`` (``label || 0x00 || context``) and as AEAD associated data.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

NONCE_BYTES = 12


def x25519_public_bytes(sk: X25519PrivateKey) -> bytes:
    """The 32 raw public bytes of ``sk``."""
    return sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _wrapping_key(sk: X25519PrivateKey, peer_public: bytes, *, label: bytes, context: bytes) -> bytes:
    try:
        shared = sk.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        raise ValueError("peer X25519 public key is malformed or of low order") from None
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label + b"\x00" + context).derive(shared)


def shared_key(sk: X25519PrivateKey, peer_public: bytes, *, label: bytes, context: bytes) -> bytes:
    """32 bytes both ends of an X25519 pair derive alike: HKDF-SHA256 of the shared secret, info
    ``label || 0x00 || context`` (threshold CKKS's pairwise seeds). ValueError on a bad peer key."""
    return _wrapping_key(sk, peer_public, label=label, context=context)


def wrap(plaintext: bytes, *, recipient_public: bytes, label: bytes, context: bytes) -> tuple[bytes, bytes, bytes]:
    """Encrypt ``plaintext`` to ``recipient_public``. Returns (ephemeral public, nonce, ciphertext)."""
    eph = X25519PrivateKey.generate()
    key = _wrapping_key(eph, recipient_public, label=label, context=context)
    nonce = os.urandom(NONCE_BYTES)
    return x25519_public_bytes(eph), nonce, ChaCha20Poly1305(key).encrypt(nonce, plaintext, context)


def unwrap(ciphertext: bytes, *, recipient: X25519PrivateKey, ephemeral_public: bytes, nonce: bytes,
           label: bytes, context: bytes) -> bytes:
    """Inverse of :func:`wrap`; ValueError if the key, context or any byte is wrong."""
    key = _wrapping_key(recipient, ephemeral_public, label=label, context=context)
    try:
        return ChaCha20Poly1305(key).decrypt(nonce, ciphertext, context)
    except InvalidTag:
        raise ValueError("AEAD tag does not verify") from None
