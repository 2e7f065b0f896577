"""The round loop -- the only one. Every deployment, simulation, benchmark and demo runs it.

One round (architecture.md, "One round, as data flows"):

1. ``plan``: the server signs the plan; each participant verifies it, trains, and answers with
   its signed report and the secure mode's first message. The previous round's global model
   rides along when the transport defers it (Flower).
2. ``stage`` (0..n times): the secure mode's later stages, each sent only to the hospitals it
   names; silence or a refusal drops the hospital, the mode recovers.
3. close: the server applies the strategy module-wise, audits, publishes the model.
4. ``end``: survivors load the new global model (or apply the aggregate they decrypted, in
   modes where the server never sees it) -- immediately, or with the next plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProtocolError
from ..messages import RoundResult
from ..server import FederationServer
from .liveness import Liveness
from .transport import Transport

EventSink = Callable[[str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class RoundOutcome:
    """The round's result, who was dropped where, and the model still owed to each survivor."""

    result: RoundResult
    dropped: dict[str, str]
    pending_model: dict[str, bytes] = field(default_factory=dict)


def _quiet(kind: str, data: Mapping[str, Any]) -> None:
    return None


def relay_stages(next_stage: Callable[[], Mapping[str, bytes] | None], receive: Callable[[bytes, str], object],
                 transport: Transport, *, round_: int, dropped: dict[str, str]) -> None:
    """The secure mode's later stages: each stage's messages to the hospitals it names, their
    replies back to ``receive(data, channel)``; silence or refusal adds to ``dropped``."""
    stage = 1
    while (messages := next_stage()) is not None:
        live = {n: {"data": d} for n, d in sorted(messages.items()) if n not in dropped}
        answers, failed = transport.exchange("stage", live, round_=round_)
        for name, reason in failed.items():
            dropped.setdefault(name, f"stage {stage}: {reason}")
        for name, parts in answers.items():
            if "reply" in parts:
                receive(parts["reply"], name)
        stage += 1


def run_round(server: FederationServer, transport: Transport, *, participants: tuple[str, ...] | None = None,
              pending_model: Mapping[str, bytes] | None = None, on_event: EventSink | None = None) -> RoundOutcome:
    """Run one round with ``participants`` (default: every enrolled hospital the transport reaches).

    Raises:
        ProtocolError: the round aborted (too few survivors for the secure mode); it is audited
            as ``round_aborted`` and nothing of it is published.
    """
    event = on_event or _quiet
    if participants is None:
        participants = tuple(sorted(set(transport.hospitals()) & set(server.enrolled)))
    round_ = server.round
    plan = server.open_round(participants)
    event("round_opened", {"round": round_, "participants": list(participants)})
    carried = dict(pending_model or {})
    outgoing = {n: {"data": plan, **({"model": carried[n]} if n in carried else {})} for n in participants}
    answers, dropped = transport.exchange("plan", outgoing, round_=round_)
    for name in participants:
        if name in dropped:
            continue
        parts = answers[name]
        if "report" not in parts or "first" not in parts:
            dropped[name] = "answer to the plan lacks the report or the first message"
            continue
        if server.receive_report(parts["report"], channel=name):
            server.receive(parts["first"], channel=name)
    relay_stages(server.next_stage, lambda data, name: server.receive(data, channel=name), transport,
                 round_=round_, dropped=dropped)
    for name, reason in sorted(dropped.items()):
        event("dropped", {"round": round_, "hospital": name, "reason": reason})
    result = server.close_round()
    # Empty bytes = "apply the aggregate you decrypted" (the server holds no plaintext model).
    model = server.global_model_bytes() if server.state is not None else b""
    survivors = [n for n in participants if n not in dropped]
    event("round_closed", {"round": round_, "contributors": list(result.contributors), "dropped": sorted(dropped)})
    if transport.defers_model:
        return RoundOutcome(result=result, dropped=dropped, pending_model={n: model for n in survivors})
    _, end_failed = transport.exchange("end", {n: {"model": model} for n in survivors}, round_=round_)
    for name, reason in end_failed.items():
        event("end_not_delivered", {"round": round_, "hospital": name, "reason": reason})
    return RoundOutcome(result=result, dropped=dropped)


def run_rounds(server: FederationServer, transport: Transport, *, rounds: int,
               participants: tuple[str, ...] | None = None,
               on_round: Callable[[int, RoundOutcome], None] | None = None,
               on_event: EventSink | None = None, liveness: Liveness | None = None) -> list[RoundOutcome]:
    """Run ``rounds`` rounds; the last global model is delivered before returning.

    With ``liveness``, hospitals that keep missing rounds are suspended and retried
    (:mod:`.liveness`); suspensions and rejoins are audited. An aborted round (ProtocolError)
    is audited by the server and re-raised after the models owed to hospitals are delivered.
    """
    event = on_event or _quiet
    outcomes: list[RoundOutcome] = []
    pending: dict[str, bytes] = {}
    try:
        for r in range(rounds):
            invited = participants
            if liveness is not None:
                available = participants or tuple(sorted(set(transport.hospitals()) & set(server.enrolled)))
                invited = liveness.invited(server.round, available)
            try:
                outcome = run_round(server, transport, participants=invited, pending_model=pending,
                                    on_event=event)
            except ProtocolError as exc:
                event("round_aborted", {"round": server.round, "reason": str(exc)[:500]})
                raise
            pending = outcome.pending_model
            outcomes.append(outcome)
            if liveness is not None and invited is not None:
                for kind, payload in liveness.observe(outcome.result.round, invited, outcome.result.contributors):
                    server.audit.record(kind, payload)
                    event(kind, payload)
            if on_round is not None:
                on_round(r, outcome)
    finally:
        if pending:
            _, failed = transport.exchange("end", {n: {"model": m} for n, m in pending.items()}, round_=server.round)
            for name, reason in failed.items():
                event("end_not_delivered", {"round": server.round, "hospital": name, "reason": reason})
    return outcomes
