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
``min-nodes``          look for new SuperNodes until this many are connected (each is
                       greeted as soon as it connects: :func:`.driver.greet_connected`)
``wait-timeout``       seconds to look for them (then go on with those present)
``hello-timeout``      seconds for each node's signed hello, from when it was sent
``plan-timeout``       seconds for the plan stage (includes local training)
``stage-timeout``      seconds for each later stage (a dead node costs one of these)
``end-timeout``        seconds to deliver the last global model
``reply-poll``         optional: shortest wait in seconds between two pulls of the
                       hospitals' replies (default 0.05; the wait grows to 5 % of the
                       time already waited, at most 1 s: :func:`.driver.poll_wait`)
``events-file``        optional JSON-lines progress log (names, stages, reasons -- no data)
``server-extension``   optional ``'package.module:function'`` called with the built
                       :class:`~clinograph.secure.server.FederationServer` before the first
                       round, e.g. FedNSL's transformer M-step
                       (``clinograph.sdk.fednsl.federation:attach_transformer``); an installed
                       module the operator names, never code read from a file
``journal``            optional path of the crash journal (SQLite, beside -- not inside -- the
                       audit directory): the server's state at every stage boundary; when
                       it exists the run resumes (:mod:`clinograph.secure.runtime.journal`)
=====================  =====================================================================

Crash and resume: with ``journal`` set, a ServerApp (or SuperLink) killed mid-run is resumed
by starting the same run again (``flwr run`` with the same run config): the new ServerApp
reopens the audit trail, restores the server from the journal, aborts and audits the round
that was open (reason ``server restart``) and runs the remaining rounds under new round
numbers. The hospitals' SuperNodes build a fresh participant for the new Flower run, which
resumes from the hospital's state directory (:mod:`clinograph.sdk.federation.anchor`).

The hospitals that answered the hello are invited to every round; the masked mode's
parameters are recomputed for each round's participants.

What the operator sees: every progress event (greeting with each hospital's Flower node id,
each round's participants by name, dropouts with their stage and the actual wait, refusals,
ε per hospital, the run's end) is also one line on the ``clinograph.secure.transport.flower.
serverapp`` logger. The ServerApp sends it to stdout, which Flower 1.41's ``flwr-serverapp``
mirrors into the run's log (``flwr log RUN_ID``, ``flwr run --stream``). A failed run is
logged, audited (``run_ended`` status ``failed``) and re-raised, so Flower marks the run
``finished:failed`` and ``flwr-serverapp`` exits non-zero; ``flwr run --stream`` itself exits
0 once the log stream ends whatever the run's status (``clinograph run`` wraps it with an exit
status: ``clinograph/commands/run_outcome.py``). Any error -- a config error before the first
round included -- is also written to ``events-file`` as a ``failed`` event. Inside a round,
each stage's answers and slowest hospital are a ``stage_progress`` event, and each
``round_closed`` carries the round's seconds and the ETA (:mod:`clinograph.secure.runtime.progress`). A
run that stops because too few hospitals can still take part (privacy budgets spent) is a
planned end: logged as a warning, audited (``too_few_hospitals``), not an error.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clinograph.secure.enrolment import load_federation
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity

from ...audit import AuditTrail
from ...messages import RoundResult
from ...runtime import ServerConfig
from ...runtime.assemble import ServerSide
from ...runtime.journal import Journal
from ...runtime.models import RunModels, run_models_from_file
from ...runtime.run import FederationRun
from ...runtime.run import run_federation as run_federation_plan
from ...runtime.voted import run_voted
from . import check_flower_version
from .driver import DEFAULT_POLL_INTERVAL, FlowerTransport, Timeouts, check_poll, greet_connected
from .logfilters import NoBlankLines, NoTracebackOfOurErrors, install
from .oplog import Events
from .polling import set_object_pull_backoff
from .worker import load_factory

app = ServerApp()
_log = logging.getLogger(__name__)


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


