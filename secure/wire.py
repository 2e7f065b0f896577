"""Signed envelopes: the only way a message crosses the boundary.

``seal`` serialises a message once and signs those exact bytes; ``open_envelope`` checks the
size, the signature over the bytes received (never a re-serialisation), the
sender and the kind, and only then parses the payload with the expected strict model.

Framing is binary, so the payload is not base64-encoded a second time. A message without
:data:`~clinograph.secure.messages.Blob` fields travels as a v1 frame::

    b"CGE1" | u8 len | sender | u8 len | kind | u32 len | payload (JSON) | signature (64)

    signed: SIG_MESSAGE || kind || 0x00 || payload

A message with Blob fields (masked vectors, plaintext tensors, CKKS ciphertexts) travels as a
v2 frame: the JSON header names each blob by its attachment index (``{"attachment": i}``) and
the raw bytes follow, so an array costs its own size on the wire, not 4/3 of it::

    b"CGE2" | u8 len | sender | u8 len | kind | u32 len | payload (JSON)
            | u16 count | count x (u32 len | attachment bytes) | signature (64)

    signed: SIG_MESSAGE_ATTACHED || kind || 0x00 || payload || 0x00 || u16 count
            || SHA-256(attachment 0) || ... || SHA-256(attachment count-1)

The signature covers every attachment through its hash, computed over the bytes received:
a swapped, truncated, altered or reordered attachment fails verification, and an attachment
the payload does not reference is refused when the payload is parsed.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
from typing import TypeVar

from pydantic import Field, ValidationError

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.labels import SIG_MESSAGE, SIG_MESSAGE_ATTACHED

from .messages import ATTACHMENTS, ID_PATTERN, MAX_MESSAGE_BYTES, WireMessage

M = TypeVar("M", bound=WireMessage)

_ID = re.compile(ID_PATTERN)
MAGIC = b"CGE1"
MAGIC_ATTACHED = b"CGE2"
#: Most attachments one envelope may carry.
MAX_ATTACHMENTS = 65_535
#: Bytes of an Ed25519 signature.
SIGNATURE_BYTES = 64


class Envelope(WireMessage):
    """``payload`` is the message's JSON bytes, ``attachments`` its raw blobs; ``signature``
    covers kind, payload and the attachments' hashes (module docstring)."""

    sender: str = Field(pattern=ID_PATTERN)
    kind: str = Field(max_length=64)
    payload: bytes
    attachments: tuple[bytes, ...] = Field(default=(), max_length=MAX_ATTACHMENTS)
    signature: bytes = Field(min_length=SIGNATURE_BYTES, max_length=SIGNATURE_BYTES)

    @property
    def size(self) -> int:
        """Payload plus attachment bytes (what size limits apply to)."""
        attachments = self.attachments
        return len(self.payload) + sum(map(len, attachments)) if attachments else len(self.payload)

    def attachment_hashes(self) -> tuple[bytes, ...]:
        """SHA-256 of each attachment, computed once over the bytes held (a copy with other
        attachments recomputes them)."""
        attachments = self.attachments
        if not attachments:
            return ()
        memo = self._memo()
        cached = memo.get("hashes")
        if cached is None or cached[0] is not attachments:
            cached = memo["hashes"] = (attachments, tuple(hashlib.sha256(a).digest() for a in attachments))
        return cached[1]

    def digest(self) -> str:
        """What the audit log and replay checks reference: SHA-256 of the payload bytes (v1), or of
        the payload and the attachments' hashes (v2). Computed once (a server's replay check and
        its record of accepted messages both ask)."""
        memo = self._memo()
        cached = memo.get("digest")
        if cached is not None and cached[0] is self.payload and cached[1] is self.attachments:
            return cached[2]
        if not self.attachments:
            out = hashlib.sha256(self.payload).hexdigest()
        else:
            out = hashlib.sha256(self.payload + b"\x00" + b"".join(self.attachment_hashes())).hexdigest()
        memo["digest"] = (self.payload, self.attachments, out)
        return out

    def _memo(self) -> dict:
        """This envelope's memo of hashes (keyed on the field objects they hash), made on first
        use in pydantic's private slot: declared PrivateAttrs cost 1.4 us at every parse, paid
        also by the envelopes nobody hashes (a client's)."""
        memo = self.__pydantic_private__
        if memo is None:
            memo = {}
            object.__setattr__(self, "__pydantic_private__", memo)  # a cache, not a field: frozen stays true
        return memo

    def to_bytes(self) -> bytes:
        """The binary frame (see module docstring)."""
        return _frame(self.sender, self.kind, self.payload, self.attachments, self.signature)


