"""Signed envelopes: the only way a message crosses the boundary.

``seal`` serialises a message once and signs those exact bytes; ``open_envelope`` checks the
size, the signature over the bytes received (never a re-serialisation, house style 8), the
sender and the kind, and only then parses the payload with the expected strict model.
"""

from __future__ import annotations

import hashlib
from typing import TypeVar

from pydantic import Field, ValidationError

from .errors import IntegrityError, ProtocolError
from .hazmat.labels import SIG_MESSAGE
from .identity import Identity, PublicIdentity
from .messages import ID_PATTERN, MAX_MESSAGE_BYTES, WireMessage

M = TypeVar("M", bound=WireMessage)


class Envelope(WireMessage):
    """``payload`` is the message's JSON bytes; ``signature`` covers kind and payload."""

    sender: str = Field(pattern=ID_PATTERN)
    kind: str = Field(max_length=64)
    payload: bytes
    signature: bytes = Field(min_length=64, max_length=64)

    def digest(self) -> str:
        """SHA-256 of the payload bytes (what the audit log references)."""
        return hashlib.sha256(self.payload).hexdigest()


def _signed_bytes(kind: str, payload: bytes) -> bytes:
    return kind.encode() + b"\x00" + payload


def seal(message: WireMessage, identity: Identity) -> bytes:
    """Serialise ``message``, sign it as ``identity`` and return the envelope's bytes."""
    kind = getattr(message, "kind", None)
    if not isinstance(kind, str):
        raise TypeError(f"{type(message).__name__} has no 'kind' and cannot be sent")
    payload = message.model_dump_json().encode()
    sig = identity.sign(_signed_bytes(kind, payload), context=SIG_MESSAGE)
    return Envelope(sender=identity.name, kind=kind, payload=payload, signature=sig).model_dump_json().encode()


def parse_envelope(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Envelope:
    """Parse the outer envelope (no signature check yet)."""
    if len(data) > max_bytes:
        raise ProtocolError(f"Message of {len(data)} bytes exceeds the limit of {max_bytes} bytes.")
    try:
        return Envelope.model_validate_json(data)
    except ValidationError as exc:
        raise ProtocolError(f"Malformed envelope: {exc.error_count()} error(s), first: "
                            f"{exc.errors()[0]['loc']} {exc.errors()[0]['msg']}.") from None


def open_envelope(envelope: Envelope, *, sender: PublicIdentity, model: type[M]) -> M:
    """Verify ``envelope`` was signed by ``sender`` and parse it as ``model``."""
    if envelope.sender != sender.name:
        raise IntegrityError(f"Envelope claims sender {envelope.sender!r} but is checked against {sender.name!r}.")
    sender.verify(envelope.signature, _signed_bytes(envelope.kind, envelope.payload), context=SIG_MESSAGE)
    expected = model.model_fields["kind"].default
    if envelope.kind != expected:
        raise ProtocolError(f"Wrong stage: expected a {expected!r} message, got {envelope.kind!r}.")
    try:
        msg = model.model_validate_json(envelope.payload)
    except ValidationError as exc:
        raise ProtocolError(f"Malformed {expected!r} payload: {exc.error_count()} error(s), first: "
                            f"{exc.errors()[0]['loc']} {exc.errors()[0]['msg']}.") from None
    if getattr(msg, "kind", None) != envelope.kind:
        raise ProtocolError("Envelope kind and payload kind differ.")
    return msg
