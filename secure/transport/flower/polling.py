"""The SuperNode's two fixed waits, made settable: the idle poll of the SuperLink and the reply wait.

Flower 1.41's SuperNode main loop (``flwr.supernode.start_client_internal``) asks the SuperLink
for a message, and when none is waiting sleeps a fixed 3 s before asking again; after handing a
message to its ClientApp it checks for the reply every 0.5 s. Neither is an option. Over a
protocol stage that is most of the wait: the last hospital to answer a stage has just begun its
3 s sleep when the server sends the next stage, so each exchange costs about 3 s more
(measured: ``benchmarks/flower_scale/round_time.py``). Our launcher runs Flower's SuperNode main
in its own process, so :func:`set_supernode_waits` gives that module a ``time`` whose ``sleep(3)``
and ``sleep(0.5)`` wait ``idle`` and ``reply`` seconds instead; every other call (and every other
module) keeps the real :mod:`time`. :func:`check_supernode_waits` (run first) refuses a Flower
whose loop no longer has those two sleeps, so a Flower update cannot silently undo it; the
adapter is pinned to 1.41 anyway (:func:`~clinograph.secure.transport.flower.check_flower_version`).

The cost of a shorter idle poll is one more small HTTPS ``PullMessages`` call a node every
``idle`` seconds on the SuperLink, so the idle poll grows while no message comes
(:class:`SupernodeClock`, ``--supernode-poll-max``): right after the node's last message it
waits a tenth of the node's last wait for a message, from 0.05 s (within a run of 3 hospitals the
next one follows within a fraction of a second) to 0.2 s (20 hospitals), then a quarter of the
time since, up to 1 s; and after its reply it keeps quiet for half its shortest recent wait for a
message (:data:`QUIET_SHARE`: the next stage comes only once every hospital replied). Why not lower: each poll costs the SuperLink about 3 ms of CPU; a 0.02 s
floor with a 0.01 s ServerApp poll gained 0.1-0.2 s a round alone (``benchmarks/flower_scale``,
third pass: 1.54-1.91 s against 1.73 s at 0.05 s) but on a shared 2-core machine running two
federations at once (``make test``) the polls took the CPU from the work. It cannot be
event-driven: Flower 1.41's Fleet API is request-response over HTTP, with no push from the
SuperLink to a SuperNode.

:func:`set_object_pull_backoff` shortens Flower's 1 s wait for an object that is not stored yet
(SuperNode and ServerApp). :func:`watch_message_pulls` is the third hook into the same loop: callbacks around each pull of
a message, with which the warm executor polls for the new task as soon as the message is stored
and never while it is half stored (:meth:`.superexec.SuperExecLoop.pull_started`).
"""

from __future__ import annotations

import collections
import functools
import inspect
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from clinograph.core.errors import ConfigError

#: Flower 1.41's fixed waits in ``start_client_internal`` (seconds): idle poll, reply wait.
FLOWER_IDLE_POLL, FLOWER_REPLY_WAIT = 3, 0.5
#: Ours (seconds): the idle poll's lowest floor, its ceiling, the reply wait. A fixed floor of 0.2 s
#: cost a masked 3-hospital exchange 0.12-0.14 s of waiting for the poll (``benchmarks/flower_scale``,
#: ``node_poll_wait``), the largest piece of a round that is not compute; 0.02 s cost the SuperLink
#: CPU that concurrent federations on two cores needed (module docstring).
DEFAULT_IDLE_POLL, DEFAULT_IDLE_POLL_MAX, DEFAULT_REPLY_WAIT = 0.05, 1.0, 0.05
#: Past its floor, the idle poll waits this share of the time since the node's last message.
IDLE_GROWTH = 0.25
#: The floor right after a message is this share of the node's last wait for a message (from its
#: reply to the next message), between ``idle`` and :data:`FLOOR_MAX` (until a wait was seen: ``FLOOR_MAX``).
#: Why not ``idle`` always: with 20 SuperNodes, whose exchanges take 2-4 s, a 0.02 s floor tripled the
#: nodes' idle polls and the SuperLink's CPU with them (3-5 ms a call), and the round took longer.
GAP_SHARE, FLOOR_MAX = 0.1, 0.2
#: After sending its reply the node does not poll for :data:`QUIET_SHARE` of its shortest wait for a
#: message over the last :data:`QUIET_MEMORY` messages (at most ``idle_max``): Flower's loop pulls at
#: once after a reply, and that pull and the next few found nothing, because the server sends the
#: next stage only once it has every hospital's reply (``benchmarks/flower_scale``, fourth pass). The
#: shortest wait is the node's when it was the last to answer (the critical path), so half of it
#: ends before the next message can be there in a steady run.
QUIET_SHARE, QUIET_MEMORY = 0.5, 5
#: The function of Flower 1.41's SuperNode loop that pulls a message, creates its task, then pulls the
#: message's objects from the SuperLink (returns the run id, or None when there was none).
PULL_AND_STORE = "_pull_and_store_message"
#: The function of the same loop that waits for the ClientApp's reply and sends it to the SuperLink.
PUSH_REPLIES = "_push_messages"


