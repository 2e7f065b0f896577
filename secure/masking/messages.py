"""Wire messages of the ``masked`` mode: one frozen, strict model per stage (Bell et al. 2020).

Stage 0  client -> server  :class:`AdvertiseKeys`     two X25519 public keys and the version
Stage 1  server -> client  :class:`KeyDirectory`      the neighbours' signed AdvertiseKeys, as received
         client -> server  :class:`ShareKeys`         encrypted Shamir shares for neighbours
Stage 2  server -> client  :class:`ForwardShares`     the shares addressed to this client
         client -> server  :class:`MaskedInput`       the masked vector, 4 bytes a word
Stage 3  server -> client  :class:`ConsistencyRequest` the survivor set U3 (masked input arrived)
         client -> server  :class:`ConsistencySignature` the digest of (federation, round, U3), signed
Stage 4  server -> client  :class:`UnmaskRequest`     who survived, who dropped, the signed U3 digests
         client -> server  :class:`UnmaskResponse`    the shares that may be revealed

Stage 3 is the consistency check of Bonawitz et al. 2017 (round 4, "ConsistencyCheck"):
see :mod:`clinograph.secure.masking.consistency` for what it does and does not guarantee.

Every client message carries the plan's federation, round, ModelSpec digest, dictionary
hash, the digest of the global model the round starts from (``global_state_digest``) and the
digest of the whole plan (``plan_digest``), both since ``masked/3``; every server message names its recipient. Sizes are bounded per field, and the
server additionally bounds whole envelopes per stage (``MaskingServer.max_message_bytes``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from clinograph.core.fields import RoundNumber

from ..hazmat.shamir import SHARE_BYTES
from ..messages import BLOB_CODEC, ID_PATTERN, WireMessage

HEX64 = r"^[0-9a-f]{64}$"
MAX_PEERS = 10_000
MAX_WORDS = 64 * 1024 * 1024
#: Largest relayed client payload (an AdvertiseKeys or ConsistencySignature header is ~0.5 kB).
MAX_VOUCHED_PAYLOAD = 2048
#: Masking protocol version, carried (and so signed) in every AdvertiseKeys: ``masked/3`` adds
#: the digest of the round's starting global model to every client message (so to the key and
#: consistency signatures its peers check); ``masked/2`` masks with AES-256-CTR
#: (:data:`~clinograph.secure.hazmat.masking_prg.MASK_PRG`) and lets envelope signatures serve as
#: key and consistency signatures; ``masked/1`` (no version field) used ChaCha20 and separate
#: inner signatures. Each refuses the others' messages, naming both versions.
MASKING_VERSION = "masked/3:aes256-ctr"


class ClientHeader(WireMessage):
    """Fields every client message repeats (checked with aggregation.checks.check_header)."""

    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    client: str = Field(pattern=ID_PATTERN)
    spec_digest: str = Field(pattern=HEX64)
    dictionary_hash: str = Field(pattern=HEX64)
    #: the plan's ``global_state_digest``: the model this hospital checked its plan against (masked/3)
    global_state_digest: str = Field(pattern=HEX64)
    #: :meth:`RoundPlan.digest` of the plan this hospital answers: every field of it (masked/3)
    plan_digest: str = Field(pattern=HEX64)


class ServerHeader(WireMessage):
    """Fields every server message carries."""

    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    recipient: str = Field(pattern=ID_PATTERN)


class AdvertiseKeys(ClientHeader):
    """Stage 0: c_pk (share encryption) and s_pk (pairwise masks) for this round, and the
    masking protocol version. Its envelope signature (the client's long-term Ed25519 identity)
    is the key signature of Bonawitz et al. 2017 round 0: the server relays the envelope's
    payload and signature unchanged (:class:`PeerKeys`) and each peer verifies them itself."""

    kind: Literal["masked_advertise_keys"] = "masked_advertise_keys"
    version: Literal["masked/3:aes256-ctr"]
    c_pk: bytes = Field(min_length=32, max_length=32)
    s_pk: bytes = Field(min_length=32, max_length=32)

    @field_validator("version", mode="before")
    @classmethod
    def _same_version(cls, got: Any) -> Any:
        """Name the peer's protocol (reported before any other field error: a ``masked/2`` peer's
        advertisement also lacks ``global_state_digest``, which alone would not say why)."""
        if got != MASKING_VERSION:
            raise ValueError(f"masking protocol {str(got)[:24]!r}, this side runs {MASKING_VERSION!r} (it binds the "
                             "starting model): upgrade the older side")
        return got


class PeerKeys(WireMessage):
    """One neighbour's :class:`AdvertiseKeys`, relayed as received: the exact JSON payload
    bytes of its envelope and the envelope's signature (``clinograph.secure.wire``)."""

    client: str = Field(pattern=ID_PATTERN)
    payload: bytes = Field(max_length=MAX_VOUCHED_PAYLOAD)
    signature: bytes = Field(min_length=64, max_length=64)