def run_federation(grid: Grid, run_config: Mapping[str, Any]) -> list[RoundResult]:
    """Everything the ServerApp does, callable with any Grid (tests use a loopback one): greet the
    SuperNodes, then the one federation run (:func:`clinograph.secure.runtime.run.run_federation`,
    the same run ``simulate()`` drives in process). Returns the kept candidate's round results.

    Whatever raises -- a config error before the first round included -- is written as a
    ``failed`` event (``reason``: the error's type and message) before it is re-raised, so
    ``clinograph run`` can name it (the JSON line is written even when no log line is)."""
    events = Events(_get(run_config, "events-file", str, ""), rounds=0)
    try:
        return _run_federation(grid, run_config, events)
    except BaseException as exc:
        events("failed", {"reason": f"{type(exc).__name__}: {exc}"[:1000]}, log=not events.failure_logged)
        raise


def _run_federation(grid: Grid, run_config: Mapping[str, Any], events: Events) -> list[RoundResult]:
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
    models = run_models_from_file(config.initial_model)
    rounds = _get(run_config, "rounds", int, 0) or fed.rounds
    min_nodes = _get(run_config, "min-nodes", int, len(federation.hospitals))
    wait = _get(run_config, "wait-timeout", float, 60.0)
    timeouts = Timeouts(hello=_get(run_config, "hello-timeout", float, 60.0),
                        plan=_get(run_config, "plan-timeout", float, 600.0),
                        stage=_get(run_config, "stage-timeout", float, 120.0),
                        end=_get(run_config, "end-timeout", float, 60.0))
    events.clock.rounds = rounds
    import importlib.util

    events("started", {"federation": fed.id, "secure_mode": fed.secure_mode, "python": sys.prefix,
                       "torch_installed": importlib.util.find_spec("torch") is not None,
                       "candidates": [c.name for c in models.candidates]})
    for line in models.default_lines():
        _log.info("%s", line)  # a setting the SDK resolved (the DP default model), audited as resolved_default
    identity = Identity.load(federation.server.name, Path(_get(run_config, "server-key", str)))
    journal_path = _get(run_config, "journal", str, "")
    if journal_path and Path(journal_path).resolve().is_relative_to(Path(config.audit_dir).resolve()):
        raise ConfigError(f"Run config 'journal' = {journal_path!r} lies inside the audit directory "
                          f"{config.audit_dir}, which holds only the audit trail; put it beside it "
                          f"(e.g. journal='{Path(config.audit_dir).with_suffix('.journal.sqlite')}').")
    audit = AuditTrail(Path(config.audit_dir), identity=identity)
    _log.info("audit run %s in %s", audit.run_id, config.audit_dir)
    journal = Journal(Path(journal_path)) if journal_path else None
    try:
        run = _run(grid, audit=audit, config=config, federation=federation, identity=identity, models=models,
                   rounds=rounds, min_nodes=min_nodes, wait=wait, timeouts=timeouts, events=events,
                   run_config=run_config, journal=journal)
    except BaseException as exc:
        reason = f"{type(exc).__name__}: {exc}"
        head = audit.head
        if not audit.closed and (head is None or head.kind != "run_ended"):
            audit.record("run_ended", {"status": "failed", "reason": reason[:4000], "rounds_completed": 0,
                                       "rounds_planned": rounds})
        _log.error("run failed (audit run %s): %s", audit.run_id, reason)
        events.failure_logged = True
        raise
    finally:
        audit.close()
        if journal is not None:
            journal.close()
    kept = run.kept
    events("finished", {"rounds": len(kept.outcomes), "candidate": kept.name})
    return [o.result for o in kept.outcomes]


