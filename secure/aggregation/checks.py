"""Boundary checks every mode applies to a client's message before using it.

:func:`authenticate` first (nothing is attributed to a hospital before its message
authenticates), then :func:`check_header` (what an authenticated sender got wrong).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import TypeVar

import numpy as np
from pydantic import ValidationError

from clinograph.core.codec import decode_array
from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import PublicIdentity
from clinograph.core.spec import ModuleKind

from ..messages import ModuleTensor, RoundPlan, WireMessage
from ..wire import Envelope, first_error, kind_of, load_payload, verify_envelope

M = TypeVar("M", bound=WireMessage)


def check_header(plan: RoundPlan, *, sender: str, federation_id: str, round_: int,
                 spec_digest: str | None = None, dictionary_hash: str | None = None,
                 global_state_digest: str | None = None, plan_digest: str | None = None) -> None:
    """Refuse a message from another federation, round, model version, dictionary or (when the
    message names them) starting global model or plan."""
    if sender not in plan.participants:
        raise ProtocolError(f"{sender!r} is not a participant of round {plan.round}.")
    if federation_id != plan.federation_id:
        raise ProtocolError(f"Message is for federation {federation_id!r}, this is {plan.federation_id!r}.")
    if round_ != plan.round:
        raise ProtocolError(f"Out-of-round message: it is for round {round_}, the current round is {plan.round}.")
    if spec_digest is not None and spec_digest != plan.spec.digest():
        raise ProtocolError(f"Message is for a different ModelSpec (digest {spec_digest[:12]}…), "
                            f"the plan uses v{plan.spec.version} ({plan.spec.digest()[:12]}…).")
    if dictionary_hash is not None and dictionary_hash != plan.dictionary_hash:
        raise ProtocolError(f"Wrong feature dictionary: message has {dictionary_hash[:12]}…, the federation "
                            f"uses {plan.dictionary_hash[:12]}…. Update the hospital's dictionary.")
    if global_state_digest is not None and global_state_digest != plan.global_state_digest:
        raise ProtocolError(f"Message starts from another global model (digest {global_state_digest[:12]}…) than "
                            f"round {plan.round}'s plan ({plan.global_state_digest[:12]}…): the hospital holds another "
                            "model than the one this round's plan names. Refused for this round.")
    if plan_digest is not None and plan_digest != plan.digest():
        raise ProtocolError(f"Message names another plan (digest {plan_digest[:12]}…) than round {plan.round}'s "
                            f"({plan.digest()[:12]}…): the hospital holds a plan the server did not send for this "
                            "round. Refused for this round.")


def decode_modules(plan: RoundPlan, modules: Sequence[ModuleTensor], *, sender: str) -> dict[str, np.ndarray]:
    """Decode module tensors, refusing unknown, personal, repeated or wrongly sized modules."""
    out: dict[str, np.ndarray] = {}
    for t in modules:
        try:
            spec = plan.spec.module(t.name)
        except KeyError as exc:
            raise ProtocolError(f"{sender!r} sent {exc.args[0]}") from None
        if spec.kind != ModuleKind.SHARED:
            raise ProtocolError(f"{sender!r} sent personal module {t.name!r}; personal modules never leave a hospital.")
        if t.name in out:
            raise ProtocolError(f"{sender!r} sent module {t.name!r} twice.")
        out[t.name] = decode_array(t.data, dtype=t.dtype, length=spec.size, what=f"module {t.name!r} from {sender!r}")
    return out


def encode_modules(modules: Mapping[str, np.ndarray], dtype: str = "<f4") -> tuple[ModuleTensor, ...]:
    """Module vectors as wire tensors, in name order."""
    from clinograph.core.codec import encode_array

    return tuple(ModuleTensor(name=n, dtype=dtype, data=encode_array(v, dtype)) for n, v in sorted(modules.items()))


#: Why a message could not be attributed to the hospital it names (the classes counted in the
#: ``unattributed_refusals`` audit entry, docs/audit.md).
UNATTRIBUTED_CLASSES = ("oversized", "malformed_envelope", "channel_mismatch", "unknown_sender", "bad_signature",
                        "wrong_stage", "other_federation", "stale_round", "duplicate")


class Unattributed(ProtocolError):
    """A refused message that does not authenticate as its sender's message for this round and stage.

    Raised before anything about the named hospital is touched: nobody can be knocked out of a
    round by bytes they did not sign for it (a forgery, another channel's envelope, a replay from
    an earlier round or stage, an exact re-send). The server counts these per round by
    ``reason_class`` (one of :data:`UNATTRIBUTED_CLASSES`) instead of auditing each one.
    """

    def __init__(self, reason_class: str, message: str):
        super().__init__(message)
        self.reason_class = reason_class


def authenticate(plan: RoundPlan, envelope: Envelope, *, peers: Mapping[str, PublicIdentity], model: type[M],
                 max_bytes: int, seen: Container[str] = ()) -> M:
    """Open ``envelope`` as ``model`` if it is the named sender's message for this round and stage.

    Checks, in this order and before any state is read or changed: the payload size, that the
    sender is enrolled, its signature over the bytes received, the stage (envelope kind), that
    these exact bytes were not already accepted (``seen``: payload digests), and, after parsing,
    the federation and round. Each failure is :class:`Unattributed`. A payload that is validly
    signed by the sender for this stage but does not parse is the sender's own doing: ProtocolError.

    Does not check participants, model version or dictionary (see :func:`check_header`): those
    failures are attributable to the sender.
    """
    sender = envelope.sender
    if envelope.size > max_bytes:
        raise Unattributed("oversized", f"Message of {envelope.size} bytes naming {sender!r} exceeds the "
                           f"stage limit of {max_bytes} bytes.")
    key = peers.get(sender)
    if key is None:
        raise Unattributed("unknown_sender", f"{sender!r} is not enrolled.")
    try:
        verify_envelope(envelope, sender=key)
    except IntegrityError as exc:
        raise Unattributed("bad_signature", str(exc)) from None
    expected = kind_of(model)
    if envelope.kind != expected:
        raise Unattributed("wrong_stage", f"Wrong stage: expected a {expected!r} message, got {envelope.kind[:64]!r}.")
    if envelope.digest() in seen:
        raise Unattributed("duplicate", f"Replayed message: an exact re-send of {sender!r}'s accepted {expected!r} "
                           "message (the first was kept).")
    try:
        msg = load_payload(envelope, model)
    except ValidationError as exc:
        first = first_error(exc)
        loc = ".".join(str(p)[:64] for p in first["loc"])
        raise ProtocolError(f"Malformed {expected!r} payload signed by {sender!r}: {exc.error_count()} error(s), "
                            f"first: {loc}: {first['msg'][:200]}.") from None
    federation_id, round_ = getattr(msg, "federation_id", None), getattr(msg, "round", None)
    if federation_id != plan.federation_id:
        raise Unattributed("other_federation", f"Message is for federation {str(federation_id)[:64]!r}, this is "
                           f"{plan.federation_id!r}.")
    if round_ != plan.round:
        raise Unattributed("stale_round", f"Out-of-round message: it is for round {round_}, the current round is "
                           f"{plan.round}.")
    return msg
