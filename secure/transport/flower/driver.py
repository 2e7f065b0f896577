"""Server side: discover which hospital each Flower node serves, and carry stages over a Grid.

:class:`FlowerTransport` is the Flower implementation of the runtime's transport seam: the one
round loop (:func:`clinograph.secure.runtime.run_round`) runs over it unchanged. Every wait is
bounded (``grid.send_and_receive(..., timeout=...)`` and the message TTL); a node that does
not answer in time, answers with a Flower error, or answers with something that does not
parse counts as dropped at that stage -- the secure mode's dropout recovery does the rest.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flwr.app import Message
from flwr.serverapp import Grid

from clinograph.core.errors import ClinographError, ConfigError, ProtocolError
from clinograph.core.identity import PublicIdentity

from ...wire import open_envelope, parse_envelope
from .messages import NodeHello
from .records import MESSAGE_TYPE, from_content, to_content


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


#: Shortest wait (seconds) between two pulls of replies (run config ``reply-poll``). Flower's own
#: ``send_and_receive`` sleeps 3 s between pulls, which made every protocol stage cost 3 s or
#: more. A pull is one small HTTP call to the SuperLink; Flower 1.41 has no way to be told a
#: reply came (the ServerApp's API is request-response), so the ServerApp polls.
DEFAULT_POLL_INTERVAL = 0.05
#: Longest wait between two pulls, and the share of the time already waited that the next wait is:
#: a reply is pulled within ``reply-poll`` for the first second of an exchange (3 hospitals on
#: loopback answer a protocol stage in 0.2-0.3 s), then within 5 % of the time waited (an exchange
#: of 20 hospitals, about 3 s, costs about 75 pulls: a fixed 0.05 s cost 60), and a plan stage
#: that trains for minutes costs one pull a second.
MAX_POLL_INTERVAL, POLL_FRACTION = 1.0, 0.05
#: The first pull of replies waits this share of the stage's earliest reply in the exchange before
#: (:class:`FlowerTransport`), at most ``FIRST_PULL_MAX`` seconds (what a stage that became faster,
#: e.g. another candidate model's plan, can lose): until then every pull found nothing
#: (3 hospitals: the first reply comes 0.2-0.3 s after the push, and pulls from 0.05 s were about 5
#: empty calls an exchange on the one SuperLink, ``benchmarks/flower_scale``, fourth pass).
FIRST_PULL_SHARE, FIRST_PULL_MAX = 0.6, 0.5
#: From this many messages, push each node's message (and its objects) on its own, not all messages
#: first and then all objects: Flower shows a message to its node as soon as it is pushed, and a node
#: pulling it while the server still pushes the others' objects retries the missing ones (20
#: SuperNodes: about 100 PullObject calls an exchange that found nothing, ``benchmarks/flower_scale``,
#: fourth pass). Not below: at 3 hospitals it saved about one call an exchange and no time.
PUSH_EACH_FROM = 8
#: Seconds between two looks for new SuperNodes and their hellos while greeting (:func:`greet_connected`).
GREET_POLL = 0.25


def poll_wait(elapsed: float, *, floor: float) -> float:
    """Seconds to wait before the next pull, ``elapsed`` seconds into an exchange."""
    return min(max(floor, POLL_FRACTION * elapsed), max(floor, MAX_POLL_INTERVAL))


def check_poll(poll: float) -> float:
    """``poll`` if it is a usable ``reply-poll`` (seconds), else ConfigError."""
    if not 0.01 <= poll <= 5.0:
        raise ConfigError(f"Run config 'reply-poll' = {poll} s must be in [0.01, 5] seconds (default "
                          f"{DEFAULT_POLL_INTERVAL}: the shortest wait between two pulls of the hospitals' replies).")
    return poll


def _send_and_receive(grid: Grid, messages: list[Message], *, timeout: float, poll: float,
                      arrivals: dict[int, float] | None = None, first_pull: float = 0.0) -> list[Message]:
    """Push ``messages``, then pull their replies (the first ``first_pull`` seconds after the start,
    then waits: :func:`poll_wait`) until all came or ``timeout``.
    ``arrivals``: filled with node -> seconds until its reply was pulled (to within one wait)."""
    if not messages:
        return []
    started = time.monotonic()
    if len(messages) >= PUSH_EACH_FROM:
        pending = {mid for m in messages for mid in grid.push_messages([m])}
    else:
        pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    deadline = time.monotonic() + timeout
    if pending and (early := min(first_pull, timeout) - (time.monotonic() - started)) > 0:
        time.sleep(early)
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        if arrivals is not None:
            for m in got:
                arrivals.setdefault(int(m.metadata.src_node_id), time.monotonic() - started)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        now = time.monotonic()
        if not pending or now >= deadline:
            break
        time.sleep(min(poll_wait(now - started, floor=poll), max(0.0, deadline - now)))
    return replies


def _message(node: int, stage: str, parts: Mapping[str, bytes], *, round_: int, timeout: float) -> Message:
    return Message(to_content(stage, parts, round_=round_), dst_node_id=node, message_type=MESSAGE_TYPE,
                   group_id=f"round-{round_}", ttl=timeout + 30.0)


#: how Flower 1.41 words a ClientApp's exception in its error reply (``run_clientapp``)
_FLOWER_EXCEPTION = re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>:<'(.*)'>", re.S)


def error_reason(reason: str) -> str:
    """A Flower error reply's reason as the operator reads it: ``<class 'clinograph.core.errors.
    ProtocolError'>:<'Hospital 'h3' refused ...'>`` becomes ``ProtocolError: Hospital 'h3' refused ...``;
    any other reason is kept as it is."""
    m = _FLOWER_EXCEPTION.fullmatch(reason.strip())
    return f"{m.group(1)}: {m.group(2)}" if m else reason


def _reply_parts(reply: Message, *, stage: str, round_: int) -> dict[str, bytes]:
    """The parts of a node's reply to ``stage`` of ``round_``; ProtocolError naming why there are none."""
    if reply.has_error():
        raise ProtocolError(f"error reply at {stage!r}: {error_reason(reply.error.reason)[:500]}")
    try:
        _, reply_round, parts = from_content(reply.content, expected_stage=stage)
        if reply_round != round_:
            raise ProtocolError(f"reply is for round {reply_round}, not {round_}")
    except ProtocolError as exc:
        raise ProtocolError(f"bad reply at {stage!r}: {exc}") from None
    return parts


