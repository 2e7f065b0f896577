"""A hospital's signed "no": the refusal of one round message, kept in the audit.

When a hospital refuses a plan or a later stage message (its privacy budget is spent, the
plan breaks its settings, the message does not verify), it answers with a
:class:`HospitalRefusal` sealed with its enrolled Ed25519 identity instead of an error
string. The round loop checks it (:func:`check_refusal`) and keeps it in the audit as a
``hospital_refused`` entry next to the stored envelope, so an auditor sees *who* refused
*which* message and why, signed by the hospital itself -- not the transport's words.

Guarantees: a refusal that verifies was signed by the named hospital, for this round and
stage, about the exact message the server sent it (``refused_sha256`` is that message's
:meth:`~clinograph.secure.wire.Envelope.digest`), so it cannot be replayed into another
round or pinned on another message. Does not guarantee: that the reason is true (it is the
hospital's word), or that a silent hospital refused anything (silence is a drop, not a
refusal). The reason is the exception's text, which by house style names no patient data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from clinograph.core.errors import ClinographError, PrivacyBudgetExceeded, ProtocolError
from clinograph.core.fields import RoundNumber
from clinograph.core.identity import Identity, PublicIdentity

from .messages import ID_PATTERN, WireMessage
from .wire import open_envelope, parse_envelope, seal

#: The reply part that carries a sealed HospitalRefusal instead of the stage's usual parts.
REFUSAL_PART = "refusal"
#: Stages a hospital answers with a signed refusal (hello and setup keep transport errors).
REFUSABLE_STAGES = ("plan", "stage", "end")
MAX_REFUSAL_BYTES = 16 * 1024
MAX_REASON_CHARS = 2000


class HospitalRefusal(WireMessage):
    """Hospital -> server: "I refuse the ``stage`` message of round ``round`` whose digest is
    ``refused_sha256``, because ``error``: ``reason``". ``final``: this hospital will not take
    part again in this run (its privacy budget is spent)."""

    kind: Literal["hospital_refusal"] = "hospital_refusal"
    hospital: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    stage: Literal["plan", "stage", "end"]
    refused_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    error: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
    reason: str = Field(max_length=MAX_REASON_CHARS)
    final: bool


def message_digest(data: bytes | None) -> str | None:
    """The digest of a refused message (None if it is not an envelope, e.g. an ``end`` model)."""
    if not data:
        return None
    try:
        return parse_envelope(data).digest()
    except ClinographError:
        return None


def is_final(exc: BaseException) -> bool:
    """Whether a refusal ends this hospital's part in the run (its privacy budget is spent)."""
    return isinstance(exc, PrivacyBudgetExceeded)


def seal_refusal(identity: Identity, *, round_: int, stage: str, parts: Mapping[str, bytes],
                 exc: BaseException) -> bytes:
    """Seal the hospital's refusal of ``parts`` (the message of ``stage`` it refused with ``exc``)."""
    if stage not in REFUSABLE_STAGES:
        raise ProtocolError(f"Stage {stage!r} is not answered with a signed refusal; expected one of "
                            f"{', '.join(REFUSABLE_STAGES)}.")
    reason = str(exc)
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS - 1] + "…"
    refusal = HospitalRefusal(hospital=identity.name, round=int(round_), stage=stage,  # type: ignore[arg-type]
                              refused_sha256=message_digest(parts.get("data")), error=type(exc).__name__,
                              reason=reason, final=is_final(exc))
    return seal(refusal, identity)


def check_refusal(data: bytes, *, hospital: str, key: PublicIdentity, round_: int, stage: str,
                  sent: bytes | None) -> HospitalRefusal:
    """The refusal in ``data`` if ``hospital`` signed it for this round, stage and the message
    ``sent`` to it.

    Raises:
        IntegrityError: not signed by ``hospital``'s enrolled key.
        ProtocolError: malformed, oversized, or for another hospital, round, stage or message.
    """
    if len(data) > MAX_REFUSAL_BYTES:
        raise ProtocolError(f"Refusal of {len(data)} bytes exceeds {MAX_REFUSAL_BYTES} bytes.")
    env = parse_envelope(data, max_bytes=MAX_REFUSAL_BYTES)
    if env.sender != hospital:
        raise ProtocolError(f"Refusal is signed as {env.sender[:64]!r} but came from {hospital!r}.")
    refusal = open_envelope(env, sender=key, model=HospitalRefusal)
    if refusal.hospital != hospital:
        raise ProtocolError(f"Refusal names {refusal.hospital!r}, not its signer {hospital!r}.")
    if (refusal.round, refusal.stage) != (round_, stage):
        raise ProtocolError(f"Refusal is for round {refusal.round} stage {refusal.stage!r}, not round {round_} "
                            f"stage {stage!r} (a replay).")
    if refusal.refused_sha256 != message_digest(sent):
        raise ProtocolError("Refusal names another message than the one the server sent.")
    return refusal


__all__ = ["REFUSAL_PART", "REFUSABLE_STAGES", "HospitalRefusal", "check_refusal", "is_final",
           "message_digest", "seal_refusal"]
