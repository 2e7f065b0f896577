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

from clinograph.core.fields import RoundNumber
from clinograph.core.labels import (
    HASH_THRESHOLD_CKKS_COMMITMENTS,
    HASH_THRESHOLD_CKKS_REQUEST,
    HASH_THRESHOLD_CKKS_SUM_REQUEST,
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
    round: RoundNumber
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
    round: RoundNumber
    party: str = Field(pattern=ID_PATTERN)
    request_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shares: tuple[Poly, ...] = Field(min_length=1, max_length=100_000)


#: ciphertexts in one update: 1000 x 4096 slots (P up to ~4e6)
MAX_UPDATE_CIPHERTEXTS = 1000
#: one compact c0 part (8192 digits of 52 bits: 53 248 bytes)
Part = Annotated[bytes, Field(min_length=1, max_length=160_000), *BLOB_CODEC]


class _Contribution(WireMessage):
    """What a hospital's commitment and its upload name: its round, model version, dictionary,
    collective key and the global model the round starts from (the plan's
    ``global_state_digest``, which the hospital checked against the model it holds)."""

    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    client: str = Field(pattern=ID_PATTERN)
    spec_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    dictionary_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    public_key_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    global_state_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    plan_digest: str = Field(pattern=r"^[0-9a-f]{64}$")  # RoundPlan.digest(): every field of the plan


class ThresholdCommit(_Contribution):
    """Hospital -> server (stage ``commit``): this hospital takes part in the round, with a fresh
    32-byte ``nonce``. The relayed set of commitments fixes the contributors of the sum, and its
    digest (which holds every member's nonce) seeds the round's common polynomials: a hospital
    never encrypts twice under the same ``a``, and a ciphertext made for one set opens under no
    other set's decryption."""

    kind: Literal["threshold_ckks_commit"] = "threshold_ckks_commit"
    nonce: bytes = Field(min_length=32, max_length=32)


SignedCommit = Annotated[bytes, Field(min_length=1, max_length=64 * 1024), *BLOB_CODEC]


class ThresholdCommitments(WireMessage):
    """Server -> every participant (stage ``reveal``): every hospital's signed
    :class:`ThresholdCommit`, as received, sorted by hospital. A hospital encrypts and uploads
    once, for this set (naming its digest)."""

    kind: Literal["threshold_ckks_commitments"] = "threshold_ckks_commitments"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    commits: tuple[SignedCommit, ...] = Field(min_length=1, max_length=10_000)


def commitments_digest(commits: tuple[bytes, ...]) -> str:
    """SHA-256 of a commitment set, over the signed envelopes' bytes in the order sent."""
    return hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_COMMITMENTS,
                                       *(hashlib.sha256(c).digest() for c in commits)])).hexdigest()


class ThresholdUpload(_Contribution):
    """Hospital -> server (stage ``updates``): its ciphertexts' rounded c0 parts
    (:mod:`.threshold_upload`), encrypted under its own key share with the common polynomials of
    the commitment set it names. No c1 travels: it is the set's public ``a``."""

    kind: Literal["threshold_ckks_upload"] = "threshold_ckks_upload"
    commitments_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    c0: tuple[Part, ...] = Field(min_length=1, max_length=MAX_UPDATE_CIPHERTEXTS)


class ThresholdDecrypt(WireMessage):
    """Server -> every key holder asked (stage ``decrypt``): open the sum of the commitment set
    this holder saw (named by its digest), ``ciphertexts`` ciphertexts of it, with the canary
    expanded from ``canary_seed``, among the ``present`` holders. It carries no polynomial: the
    holder knows the set's members and expands the common polynomials itself."""

    kind: Literal["threshold_ckks_decrypt"] = "threshold_ckks_decrypt"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    commitments_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    ciphertexts: int = Field(ge=1, le=MAX_UPDATE_CIPHERTEXTS)
    canary_seed: bytes = Field(min_length=32, max_length=32)
    #: the key holders asked to decrypt (their Lagrange coefficients are for this set); a holder that
    #: drops is replaced by re-sending this same message with another present set
    present: tuple[Annotated[str, Field(pattern=ID_PATTERN)], ...] = Field(min_length=1, max_length=MAX_HOLDERS)

    def digest(self) -> str:
        """SHA-256 over everything the request fixes (the shares name it; the zero-sharing masks
        are keyed by it, so they cancel only among holders answering the same request)."""
        return hashlib.sha256(pack_fields([
            HASH_THRESHOLD_CKKS_SUM_REQUEST, self.federation_id.encode(), self.round.to_bytes(8, "big"),
            self.commitments_sha256.encode(), self.ciphertexts.to_bytes(4, "big"), self.canary_seed,
            *(p.encode() for p in self.present)])).hexdigest()


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