def exchange(grid: Grid, *, stage: str, outgoing: Mapping[int, Mapping[str, bytes]], round_: int,
             timeout: float, poll: float = DEFAULT_POLL_INTERVAL, arrivals: dict[int, float] | None = None,
             first_pull: float = 0.0) -> tuple[dict[int, dict[str, bytes]], dict[int, str]]:
    """Send ``stage`` to each node and collect the replies within ``timeout`` seconds
    (``arrivals``: filled with node -> seconds until its reply came; ``first_pull``: seconds before
    the first look for replies).

    Returns (node -> reply parts, node -> reason it gave none, with the time actually waited).
    """
    messages = [_message(node, stage, parts, round_=round_, timeout=timeout) for node, parts in outgoing.items()]
    answers: dict[int, dict[str, bytes]] = {}
    failed: dict[int, str] = {}
    started = time.monotonic()
    replies = _send_and_receive(grid, messages, timeout=timeout, poll=poll, arrivals=arrivals, first_pull=first_pull)
    waited = time.monotonic() - started
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        if node not in outgoing or node in answers:
            continue
        try:
            answers[node] = _reply_parts(reply, stage=stage, round_=round_)
        except ProtocolError as exc:
            failed[node] = str(exc)
    for node in outgoing:
        if node not in answers:
            failed.setdefault(node, f"no reply to {stage!r} within {waited:.0f} s (timeout {timeout:g} s)")
    return answers, failed


def check_hello(parts: Mapping[str, bytes], *, node: int, nonce: bytes, run_id: int, federation_id: str,
                enrolled: Mapping[str, PublicIdentity]) -> str:
    """The hospital whose hello ``parts`` came from ``node``: ProtocolError unless the hello is sealed by
    the enrolled key of the hospital it names and echoes this run, this node and the ``nonce`` sent to it."""
    env = parse_envelope(parts.get("hello", b""))
    if env.sender not in enrolled:
        raise ProtocolError(f"hospital {env.sender!r} is not enrolled in {federation_id!r}")
    hello = open_envelope(env, sender=enrolled[env.sender], model=NodeHello)
    if hello.hospital != env.sender:  # a node may only speak for the hospital whose key signed
        raise ProtocolError(f"hello names hospital {hello.hospital[:64]!r} but is signed by {env.sender!r}")
    if (hello.nonce, hello.node_id, hello.run_id, hello.federation_id) != (nonce, node, run_id, federation_id):
        raise ProtocolError("hello does not echo this nonce, node, run and federation")
    return hello.hospital


