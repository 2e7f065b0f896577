"""A ClientApp that died without replying is answered at once, not a minute later.

Flower 1.41's SuperNode answers a message whose ClientApp process died ("ClientApp stopped
responding.", ``CLIENT_APP_CRASHED``) only when the task's token expires: the ClientApp's
heartbeats stop, and the token lives ``HEARTBEAT_PATIENCE`` × ``HEARTBEAT_DEFAULT_INTERVAL`` =
60 s past the last one (Flower's own executor waits the same). The warm executor reaps the child
as soon as it exits (:meth:`.superexec.WarmExecutor.reconcile`) and knows its task, and our
SuperExec thread runs in the SuperNode's process: :func:`expire_task` makes that task's token
expire now in the SuperNode's own state, and Flower's own clean-up does the rest -- the task is
marked failed ("No heartbeat received from the task") and the same error reply goes to the
server. Measured: tests/integration/test_flower_warm_executor.py's killed ClientApp, about 60 s
of its 79 s.

Only a *running* task whose token is still live is touched. A ClientApp that replied has
finished its task (``PushTaskOutput`` revokes the token), so an exit code after its reply
changes nothing; a task still starting is left to Flower (which would put it back in the queue:
expired at once, a ClientApp that dies at start would be forked again and again).

:func:`capture_node_state` (called by the launcher before Flower's SuperNode main) keeps the
state Flower's ``NodeStateFactory`` hands out. On a Flower whose state no longer has the parts
used here, :func:`expire_task` does nothing and Flower's own 60 s apply.
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

#: What :func:`expire_task` uses of Flower 1.41's ``InMemoryNodeState``.
STATE_PARTS = ("lock_task_store", "task_token_store", "task_store", "_cleanup_expired_task_tokens_locked")
_node: dict[str, Any] = {"state": None}
_log = logging.getLogger(__name__)


def capture_node_state(factory: Any = None) -> None:
    """Keep the NodeState that ``factory`` (a class; default Flower's ``NodeStateFactory``) hands out."""
    if factory is None:
        from flwr.supernode.nodestate import NodeStateFactory as factory
    inner = factory.state
    if getattr(inner, "_keeps_node_state", False):  # captured already
        return

    @functools.wraps(inner)
    def state(self: Any) -> Any:
        out = inner(self)
        _node["state"] = out
        return out

    state._keeps_node_state = True  # type: ignore[attr-defined]
    factory.state = state


def expire_task(task_id: int, *, state: Any = None) -> bool:
    """Expire the token of running task ``task_id`` now, so that Flower answers its message with its
    crash error at once (see the module docstring). True if it did; False if the task is not
    running with a live token, or no usable state was captured."""
    from flwr.common.constant import Status
    from flwr.supercore.date import now

    state = state if state is not None else _node["state"]
    if state is None or not all(hasattr(state, part) for part in STATE_PARTS):
        return False
    with state.lock_task_store:
        record, task = state.task_token_store.get(task_id), state.task_store.get(task_id)
        if record is None or task is None or task.status.status != Status.RUNNING:
            return False
        record.active_until = now() - timedelta(seconds=1)
        state._cleanup_expired_task_tokens_locked()
    _log.warning("answered the message of task %d as crashed now (Flower would wait for its token to expire)",
                 task_id)
    return True