def _frame(sender: str, kind: str, payload: bytes, attachments: tuple[bytes, ...], signature: bytes) -> bytes:
    """The v1 or v2 binary frame of the module docstring, joined once."""
    s, k = sender.encode(), kind.encode()
    head = struct.pack(">B", len(s)) + s + struct.pack(">B", len(k)) + k + struct.pack(">I", len(payload))
    if not attachments:
        return b"".join((MAGIC, head, payload, signature))
    parts = [MAGIC_ATTACHED, head, payload, struct.pack(">H", len(attachments))]
    for a in attachments:
        parts += (struct.pack(">I", len(a)), a)
    parts.append(signature)
    return b"".join(parts)


def signed_bytes(kind: str, payload: bytes, hashes: tuple[bytes, ...] | None = None) -> tuple[bytes, bytes]:
    """(signature context, bytes signed) for ``kind``, ``payload`` and the attachments' hashes.

    ``hashes`` None or empty: a v1 envelope (no attachments)."""
    if not hashes:
        return SIG_MESSAGE, kind.encode() + b"\x00" + payload
    return SIG_MESSAGE_ATTACHED, b"".join((kind.encode(), b"\x00", payload, b"\x00",
                                           struct.pack(">H", len(hashes)), *hashes))


@functools.lru_cache(maxsize=1024)
def _valid_sender(name: str) -> bool:
    """Whether ``name`` matches the envelope's sender pattern (a sealing identity's name: the
    same few a process, so checked once each)."""
    return _ID.fullmatch(name) is not None


def seal(message: WireMessage, identity: Identity) -> bytes:
    """Serialise ``message`` (Blob fields as attachments), sign it as ``identity`` and return
    the envelope's bytes."""
    kind = getattr(message, "kind", None)
    if not isinstance(kind, str):
        raise TypeError(f"{type(message).__name__} has no 'kind' and cannot be sent")
    blobs: list[bytes] = []
    payload = message.model_dump_json(context={ATTACHMENTS: blobs}).encode()
    if len(blobs) > MAX_ATTACHMENTS:
        raise ProtocolError(f"{kind!r} message has {len(blobs)} blobs; an envelope carries at most {MAX_ATTACHMENTS}.")
    if not _valid_sender(identity.name) or len(kind) > 64:  # what Envelope would refuse, without building one
        raise ProtocolError(f"Cannot seal a {kind[:64]!r} message as {identity.name[:64]!r}: invalid sender or kind.")
    context, data = signed_bytes(kind, payload, tuple(hashlib.sha256(b).digest() for b in blobs) if blobs else None)
    sig = identity.sign(data, context=context)
    return _frame(identity.name, kind, payload, tuple(blobs), sig)


