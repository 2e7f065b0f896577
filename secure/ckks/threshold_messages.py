"""Wire messages of threshold CKKS (:mod:`.threshold`): key generation (one a key holder) and
the decryption of one aggregate (the combiner's request, one share a key holder). Frozen,
strict, size-limited; sent through :func:`clinograph.secure.wire.seal` (signed over the exact
bytes). Polynomials are raw little-endian uint64 words, RNS limbs of N = 8192, travelling as
raw envelope attachments.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import Field

from clinograph.core.labels import (
    HASH_THRESHOLD_CKKS_C1,
    HASH_THRESHOLD_CKKS_COMMITMENTS,
    HASH_THRESHOLD_CKKS_REQUEST,
)

from ..hazmat.ckks_context import pack_fields
from ..messages import BLOB_CODEC, ID_PATTERN, WireMessage

#: three limbs of N = 8192 words, eight times over: nothing valid is larger
MAX_POLY_BYTES = 3 * 8 * 8192 * 8
#: key holders a collective key can have (ThresholdPreset.max_parties)
MAX_HOLDERS = 32
#: one polynomial, raw little-endian uint64 words, travelling as a raw envelope attachment
Poly = Annotated[bytes, Field(min_length=8, max_length=MAX_POLY_BYTES), *BLOB_CODEC]


class KeyGenShare(WireMessage):
    """Key holder -> all: ``p0_i = -a*s_i + e_i`` (raw little-endian uint64, key-level limbs)."""

    kind: Literal["threshold_ckks_keygen_share"] = "threshold_ckks_keygen_share"
    federation_id: str = Field(pattern=ID_PATTERN)
    party: str = Field(pattern=ID_PATTERN)
    seed_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    p0: Poly


class DecryptionRequest(WireMessage):
    """Combiner -> every key holder: the ``c1`` halves to decrypt (one is a canary)."""

    kind: Literal["threshold_ckks_decryption_request"] = "threshold_ckks_decryption_request"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: int = Field(ge=0)
    c1: tuple[Poly, ...] = Field(min_length=1, max_length=100_000)
    #: t-of-N: the key holders whose shares are combined (their Lagrange coefficients are for this
    #: set); empty: N-of-N, every holder
    present: tuple[Annotated[str, Field(pattern=ID_PATTERN)], ...] = Field(default=(), max_length=MAX_HOLDERS)

    def digest(self) -> str:
        """SHA-256 over the request's ``c1`` halves and, t-of-N, its present set (binds each share
        to its request)."""
        h = hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_REQUEST, self.federation_id.encode(),
                                         self.round.to_bytes(8, "big")]))
        if self.present:
            h.update(pack_fields([b"present", *(p.encode() for p in self.present)]))
        for c in self.c1:
            h.update(hashlib.sha256(c).digest())
        return h.hexdigest()


class DecryptionShare(WireMessage):
    """Key holder -> combiner: ``d_i = c1*s_i + e_smudge`` for every ``c1`` of one request."""

    kind: Literal["threshold_ckks_decryption_share"] = "threshold_ckks_decryption_share"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: int = Field(ge=0)
    party: str = Field(pattern=ID_PATTERN)
    request_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shares: tuple[Poly, ...] = Field(min_length=1, max_length=100_000)


#: ciphertexts in one update: 1000 x 4096 slots (P up to ~4e6); the decryption request that carries
#: every contributor's c1 parts must also fit one message (MAX_MESSAGE_BYTES): n * P <= ~8e6
MAX_UPDATE_CIPHERTEXTS = 1000
#: one compact ciphertext part (c1: 2 x 8192 residues of 60 bits = 122 880 bytes; c0: 53 248)
Part = Annotated[bytes, Field(min_length=1, max_length=160_000), *BLOB_CODEC]
#: one hospital's signed :class:`ThresholdUpdate` envelope (its c1 parts and a small header)
MAX_UPDATE_ENVELOPE = MAX_UPDATE_CIPHERTEXTS * 160_000 + 64 * 1024
SignedUpdate = Annotated[bytes, Field(min_length=1, max_length=MAX_UPDATE_ENVELOPE), *BLOB_CODEC]


class _Contribution(WireMessage):
    """What a hospital's commitment and its c1 name: its round, model version, dictionary and
    collective key."""

    federation_id: str = Field(pattern=ID_PATTERN)
    round: int = Field(ge=0)
    client: str = Field(pattern=ID_PATTERN)
    spec_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    dictionary_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    public_key_digest: str = Field(pattern=r"^[0-9a-f]{64}$")


class ThresholdUpdate(_Contribution):
    """Hospital -> server -> every key holder: the c1 parts of its encrypted slot vector
    (:mod:`.threshold_upload`), signed on their own. The signature over these bytes is what lets
    a key holder check that the sum it computes and decrypts is a sum of signed contributions,
    without downloading their c0 parts."""

    kind: Literal["threshold_ckks_update"] = "threshold_ckks_update"
    #: the commitment set this hospital saw before it revealed its c1 (:func:`commitments_digest`)
    commitments_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    c1: tuple[Part, ...] = Field(min_length=1, max_length=MAX_UPDATE_CIPHERTEXTS)


class ThresholdCommit(_Contribution):
    """Hospital -> server (stage ``commit``): the hash of its c1 parts (:func:`c1_digest`), sent
    before any hospital reveals a c1, so that no contribution can be chosen after seeing
    another's (a contributor colluding with the server could otherwise sign minus the others'
    c1 and have one hospital's ciphertext decrypted)."""

    kind: Literal["threshold_ckks_commit"] = "threshold_ckks_commit"
    c1_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


