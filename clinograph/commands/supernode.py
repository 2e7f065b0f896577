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