class SupernodeClock:
    """Stands in for :mod:`time` inside one Flower module: two fixed sleeps shortened, nothing else.

    The idle poll waits a floor while the node's last message (pulled, or its reply sent:
    :meth:`message_pulled`, :meth:`reply_sent`) is recent, then :data:`IDLE_GROWTH` of the time
    since, at most ``idle_max``: a node in the middle of a round polls often, an idle node
    rarely, and a message is seen within about a quarter of the time it took to come. The floor
    follows the node's last wait for a message (:data:`GAP_SHARE`, between ``idle`` and
    :data:`FLOOR_MAX`): a tenth of it, so 3 hospitals whose next message follows within 0.1-0.3 s
    poll every 0.05 s and 20 hospitals whose exchanges take seconds every 0.2 s. Why: every
    idle poll is an HTTPS call the one SuperLink serves; with 20 SuperNodes at a fixed 0.2 s
    they were 100 calls a second, about half the SuperLink's calls (estimated from
    ``benchmarks/flower_scale``: about 80 useful calls a second in a round)."""

    def __init__(self, *, idle: float, reply: float, idle_max: float | None = None,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic):
        self._sleep, self._now = sleep, monotonic
        idle_max = idle if idle_max is None else idle_max
        for name, value in (("idle", idle), ("reply", reply), ("idle_max", idle_max)):
            if not 0.01 <= value <= FLOWER_IDLE_POLL:
                option = {"idle": " (--supernode-poll)", "idle_max": " (--supernode-poll-max)"}.get(name, "")
                raise ConfigError(f"SuperNode {name} wait{option} {value} s must be in [0.01, {FLOWER_IDLE_POLL}] seconds.")
        if idle_max < idle:
            raise ConfigError(f"SuperNode idle_max wait {idle_max} s is below its idle wait {idle} s: pass a "
                              "--supernode-poll-max at least --supernode-poll (equal: a fixed poll).")
        self.idle, self.idle_max, self.reply = idle, idle_max, reply
        self.floor = max(idle, FLOOR_MAX)
        self._last_message = monotonic()
        self._replied: float | None = None
        self._gaps: collections.deque[float] = collections.deque(maxlen=QUIET_MEMORY)

    def message_seen(self) -> None:
        """The node pulled a message or sent a reply: poll often again."""
        self._last_message = self._now()

    def message_pulled(self) -> None:
        """A message was stored: the floor becomes :data:`GAP_SHARE` of the wait since the last reply."""
        if self._replied is not None:
            gap = self._now() - self._replied
            self._gaps.append(gap)
            self.floor = min(max(self.idle, GAP_SHARE * gap), max(self.idle, FLOOR_MAX))
        self.message_seen()

    def reply_sent(self) -> None:
        """The node sent its reply: the wait for the next message begins."""
        self.message_seen()
        self._replied = self._last_message

    def quiet(self) -> float:
        """Seconds the node does not poll after a reply (:data:`QUIET_SHARE`): 0 until a wait was seen."""
        return min(QUIET_SHARE * min(self._gaps), self.idle_max) if self._gaps else 0.0

    def after_reply(self) -> None:
        """The reply was sent (:meth:`reply_sent`); wait :meth:`quiet` before Flower's loop pulls again."""
        self.reply_sent()
        if wait := self.quiet():
            self._sleep(wait)

    def idle_wait(self) -> float:
        """Seconds the next idle poll waits."""
        return min(max(self.floor, IDLE_GROWTH * (self._now() - self._last_message)), self.idle_max)

    def sleep(self, seconds: float) -> None:
        if float(seconds) == FLOWER_IDLE_POLL:
            self._sleep(self.idle_wait())
        else:
            self._sleep(self.reply if float(seconds) == FLOWER_REPLY_WAIT else seconds)

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def _loop_module() -> ModuleType:
    from flwr.supernode import start_client_internal

    return start_client_internal


def check_supernode_waits(module: ModuleType | None = None) -> None:
    """ConfigError unless Flower's SuperNode loop still sleeps the two fixed waits this module replaces."""
    source = inspect.getsource(module or _loop_module())
    missing = [f"time.sleep({w})" for w in (FLOWER_IDLE_POLL, FLOWER_REPLY_WAIT) if f"time.sleep({w})" not in source]
    if missing:
        raise ConfigError(f"Flower's SuperNode loop no longer calls {', '.join(missing)}: the installed flwr is not "
                          "the one the SuperNode wait settings were written for. Pass --supernode-poll 3 "
                          "(Flower's own waits) or install flwr 1.41.")


def idle_poll_max(idle: float, given: float | None) -> float:
    """The idle poll's ceiling: ``given`` (``--supernode-poll-max``) as is, so that a value below
    ``idle`` or out of range is refused by :class:`SupernodeClock`; unset, the default raised to ``idle``."""
    return max(idle, DEFAULT_IDLE_POLL_MAX) if given is None else given