SignedCommit = Annotated[bytes, Field(min_length=1, max_length=64 * 1024), *BLOB_CODEC]


class ThresholdCommitments(WireMessage):
    """Server -> every participant (stage ``reveal``): every hospital's signed
    :class:`ThresholdCommit`, as received, sorted by hospital. A hospital reveals its c1 once,
    naming this set's digest."""

    kind: Literal["threshold_ckks_commitments"] = "threshold_ckks_commitments"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: int = Field(ge=0)
    commits: tuple[SignedCommit, ...] = Field(min_length=1, max_length=10_000)


def c1_digest(parts: tuple[bytes, ...]) -> str:
    """SHA-256 commitment to a contribution's c1 parts (purpose-labelled, length-prefixed)."""
    return hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_C1, *parts])).hexdigest()


def commitments_digest(commits: tuple[bytes, ...]) -> str:
    """SHA-256 of a commitment set, over the signed envelopes' bytes in the order sent."""
    return hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_COMMITMENTS,
                                       *(hashlib.sha256(c).digest() for c in commits)])).hexdigest()


class ThresholdUpload(WireMessage):
    """Hospital -> server (stage ``updates``): the rounded c0 parts, which only the server uses,
    and the separately signed :class:`ThresholdUpdate` holding the c1 parts."""

    kind: Literal["threshold_ckks_upload"] = "threshold_ckks_upload"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: int = Field(ge=0)
    client: str = Field(pattern=ID_PATTERN)
    c0: tuple[Part, ...] = Field(min_length=1, max_length=MAX_UPDATE_CIPHERTEXTS)
    update: SignedUpdate


class ThresholdDecrypt(WireMessage):
    """Server -> every key holder (stage ``decrypt``): every contributor's signed
    :class:`ThresholdUpdate` envelope, as received, and a fresh public ``canary_seed``. It
    carries no c1 to decrypt: the holder adds the contributions' c1 itself and decrypts that sum
    and the canary it expands from the seed (:mod:`.threshold_check`)."""

    kind: Literal["threshold_ckks_decrypt"] = "threshold_ckks_decrypt"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: int = Field(ge=0)
    canary_seed: bytes = Field(min_length=32, max_length=32)
    updates: tuple[SignedUpdate, ...] = Field(min_length=1, max_length=10_000)
    #: t-of-N: the key holders asked to decrypt (see :attr:`DecryptionRequest.present`); a holder
    #: that drops is replaced by re-sending this same message with another present set
    present: tuple[Annotated[str, Field(pattern=ID_PATTERN)], ...] = Field(default=(), max_length=MAX_HOLDERS)


# -- t-of-N: re-sharing every holder's key share at set-up (:mod:`.threshold_reshare`) ---------------

class ReshareKey(WireMessage):
    """Key holder -> all (step ``tckks/keygen``): a fresh X25519 public key its Shamir shares are
    wrapped to, bound to the federation and the seed of ``a``."""

    kind: Literal["threshold_ckks_reshare_key"] = "threshold_ckks_reshare_key"
    federation_id: str = Field(pattern=ID_PATTERN)
    party: str = Field(pattern=ID_PATTERN)
    seed_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    threshold: int = Field(ge=1, le=MAX_HOLDERS)
    x25519: bytes = Field(min_length=32, max_length=32)


class ReshareDeal(WireMessage):
    """Dealer -> one recipient, relayed (step ``tckks/public``): the dealer's Shamir share ``f_i(k)``
    of its key share, wrapped (X25519, HKDF, ChaCha20-Poly1305) to the recipient's ReshareKey."""

    kind: Literal["threshold_ckks_reshare_deal"] = "threshold_ckks_reshare_deal"
    federation_id: str = Field(pattern=ID_PATTERN)
    dealer: str = Field(pattern=ID_PATTERN)
    recipient: str = Field(pattern=ID_PATTERN)
    index: int = Field(ge=1, le=MAX_HOLDERS)
    threshold: int = Field(ge=1, le=MAX_HOLDERS)
    public_key_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    ephemeral: bytes = Field(min_length=32, max_length=32)
    nonce: bytes = Field(min_length=12, max_length=12)
    wrapped: Poly


class ThresholdKeyShare(WireMessage):
    """Key holder -> server (step ``tckks/reshare``): it adopted its Shamir share ``S_k = sum_i
    f_i(k)`` of the secret key at ``index`` for this key and t (nothing derived from ``S_k``)."""

    kind: Literal["threshold_ckks_key_share"] = "threshold_ckks_key_share"
    federation_id: str = Field(pattern=ID_PATTERN)
    party: str = Field(pattern=ID_PATTERN)
    index: int = Field(ge=1, le=MAX_HOLDERS)
    threshold: int = Field(ge=1, le=MAX_HOLDERS)
    public_key_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
