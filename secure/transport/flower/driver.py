"""Server side: discover which hospital each Flower node serves, then run rounds over a Grid.

:func:`run_flower_round` performs the steps of :func:`clinograph.secure.rounds.run_round`
with each hop carried by Flower: the plan to every participant, each later stage of the
secure mode to the clients it names, and the new global model to the survivors. Every wait is
bounded (``grid.send_and_receive(..., timeout=...)`` and the message TTL); a node that does
not answer in time, answers with a Flower error, or answers with something that does not
parse counts as dropped at that stage -- the secure mode's dropout recovery does the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flwr.app import Message
from flwr.serverapp import Grid

from ...errors import ClinographError, ConfigError, ProtocolError
from ...identity import PublicIdentity
from ...rounds import RoundOutcome
from ...server import FederationServer
from ...wire import open_envelope, parse_envelope
from .messages import NodeHello
from .records import MESSAGE_TYPE, from_content, to_content

EventSink = Callable[[str, Mapping[str, object]], None]


@dataclass(frozen=True)
class Timeouts:
    """Seconds each exchange may take: ``plan`` includes local training; ``stage`` is each later
    stage of the secure mode (a dead node costs one of these); ``end`` delivers the model."""

    hello: float
    plan: float
    stage: float
    end: float

    def __post_init__(self) -> None:
        for name in ("hello", "plan", "stage", "end"):
            if not 0 < getattr(self, name) <= 24 * 3600:
                raise ConfigError(f"Timeout {name!r} = {getattr(self, name)} must be in (0, 86400] seconds.")


def exchange(grid: Grid, *, stage: str, outgoing: Mapping[int, Mapping[str, bytes]], round_: int,
             timeout: float) -> tuple[dict[int, dict[str, bytes]], dict[int, str]]:
    """Send ``stage`` to each node and collect the replies within ``timeout`` seconds.

    Returns (node -> reply parts, node -> reason it gave none).
    """
    messages = [Message(to_content(stage, parts, round_=round_), dst_node_id=node, message_type=MESSAGE_TYPE,
                        group_id=f"round-{round_}", ttl=timeout + 30.0)
                for node, parts in outgoing.items()]
    answers: dict[int, dict[str, bytes]] = {}
    failed: dict[int, str] = {}
    replies = grid.send_and_receive(messages, timeout=timeout) if messages else []
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        if node not in outgoing or node in answers:
            continue
        if reply.has_error():
            failed[node] = f"error reply at {stage!r}: {reply.error.reason[:500]}"
            continue
        try:
            _, reply_round, parts = from_content(reply.content, expected_stage=stage)
            if reply_round != round_:
                raise ProtocolError(f"reply is for round {reply_round}, not {round_}")
        except ProtocolError as exc:
            failed[node] = f"bad reply at {stage!r}: {exc}"
            continue
        answers[node] = parts
    for node in outgoing:
        if node not in answers:
            failed.setdefault(node, f"no reply to {stage!r} within {timeout:g} s")
    return answers, failed


def greet_nodes(grid: Grid, *, federation_id: str, enrolled: Mapping[str, PublicIdentity], node_ids: list[int],
                timeout: float) -> tuple[dict[str, int], dict[int, str]]:
    """Challenge each node with a fresh nonce; map hospital name -> node id from verified hellos.

    A hello counts only if it is sealed by the enrolled key of the hospital it names, echoes
    this run, this node and the nonce sent to it. Returns (name -> node id, node -> reason).
    """
    run_id = int(grid.run.run_id)
    nonces = {node: os.urandom(32) for node in node_ids}
    outgoing = {n: {"nonce": nonces[n], "federation": federation_id.encode()} for n in node_ids}
    answers, failed = exchange(grid, stage="hello", outgoing=outgoing, round_=0, timeout=timeout)
    names: dict[str, int] = {}
    for node, parts in sorted(answers.items()):
        try:
            env = parse_envelope(parts.get("hello", b""))
            if env.sender not in enrolled:
                raise ProtocolError(f"hospital {env.sender!r} is not enrolled in {federation_id!r}")
            hello = open_envelope(env, sender=enrolled[env.sender], model=NodeHello)
            if (hello.nonce, hello.node_id, hello.run_id, hello.federation_id) != (nonces[node], node, run_id,
                                                                                    federation_id):
                raise ProtocolError("hello does not echo this nonce, node, run and federation")
            if hello.hospital in names:
                raise ProtocolError(f"hospital {hello.hospital!r} already answered from node {names[hello.hospital]}")
        except ClinographError as exc:
            failed[node] = f"hello refused: {exc}"
            continue
        names[hello.hospital] = node
    return names, failed


@dataclass(frozen=True)
class FlowerRound:
    """A round's outcome plus the global model still owed to each survivor (if not delivered)."""

    outcome: RoundOutcome
    pending_model: dict[str, bytes]