def _hello_parts(nonce: bytes, federation_id: str) -> dict[str, bytes]:
    return {"nonce": nonce, "federation": federation_id.encode()}


def _name_node(names: dict[str, int], failed: dict[int, str], node: int, check: Callable[[], str]) -> None:
    """Add ``node`` under the hospital ``check()`` returns, or its refusal to ``failed``."""
    try:
        hospital = check()
        if hospital in names:
            raise ProtocolError(f"hospital {hospital!r} already answered from node {names[hospital]}")
    except ClinographError as exc:
        failed[node] = f"hello refused: {exc}"
        return
    names[hospital] = node


def greet_nodes(grid: Grid, *, federation_id: str, enrolled: Mapping[str, PublicIdentity], node_ids: list[int],
                timeout: float) -> tuple[dict[str, int], dict[int, str]]:
    """Challenge each node with a fresh nonce; map hospital name -> node id from verified hellos
    (:func:`check_hello`). Returns (name -> node id, node -> reason)."""
    run_id = int(grid.run.run_id)
    nonces = {node: os.urandom(32) for node in node_ids}
    outgoing = {n: _hello_parts(nonces[n], federation_id) for n in node_ids}
    answers, failed = exchange(grid, stage="hello", outgoing=outgoing, round_=0, timeout=timeout)
    names: dict[str, int] = {}
    for node, parts in sorted(answers.items()):
        _name_node(names, failed, node, lambda: check_hello(parts, node=node, nonce=nonces[node], run_id=run_id,  # noqa: B023
                                                            federation_id=federation_id, enrolled=enrolled))
    return names, failed


