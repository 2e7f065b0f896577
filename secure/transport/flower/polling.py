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
``idle`` seconds on the SuperLink (0.2 s: five a second a node). The idle poll itself cannot be
event-driven: Flower 1.41's Fleet API is request-response over HTTP, with no push from the
SuperLink to a SuperNode.

:func:`watch_message_pulls` is the third hook into the same loop: callbacks around each pull of
a message, with which the warm executor polls for the new task as soon as the message is stored
and never while it is half stored (:meth:`.superexec.SuperExecLoop.pull_started`).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from clinograph.core.errors import ConfigError

#: Flower 1.41's fixed waits in ``start_client_internal`` (seconds): idle poll, reply wait.
FLOWER_IDLE_POLL, FLOWER_REPLY_WAIT = 3, 0.5
#: Ours (seconds).
DEFAULT_IDLE_POLL, DEFAULT_REPLY_WAIT = 0.2, 0.05


class SupernodeClock:
    """Stands in for :mod:`time` inside one Flower module: two fixed sleeps shortened, nothing else."""

    def __init__(self, *, idle: float, reply: float, sleep: Callable[[float], None] = time.sleep):
        self._sleep = sleep
        for name, value in (("idle", idle), ("reply", reply)):
            if not 0.01 <= value <= FLOWER_IDLE_POLL:
                raise ConfigError(f"SuperNode {name} wait {value} s must be in [0.01, {FLOWER_IDLE_POLL}] seconds.")
        self._waits = {float(FLOWER_IDLE_POLL): idle, float(FLOWER_REPLY_WAIT): reply}

    def sleep(self, seconds: float) -> None:
        self._sleep(self._waits.get(float(seconds), seconds))

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


def set_supernode_waits(*, idle: float, reply: float, module: ModuleType | None = None) -> None:
    """Make Flower's SuperNode loop poll the SuperLink every ``idle`` s and its reply every ``reply`` s."""
    target = module or _loop_module()
    check_supernode_waits(target)
    target.time = SupernodeClock(idle=idle, reply=reply)  # type: ignore[attr-defined]


#: The function of Flower 1.41's SuperNode loop that pulls a message, creates its task, then pulls the
#: message's objects from the SuperLink (returns the run id, or None when there was none).
PULL_AND_STORE = "_pull_and_store_message"


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
    inner = getattr(target, PULL_AND_STORE, None)
    if not callable(inner):
        raise ConfigError(f"Flower's SuperNode loop has no {PULL_AND_STORE}(): the installed flwr is not the one "
                          "the warm executor's task wake-up was written for. Install flwr 1.41.")

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