def run_flower_round(grid: Grid, server: FederationServer, *, nodes: Mapping[str, int], timeouts: Timeouts,
                     pending_model: Mapping[str, bytes] | None = None, deliver_model: bool = True,
                     on_event: EventSink | None = None) -> FlowerRound:
    """Run one round over Flower with the hospitals in ``nodes`` (name -> Flower node id).

    The global model of the previous round rides with this round's plan (``pending_model``:
    only the previous round's survivors receive it, as in :func:`run_round`); with
    ``deliver_model=False`` this round's model is returned as ``pending_model`` instead of
    being sent in a separate exchange (each exchange costs Flower's polling delays).
    """
    if not server.mode.server_sees_sum:
        raise ConfigError(f"Secure mode {server.mode.name!r} is not supported over Flower yet (the aggregate is "
                          "decrypted by the hospitals); use 'masked', or the in-process transport.")
    event = on_event or (lambda kind, data: None)
    participants = tuple(sorted(nodes))
    round_ = server.round
    plan = server.open_round(participants)
    event("round_opened", {"round": round_, "participants": list(participants)})
    dropped: dict[str, str] = {}
    carried = dict(pending_model or {})
    plans = {nodes[n]: {"data": plan, **({"model": carried[n]} if n in carried else {})} for n in participants}
    answers, failed = exchange(grid, stage="plan", outgoing=plans, round_=round_, timeout=timeouts.plan)
    for name in participants:
        node = nodes[name]
        if node in failed:
            dropped[name] = failed[node]
            continue
        parts = answers[node]
        if "report" not in parts or "first" not in parts:
            dropped[name] = "plan reply lacks the report or the first message"
            continue
        if server.receive_report(parts["report"]):
            server.receive(parts["first"])
        event("stage_answered", {"round": round_, "stage": 0, "hospital": name})
    stage = 1
    while (outgoing := server.next_stage()) is not None:
        live = {name: data for name, data in sorted(outgoing.items()) if name not in dropped and name in nodes}
        for name in outgoing:
            if name not in live:
                dropped.setdefault(name, f"not reachable at stage {stage}")
        event("stage_sent", {"round": round_, "stage": stage, "hospitals": sorted(live)})
        answers, failed = exchange(grid, stage="stage", outgoing={nodes[n]: {"data": d} for n, d in live.items()},
                                   round_=round_, timeout=timeouts.stage)
        for name in live:
            node = nodes[name]
            if node in failed:
                dropped[name] = failed[node]
            elif "reply" in answers[node]:
                server.receive(answers[node]["reply"])
        stage += 1
    for name, reason in dropped.items():
        event("dropped", {"round": round_, "hospital": name, "reason": reason})
    result = server.close_round()
    model = server.global_model_bytes() if server.state is not None else b""
    survivors = [n for n in participants if n not in dropped]
    event("round_closed", {"round": round_, "contributors": list(result.contributors),
                           "dropped": sorted(dropped)})
    outcome = RoundOutcome(result=result, dropped=dropped)
    if not deliver_model:
        return FlowerRound(outcome=outcome, pending_model={n: model for n in survivors})
    _, end_failed = exchange(grid, stage="end", outgoing={nodes[n]: {"data": model} for n in survivors}, round_=round_,
                             timeout=timeouts.end)
    for node, reason in end_failed.items():
        event("end_not_delivered", {"round": round_, "node": node, "reason": reason})
    return FlowerRound(outcome=outcome, pending_model={})
