"""`clinograph supernode`: a taken local Runtime API port is refused before anything starts."""

from __future__ import annotations

import socket

from typer.testing import CliRunner

from clinograph.cli import app


def test_a_taken_runtime_port_is_refused_by_name_with_the_fix():
    """A second SuperNode on one machine with the same --port was Flower's bind error and a
    RuntimeError traceback, after the hospital's worker had started."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        res = CliRunner().invoke(app, ["supernode", "--node-config", "hospital='h1'", "--port", str(port),
                                       "--superlink", "127.0.0.1:9"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert f"127.0.0.1:{port} cannot be used" in said and "--port N" in said and "Traceback" not in said
