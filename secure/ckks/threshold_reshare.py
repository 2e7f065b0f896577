"""t-of-N threshold CKKS: re-sharing every holder's key share at set-up (MTBH sec. V).

After the N-of-N collective key generation (``s = sum_i s_i``), each holder i Shamir-shares its
``s_i`` coefficientwise over every RNS prime (degree t-1) and sends ``f_i(k)`` to holder k,
wrapped to k's fresh X25519 key (:class:`~.threshold_messages.ReshareKey`, signed at key
generation) and signed by i, so the server relaying it learns nothing. Holder k sums what it
received into ``S_k = sum_i f_i(k)``, a Shamir share of ``s`` at index k, erases ``s_i``, and
confirms (:class:`~.threshold_messages.ThresholdKeyShare`). The same X25519 keys give every pair
of holders a seed (X25519 + HKDF, bound to the federation, the key and the pair), whose PRG
output masks their decryption shares as a sharing of zero (:func:`.threshold.zero_shares`). Any t
holders T then decrypt with ``lambda_k^T * S_k`` in place of ``s_i``
(:meth:`.threshold.ThresholdParty.decryption_share`).

Guarantees: fewer than t holders' ``S_k`` are independent of ``s`` (Shamir, per prime); the
server sees only wrapped shares; nothing public is derived from an ``S_k`` (a public
``-a*S_k + e_k`` would give t - 1 colluders the collective key's error through the Lagrange
coefficients' denominators: SECURITY.md). Does not guarantee: that a
dealer dealt shares of its own ``s_i`` (no verifiable secret sharing over RLWE here; MTBH's
model for set-up is passive): a dealer that deals inconsistent shares makes the collective key
undecryptable -- the first decryption's canary check fails (IntegrityError) -- but cannot make
it open anything but sums (the aggregate check of :mod:`.threshold_check` is unchanged). Every
holder must complete the re-share: set-up is all-holders, decryption then needs any t.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from clinograph.core.errors import ClinographError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.labels import KDF_THRESHOLD_CKKS_PAIR_SEED, KDF_THRESHOLD_CKKS_RESHARE

from ..hazmat.ckks_context import pack_fields
from ..hazmat.ckks_keywrap import shared_key, unwrap, wrap, x25519_public_bytes
from ..hazmat.x25519 import check_public
from ..wire import open_envelope, parse_envelope, seal
from .threshold import CollectivePublicKey, ThresholdParty
from .threshold_messages import ReshareDeal, ReshareKey, ThresholdKeyShare


def _context(*, federation_id: str, dealer: str, recipient: str, index: int, threshold: int, digest: str) -> bytes:
    return pack_fields([federation_id.encode(), dealer.encode(), recipient.encode(), str(index).encode(),
                        str(threshold).encode(), digest.encode()])


def check_reshare_key(msg: ReshareKey) -> None:
    """ProtocolError naming the holder unless its re-share X25519 key is usable: 32 bytes, not a
    low-order point (every agreement with one is the all-zero secret, which ``cryptography``
    refuses at the first wrap, so the holder's peers failed with a bare ValueError that blamed
    them all, not it)."""
    try:
        check_public(msg.x25519)
    except ValueError:
        raise ProtocolError(f"The re-share X25519 key of {msg.party!r} is a low-order point (every key agreement with "
                            "it is zero): refused; it cannot hold a t-of-N key share.") from None


class Resharer:
    """One holder's side of the re-share: its X25519 key, its deals, and adopting ``S_k``."""

    def __init__(self, *, identity: Identity, party: ThresholdParty, threshold: int, seed_sha256: str):
        self.identity, self.party, self.threshold = identity, party, threshold
        self._kx: X25519PrivateKey | None = X25519PrivateKey.generate()
        self._keys: dict[str, ReshareKey] = {}
        self.key = ReshareKey(federation_id=party.federation_id, party=identity.name, seed_sha256=seed_sha256,
                              threshold=threshold, x25519=x25519_public_bytes(self._kx))

    def __repr__(self) -> str:
        return f"Resharer(hospital={self.identity.name!r}, threshold={self.threshold})"

    def deals(self, *, public: CollectivePublicKey, keys: Mapping[str, bytes],
              peers: Mapping[str, PublicIdentity]) -> dict[str, bytes]:
        """``deal/<k>`` for every holder k: this holder's signed, wrapped ``f_i(k)``. ``keys``: each
        holder's signed ReshareKey (as relayed); one must be there, for this seed and t, per holder."""
        holders = public.holders
        if not 1 <= self.threshold <= len(holders):
            raise ProtocolError(f"t-of-N with t = {self.threshold} but {len(holders)} key holder(s).")
        opened = self._keys = {}
        for name in holders:
            if name not in peers or name not in keys:
                raise ProtocolError(f"No re-share key from holder {name!r}: every holder must take part (t-of-N).")
            msg = open_envelope(parse_envelope(keys[name]), sender=peers[name], model=ReshareKey)
            if (msg.party, msg.federation_id, msg.seed_sha256, msg.threshold) != (
                    name, public.federation_id, self.key.seed_sha256, self.threshold):
                raise ProtocolError(f"The re-share key of {name!r} is for another party, federation, key or t.")
            check_reshare_key(msg)
            opened[name] = msg
        out = {}
        for index, (name, poly) in enumerate(self.party.deal(threshold=self.threshold, holders=holders).items(), 1):
            ctx = _context(federation_id=public.federation_id, dealer=self.identity.name, recipient=name, index=index,
                           threshold=self.threshold, digest=public.digest)
            eph, nonce, ct = wrap(np.ascontiguousarray(poly, dtype="<u8").tobytes(),
                                  recipient_public=opened[name].x25519, label=KDF_THRESHOLD_CKKS_RESHARE, context=ctx)
            msg = ReshareDeal(federation_id=public.federation_id, dealer=self.identity.name, recipient=name,
                              index=index, threshold=self.threshold, public_key_digest=public.digest,
                              ephemeral=eph, nonce=nonce, wrapped=ct)
            out[f"deal/{name}"] = seal(msg, self.identity)
        return out

    def adopt(self, *, public: CollectivePublicKey, deals: Mapping[str, bytes],
              peers: Mapping[str, PublicIdentity]) -> bytes:
        """Unwrap one deal from every holder (``deal/<dealer>``), adopt ``S_k``, and answer the
        signed :class:`ThresholdKeyShare`. Raises ProtocolError / IntegrityError for a missing or
        bad deal (naming its dealer); the X25519 key is erased after (set-up only)."""
        if self._kx is None:
            raise ProtocolError(f"Hospital {self.identity.name!r} has already adopted its t-of-N key share.")
        holders, me = public.holders, self.identity.name
        index = holders.index(me) + 1
        ring = public._c.ring
        received = []
        for dealer in holders:
            raw = deals.get(f"deal/{dealer}")
            if raw is None or dealer not in peers:
                raise ProtocolError(f"No re-share deal from holder {dealer!r} for {me!r}: every holder must deal.")
            msg = open_envelope(parse_envelope(raw), sender=peers[dealer], model=ReshareDeal)
            if (msg.dealer, msg.recipient, msg.index, msg.threshold, msg.public_key_digest, msg.federation_id) != (
                    dealer, me, index, self.threshold, public.digest, public.federation_id):
                raise ProtocolError(f"The re-share deal of {dealer!r} names another recipient, index, t or key.")
            ctx = _context(federation_id=public.federation_id, dealer=dealer, recipient=me, index=index,
                           threshold=self.threshold, digest=public.digest)
            try:
                plain = unwrap(msg.wrapped, recipient=self._kx, ephemeral_public=msg.ephemeral, nonce=msg.nonce,
                               label=KDF_THRESHOLD_CKKS_RESHARE, context=ctx)
            except ValueError:
                raise ProtocolError(f"The re-share deal of {dealer!r} does not open under {me!r}'s key.") from None
            received.append(public._c.poly(plain, len(ring.primes), f"re-share deal of {dealer!r}"))
        seeds = {}
        for other in holders:
            if other == me:
                continue
            if other not in self._keys:
                raise ProtocolError(f"No re-share key of {other!r} was checked by {me!r}: deal first.")
            pair = pack_fields([public.federation_id.encode(), public.digest.encode(), *(n.encode() for n in sorted((me, other)))])
            seeds[other] = shared_key(self._kx, self._keys[other].x25519, label=KDF_THRESHOLD_CKKS_PAIR_SEED,
                                      context=pair)
        self._kx = None
        self.party.adopt(threshold=self.threshold, holders=holders, received=received, pair_seeds=seeds)
        msg = ThresholdKeyShare(federation_id=public.federation_id, party=me, index=index, threshold=self.threshold,
                                public_key_digest=public.digest)
        return seal(msg, self.identity)


