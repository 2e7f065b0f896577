"""`clinograph keys init`: every file in place, private ones 0600, the federation file loads."""

from __future__ import annotations

import os
import stat

from clinograph.secure.enrolment import load_federation
from clinograph.secure.pki import load_certificate, verify_server_certificate
from typer.testing import CliRunner

from clinograph.commands.keys import app
from clinograph.core.identity import Identity


def _init(tmp_path, *extra):
    return CliRunner().invoke(app, ["init", "--out", str(tmp_path / "keys"), "--federation-id", "fed-a",
                                    "--hospital", "h1", "--hospital", "h2", "--host", "10.0.0.5",
                                    "--host", "superlink.example.org", "--port", "9092", *extra])


def test_keys_init_writes_a_complete_keyset(tmp_path):
    r = _init(tmp_path)
    assert r.exit_code == 0, r.output
    k = tmp_path / "keys"
    fed = load_federation(k / "federation.toml")
    assert fed.federation_id == "fed-a" and fed.superlink_address == "10.0.0.5:9092"
    assert sorted(fed.hospitals) == ["h1", "h2"]
    for h in ("h1", "h2"):  # the key on disk is the one enrolled
        ident = Identity.load(h, k / "hospitals" / h / f"{h}.ed25519.pem")
        assert fed.enrolled()[h].raw == ident.public.raw
        pub = (k / "hospitals" / h / f"{h}.node-auth.pub").read_text().strip()
        assert fed.hospitals[h].node_auth_public_key == pub
    server = Identity.load("server", k / "superlink" / "server.ed25519.pem")
    assert fed.server_public().raw == server.public.raw
    cert = load_certificate(k / "superlink" / "server.pem")
    for host in ("10.0.0.5", "superlink.example.org"):
        verify_server_certificate(cert, ca=load_certificate(k / "hospitals" / "h1" / "ca.pem"), hostname=host)
    private = sorted(str(p.relative_to(k)) for p in k.rglob("*")
                     if p.is_file() and stat.S_IMODE(os.stat(p).st_mode) == 0o600)
    assert private == ["ca/ca.key", "hospitals/h1/h1.ed25519.pem", "hospitals/h1/h1.node-auth",
                       "hospitals/h2/h2.ed25519.pem", "hospitals/h2/h2.node-auth", "superlink/server.ed25519.pem",
                       "superlink/server.key"]
    for p in k.rglob("*"):  # everything else is public material, and no secret sits in a public file
        if p.is_file() and str(p.relative_to(k)) not in private:
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o644
            assert b"PRIVATE KEY" not in p.read_bytes(), p


def test_keys_init_refuses_to_overwrite_and_bad_names(tmp_path):
    assert _init(tmp_path).exit_code == 0
    again = _init(tmp_path)
    assert again.exit_code == 2 and "not empty" in again.output
    bad = CliRunner().invoke(app, ["init", "--out", str(tmp_path / "k2"), "--federation-id", "f",
                                   "--hospital", "bad name", "--hospital", "h1", "--hospital", "h1",
                                   "--host", "127.0.0.1"])
    assert bad.exit_code == 2
    assert "'bad name' must match" in bad.output and "repeat" in bad.output
    assert not (tmp_path / "k2").exists()


def test_keys_init_writes_server_pub_for_auditors_and_verify_pins_it(tmp_path):
    """docs/audit.md's `audit verify ... --trusted-key server.pub` works with what keys init wrote."""
    from clinograph.secure.audit import AuditTrail

    from clinograph.commands.audit import app as audit_app

    r = _init(tmp_path)
    assert r.exit_code == 0, r.output
    k = tmp_path / "keys"
    server = Identity.load("server", k / "superlink" / "server.ed25519.pem")
    assert (k / "server.pub").read_text() == server.public.b64() + "\n"
    assert f"fingerprint {server.public.fingerprint}" in r.output and "server.pub" in r.output
    with AuditTrail(tmp_path / "audit", identity=server) as trail:
        trail.record("note", {"x": 1})
    ok = CliRunner().invoke(audit_app, ["verify", str(tmp_path / "audit"), "--trusted-key", str(k / "server.pub")])
    assert ok.exit_code == 0, ok.output
    assert "signer checked" in ok.stdout and server.public.fingerprint in ok.stdout


def test_keys_init_prints_register_commands_whose_paths_exist(tmp_path):
    r = _init(tmp_path)
    assert r.exit_code == 0, r.output
    lines = [line.split() for line in r.output.splitlines() if "flwr supernode register" in line]
    assert len(lines) == 2  # one a hospital, the path as written from where the command ran
    for words, h in zip(lines, ("h1", "h2"), strict=True):
        path = words[words.index("register") + 1]
        assert path == str(tmp_path / "keys" / "hospitals" / h / f"{h}.node-auth.pub")


def test_bad_names_are_refused_at_once_before_any_key_is_written(tmp_path):
    """A federation id or server name federation.toml cannot hold was a pydantic traceback after
    the CA and some keys were already written (so the rerun met a non-empty --out)."""
    out = tmp_path / "keys"
    r = CliRunner().invoke(app, ["init", "--out", str(out), "--federation-id", "fed a", "--server-name", "the/server",
                                 "--hospital", "h1", "--hospital", "h 2", "--hospital", "h1", "--host", "10.0.0.5"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    for part in ("--federation-id 'fed a'", "--server-name 'the/server'", "hospital name 'h 2'", "repeat: h1"):
        assert part in said, said
    assert not out.exists()


def test_an_out_that_is_a_file_is_refused_by_name_not_a_traceback(tmp_path):
    """`--out export.csv` (or a folder under a file) was `internal error (NotADirectoryError)`."""
    (tmp_path / "export.csv").write_text("a,b\n")
    for out in (tmp_path / "export.csv", tmp_path / "export.csv" / "keys"):
        r = CliRunner().invoke(app, ["init", "--out", str(out), "--federation-id", "f", "--hospital", "h1",
                                     "--host", "127.0.0.1"])
        said = " ".join(r.output.split())
        assert r.exit_code == 2, r.output
        assert "export.csv is a file, not a directory" in said and "new or empty directory" in said, said
    assert (tmp_path / "export.csv").read_text() == "a,b\n"


def test_a_repeated_hospital_alone_is_not_told_the_naming_rule(tmp_path):
    """`--hospital north --hospital north` was answered with the naming rule too (letters, digits, ...),
    which the names already met."""
    r = CliRunner().invoke(app, ["init", "--out", str(tmp_path / "k"), "--federation-id", "f", "--hospital", "north",
                                 "--hospital", "north", "--host", "127.0.0.1"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "hospital names repeat: north (give each --hospital once)" in said, said
    assert "A name is letters" not in said and "nothing was written" in said, said
