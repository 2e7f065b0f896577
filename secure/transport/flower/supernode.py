"""Start a hospital's SuperNode with the hospital living inside it.

Usage (every argument after the factory goes to ``flower-supernode`` unchanged)::

    python -m clinograph.secure.transport.flower.supernode \
        --superlink superlink.example.org:9092 --root-certificates keys/ca.pem \
        --auth-supernode-private-key keys/h1.node-auth \
        --node-config "hospital='h1' data-dir='/srv/h1/data' state-dir='/srv/h1/state' key-file='keys/h1.ed25519.pem'"

It loads the hospital's signing key, starts the :class:`~.worker.HospitalWorker` on the
state directory's local socket, then runs Flower's own SuperNode main in this process. With
``--insecure`` (plain-text gRPC) it refuses unless ``--insecure-transport`` is also given,
which goes through :func:`clinograph.secure.policy.require_allowed` (warns; refused in
production).

How ClientApps start (``--executor``): ``warm`` (the default) runs Flower's SuperNode with
``--isolation process`` and our SuperExec thread, which forks each ClientApp from a pre-imported
forkserver (:mod:`.superexec`); ``subprocess`` is Flower's own ``flower-superexec`` starting a
``flwr-clientapp`` per message. ``--supernode-poll`` shortens the SuperNode's fixed 3 s idle
poll of the SuperLink, growing to ``--supernode-poll-max`` while no message comes
(:mod:`.polling`). Measured in ``benchmarks/flower_scale/round_time.py``;
the operator's view is in docs/deployment.md.

Logging (:func:`configure_hospital_logging`): one handler on the root logger; Clinograph's
loggers at ``INFO`` (``--log-level``), other libraries at ``WARNING`` (httpx would log every
3-second poll), everything at ``DEBUG`` with ``--log-level debug``; Flower's own logger kept
to its console handler, without its five INFO lines a message (``Receiving: ...``, ``Sent
successfully``: shown with ``--log-level debug``). Without
this every Flower line was printed twice and ~60 DEBUG lines a minute appeared on an idle
node: importing Opacus (the hospital's DP training) calls ``logging.basicConfig`` on the
root logger, which Flower's ``flwr`` logger (level DEBUG) propagates to. A root handler set up
first makes that call a no-op.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from clinograph.core.errors import ClinographError, ConfigError
from clinograph.core.logging import format_warning

from ...policy import Environment, require_allowed
from . import check_flower_version
from .clientapp_pin import CLINOGRAPH_CLIENTAPP
from .crash_report import capture_node_state
from .logfilters import NoPerMessageLines, install, is_terminal
from .polling import (
    DEFAULT_IDLE_POLL,
    DEFAULT_IDLE_POLL_MAX,
    DEFAULT_REPLY_WAIT,
    FLOOR_MAX,
    FLOWER_IDLE_POLL,
    idle_poll_max,
    set_object_pull_backoff,
    set_supernode_waits,
    watch_message_pulls,
)
from .superexec import DEFAULT_POLL_INTERVAL, RuntimeApi, SuperExecLoop, WarmExecutor
from .worker import HospitalWorker, check_node_config, load_factory

#: The hospital built from files (a string reference: ``secure`` never imports ``sdk`` statically).
DEFAULT_FACTORY = "clinograph.sdk.federation.node:make_hospital"

INSECURE_FLAGS = ("--insecure", "--insecure-transport")
EXECUTORS = ("warm", "subprocess")


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def insecure_abbreviations(argv: Sequence[str]) -> list[str]:
    """Arguments that abbreviate an insecure flag (``--insecur``, ``--ins``, ``--insecure-t``).

    argparse (ours with its default, Flower's always) expands an unambiguous prefix to the full
    option, so ``--insecur`` would start plain-text gRPC while a check for the literal
    ``--insecure`` passed. Insecure options count only by their full name: a prefix is refused.
    """
    out = []
    for arg in argv:
        if arg == "--":
            break
        name = _flag_name(arg)
        if len(name) > 2 and name.startswith("--") and name not in INSECURE_FLAGS and any(
                flag.startswith(name) for flag in INSECURE_FLAGS):
            out.append(name)
    return out


def refuse_abbreviations(argv: Sequence[str]) -> None:
    """Raise ConfigError if any argument abbreviates an insecure option (see above)."""
    abbreviated = insecure_abbreviations(argv)
    if abbreviated:
        raise ConfigError(f"Option {abbreviated[0]!r} abbreviates an insecure option ({', '.join(INSECURE_FLAGS)}). "
                          "Insecure options are accepted only by their full name: write it out in full (and only "
                          "with --environment development), or remove it and pass --root-certificates.")


def check_transport(flower_args: Sequence[str], *, insecure_transport: bool, environment: Environment) -> None:
    """Refuse ``--insecure`` unless named (``insecure_transport``); warns, refused in production.

    Any abbreviation of ``--insecure`` or ``--insecure-transport`` is refused outright: an
    insecure option is accepted only by its full name.
    """
    refuse_abbreviations(flower_args)
    if not any(_flag_name(a) == "--insecure" for a in flower_args):
        return
    if not insecure_transport:
        raise ConfigError("flower-supernode --insecure sends protocol messages without TLS. Remove it and pass "
                          "--root-certificates, or add --insecure-transport --environment development.")
    require_allowed("insecure_transport", environment=environment, why="Flower messages travel without TLS",
                    fix="Remove --insecure and pass --root-certificates, or, for a test on one machine, "
                        "add --environment development.")


#: Flower's flag that lets a run's app bundle pip-install packages on the hospital's node
DEPENDENCY_INSTALL_FLAG = "--allow-runtime-dependency-installation"


def check_run_code(flower_args: Sequence[str], *, executor: str, environment: Environment) -> None:
    """Code a run may bring to the hospital's node is insecure by name: Flower's own executor
    (``--executor subprocess``) imports the ClientApp the run's app bundle (FAB) names -- code
    chosen by whoever submits the run, beside this hospital's data and keys -- and
    ``--allow-runtime-dependency-installation`` lets the run install packages. Each warns, is
    refused in production and, for the former, is named ``insecure_fab_clientapp``; the warm
    executor runs only the pinned ClientApp (:mod:`.clientapp_pin`)."""
    if executor == "subprocess":
        require_allowed("insecure_fab_clientapp", environment=environment,
                        why="Flower's own executor imports the ClientApp the run's app bundle names: code chosen by "
                            "whoever submits a run would run beside this hospital's data and keys",
                        fix="Remove --executor subprocess (the default warm executor runs only this node's "
                            "--clientapp), or, for a test, add --environment development.")
    if any(_flag_name(a) == DEPENDENCY_INSTALL_FLAG for a in flower_args):
        require_allowed("insecure_runtime_dependency_install", environment=environment,
                        why="a run's app bundle could install and run packages on this hospital's node",
                        fix=f"Remove {DEPENDENCY_INSTALL_FLAG} and install the app's dependencies beforehand, or, "
                            "for a test, add --environment development.")


def executor_args(flower_args: Sequence[str], *, executor: str, poll: float | None) -> list[str]:
    """``flower-supernode`` arguments for ``executor``: warm adds ``--isolation process`` (our SuperExec
    thread serves the Runtime API), subprocess leaves Flower's own; ConfigError on a conflict."""
    isolation = [a for a in flower_args if _flag_name(a) == "--isolation"]
    if executor == "warm":
        if isolation:
            raise ConfigError("--isolation is set by --executor: --executor warm runs the SuperNode with "
                              "--isolation process and its own SuperExec. Remove --isolation, or pass "
                              "--executor subprocess for Flower's own subprocess isolation.")
        return [*flower_args, "--isolation", "process"]
    if poll is not None:  # Flower's flower-superexec reads its poll interval from the environment
        os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(poll)
    return list(flower_args)


def runtime_api(flower_args: Sequence[str]) -> RuntimeApi:
    """Where and how the SuperNode's Runtime API listens, read with Flower's own parser and defaults
    (what ``start_client_internal`` passes to the ``flower-superexec`` it starts)."""
    from flwr.supercore.address import resolve_bind_address
    from flwr.supercore.auth import load_superexec_auth_secret
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    args, _ = _parse_args_run_supernode().parse_known_args(list(flower_args))
    host = f"[{args.host}]" if ":" in args.host else args.host
    tls = bool(args.ssl_certfile or args.ssl_keyfile or args.ssl_ca_certfile)
    return RuntimeApi(address=resolve_bind_address(f"{host}:{args.port}"), insecure=not tls,
                      root_certificates_path=str(Path(args.ssl_ca_certfile).expanduser()) if tls else None,
                      auth_secret=(load_superexec_auth_secret(secret_file=args.superexec_auth_secret_file)
                                   if args.superexec_auth_secret_file else None),
                      runtime_dependency_install=bool(args.runtime_dependency_install))


def start_superexec(flower_args: Sequence[str], *, poll: float | None,
                    clientapp: str = CLINOGRAPH_CLIENTAPP) -> SuperExecLoop:
    """The warm executor's forkserver and our SuperExec thread, before Flower's SuperNode main runs;
    its ClientApp processes run only ``clientapp`` (:mod:`.clientapp_pin`). The thread polls as
    soon as the SuperNode has stored a message, and never while it stores one
    (:func:`.polling.watch_message_pulls`)."""
    executor = WarmExecutor(clientapp=clientapp)
    executor.start()
    capture_node_state()  # a ClientApp that dies is answered at once (.crash_report)
    loop = SuperExecLoop(runtime_api(flower_args), executor=executor,
                         poll_interval=DEFAULT_POLL_INTERVAL if poll is None else poll)
    watch_message_pulls(started=loop.pull_started, ended=loop.pull_ended)
    loop.start()
    return loop


#: flower-supernode's RuntimeError when its Runtime API server did not start (Flower 1.2x-1.4x)
RUNTIME_API_FAILED = "SuperNode Runtime HTTP API failed to start."


def check_runtime_port(args: Sequence[str]) -> None:
    """ConfigError if the SuperNode's Runtime API address (``--host``/``--port``, Flower's
    defaults otherwise) cannot be bound here; a malformed value is left to Flower to refuse."""
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    parser.add_argument("--port", default=str(SUPERNODE_UVICORN_DEFAULT_PORT))
    ours, _ = parser.parse_known_args(list(args))
    try:
        port = int(ours.port)
    except ValueError:
        return
    family = socket.AF_INET6 if ":" in ours.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            probe.bind((ours.host, port))
        except OSError as exc:
            default = " (Flower's default)" if port == SUPERNODE_UVICORN_DEFAULT_PORT else ""
            raise ConfigError(
                f"The SuperNode's local Runtime API address {ours.host}:{port}{default} cannot be used: "
                f"{exc.strerror or exc}. Another SuperNode (or another program) on this machine holds it: give "
                "this SuperNode a free port of its own with --port N (every SuperNode on one machine needs "
                "its own).") from None


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_hospital_logging(level: str = "info", *, stream: object | None = None) -> None:
    """Each line once, DEBUG off unless asked, Flower's per-message lines only with debug: see the
    module docstring."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    debug = level.lower() == "debug"
    root.setLevel(logging.DEBUG if debug else logging.WARNING)  # httpx/alembic INFO lines: polling noise
    logging.getLogger("clinograph").setLevel(level.upper())
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.propagate = False  # Flower prints through its own console handler
    for old in [f for f in flwr_logger.filters if isinstance(f, NoPerMessageLines)]:
        flwr_logger.removeFilter(old)
    if not debug:
        install(NoPerMessageLines, flwr_logger)  # Flower's five lines a message (logfilters.py)
    from flwr.common.logger import update_console_handler

    # colours only on a terminal: a SuperNode's log file (systemd, nohup) held "\x1b[92mINFO \x1b[0m:"
    update_console_handler(colored=False if debug else is_terminal(sys.stderr))
    if debug:
        update_console_handler(level="DEBUG", timestamps=True)


def main(argv: list[str] | None = None) -> int:
    """Parse our options, start the worker, hand the rest to ``flower-supernode``; Clinograph's
    warnings shown as one line each, as every clinograph command shows them (put back after)."""
    saved, warnings.formatwarning = warnings.formatwarning, format_warning
    try:
        return _main(argv)
    finally:
        warnings.formatwarning = saved


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # allow_abbrev=False: Flower's own --insecure must not be taken for our --insecure-transport
    parser = argparse.ArgumentParser(prog="clinograph supernode", add_help=True, allow_abbrev=False,
                                     epilog="Every other option is flower-supernode's, passed through "
                                            "(flower-supernode --help); see examples/flower_deployment/README.md.")
    parser.add_argument("--participant-factory", default=DEFAULT_FACTORY,
                        help="'package.module:function' building the hospital (default: Clinograph's own, from "
                             "the node's data-dir files: hospital.toml, schema.toml and table.csv -- or, for an EHR "
                             "export, schema.toml its [omop]/[meds]/[fhir] source file and the export at source, "
                             "source.duckdb or the URL in source.url; docs/ehr_formats.md)")
    parser.add_argument("--insecure-transport", action="store_true", help="allow flower-supernode --insecure")
    parser.add_argument("--environment", choices=["development", "production"], default="production")
    parser.add_argument("--node-config", required=True,
                        help="\"hospital='h1' data-dir='/srv/h1/data' state-dir='/srv/h1/state' "
                             "key-file='/srv/h1/keys/h1.ed25519.pem' federation-file='/srv/h1/keys/federation.toml'\" "
                             "(examples/flower_deployment/README.md, step 5)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning"], default="info",
                        help="the hospital's log level (default info; debug also turns on Flower's DEBUG lines)")
    parser.add_argument("--executor", choices=list(EXECUTORS), default="warm",
                        help="how a ClientApp process starts: 'warm' (default) forks it from a pre-imported "
                             "parent, polled by our SuperExec thread (the SuperNode runs with --isolation process); "
                             "'subprocess' is Flower's own flower-superexec starting flwr-clientapp per message")
    parser.add_argument("--superexec-poll", type=float, default=None, metavar="SECONDS",
                        help=f"seconds between two task polls of the SuperExec (warm: default "
                             f"{DEFAULT_POLL_INTERVAL}; subprocess: Flower's default 1, set through "
                             "FLWR_SUPEREXEC_TASK_POLL_INTERVAL)")
    parser.add_argument("--clientapp", default=CLINOGRAPH_CLIENTAPP, metavar="REF",
                        help="the only ClientApp this node runs (warm executor): a run whose app names another "
                             f"is refused before any of its code is imported (default: {CLINOGRAPH_CLIENTAPP}, "
                             "from the installed package, never from the run's files)")
    parser.add_argument("--supernode-poll", type=float, default=DEFAULT_IDLE_POLL, metavar="SECONDS",
                        help=f"the shortest wait between two polls of the SuperLink when idle (default "
                             f"{DEFAULT_IDLE_POLL}; right after a message the wait is a tenth of the node's last wait "
                             f"for one, up to {FLOOR_MAX} s, then grows; {FLOWER_IDLE_POLL} keeps Flower's own fixed "
                             "waits, see polling.py)")
    parser.add_argument("--supernode-poll-max", type=float, default=None, metavar="SECONDS",
                        help=f"the idle poll grows to this while no message comes (default {DEFAULT_IDLE_POLL_MAX}, "
                             "or --supernode-poll if larger; equal to --supernode-poll: a fixed poll)")
    try:  # on the raw argv, before parsing: no parser may expand a prefix of an insecure option
        refuse_abbreviations(argv)
    except ClinographError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ours, rest = parser.parse_known_args(argv)
    configure_hospital_logging(ours.log_level)
    try:
        check_flower_version()
        from flwr.common.config import parse_config_args

        check_transport(rest, insecure_transport=ours.insecure_transport, environment=ours.environment)
        check_run_code(rest, executor=ours.executor, environment=ours.environment)
        check_runtime_port(rest)  # before the worker starts: Flower's bind error was a traceback after it
        node_config = parse_config_args([ours.node_config])
        check_node_config(node_config)
        rest = executor_args(rest, executor=ours.executor, poll=ours.superexec_poll)
        factory = load_factory(ours.participant_factory)
        preflight = getattr(factory, "preflight", None)  # the default factory's check of the data-dir files
        if callable(preflight):
            preflight(node_config)
        worker = HospitalWorker(node_config=node_config, factory=factory)
        worker.start()
    except ClinographError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *rest, "--node-config", ours.node_config]
    try:
        if ours.supernode_poll < FLOWER_IDLE_POLL:
            set_object_pull_backoff()
            set_supernode_waits(idle=ours.supernode_poll, reply=min(DEFAULT_REPLY_WAIT, ours.supernode_poll),
                                idle_max=idle_poll_max(ours.supernode_poll, ours.supernode_poll_max))
        superexec = start_superexec(rest, poll=ours.superexec_poll, clientapp=ours.clientapp) if ours.executor == "warm" else None
    except ClinographError as exc:
        worker.stop()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        flower_supernode()
    except RuntimeError as exc:
        if str(exc) != RUNTIME_API_FAILED:
            raise
        # check_runtime_port passed moments ago: another program took the port since (uvicorn's line
        # above names the address), or the address is one uvicorn cannot serve
        print("error: The SuperNode's local Runtime API did not start (the line above says why; most often its "
              "port was taken by another program after this launcher checked it). Give this SuperNode a free "
              "port of its own with --port N and start it again.", file=sys.stderr)
        return 2
    finally:
        if superexec is not None:
            superexec.stop()
            superexec.executor.close()
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
