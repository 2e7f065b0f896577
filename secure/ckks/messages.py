"""Wire messages of the ``ckks`` mode: the key ceremony (three messages, once per federation)
and one round (two stages). Frozen, strict, size-limited; always sent through
:func:`clinograph.secure.wire.seal` (signed over the exact bytes).

Size on the wire: every ciphertext is a :data:`~clinograph.secure.messages.Blob`, a raw
envelope attachment (:mod:`clinograph.secure.wire`), so an update costs its SEAL bytes plus
a small JSON header and 4 bytes of framing per ciphertext. The presets state SEAL bytes; the
benchmark reports both.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from clinograph.core.fields import RoundNumber

from ..messages import BLOB_CODEC, ID_PATTERN, WireMessage

HEX64 = r"^[0-9a-f]{64}$"
KEY_ID = r"^[0-9a-f]{32}$"
#: A full (unseeded) ciphertext at N = 8192 under two 60-bit primes is ~262 KB; nothing larger is valid.
MAX_CIPHERTEXT_BYTES = 300_000
#: 100 000 ciphertexts = 409.6 M slots at N = 8192.
MAX_CIPHERTEXTS = 100_000

Ciphertext = Annotated[bytes, Field(min_length=1, max_length=MAX_CIPHERTEXT_BYTES), *BLOB_CODEC]


class CkksKeyRequest(WireMessage):
    """Hospital -> dealer hospital: "wrap the federation's CKKS key to this X25519 key"
    (ephemeral, generated for this ceremony, signed by the hospital's Ed25519 identity)."""

    kind: Literal["ckks_key_request"] = "ckks_key_request"
    federation_id: str = Field(pattern=ID_PATTERN)
    requester: str = Field(pattern=ID_PATTERN)
    x25519_public: bytes = Field(min_length=32, max_length=32)


class CkksKeyPackage(WireMessage):
    """Dealer -> one hospital: the secret CKKS context wrapped to that hospital's X25519 key
    (X25519 + HKDF(KDF_CKKS_KEY_WRAP) + ChaCha20-Poly1305), signed by the dealer."""

    kind: Literal["ckks_key_package"] = "ckks_key_package"
    federation_id: str = Field(pattern=ID_PATTERN)
    dealer: str = Field(pattern=ID_PATTERN)
    recipient: str = Field(pattern=ID_PATTERN)
    recipient_x25519_public: bytes = Field(min_length=32, max_length=32)
    preset: str = Field(max_length=64)
    key_id: str = Field(pattern=KEY_ID)
    context_digest: str = Field(pattern=HEX64)
    ephemeral_public: bytes = Field(min_length=32, max_length=32)
    nonce: bytes = Field(min_length=12, max_length=12)
    wrapped: bytes = Field(min_length=16, max_length=1_000_000)


class CkksPublicContext(WireMessage):
    """Dealer -> server: the public context. SEAL parameters only -- no secret, public,
    relinearisation or Galois key (the server only adds)."""

    kind: Literal["ckks_public_context"] = "ckks_public_context"
    federation_id: str = Field(pattern=ID_PATTERN)
    dealer: str = Field(pattern=ID_PATTERN)
    preset: str = Field(max_length=64)
    key_id: str = Field(pattern=KEY_ID)
    parms: bytes = Field(min_length=1, max_length=4096)


class CkksUpdate(WireMessage):
    """Stage 1, hospital -> server: the encrypted slot vector (all shared modules, then one
    weight slot and one count slot per module, then one contributor-tag slot per participant)."""

    kind: Literal["ckks_update"] = "ckks_update"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    client: str = Field(pattern=ID_PATTERN)
    spec_digest: str = Field(pattern=HEX64)
    dictionary_hash: str = Field(pattern=HEX64)
    context_digest: str = Field(pattern=HEX64)
    ciphertexts: tuple[Ciphertext, ...] = Field(min_length=1, max_length=MAX_CIPHERTEXTS)


class CkksAggregate(WireMessage):
    """Stage 2, server -> every contributing hospital (one broadcast, sealed once): Σ of the
    accepted ciphertexts and the contributors the server claims (each hospital checks the
    claim against the decrypted contributor tags)."""

    kind: Literal["ckks_aggregate"] = "ckks_aggregate"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    spec_digest: str = Field(pattern=HEX64)
    context_digest: str = Field(pattern=HEX64)
    contributors: tuple[Annotated[str, Field(pattern=ID_PATTERN)], ...] = Field(min_length=1, max_length=10_000)
    ciphertexts: tuple[Ciphertext, ...] = Field(min_length=1, max_length=MAX_CIPHERTEXTS)
