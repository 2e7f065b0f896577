"""The Flower ServerApp: greet the SuperNodes, build the server from ``server.toml``, run the rounds.

Point ``[tool.flwr.app.components] serverapp`` at
``clinograph.secure.transport.flower.serverapp:app``; no deployment code is needed. Run config
keys (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``):

=====================  =====================================================================
``server-config``      path (on the SuperLink machine) of ``server.toml``
                       (:class:`clinograph.secure.runtime.ServerConfig`: federation, DP
                       policy, initial model file, audit directory)
``federation-file``    path of ``federation.toml`` (who is enrolled, with which keys)
``server-key``         path of the server's Ed25519 signing key
``rounds``             optional: overrides ``[federation] rounds`` (0: use server.toml's)
``min-nodes``          wait for this many connected SuperNodes before greeting them
``wait-timeout``       seconds to wait for them (then go on with those present)
``hello-timeout``      seconds for the signed hello
``plan-timeout``       seconds for the plan stage (includes local training)
``stage-timeout``      seconds for each later stage (a dead node costs one of these)
``end-timeout``        seconds to deliver the last global model
``events-file``        optional JSON-lines progress log (names, stages, reasons -- no data)
=====================  =====================================================================

The hospitals that answered the hello are invited to every round; the masked mode's
parameters are recomputed for each round's participants.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ...audit import AuditTrail
from ...errors import ConfigError, ProtocolError
from ...identity import Identity
from ...messages import RoundResult
from ...runtime import (
    ServerConfig,
    build_server,
    initial_model_from_bytes,
    run_ckks_ceremony,
    run_rounds,
)
from . import check_flower_version
from .driver import FlowerTransport, Timeouts, greet_nodes
from .enrolment import load_federation

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


def run_federation(grid: Grid, run_config: Mapping[str, Any]) -> list[RoundResult]:
    """Everything the ServerApp does, callable with any Grid (tests use a loopback one)."""
    check_flower_version()
    config = ServerConfig.from_toml(Path(_get(run_config, "server-config", str)))
    federation = load_federation(Path(_get(run_config, "federation-file", str)))
    fed = config.federation
    if fed.id != federation.federation_id:
        raise ConfigError(f"server.toml runs federation {fed.id!r} but the federation file enrols "
                          f"{federation.federation_id!r}; make [federation] id match.")
    if config.initial_model is None:
        raise ConfigError("server.toml names no initial_model: write one with `clinograph model init` "
                          "(hospital install) and set initial_model = \"initial_model.json\".")
    try:
        initial = initial_model_from_bytes(Path(config.initial_model).read_bytes())
    except OSError as exc:
        raise ConfigError(f"Cannot read the initial model {config.initial_model}: {exc.strerror}.") from None
    rounds = _get(run_config, "rounds", int, 0) or fed.rounds
    min_nodes = _get(run_config, "min-nodes", int, len(federation.hospitals))
    wait = _get(run_config, "wait-timeout", float, 60.0)
    timeouts = Timeouts(hello=_get(run_config, "hello-timeout", float, 60.0),
                        plan=_get(run_config, "plan-timeout", float, 600.0),
                        stage=_get(run_config, "stage-timeout", float, 120.0),
                        end=_get(run_config, "end-timeout", float, 60.0))
    events = _Events(_get(run_config, "events-file", str, ""))
    import importlib.util
    import sys

    events("started", {"federation": fed.id, "secure_mode": fed.secure_mode, "python": sys.prefix,
                       "torch_installed": importlib.util.find_spec("torch") is not None})
    identity = Identity.load(federation.server.name, Path(_get(run_config, "server-key", str)))
    deadline = time.monotonic() + wait
    node_ids = sorted(grid.get_node_ids())
    while len(node_ids) < min_nodes and time.monotonic() < deadline:
        time.sleep(0.5)
        node_ids = sorted(grid.get_node_ids())
    enrolled = federation.enrolled()
    nodes, refused = greet_nodes(grid, federation_id=federation.federation_id, enrolled=enrolled,
                                 node_ids=node_ids, timeout=timeouts.hello)
    events("greeted", {"hospitals": sorted(nodes), "refused": {str(k): v for k, v in refused.items()}})
    if len(nodes) < min(fed.min_clients, len(enrolled)):
        raise ProtocolError(f"Only {len(nodes)} hospital(s) proved they serve an enrolled hospital within "
                            f"{timeouts.hello:g} s ({len(node_ids)} node(s) connected); the federation needs "
                            f"{fed.min_clients}. Check the SuperNodes' logs and key files.")
    transport = FlowerTransport(grid, nodes=nodes, timeouts=timeouts)
    ckks_context = None
    if fed.secure_mode == "ckks":
        from ...ckks.presets import CkksPreset

        ckks_context, holders = run_ckks_ceremony(transport, federation_id=fed.id, participants=tuple(sorted(nodes)),
                                                  enrolled=enrolled, preset=CkksPreset(fed.ckks_preset),
                                                  min_holders=min(fed.min_clients, len(nodes)))
        events("ckks_keys", {"holders": list(holders)})
        transport = FlowerTransport(grid, nodes={n: nodes[n] for n in holders}, timeouts=timeouts)
    audit = AuditTrail(Path(config.audit_dir), identity=identity)
    try:
        server = build_server(federation=fed, identity=identity, enrolled=enrolled, initial=initial, audit=audit,
                              dp_policy=config.dp_policy.policy() if config.dp_policy else None,
                              ckks_context=ckks_context)
        outcomes = run_rounds(server, transport, rounds=rounds, on_event=events)
    finally:
        audit.close()
    events("finished", {"rounds": len(outcomes)})
    return [o.result for o in outcomes]


@app.main()
def _main(grid: Grid, context: Context) -> None:
    run_federation(grid, context.run_config)