_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def parse_envelope(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Envelope:
    """Parse the outer envelope (no signature check yet); truncation and trailing bytes are errors."""
    if len(data) > max_bytes:
        raise ProtocolError(f"Message of {len(data)} bytes exceeds the limit of {max_bytes} bytes.")
    data = bytes(data)  # no copy for bytes; each field below is one slice (one copy)
    magic, end = data[:4], len(data)
    if magic not in (MAGIC, MAGIC_ATTACHED):
        raise ProtocolError("Malformed envelope: not a Clinograph v1 envelope (bad magic).")
    attachments: list[bytes] = []
    try:  # a field cut short fails the next read (IndexError, struct.error) or a length check
        n = data[4]
        sender, pos = data[5:5 + n], 5 + n
        n = data[pos]
        kind, pos = data[pos + 1:pos + 1 + n], pos + 1 + n
        (n,) = _U32.unpack_from(data, pos)
        if pos + 4 + n > end:  # sender and kind lie before pos: complete once this length was read
            raise IndexError
        payload, pos = data[pos + 4:pos + 4 + n], pos + 4 + n
        if magic == MAGIC_ATTACHED:
            (count,) = _U16.unpack_from(data, pos)
            pos += 2
            if count == 0:
                raise ProtocolError("Malformed envelope: a v2 frame with no attachments.")
            for _ in range(count):
                (n,) = _U32.unpack_from(data, pos)
                if pos + 4 + n > end:
                    raise IndexError
                attachments.append(data[pos + 4:pos + 4 + n])
                pos += 4 + n
    except (IndexError, struct.error):
        raise ProtocolError(f"Malformed envelope: truncated ({len(data)} bytes).") from None
    signature = data[pos:]
    if len(signature) != 64:
        raise ProtocolError(f"Malformed envelope: truncated or trailing bytes (signature of {len(signature)} bytes).")
    try:
        return Envelope(sender=sender.decode(), kind=kind.decode(), payload=payload,
                        attachments=tuple(attachments), signature=signature)
    except (UnicodeDecodeError, ValidationError) as exc:
        raise ProtocolError(f"Malformed envelope header: {type(exc).__name__}.") from None


def verify_envelope(envelope: Envelope, *, sender: PublicIdentity) -> None:
    """Raise IntegrityError unless ``sender`` signed this envelope's kind, payload and attachments."""
    if envelope.sender != sender.name:
        raise IntegrityError(f"Envelope claims sender {envelope.sender!r} but is checked against {sender.name!r}.")
    context, data = signed_bytes(envelope.kind, envelope.payload, envelope.attachment_hashes())
    sender.verify(envelope.signature, data, context=context)


def load_payload(envelope: Envelope, model: type[M]) -> M:
    """Parse ``envelope``'s payload as ``model``, resolving attachment references (no signature check).

    Raises:
        ValidationError: the payload does not parse as ``model``.
        ProtocolError: an attachment is not referenced by the payload (every one must be used once).
    """
    return _load(envelope.kind, envelope.payload, envelope.attachments, model)


@functools.cache
def kind_of(model: type[WireMessage]) -> str:
    """The envelope kind of ``model``: its ``kind`` field's default (looked up once a model)."""
    return model.model_fields["kind"].default


def _load(kind: str, payload: bytes, attachments: tuple[bytes, ...], model: type[M]) -> M:
    context: dict = {ATTACHMENTS: attachments}
    msg = model.model_validate_json(payload, context=context)
    used = len(context["used"]) if "used" in context else 0
    if used != len(attachments):
        raise ProtocolError(f"Malformed {kind[:64]!r} envelope: {len(attachments) - used} of "
                            f"{len(attachments)} attachment(s) are not referenced by its payload.")
    return msg


def open_envelope(envelope: Envelope, *, sender: PublicIdentity, model: type[M]) -> M:
    """Verify ``envelope`` was signed by ``sender`` and parse it as ``model``."""
    verify_envelope(envelope, sender=sender)
    expected = kind_of(model)
    if envelope.kind != expected:
        raise ProtocolError(f"Wrong stage: expected a {expected!r} message, got {envelope.kind!r}.")
    return _checked_payload(envelope.kind, envelope.payload, envelope.attachments, model)


def open_signed(payload: bytes, signature: bytes, *, sender: PublicIdentity, model: type[M]) -> M:
    """:func:`open_envelope` for the v1 envelope ``sender`` would have sent with this payload
    and signature (kind: ``model``'s), without building it: a relayed message, given as its
    payload bytes and signature exactly as received (``masking.stages.open_relayed``).

    Raises:
        ProtocolError: the signature is not 64 bytes, or the payload does not parse as ``model``.
        IntegrityError: ``sender`` did not sign ``model``'s kind and this payload.
    """
    kind = kind_of(model)
    if len(signature) != SIGNATURE_BYTES:
        raise ProtocolError(f"Malformed {kind!r} message of {sender.name!r}: a signature of {len(signature)} bytes.")
    context, data = signed_bytes(kind, payload)
    sender.verify(signature, data, context=context)
    return _checked_payload(kind, payload, (), model)


def _checked_payload(kind: str, payload: bytes, attachments: tuple[bytes, ...], model: type[M]) -> M:
    """A payload already verified and of ``model``'s kind, parsed strictly (ProtocolError if not)."""
    try:
        msg = _load(kind, payload, attachments, model)
    except ValidationError as exc:
        first = first_error(exc)
        raise ProtocolError(f"Malformed {kind!r} payload: {exc.error_count()} error(s), first: "
                            f"{first['loc']} {first['msg']}.") from None
    if getattr(msg, "kind", None) != kind:
        raise ProtocolError("Envelope kind and payload kind differ.")
    return msg


def first_error(exc: ValidationError) -> dict:
    """The error to report of a payload that does not parse: one about its protocol ``version``
    field if there is one (a peer of another protocol version gets every other field wrong too,
    and the version is what says why), else the first."""
    errors = exc.errors()
    return next((e for e in errors if tuple(e["loc"][:1]) == ("version",)), errors[0])
