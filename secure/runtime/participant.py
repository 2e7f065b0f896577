"""The hospital side of the protocol as bytes in, bytes out, and the one stage dispatcher.

Every hop of a round is a *stage* carrying named byte parts. :func:`dispatch` maps a stage to
one :class:`RoundParticipant` call; the in-process transport calls it directly and the Flower
SuperNode worker calls it for each relayed message, so both transports run the same code.

==============  =====================================  ================================
stage           parts in                               parts out
==============  =====================================  ================================
``plan``        ``data`` (signed plan), optional       ``report``, ``first``
                ``model`` (previous round's model;
                empty: apply the decrypted aggregate)
``stage``       ``data`` (a secure mode's message)     ``reply`` (absent: nothing)
``end``         ``model`` (empty: decrypted aggregate)  optional ``status`` (signed)
``setup``       ``step`` + the step's parts            the step's parts (CKKS ceremony;
                                                       the run's ``run/start``,
                                                       ``run/finish``, ``run/chosen``)
==============  =====================================  ================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from clinograph.core.errors import ProtocolError
from clinograph.core.identity import Identity

from ..refusals import seal_refusal
from .selection import STATUS_PART

STAGES = ("hello", "plan", "stage", "end", "setup")


class RoundParticipant(Protocol):
    """What a hospital must answer (the SDK's ``HospitalClient`` is one)."""

    name: str

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        """Verify the plan, train, and return (signed report, the mode's first message)."""

    def on_stage(self, data: bytes) -> bytes | None:
        """Answer one later-stage message of the secure-aggregation mode."""

    def on_round_end(self, global_model: bytes | None) -> bytes | None:
        """Load the new global model (None: apply the aggregate this hospital decrypted); return
        the hospital's signed selection status, if it selects models (:mod:`.selection`)."""

    def on_setup(self, step: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """One step of a set-up exchange before the first round (the CKKS key ceremony)."""


def part(parts: Mapping[str, bytes], name: str, stage: str) -> bytes:
    """``parts[name]`` or a ProtocolError naming the stage and the missing part."""
    try:
        return parts[name]
    except KeyError:
        raise ProtocolError(f"The {stage!r} message lacks its {name!r} part.") from None


def dispatch(participant: RoundParticipant, stage: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
    """Answer one stage message. Raises a ClinographError when the hospital refuses it."""
    if stage == "plan":
        if "model" in parts:  # the previous round's end rides with this plan (Flower saves one exchange)
            participant.on_round_end(parts["model"] or None)
        report, first = participant.on_plan(part(parts, "data", stage))
        return {"report": report, "first": first}
    if stage == "stage":
        reply = participant.on_stage(part(parts, "data", stage))
        return {} if reply is None else {"reply": reply}
    if stage == "end":
        status = participant.on_round_end(part(parts, "model", stage) or None)
        return {} if status is None else {STATUS_PART: status}
    if stage == "setup":
        step = part(parts, "step", stage).decode("ascii", errors="replace")
        return participant.on_setup(step, {k: v for k, v in parts.items() if k != "step"})
    raise ProtocolError(f"Unknown stage {stage!r}; expected one of {', '.join(STAGES)}.")


def refuse(participant: object, identity: Identity, *, round_: int, stage: str, parts: Mapping[str, bytes],
           exc: BaseException) -> bytes:
    """The hospital's signed refusal of ``parts`` at ``stage`` (:func:`~clinograph.secure.refusals.seal_refusal`),
    handed first to the participant's optional ``on_refused(stage, parts, refusal)``: the SDK's
    hospital keeps a copy of a refused plan's refusal and checks that the server logged it
    (:meth:`clinograph.sdk.federation.anchor.HospitalAnchor.check`). Both transports call this."""
    sealed = seal_refusal(identity, round_=round_, stage=stage, parts=parts, exc=exc)
    keep = getattr(participant, "on_refused", None)
    if callable(keep):
        keep(stage, parts, sealed)
    return sealed
