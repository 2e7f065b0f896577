"""Signed envelopes: the only way a message crosses the boundary.

``seal`` serialises a message once and signs those exact bytes; ``open_envelope`` checks the
size, the signature over the bytes received (never a re-serialisation), the
sender and the kind, and only then parses the payload with the expected strict model.

Framing is binary, so the payload is not base64-encoded a second time::

    b"CGE1" | u8 len | sender | u8 len | kind | u32 len | payload (JSON) | signature (64)
"""

from __future__ import annotations

import hashlib
import struct
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

    def to_bytes(self) -> bytes:
        """The binary frame (see module docstring)."""
        s, k = self.sender.encode(), self.kind.encode()
        return (MAGIC + struct.pack(">B", len(s)) + s + struct.pack(">B", len(k)) + k
                + struct.pack(">I", len(self.payload)) + self.payload + self.signature)


MAGIC = b"CGE1"


def _signed_bytes(kind: str, payload: bytes) -> bytes:
    return kind.encode() + b"\x00" + payload


def seal(message: WireMessage, identity: Identity) -> bytes:
    """Serialise ``message``, sign it as ``identity`` and return the envelope's bytes."""
    kind = getattr(message, "kind", None)
    if not isinstance(kind, str):
        raise TypeError(f"{type(message).__name__} has no 'kind' and cannot be sent")
    payload = message.model_dump_json().encode()
    sig = identity.sign(_signed_bytes(kind, payload), context=SIG_MESSAGE)
    return Envelope(sender=identity.name, kind=kind, payload=payload, signature=sig).to_bytes()


def parse_envelope(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Envelope:
    """Parse the outer envelope (no signature check yet); truncation and trailing bytes are errors."""
    if len(data) > max_bytes:
        raise ProtocolError(f"Message of {len(data)} bytes exceeds the limit of {max_bytes} bytes.")
    if data[:4] != MAGIC:
        raise ProtocolError("Malformed envelope: not a Clinograph v1 envelope (bad magic).")
    pos = 4
    fields: list[bytes] = []
    try:
        for fmt in (">B", ">B", ">I"):
            size = struct.calcsize(fmt)
            (n,) = struct.unpack(fmt, data[pos:pos + size])
            pos += size
            if pos + n > len(data):
                raise struct.error("short")
            fields.append(data[pos:pos + n])
            pos += n
    except struct.error:
        raise ProtocolError(f"Malformed envelope: truncated ({len(data)} bytes).") from None
    signature = data[pos:]
    if len(signature) != 64:
        raise ProtocolError(f"Malformed envelope: truncated or trailing bytes (signature of {len(signature)} bytes).")
    try:
        return Envelope(sender=fields[0].decode(), kind=fields[1].decode(), payload=fields[2], signature=signature)
    except (UnicodeDecodeError, ValidationError) as exc:
        raise ProtocolError(f"Malformed envelope header: {type(exc).__name__}.") from None


def verify_envelope(envelope: Envelope, *, sender: PublicIdentity) -> None:
    """Raise IntegrityError unless ``sender`` signed this envelope's kind and payload bytes."""
    if envelope.sender != sender.name:
        raise IntegrityError(f"Envelope claims sender {envelope.sender!r} but is checked against {sender.name!r}.")
    sender.verify(envelope.signature, _signed_bytes(envelope.kind, envelope.payload), context=SIG_MESSAGE)


def open_envelope(envelope: Envelope, *, sender: PublicIdentity, model: type[M]) -> M:
    """Verify ``envelope`` was signed by ``sender`` and parse it as ``model``."""
    verify_envelope(envelope, sender=sender)
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