class KeyDirectory(ServerHeader):
    """Stage 1, server -> client: keys of the client's neighbours that advertised."""

    kind: Literal["masked_key_directory"] = "masked_key_directory"
    keys: tuple[PeerKeys, ...] = Field(max_length=MAX_PEERS)


class EncryptedShare(WireMessage):
    """AEAD(ChaCha20-Poly1305) of (index, share of b, share of s_sk) for one holder."""

    peer: str = Field(pattern=ID_PATTERN)
    ciphertext: bytes = Field(min_length=12 + 2 + 2 * SHARE_BYTES + 16, max_length=12 + 2 + 2 * SHARE_BYTES + 16)


class ShareKeys(ClientHeader):
    """Stage 1, client -> server: one encrypted share per neighbour (peer = recipient)."""

    kind: Literal["masked_share_keys"] = "masked_share_keys"
    shares: tuple[EncryptedShare, ...] = Field(max_length=MAX_PEERS)


class ForwardShares(ServerHeader):
    """Stage 2, server -> client: shares addressed to the recipient (peer = sender)."""

    kind: Literal["masked_forward_shares"] = "masked_forward_shares"
    shares: tuple[EncryptedShare, ...] = Field(max_length=MAX_PEERS)


class MaskedInput(ClientHeader):
    """Stage 2, client -> server: y_u = x_u + PRG(b_u) + sum_v +-PRG(s_uv) mod 2^32, as <u4 bytes."""

    kind: Literal["masked_input"] = "masked_input"
    words: Annotated[bytes, Field(max_length=4 * MAX_WORDS), *BLOB_CODEC]


class ConsistencyRequest(ServerHeader):
    """Stage 3, server -> client: the survivor set U3 (clients whose masked input arrived)."""

    kind: Literal["masked_consistency_request"] = "masked_consistency_request"
    survivors: tuple[str, ...] = Field(max_length=MAX_PEERS)


class ConsistencySignature(ClientHeader):
    """Stage 3, client -> server: the digest of (federation, round, sorted U3)
    (:func:`~clinograph.secure.masking.consistency.survivors_digest`). Its envelope signature
    is the client's consistency signature (Bonawitz et al. 2017 round 4), relayed to the
    other survivors as :class:`SurvivorSignature`."""

    kind: Literal["masked_consistency_signature"] = "masked_consistency_signature"
    survivors_digest: str = Field(pattern=HEX64)


class SurvivorSignature(WireMessage):
    """One client's :class:`ConsistencySignature`, relayed as received: the exact JSON payload
    bytes of its envelope and the envelope's signature."""

    client: str = Field(pattern=ID_PATTERN)
    payload: bytes = Field(max_length=MAX_VOUCHED_PAYLOAD)
    signature: bytes = Field(min_length=64, max_length=64)


class UnmaskRequest(ServerHeader):
    """Stage 4, server -> client: survivors U3, dropped clients and the U3 signatures collected."""

    kind: Literal["masked_unmask_request"] = "masked_unmask_request"
    survivors: tuple[str, ...] = Field(max_length=MAX_PEERS)
    dropped: tuple[str, ...] = Field(max_length=MAX_PEERS)
    signatures: tuple[SurvivorSignature, ...] = Field(max_length=MAX_PEERS)


class RevealedShare(WireMessage):
    """One share revealed at unmasking: of b (survivor) or of s_sk (dropped client)."""

    owner: str = Field(pattern=ID_PATTERN)
    secret: Literal["self_mask", "pairwise_key"]
    index: int = Field(ge=1, le=MAX_PEERS + 1)
    share: bytes = Field(min_length=SHARE_BYTES, max_length=SHARE_BYTES)


class UnmaskResponse(ClientHeader):
    """Stage 4, client -> server."""

    kind: Literal["masked_unmask_response"] = "masked_unmask_response"
    shares: tuple[RevealedShare, ...] = Field(max_length=MAX_PEERS + 1)
