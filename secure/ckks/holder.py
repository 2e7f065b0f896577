"""A hospital's part of the CKKS key ceremony, answered over any transport.

The ceremony (:func:`clinograph.secure.ckks.relayed.run_ckks_ceremony`) is relayed by the server
as ``setup`` steps; the server only ever carries sealed messages it cannot open (the key
packages are wrapped to each recipient's fresh X25519 key and signed by the dealer) and ends
with the public context, which holds no secret key.

=================  =========================================  ==============================
step               parts in                                   parts out
=================  =========================================  ==============================
``ckks/deal``      ``federation``, ``preset``                  ``context`` (sealed, no key)
``ckks/request``   ``federation``                              ``request`` (signed)
``ckks/wrap``      ``request/<hospital>`` per recipient        ``package/<hospital>``
``ckks/unwrap``    ``package``, ``dealer``                     nothing
=================  =========================================  ==============================
"""

from __future__ import annotations

from collections.abc import Mapping

from clinograph.core.errors import ProtocolError
from clinograph.core.identity import Identity, PublicIdentity

from .keys import CkksKeyDealer, CkksKeyring, CkksRecipientKey
from .presets import CkksPreset
from .threshold_relayed import STEPS as THRESHOLD_STEPS
from .threshold_relayed import ThresholdKeyHolder

STEPS = ("ckks/deal", "ckks/request", "ckks/wrap", "ckks/unwrap")


class CkksKeyHolder:
    """Answers the ceremony's steps for one hospital and then holds its keyring."""

    def __init__(self, *, identity: Identity, peers: Mapping[str, PublicIdentity], federation_id: str,
                 tckks_threshold: int | None = None):
        """``tckks_threshold``: the smallest t this hospital accepts for a ``ckks_threshold`` key
        (its ``[release] tckks_threshold``); None: N-of-N only."""
        self.identity = identity
        self.peers = dict(peers)
        self.federation_id = federation_id
        self.keyring: CkksKeyring | None = None
        self._dealer: CkksKeyDealer | None = None
        self._recipient: CkksRecipientKey | None = None
        #: the ``ckks_threshold`` mode's key share (its ``tckks/*`` set-up steps)
        self.threshold = ThresholdKeyHolder(identity=identity, server=None, federation_id=federation_id, peers=peers,
                                            min_threshold=tckks_threshold)

    def __repr__(self) -> str:
        return f"CkksKeyHolder(hospital={self.identity.name!r}, keyring={'held' if self.keyring else 'none'})"

    def _check_federation(self, parts: Mapping[str, bytes]) -> None:
        fid = parts.get("federation", b"").decode("utf-8", errors="replace")
        if fid != self.federation_id:
            raise ProtocolError(f"CKKS ceremony for federation {fid[:64]!r}, but hospital {self.identity.name!r} "
                                f"is enrolled in {self.federation_id!r}.")

    def on_setup(self, step: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """Answer one ceremony step (see the module table; ``tckks/*``: the threshold key holder's)."""
        if step in THRESHOLD_STEPS:
            return self.threshold.on_setup(step, parts)
        if step == "ckks/deal":
            self._check_federation(parts)
            try:
                preset = CkksPreset(parts.get("preset", b"").decode("ascii", errors="replace"))
            except ValueError:
                raise ProtocolError(f"Unknown CKKS preset; known: {', '.join(p.value for p in CkksPreset)}.") from None
            self._dealer = CkksKeyDealer.create(preset=preset, identity=self.identity, federation_id=self.federation_id)
            self.keyring = self._dealer.keyring()
            return {"context": self._dealer.public_context()}
        if step == "ckks/request":
            self._check_federation(parts)
            self._recipient = CkksRecipientKey.generate(identity=self.identity, federation_id=self.federation_id)
            return {"request": self._recipient.request()}
        if step == "ckks/wrap":
            if self._dealer is None:
                raise ProtocolError(f"Hospital {self.identity.name!r} was asked to wrap CKKS keys but is not the dealer.")
            out: dict[str, bytes] = {}
            for key, request in parts.items():
                name = key.removeprefix("request/")
                if not key.startswith("request/") or name not in self.peers or name == self.identity.name:
                    raise ProtocolError(f"CKKS wrap step names {name[:64]!r}, which is not another enrolled hospital.")
                out[f"package/{name}"] = self._dealer.wrap_for(request=request, requester=self.peers[name])
            return out
        if step == "ckks/unwrap":
            dealer = parts.get("dealer", b"").decode("utf-8", errors="replace")
            if self._recipient is None or dealer not in self.peers:
                raise ProtocolError("CKKS unwrap step without a request from this hospital, or from an unknown dealer.")
            self.keyring = CkksKeyring.unwrap(package=parts.get("package", b""), recipient_key=self._recipient,
                                              dealer=self.peers[dealer])
            self._recipient = None
            return {}
        raise ProtocolError(f"Unknown set-up step {step[:64]!r}; expected one of "
                            f"{', '.join(STEPS + THRESHOLD_STEPS)}.")