def collect_share_keys(answers: Mapping[str, Mapping[str, bytes]], *, holders: Sequence[str],
                       enrolled: Mapping[str, PublicIdentity]) -> tuple[dict[str, ThresholdKeyShare], dict[str, str]]:
    """The server's reading of ``tckks/reshare`` answers: each holder's checked share key, and why
    the others failed."""
    out: dict[str, ThresholdKeyShare] = {}
    failed: dict[str, str] = {}
    for name in holders:
        try:
            out[name] = open_envelope(parse_envelope(answers.get(name, {}).get("share", b"")), sender=enrolled[name],
                                      model=ThresholdKeyShare)
        except ClinographError as exc:
            failed[name] = str(exc)
    return out, failed


def in_process_reshare(parties: Mapping[str, ThresholdParty], public: CollectivePublicKey, *, threshold: int) -> None:
    """The re-share of one process holding every party (tests, benchmarks): each party deals to
    every holder and adopts, with a fresh random pairwise seed for each pair (the relayed set-up
    derives them by X25519 instead); ``public`` records t. Nothing is wrapped: no transport."""
    import os

    holders = public.holders
    if set(parties) != set(holders):
        raise ProtocolError("in_process_reshare needs every holder's party.")
    deals = {name: parties[name].deal(threshold=threshold, holders=holders) for name in holders}
    seeds = {frozenset((a, b)): os.urandom(32) for a in holders for b in holders if a < b}
    for k in holders:
        parties[k].adopt(threshold=threshold, holders=holders, received=[deals[i][k] for i in holders],
                         pair_seeds={o: seeds[frozenset((k, o))] for o in holders if o != k})
    public.adopt_threshold(threshold=threshold, shares={
        k: ThresholdKeyShare(federation_id=public.federation_id, party=k, index=i + 1, threshold=threshold,
                             public_key_digest=public.digest) for i, k in enumerate(holders)})
