"""``clinograph supernode``'s checks before Flower starts: its local Runtime API port.

A second SuperNode on one machine with Flower's default ``--port`` (9094) ended in Flower's
"address already in use" log line and a RuntimeError traceback, after the hospital's worker had
started. The port is tried first and a taken one refused by name, with the fix.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence


def check_runtime_port(args: Sequence[str]) -> None:
    """ConfigError if the SuperNode's Runtime API address (``--host``/``--port``, Flower's
    defaults otherwise) cannot be bound here; a malformed value is left to Flower to refuse."""
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST

    from clinograph.core.errors import ConfigError

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


def check_enrolment(args: Sequence[str]) -> None:
    """ConfigError if ``--node-config`` names a hospital its ``federation-file`` does not enrol, or
    a ``key-file`` that is not that hospital's enrolled key (both went unnoticed until the first
    run's greeting, which the server refuses). Missing keys are the launcher's to report."""
    from pathlib import Path

    from flwr.common.config import parse_config_args

    from clinograph.core.errors import ConfigError
    from clinograph.core.identity import Identity
    from clinograph.secure.enrolment import load_federation

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--node-config")
    ours, _ = parser.parse_known_args(list(args))
    if not ours.node_config:
        return
    try:
        config = parse_config_args([ours.node_config])
    except Exception:  # noqa: BLE001 -- malformed: the launcher parses it again and says so
        return
    hospital, fed_file, key_file = (config.get(k) for k in ("hospital", "federation-file", "key-file"))
    if not all(isinstance(v, str) and v for v in (hospital, fed_file, key_file)):
        return
    fed = load_federation(Path(fed_file))
    enrolled = fed.enrolled()
    if hospital not in enrolled:
        raise ConfigError(f"--node-config hospital={hospital!r} is not enrolled in federation-file {fed_file} "
                          f"(federation {fed.federation_id!r}: {', '.join(enrolled)}). Use this hospital's own "
                          "name, or the federation.toml of the federation it belongs to (`clinograph keys init "
                          "--hospital NAME` enrols it).")
    mine = Identity.load(hospital, Path(key_file)).public
    if mine.raw != enrolled[hospital].raw:
        holder = [name for name, key in enrolled.items() if key.raw == mine.raw]
        whose = f"it is the key of {holder[0]!r}" if holder else "it is no enrolled hospital's key"
        raise ConfigError(f"--node-config key-file {key_file} is not the key enrolled for {hospital!r} in {fed_file} "
                          f"({whose}; fingerprint {mine.fingerprint[:16]}, enrolled "
                          f"{enrolled[hospital].fingerprint[:16]}). Use {hospital}'s own {hospital}.ed25519.pem "
                          "from `clinograph keys init`.")
