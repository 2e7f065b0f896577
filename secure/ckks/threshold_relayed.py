"""Threshold CKKS relayed by the server over any transport: collective key generation as
``setup`` steps, and the collective decryption of one aggregate. The ``ckks_threshold`` mode's
set-up (:mod:`.threshold_setup`) runs the key generation here; its rounds decrypt through their
own checked stage (:mod:`.threshold_client`), and its hospitals refuse ``tckks/decrypt``.

=====================  =======================================  ================================
step                   parts in                                 parts out
=====================  =======================================  ================================
``tckks/keygen``       ``federation``, ``preset``, ``seed``,     ``share`` (signed KeyGenShare)
                       ``min_contributors``
``tckks/public``       ``seed``, ``share/<holder>`` (each       ``digest`` (of the collective key
                       holder's signed KeyGenShare)             it rebuilt and checked)
``tckks/decrypt``      ``request`` (signed by the server)        ``share`` (signed DecryptionShare)
``tckks/reshare``      ``deal/<dealer>`` (each holder's          ``share`` (signed
                       signed, wrapped Shamir share)            ThresholdKeyShare)
=====================  =======================================  ================================

t-of-N (``threshold`` given): ``tckks/keygen`` also carries ``threshold`` and answers ``kx`` (a
signed :class:`~.threshold_messages.ReshareKey`); ``tckks/public`` also carries every holder's
``kx/<holder>`` and answers ``deal/<holder>`` for each (:mod:`.threshold_reshare`); then
``tckks/reshare`` hands each holder its deals and gets its share key back.

``tckks/public`` (``distribute=True``, what the ``ckks_threshold`` mode runs) gives every holder
the collective public key (whose digest every round names, and whose shares ``p0_i`` check the
canary): each holder rebuilds it from the holders' *signed* shares, checks its own share is in it
unchanged, and answers the key's digest, so a server cannot substitute a key it chose. ``tckks/decrypt`` decrypts whatever ``c1``
the server sends; the mode's round protocol (:mod:`.threshold_client`) instead checks first that
it is the aggregate of enough signed contributions.

Who holds what: each hospital's :class:`ThresholdKeyHolder` keeps its secret share; the server
keeps the :class:`~.threshold.CollectivePublicKey` (public) and, while it opens an aggregate, the
:class:`~.threshold.Combiner` (the aggregate's ``c0`` and the canary's secret ``u``); it learns
the sum. Every message is a signed envelope checked against the enrolled identity. Dropout: the
key holders are the hospitals that answered key generation; a holder that does not answer a
decryption stops it (N-of-N) -- :func:`open_aggregate` raises a ProtocolError naming it, and the
recovery is to run :func:`run_threshold_keygen` again without it and redo the round.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from clinograph.core.errors import ClinographError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity

from ..wire import open_envelope, parse_envelope, seal
from .threshold import (
    CollectivePublicKey,
    Combiner,
    DecryptionRequest,
    DecryptionShare,
    KeyGenShare,
    ThresholdParty,
    ThresholdPreset,
)
from .threshold_messages import ReshareKey
from .threshold_reshare import Resharer, check_reshare_key, collect_share_keys

if TYPE_CHECKING:  # only the annotation needs the runtime's transport
    from ..runtime.transport import Transport

STEPS = ("tckks/keygen", "tckks/public", "tckks/decrypt", "tckks/reshare")
#: a sum of one contribution is that contribution: no key holder helps open one, whatever it is told
MIN_CONTRIBUTORS = 2


class ThresholdKeyHolder:
    """Answers the threshold steps for one hospital and then holds its secret share."""

    def __init__(self, *, identity: Identity, server: PublicIdentity | None, federation_id: str,
                 peers: Mapping[str, PublicIdentity] | None = None, min_threshold: int | None = None):
        """``min_threshold``: the hospital's own rule for a re-shared key -- the smallest t it
        accepts (its ``[release] tckks_threshold``), or None: N-of-N only (t must be the number of
        holders). The server proposes t; a lower one is refused, because the server with t - 1
        colluding holders can open any set of t hospitals' sum."""
        self.identity, self.server, self.federation_id = identity, server, federation_id
        self.min_threshold = min_threshold
        self.peers = dict(peers or {})
        self.party: ThresholdParty | None = None
        #: the collective public key, once ``tckks/public`` gave it (and this holder checked it)
        self.public: CollectivePublicKey | None = None
        self._mine: KeyGenShare | None = None
        #: the fewest signed contributions a sum must have before this holder helps open it, fixed
        #: at key generation and never below MIN_CONTRIBUTORS (a later plan can only raise it)
        self.min_contributors = MIN_CONTRIBUTORS
        #: t-of-N: the re-share in progress (None under N-of-N)
        self._resharer: Resharer | None = None

    def __repr__(self) -> str:
        return (f"ThresholdKeyHolder(hospital={self.identity.name!r}, "
                f"secret_share={'held' if self.party else 'none'})")

    def on_setup(self, step: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """Answer one step (see the module table)."""
        if step == "tckks/keygen":
            fid = parts.get("federation", b"").decode("utf-8", errors="replace")
            if fid != self.federation_id:
                raise ProtocolError(f"Threshold key generation for federation {fid[:64]!r}, but hospital "
                                    f"{self.identity.name!r} is enrolled in {self.federation_id!r}.")
            try:
                preset = ThresholdPreset(parts.get("preset", b"").decode("ascii", errors="replace"))
            except ValueError:
                raise ProtocolError("Unknown threshold CKKS preset; known: "
                                    f"{', '.join(p.value for p in ThresholdPreset)}.") from None
            try:
                asked = int(parts.get("min_contributors", b"2").decode("ascii", errors="replace"))
            except ValueError:
                raise ProtocolError("Threshold key generation: min_contributors is not a whole number.") from None
            self.min_contributors = max(MIN_CONTRIBUTORS, asked)
            self.party = ThresholdParty(preset=preset, federation_id=fid, name=self.identity.name)
            self.public, self._mine = None, self.party.keygen_share(seed=parts.get("seed", b""))
            out = {"share": seal(self._mine, self.identity)}
            self._resharer = None
            if "threshold" in parts:
                try:
                    t = int(parts["threshold"].decode("ascii", errors="replace"))
                except ValueError:
                    raise ProtocolError("Threshold key generation: threshold is not a whole number.") from None
                if not 2 <= t <= preset.max_parties:  # t = 1: every holder's Shamir share would be the key itself
                    raise ProtocolError(f"Threshold key generation: t = {t} is outside 2..{preset.max_parties} "
                                        "(at t = 1 every holder would hold the whole key).")
                if self.min_threshold is not None and t < self.min_threshold:
                    raise ProtocolError(self._below_rule(t, f"at least {self.min_threshold}"))
                self._resharer = Resharer(identity=self.identity, party=self.party, threshold=t,
                                          seed_sha256=self._mine.seed_sha256)
                out["kx"] = seal(self._resharer.key, self.identity)
            return out
        if step == "tckks/public":
            digest = self._accept_public(parts)
            if self._resharer is None or self.public is None:
                return {"digest": digest.encode()}
            n = len(self.public.holders)
            if self.min_threshold is None and self._resharer.threshold != n:  # the holders are known only now
                raise ProtocolError(self._below_rule(self._resharer.threshold, f"N-of-N (t = {n})"))
            keys = {k.removeprefix("kx/"): v for k, v in parts.items() if k.startswith("kx/")}
            return {"digest": digest.encode(), **self._resharer.deals(public=self.public, keys=keys, peers=self.peers)}
        if step == "tckks/reshare":
            if self._resharer is None or self.public is None:
                raise ProtocolError(f"Hospital {self.identity.name!r} is in no t-of-N key generation.")
            return {"share": self._resharer.adopt(public=self.public, deals=parts, peers=self.peers)}
        if step == "tckks/decrypt":
            if self.server is None:  # a mode's holder: it decrypts only in a round, after checking the aggregate
                raise ProtocolError(f"Hospital {self.identity.name!r} answers no unchecked decryption request: under "
                                    "ckks_threshold it decrypts only the aggregate of a round, after checking it.")
            if self.party is None:
                raise ProtocolError(f"Hospital {self.identity.name!r} holds no threshold key share.")
            request = open_envelope(parse_envelope(parts.get("request", b"")), sender=self.server,
                                    model=DecryptionRequest)
            return {"share": seal(self.party.decryption_share(request), self.identity)}
        raise ProtocolError(f"Unknown set-up step {step[:64]!r}; expected one of {', '.join(STEPS)}.")

    def _below_rule(self, t: int, rule: str) -> str:
        return (f"Hospital {self.identity.name!r} refuses a threshold key with t = {t}: its own rule is {rule} "
                "(hospital.toml [release] tckks_threshold; unset: N-of-N). The server with t - 1 colluding key holders "
                "could open the sum of any t hospitals, one honest update among them. Fix: if the consortium agreed "
                f"on t-of-N, write [release] tckks_threshold = {t} at every hospital; else drop [federation] "
                "tckks_threshold in server.toml.")

    def _accept_public(self, parts: Mapping[str, bytes]) -> str:
        """Rebuild the collective key from the holders' signed shares; check this holder's is in it."""
        if self.party is None or self._mine is None:
            raise ProtocolError(f"Hospital {self.identity.name!r} made no threshold key-generation share.")
        shares: dict[str, KeyGenShare] = {}
        for key, raw in parts.items():
            name = key.removeprefix("share/")
            if not key.startswith("share/") or name not in self.peers:
                continue  # only "seed" and the holders' shares are read
            shares[name] = open_envelope(parse_envelope(raw), sender=self.peers[name], model=KeyGenShare)
        mine = shares.get(self.identity.name)
        if mine is None or mine.p0 != self._mine.p0 or mine.seed_sha256 != self._mine.seed_sha256:
            raise IntegrityError(f"The collective key offered to {self.identity.name!r} does not contain its own "
                                 "key-generation share unchanged: refused (report the server).")
        self.public = CollectivePublicKey(preset=self.party.preset, federation_id=self.federation_id,
                                          seed=parts.get("seed", b""), shares=shares)
        return self.public.digest


def run_threshold_keygen(transport: Transport, *, federation_id: str, participants: Sequence[str],
                         enrolled: Mapping[str, PublicIdentity], preset: ThresholdPreset,
                         min_holders: int, distribute: bool = False,
                         min_contributors: int = MIN_CONTRIBUTORS,
                         threshold: int | None = None) -> tuple[CollectivePublicKey, tuple[str, ...]]:
    """Collective key generation over ``transport``; returns the public key and its holders.
    ``distribute``: then give every holder the key (step ``tckks/public``) and check its digest.
    ``min_contributors``: the floor each holder keeps for the sums it helps open (at least 2).
    ``threshold``: t-of-N -- every holder re-shares its key share (:mod:`.threshold_reshare`;
    needs ``distribute``); None: N-of-N.

    Raises:
        ProtocolError: fewer than ``min_holders`` hospitals answered with a valid share, or (with
            ``distribute``) a holder did not confirm the collective key, or (t-of-N) a holder did
            not complete the re-share, or t exceeds the holders.
    """
    seed = secrets.token_bytes(32)  # public: it only fixes the common polynomial a
    names = tuple(sorted(set(participants) & set(enrolled)))
    step = {"step": b"tckks/keygen", "federation": federation_id.encode(), "preset": preset.value.encode(),
            "seed": seed, "min_contributors": str(min_contributors).encode()}
    if threshold is not None:
        if not distribute:
            raise ProtocolError("t-of-N threshold key generation re-shares over the holders: it needs distribute=True.")
        step["threshold"] = str(threshold).encode()
    answers, refused = transport.exchange("setup", {n: dict(step) for n in names}, round_=0)
    shares: dict[str, KeyGenShare] = {}
    signed: dict[str, bytes] = {}
    for name, parts in sorted(answers.items()):
        try:
            shares[name] = open_envelope(parse_envelope(parts.get("share", b"")), sender=enrolled[name],
                                         model=KeyGenShare)
            signed[f"share/{name}"] = parts["share"]
            if threshold is not None:
                # a re-share key every peer would refuse makes its holder no holder, not everyone's failure:
                # signed by it, for this federation, key seed and t, and not a low-order point
                kx = open_envelope(parse_envelope(parts["kx"]), sender=enrolled[name], model=ReshareKey)
                if (kx.party, kx.federation_id, kx.seed_sha256, kx.threshold) != (
                        name, federation_id, hashlib.sha256(seed).hexdigest(), threshold):
                    raise ProtocolError(f"The re-share key of {name!r} is for another party, federation, key or t.")
                check_reshare_key(kx)
                signed[f"kx/{name}"] = parts["kx"]
        except (ClinographError, KeyError):
            shares.pop(name, None)
            signed.pop(f"share/{name}", None)
            continue  # not a holder: the key is generated among the others
    if len(shares) < max(min_holders, 1, threshold or 1):
        why = "; ".join(f"{n}: {str(refused[n])[:300]}" for n in sorted(refused))
        raise ProtocolError(f"Threshold key generation: only {len(shares)} hospital(s) answered "
                            f"({', '.join(sorted(shares)) or 'none'}); the federation needs "
                            f"{max(min_holders, threshold or 1)}." + (f" Refused: {why}" if why else ""))
    public = CollectivePublicKey(preset=preset, federation_id=federation_id, seed=seed, shares=shares)
    if distribute:
        done, failed = transport.exchange("setup", {h: {"step": b"tckks/public", "seed": seed, **signed}
                                                    for h in public.holders}, round_=0)
        bad = sorted(h for h in public.holders if done.get(h, {}).get("digest") != public.digest.encode())
        if bad:
            raise ProtocolError(f"Threshold key generation: {', '.join(bad)} did not confirm the collective key "
                                f"({failed.get(bad[0], 'another digest')[:200]}). Every holder is needed at set-up.")
        if threshold is not None:
            _reshare(transport, public=public, done=done, enrolled=enrolled, threshold=threshold)
    return public, public.holders


def _reshare(transport: Transport, *, public: CollectivePublicKey, done: Mapping[str, Mapping[str, bytes]],
             enrolled: Mapping[str, PublicIdentity], threshold: int) -> None:
    """Relay every dealer's deal to its recipient (step ``tckks/reshare``) and record the holders'
    share keys on ``public``."""
    holders = public.holders
    deals = {k: {"step": b"tckks/reshare", **{f"deal/{i}": done[i].get(f"deal/{k}", b"") for i in holders}}
             for k in holders}
    answers, failed = transport.exchange("setup", deals, round_=0)
    keys, bad = collect_share_keys(answers, holders=holders, enrolled=enrolled)
    if bad:
        name = sorted(bad)[0]
        raise ProtocolError(f"Threshold key generation (t-of-N): {', '.join(sorted(bad))} did not adopt a key share "
                            f"({failed.get(name, bad[name])[:200]}). Every holder is needed at set-up.")
    public.adopt_threshold(threshold=threshold, shares=keys)


def open_aggregate(transport: Transport, *, combiner: Combiner, identity: Identity,
                   enrolled: Mapping[str, PublicIdentity], length: int) -> np.ndarray:
    """Ask every key holder for its decryption share of ``combiner``'s request and combine.

    Raises:
        ProtocolError: a holder gave no valid share (re-run key generation without it).
        IntegrityError: a share fails the canary check (the holder is named) or corrupts the sum.
    """
    holders = combiner.present
    request = seal(combiner.request, identity)
    answers, failed = transport.exchange("setup", {h: {"step": b"tckks/decrypt", "request": request}
                                                   for h in holders}, round_=combiner.round)
    shares: dict[str, DecryptionShare] = {}
    for name in holders:
        parts = answers.get(name)
        if parts is None:
            continue
        try:
            shares[name] = open_envelope(parse_envelope(parts.get("share", b"")), sender=enrolled[name],
                                         model=DecryptionShare)
        except ClinographError as exc:
            failed[name] = str(exc)
    if set(shares) != set(holders):
        missing = sorted(set(holders) - set(shares))
        raise ProtocolError(f"No valid decryption share from {', '.join(missing)} ({failed.get(missing[0], '')[:200]}). "
                            + ("Threshold CKKS is N-of-N: re-run key generation without them and redo the round."
                               if combiner.public.threshold is None else
                               f"Ask another {combiner.public.threshold} of the holders ({combiner.public.rule})."))
    return combiner.combine(shares, length=length)