def greet_connected(grid: Grid, *, federation_id: str, enrolled: Mapping[str, PublicIdentity], min_nodes: int,
                    wait: float, timeout: float,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> tuple[dict[str, int], dict[int, str], int]:
    """:func:`greet_nodes` for SuperNodes still coming up: each node is sent its hello as soon as it
    is connected, not once ``min_nodes`` are, so the hellos of nodes that came up early are answered
    while the others still start (20 SuperNodes started at once on two shared cores gained nothing
    measurable: they all came up together, ``benchmarks/flower_scale``). New nodes are looked for until ``min_nodes`` are
    connected or ``wait`` seconds passed -- the nodes the old wait would have greeted -- and each hello
    waits ``timeout`` seconds from when it was sent; the same message and checks (:func:`check_hello`).
    Two nodes naming one hospital: the first verified hello counts. Every :data:`GREET_POLL` s: one
    look for nodes (while looking) and one pull of hellos (while any is pending).

    Returns (name -> node id, node -> reason, how many nodes were connected)."""
    run_id = int(grid.run.run_id)
    started = clock()
    nonces: dict[int, bytes] = {}
    pending: dict[str, tuple[int, float]] = {}  # message id -> (node, seconds when sent)
    names: dict[str, int] = {}
    failed: dict[int, str] = {}
    looking = True
    while True:
        if looking:
            new = sorted(set(grid.get_node_ids()) - set(nonces))
            for node in new:
                nonces[node] = os.urandom(32)
            if new:
                messages = [_message(n, "hello", _hello_parts(nonces[n], federation_id), round_=0, timeout=timeout)
                            for n in new]
                sent = clock()
                for node, mid in zip(new, grid.push_messages(messages), strict=True):
                    if mid:
                        pending[mid] = (node, sent)
                    else:  # Flower could not store it (a malformed message)
                        failed[node] = "hello not accepted by the SuperLink"
            looking = len(nonces) < min_nodes and clock() - started < wait
        if pending:
            for reply in grid.pull_messages(list(pending)):
                node, _ = pending.pop(reply.metadata.reply_to_message_id, (None, 0.0))
                if node is None:
                    continue
                try:
                    parts = _reply_parts(reply, stage="hello", round_=0)
                except ProtocolError as exc:
                    failed[node] = str(exc)
                    continue
                _name_node(names, failed, node, lambda: check_hello(parts, node=node, nonce=nonces[node],  # noqa: B023
                                                                    run_id=run_id, federation_id=federation_id,
                                                                    enrolled=enrolled))
        now = clock()
        for mid, (node, sent) in list(pending.items()):
            if now - sent >= timeout:
                del pending[mid]
                failed[node] = f"no reply to 'hello' within {now - sent:.0f} s (timeout {timeout:g} s)"
        if not looking and not pending:
            return names, failed, len(nonces)
        sleep(GREET_POLL)


class FlowerTransport:
    """The :class:`clinograph.secure.runtime.Transport` over a Flower Grid.

    ``nodes`` maps each greeted hospital to its Flower node id (from :func:`greet_nodes`, which
    checked the hello under that hospital's enrolled key). Each exchange pushes the stage and pulls
    the replies (waits from ``poll`` up, :func:`poll_wait`) within the stage's timeout, the first pull
    :data:`FIRST_PULL_SHARE` of the stage's earliest reply the last time it ran; the global model rides with the
    next plan (``defers_model``), which saves one exchange -- one polling delay -- a round.
    """

    defers_model = True

    def __init__(self, grid: Grid, *, nodes: Mapping[str, int], timeouts: Timeouts,
                 poll: float = DEFAULT_POLL_INTERVAL):
        self.grid, self.nodes, self.timeouts, self.poll = grid, dict(nodes), timeouts, check_poll(poll)
        self._names = {node: name for name, node in self.nodes.items()}
        self.last_timings: dict[str, float] = {}  # name -> seconds until its reply in the last exchange
        # (stage, its place in a run of that stage) -> seconds until its first reply, the last time it ran
        self._earliest: dict[tuple[str, int], float] = {}
        self._last: tuple[str, int, int] = ("", -1, 0)  # the last exchange's stage, round and place

    def _place(self, stage: str, round_: int, step: bytes = b"") -> tuple[str, int, bytes]:
        """``stage``, its place among consecutive exchanges of it in ``round_`` (the secure mode's
        stages are all ``"stage"``: the 2nd and the 3rd differ in work) and its set-up ``step``
        (``setup/sum`` computes, ``run/start`` does not)."""
        last_stage, last_round, place = self._last
        place = place + 1 if (last_stage, last_round) == (stage, round_) else 0
        self._last = (stage, round_, place)
        return stage, place, step

    def first_pull(self, key: tuple[str, int, bytes]) -> float:
        """Seconds after the push of exchange ``key`` (:meth:`_place`) before its first pull of replies
        (0 the first time)."""
        return min(FIRST_PULL_SHARE * self._earliest.get(key, 0.0), FIRST_PULL_MAX)

    def hospitals(self) -> tuple[str, ...]:
        return tuple(sorted(self.nodes))

    def _timeout(self, stage: str) -> float:
        return {"plan": self.timeouts.plan, "end": self.timeouts.end}.get(stage, self.timeouts.stage)

    def exchange(self, stage: str, outgoing: Mapping[str, Mapping[str, bytes]], *,
                 round_: int) -> tuple[dict[str, dict[str, bytes]], dict[str, str]]:
        failed: dict[str, str] = {n: "not greeted on this run" for n in outgoing if n not in self.nodes}
        by_node = {self.nodes[n]: parts for n, parts in outgoing.items() if n in self.nodes}
        arrivals: dict[int, float] = {}
        key = self._place(stage, round_, next(iter(by_node.values()), {}).get("step", b""))
        answers, node_failed = exchange(self.grid, stage=stage, outgoing=by_node, round_=round_,
                                        timeout=self._timeout(stage), poll=self.poll, arrivals=arrivals,
                                        first_pull=self.first_pull(key))
        self.last_timings = {self._names[n]: t for n, t in arrivals.items() if n in self._names}
        if arrivals:
            self._earliest[key] = min(arrivals.values())
        failed.update({self._names[node]: reason for node, reason in node_failed.items()})
        return {self._names[node]: parts for node, parts in answers.items()}, failed