def _run(grid: Grid, *, audit: AuditTrail, config: ServerConfig, federation: Any, identity: Identity,
         models: RunModels, rounds: int, min_nodes: int, wait: float, timeouts: Timeouts, events: Events,
         run_config: Mapping[str, Any], journal: Journal | None = None) -> FederationRun:
    poll = check_poll(_get(run_config, "reply-poll", float, DEFAULT_POLL_INTERVAL))  # before any wait for nodes
    fed = config.federation
    enrolled = federation.enrolled()
    nodes, refused, connected = greet_connected(grid, federation_id=federation.federation_id, enrolled=enrolled,
                                                min_nodes=min_nodes, wait=wait, timeout=timeouts.hello)
    events.nodes.update(nodes)
    events("greeted", {"hospitals": sorted(nodes), "nodes": dict(sorted(nodes.items())),
                       "refused": {str(k): v for k, v in refused.items()}})
    for node, reason in sorted(refused.items()):
        audit.record("hospital_refused", {"stage": "hello", "node": int(node), "reason": reason[:4000],
                                          "signed": False, "final": False})
    if len(nodes) < min(fed.min_clients, len(enrolled)):
        raise too_few_hellos(nodes, refused, connected=connected, timeout=timeouts.hello, needed=fed.min_clients)
    transport = FlowerTransport(grid, nodes=nodes, timeouts=timeouts,
                                poll=poll)
    extension = _get(run_config, "server-extension", str, "")
    side = ServerSide(federation=fed, identity=identity, enrolled=enrolled,
                      dp_policy=config.dp_policy.policy() if config.dp_policy else None,
                      audit_dir=Path(config.audit_dir), audit=audit,
                      configure=load_factory(extension) if extension else None)
    if models.vote is not None:  # concepts: the DAG vote, the derived model, its training
        return run_voted(models, side=side, transport=transport, rounds=rounds, on_event=events,
                         journal=journal).training
    return run_federation_plan(models, side=side, transport=transport, rounds=rounds, on_event=events,
                               journal=journal)


def too_few_hellos(nodes: Mapping[str, int], refused: Mapping[int, str], *, connected: int, timeout: float,
                   needed: int) -> ProtocolError:
    """The run's failure when fewer hospitals than the federation needs answered the hello: with the
    reasons of the nodes that refused it (a hospital whose data cannot be read says so in its refusal),
    which ``clinograph run`` prints as the run's last line -- not only "check the logs"."""
    head = (f"Only {len(nodes)} hospital(s) proved they serve an enrolled hospital within {timeout:g} s "
            f"({connected} node(s) connected); the federation needs {needed}.")
    if not refused:
        return ProtocolError(f"{head} Check the SuperNodes' logs and key files.")

    def one_line(reason: str) -> str:  # the hospital's own words: Flower's wrapping and escaped newlines off
        body = reason.removeprefix("error reply at 'hello': ")
        wrapped = re.fullmatch(r"(?s)\w+:\s*<'(.*)'>", body)  # ProtocolError:<'...'>, as error_reason leaves
        body = (wrapped.group(1) if wrapped else body).removeprefix("ProtocolError: ")
        return " ".join(body.replace("\\n", " ").split())[:400]

    reasons = "; ".join(f"node {node}: {one_line(r)}" for node, r in sorted(refused.items()))
    return ProtocolError(f"{head} {len(refused)} node(s) refused the hello -- {reasons}. Fix what each names (its "
                         "SuperNode's log says it too; the audit log keeps each as hospital_refused), then run again.")


def _log_to_stdout() -> None:
    """Send this module's progress lines to stdout, which flwr-serverapp mirrors into the run's
    log (``flwr log``, ``flwr run --stream``); once, and not also through the root logger."""
    if not any(getattr(h, "_clinograph_progress", False) for h in _log.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(levelname)s clinograph: %(message)s"))
        handler._clinograph_progress = True  # type: ignore[attr-defined]
        _log.addHandler(handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False
    install(NoBlankLines)  # flwr-serverapp's clean exit logs a blank INFO line: the stream's last line was empty
    install(NoTracebackOfOurErrors)  # our error's message is the 'run failed' line; Flower added its traceback


@app.main()
def _main(grid: Grid, context: Context) -> None:
    _log_to_stdout()
    set_object_pull_backoff()  # a reply pulled before its objects: retried after 0.05 s (doubling), not Flower's 1 s
    run_federation(grid, context.run_config)  # raises on a failed run: Flower marks it failed