def set_supernode_waits(*, idle: float, reply: float, idle_max: float | None = None,
                        module: ModuleType | None = None) -> SupernodeClock:
    """Make Flower's SuperNode loop poll the SuperLink every ``idle`` s (growing to ``idle_max`` s
    while no message comes: :class:`SupernodeClock`) and its reply every ``reply`` s."""
    target = module or _loop_module()
    check_supernode_waits(target)
    clock = SupernodeClock(idle=idle, reply=reply, idle_max=idle_max)
    if clock.idle_max > clock.idle:  # the clock must hear of every message and reply
        _require(target, PULL_AND_STORE, PUSH_REPLIES)
        watch_message_pulls(started=_nothing, ended=lambda stored: clock.message_pulled() if stored else None,
                            module=target)
        _after(target, PUSH_REPLIES, clock.after_reply)
    target.time = clock  # type: ignore[attr-defined]
    return clock


def _nothing() -> None:
    return None


def _require(module: ModuleType, *names: str) -> None:
    """ConfigError unless Flower's SuperNode loop still has the functions ``names`` (hooked here)."""
    missing = [n for n in names if not callable(getattr(module, n, None))]
    if missing:
        raise ConfigError(f"Flower's SuperNode loop has no {', '.join(m + '()' for m in missing)}: the installed flwr "
                          "is not the one the SuperNode hooks were written for. Install flwr 1.41 (or, for the "
                          "growing idle poll, pass --supernode-poll-max equal to --supernode-poll).")


def _after(module: ModuleType, name: str, callback: Callable[[], None]) -> None:
    """Call ``callback`` after each call of ``module.name``."""
    inner = getattr(module, name)

    @functools.wraps(inner)
    def then(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        finally:
            callback()

    setattr(module, name, then)




def watch_message_pulls(*, started: Callable[[], None], ended: Callable[[bool], None],
                        module: ModuleType | None = None) -> None:
    """Call ``started()`` when Flower's SuperNode loop begins a pull and ``ended(stored)`` when it is
    done (``stored``: a message was stored and its task created).

    Why both: Flower creates the task *before* it pulls the message's objects, so an executor that
    polls in between starts a ClientApp that asks for objects not there yet, and Flower's
    ClientApp retries about a second later (measured: 1.2 s). Between ``started`` and ``ended``
    the warm executor does not poll; at ``ended(True)`` it polls at once.
    ConfigError if the loop no longer has :data:`PULL_AND_STORE` (a Flower update): then nothing
    is changed."""
    target = module or _loop_module()
    _require(target, PULL_AND_STORE)
    inner = getattr(target, PULL_AND_STORE)

    @functools.wraps(inner)
    def pulled(*args: Any, **kwargs: Any) -> Any:
        run_id = None
        started()
        try:
            run_id = inner(*args, **kwargs)
            return run_id
        finally:
            ended(run_id is not None)

    setattr(target, PULL_AND_STORE, pulled)


#: Flower 1.41 retries an object that is not stored yet after 1 s, doubling up to 10 s
#: (``pull_objects``' ``initial_backoff``); ours (seconds): the push of a message's three objects
#: takes 0.02-0.03 s, so a pull that comes first finds them within one retry.
FLOWER_PULL_BACKOFF, DEFAULT_PULL_BACKOFF = 1, 0.05


def set_object_pull_backoff(initial: float = DEFAULT_PULL_BACKOFF, *, function: Any = None) -> None:
    """Make this process's Flower retry a not-yet-stored object after ``initial`` s (doubling) instead of 1 s.

    Why: Flower makes a message visible (``PullMessages``) before its objects are pushed, so a
    pull that comes in between finds an object missing and waits 1 s. With our short polls
    that hit about one exchange in three (before the first 0.05 s backoff), on both sides (the SuperNode pulling the server's
    message, the ServerApp pulling a reply; measured: ``benchmarks/flower_scale/round_time.py``,
    ``node_pull`` / ``server_pull`` of about 1 s). The retry limits (500 tries, 2 h) are Flower's.
    ConfigError if the installed Flower's ``pull_objects`` has another default (a Flower update)."""
    if function is None:
        from flwr.supercore.inflatable import inflatable_utils

        function = inflatable_utils.pull_objects
    if not 0.01 <= initial <= FLOWER_PULL_BACKOFF:
        raise ConfigError(f"Object pull backoff {initial} s must be in [0.01, {FLOWER_PULL_BACKOFF}] seconds.")
    defaults = getattr(function, "__kwdefaults__", None) or {}
    if defaults.get("initial_backoff") not in (FLOWER_PULL_BACKOFF, initial):
        raise ConfigError("Flower's pull_objects no longer has initial_backoff=1: the installed flwr is not the one "
                          "the object pull backoff was written for. Install flwr 1.41.")
    defaults["initial_backoff"] = initial
