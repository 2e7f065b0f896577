"""Threshold CKKS relayed by the server over any transport: collective key generation as
``setup`` steps, and the collective decryption of one aggregate. Not yet a secure mode (no
round protocol, journal or report uses it); this is the part that a mode's set-up will call.

=====================  =======================================  ================================
step                   parts in                                 parts out
=====================  =======================================  ================================
``tckks/keygen``       ``federation``, ``preset``, ``seed``      ``share`` (signed KeyGenShare)
``tckks/decrypt``      ``request`` (signed by the server)        ``share`` (signed DecryptionShare)
=====================  =======================================  ================================

Who holds what: each hospital's :class:`ThresholdKeyHolder` keeps its secret share; the server
keeps the :class:`~.threshold.CollectivePublicKey` (public) and, while it opens an aggregate, the
:class:`~.threshold.Combiner` (the aggregate's ``c0`` and the canary's secret ``u``); it learns
the sum. Every message is a signed envelope checked against the enrolled identity. Dropout: the
key holders are the hospitals that answered key generation; a holder that does not answer a
decryption stops it (N-of-N) -- :func:`open_aggregate` raises a ProtocolError naming it, and the
recovery is to run :func:`run_threshold_keygen` again without it and redo the round.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from clinograph.core.errors import ClinographError, ProtocolError
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

if TYPE_CHECKING:  # only the annotation needs the runtime's transport
    from ..runtime.transport import Transport

STEPS = ("tckks/keygen", "tckks/decrypt")


class ThresholdKeyHolder:
    """Answers the threshold steps for one hospital and then holds its secret share."""

    def __init__(self, *, identity: Identity, server: PublicIdentity, federation_id: str):
        self.identity, self.server, self.federation_id = identity, server, federation_id
        self.party: ThresholdParty | None = None

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
            self.party = ThresholdParty(preset=preset, federation_id=fid, name=self.identity.name)
            return {"share": seal(self.party.keygen_share(seed=parts.get("seed", b"")), self.identity)}
        if step == "tckks/decrypt":
            if self.party is None:
                raise ProtocolError(f"Hospital {self.identity.name!r} holds no threshold key share.")
            request = open_envelope(parse_envelope(parts.get("request", b"")), sender=self.server,
                                    model=DecryptionRequest)
            return {"share": seal(self.party.decryption_share(request), self.identity)}
        raise ProtocolError(f"Unknown set-up step {step[:64]!r}; expected one of {', '.join(STEPS)}.")


def run_threshold_keygen(transport: Transport, *, federation_id: str, participants: Sequence[str],
                         enrolled: Mapping[str, PublicIdentity], preset: ThresholdPreset,
                         min_holders: int) -> tuple[CollectivePublicKey, tuple[str, ...]]:
    """Collective key generation over ``transport``; returns the public key and its holders.

    Raises:
        ProtocolError: fewer than ``min_holders`` hospitals answered with a valid share.
    """
    seed = secrets.token_bytes(32)  # public: it only fixes the common polynomial a
    names = tuple(sorted(set(participants) & set(enrolled)))
    answers, _ = transport.exchange("setup", {n: {"step": b"tckks/keygen", "federation": federation_id.encode(),
                                                  "preset": preset.value.encode(), "seed": seed} for n in names},
                                    round_=0)
    shares: dict[str, KeyGenShare] = {}
    for name, parts in sorted(answers.items()):
        try:
            shares[name] = open_envelope(parse_envelope(parts.get("share", b"")), sender=enrolled[name],
                                         model=KeyGenShare)
        except ClinographError:
            continue  # not a holder: the key is generated among the others
    if len(shares) < max(min_holders, 1):
        raise ProtocolError(f"Threshold key generation: only {len(shares)} hospital(s) answered "
                            f"({', '.join(sorted(shares)) or 'none'}); the federation needs {min_holders}.")
    public = CollectivePublicKey(preset=preset, federation_id=federation_id, seed=seed, shares=shares)
    return public, public.holders


def open_aggregate(transport: Transport, *, combiner: Combiner, identity: Identity,
                   enrolled: Mapping[str, PublicIdentity], length: int) -> np.ndarray:
    """Ask every key holder for its decryption share of ``combiner``'s request and combine.

    Raises:
        ProtocolError: a holder gave no valid share (re-run key generation without it).
        IntegrityError: a share fails the canary check (the holder is named) or corrupts the sum.
    """
    holders = combiner.public.holders
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
                            "Threshold CKKS is N-of-N: re-run key generation without them and redo the round.")
    return combiner.combine(shares, length=length)
