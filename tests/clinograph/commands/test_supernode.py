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


def test_a_hospital_not_enrolled_or_with_another_hospitals_key_is_refused_at_start(tmp_path):
    """Both started without a word and failed only at the first run's greeting."""
    from clinograph.secure.transport.flower.keyset import init_keyset

    keys = init_keyset(tmp_path / "k", federation_id="fed-a", hospitals=["h1", "h2"], superlink_hosts=["127.0.0.1"],
                       superlink_port=9092)
    fed, h1 = keys.federation_file, keys.hospital_dirs["h1"] / "h1.ed25519.pem"

    def start(hospital: str):
        node = f"hospital='{hospital}' key-file='{h1}' federation-file='{fed}' data-dir='.' state-dir='s'"
        res = CliRunner().invoke(app, ["supernode", "--node-config", node, "--superlink", "127.0.0.1:9"])
        return res.exit_code, " ".join(res.output.split())

    code, said = start("h9")
    assert code == 2 and "hospital='h9' is not enrolled in federation-file" in said and "h1, h2" in said, said
    code, said = start("h2")
    assert code == 2 and "is not the key enrolled for 'h2'" in said and "it is the key of 'h1'" in said, said
    assert "Traceback" not in said
