"""The Flower ServerApp: builds the FederationServer and runs rounds over the Grid.

Point ``[tool.flwr.app.components] serverapp`` at
``clinograph.secure.transport.flower.serverapp:app``. Run config keys (``[tool.flwr.app.config]``,
overridable with ``flwr run --run-config``):

=====================  =====================================================================
``server-factory``     ``'package.module:function'``; called once the nodes are greeted as
                       ``f(run_config=..., federation=FederationFile, participants=(names...))
                       -> FederationServer`` (mode parameters depend on the participant count)
``federation-file``    path (on the SuperLink machine) of ``federation.toml``
``rounds``             number of rounds
``min-nodes``          wait for this many connected SuperNodes before greeting them
``wait-timeout``       seconds to wait for them (then go on with those present)
``hello-timeout``      seconds for the signed hello
``plan-timeout``       seconds for the plan stage (includes local training)
``stage-timeout``      seconds for each later stage (a dead node costs one of these)
``end-timeout``        seconds to deliver the global model
``events-file``        optional JSON-lines progress log (names, stages, reasons -- no data)
=====================  =====================================================================

The hospitals that answered the hello are invited to every round of the run; one that has
died drops out at the plan stage (after ``stage-timeout``), so each round's participant set
stays the one the secure mode's parameters were computed for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ...errors import ConfigError, ProtocolError
from ...server import FederationServer
from . import check_flower_version
from .driver import Timeouts, greet_nodes, run_flower_round
from .enrolment import load_federation
from .worker import load_factory

app = ServerApp()


def _get(cfg: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"Run config lacks {key!r}. Set it under [tool.flwr.app.config] in the app's "
                          f"pyproject.toml or pass --run-config \"{key}=...\".")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"Run config {key!r} must be {kind.__name__}, got {type(value).__name__}.")
    return value


class _Events:
    def __init__(self, path: str):
        self.path = Path(path) if path else None

    def __call__(self, kind: str, data: Mapping[str, object]) -> None:
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(json.dumps({"t": time.time(), "event": kind, **data}, sort_keys=True) + "\n")


def run_federation(grid: Grid, run_config: Mapping[str, Any]) -> list[Any]:
    """Everything the ServerApp does, callable with any Grid (tests use a loopback one)."""
    check_flower_version()
    federation = load_federation(Path(_get(run_config, "federation-file", str)))
    factory = load_factory(_get(run_config, "server-factory", str))
    rounds = _get(run_config, "rounds", int)
    min_nodes = _get(run_config, "min-nodes", int, len(federation.hospitals))
    wait = _get(run_config, "wait-timeout", float, 60.0)
    timeouts = Timeouts(hello=_get(run_config, "hello-timeout", float, 60.0),
                        plan=_get(run_config, "plan-timeout", float, 600.0),
                        stage=_get(run_config, "stage-timeout", float, 120.0),
                        end=_get(run_config, "end-timeout", float, 60.0))
    events = _Events(_get(run_config, "events-file", str, ""))
    deadline = time.monotonic() + wait
    node_ids = sorted(grid.get_node_ids())
    while len(node_ids) < min_nodes and time.monotonic() < deadline:
        time.sleep(0.5)
        node_ids = sorted(grid.get_node_ids())
    nodes, refused = greet_nodes(grid, federation_id=federation.federation_id, enrolled=federation.enrolled(),
                                 node_ids=node_ids, timeout=timeouts.hello)
    events("greeted", {"hospitals": sorted(nodes), "refused": {str(k): v for k, v in refused.items()}})
    if not nodes:
        raise ProtocolError(f"No SuperNode proved it serves an enrolled hospital within {timeouts.hello:g} s "
                            f"({len(node_ids)} node(s) connected). Check the SuperNodes' logs and key files.")
    server: FederationServer = factory(run_config=dict(run_config), federation=federation,
                                       participants=tuple(sorted(nodes)))
    if len(nodes) < server.min_clients:
        raise ProtocolError(f"Only {len(nodes)} hospital(s) reachable ({sorted(nodes)}); the federation "
                            f"needs {server.min_clients}.")
    results = []
    pending: dict[str, bytes] = {}
    try:
        for r in range(rounds):
            try:
                done = run_flower_round(grid, server, nodes=nodes, timeouts=timeouts, pending_model=pending,
                                        deliver_model=(r == rounds - 1), on_event=events)
            except ProtocolError as exc:  # e.g. fewer survivors than the threshold: nothing published
                events("round_aborted", {"round": server.round, "reason": str(exc)})
                raise
            results.append(done.outcome.result)
            pending = done.pending_model
    finally:
        close = getattr(server.audit, "close", None)
        if callable(close):
            close()
    events("finished", {"rounds": len(results)})
    return results


@app.main()
def _main(grid: Grid, context: Context) -> None:
    run_federation(grid, context.run_config)
