"""Checking the signed envelopes kept as artefacts (hospital reports, the server's plans).

The signature check is wire.py's own (same signed bytes, same context), so the verifier
accepts exactly what the server's boundary accepted.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from clinograph.core.errors import ClinographError, IntegrityError
from clinograph.core.identity import PublicIdentity

from ..wire import Envelope, parse_envelope, verify_envelope

Status = Literal["valid", "invalid", "unknown_sender"]


def keys_from(payload: dict[str, Any]) -> dict[str, PublicIdentity]:
    """Name -> key for the server and every hospital of a manifest or audit_open payload."""
    keys: dict[str, PublicIdentity] = {}
    for name, b64 in (payload.get("hospitals") or {}).items():
        keys[name] = PublicIdentity(name, base64.b64decode(b64))
    server = payload.get("server") or {}
    if "name" in server:
        keys[server["name"]] = PublicIdentity(server["name"], base64.b64decode(server["public_key"]))
    return keys


def signature_status(envelope: Envelope, keys: dict[str, PublicIdentity]) -> Status:
    """Whether the envelope's sender signature verifies under the enrolled key."""
    key = keys.get(envelope.sender)
    if key is None:
        return "unknown_sender"
    try:
        verify_envelope(envelope, sender=key)
    except IntegrityError:
        return "invalid"
    return "valid"


def parse_stored(data: bytes, *, what: str) -> Envelope:
    """Parse a stored envelope, turning any failure into :class:`IntegrityError`."""
    try:
        return parse_envelope(data)
    except ClinographError as exc:
        raise IntegrityError(f"{what} is not a valid envelope: {exc}") from None
