"""`clinograph audit verify|report` through typer's CliRunner: exit codes, messages, no tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from clinograph.secure.audit import AuditTrail
from typer.testing import CliRunner

from clinograph.commands.audit import app
from clinograph.core.identity import Identity

runner = CliRunner()


@pytest.fixture
def audit_dir(tmp_path) -> tuple[Path, Identity]:
    server = Identity.generate("server")
    d = tmp_path / "audit"
    with AuditTrail(d, identity=server) as trail:
        trail.record("ledger", {"client": "hosp-a", "round": 0, "epsilon": 1.5, "delta": 1e-5,
                                "budget_epsilon": 4.0, "noise_multiplier": 1.1})
        trail.publish("round-0000/global_model.json", b"{}", kind="global_model")
    return d, server


def test_verify_ok_with_and_without_pinned_key(audit_dir, tmp_path):
    d, server = audit_dir
    result = runner.invoke(app, ["verify", str(d)])
    assert result.exit_code == 0, result.output
    assert "OK: 3 entries verified" in result.stdout and "not pinned" in result.stdout
    keyfile = tmp_path / "server.pub"
    keyfile.write_text(server.public.b64() + "\n")
    result = runner.invoke(app, ["verify", str(d), "--trusted-key", str(keyfile)])
    assert result.exit_code == 0 and "not pinned" not in result.stdout


def test_verify_tampered_names_problem_on_stderr_without_traceback(audit_dir):
    d, _ = audit_dir
    log = d / "audit.jsonl"
    log.write_bytes(log.read_bytes().replace(b'"epsilon":1.5', b'"epsilon":0.5'))
    result = runner.invoke(app, ["verify", str(d)])
    assert result.exit_code == 1
    assert "FAILED" in result.stderr and "first bad entry: 1" in result.stderr
    assert "entry 1 (kind 'ledger'): content does not match its hash" in result.stderr
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an uncaught error


def test_verify_wrong_key_missing_dir_and_bad_key_argument(audit_dir, tmp_path):
    d, _ = audit_dir
    other = Identity.generate("server").public.b64()
    result = runner.invoke(app, ["verify", str(d), "--trusted-key", other])
    assert result.exit_code == 1 and "not by the trusted server key" in result.stderr
    result = runner.invoke(app, ["verify", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "is not a directory" in result.stderr
    result = runner.invoke(app, ["verify", str(d), "--trusted-key", "not-base64!"])
    assert result.exit_code == 2 and "32 bytes" in result.stderr
    assert isinstance(result.exception, SystemExit)


def test_report_writes_html_and_refuses_output_inside_the_audit_dir(audit_dir, tmp_path):
    d, _ = audit_dir
    out = tmp_path / "out" / "report.html"
    result = runner.invoke(app, ["report", str(d), "--out", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert 'id="img-privacy"' in html and 'id="verification-ok"' in html
    result = runner.invoke(app, ["report", str(d), "--out", str(d / "report.html")])
    assert result.exit_code == 1 and "inside the audit directory" in result.stderr
    assert not (d / "report.html").exists()
    (d / "artefacts" / ("00" * 32)).write_bytes(b"x")
    result = runner.invoke(app, ["report", str(d), "--out", str(out)])
    assert result.exit_code == 1 and "does not verify" in result.stderr
    assert 'id="verification-failed"' in out.read_text()
    result = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 1 and "not a directory" in result.stderr


def test_trusted_key_errors_are_distinct(audit_dir, tmp_path):
    """A missing file, a PEM private key, a non-base64 file and a wrong-length key each say what
    they are (exit 2); a valid key of another server is WRONG KEY (exit 1); a PEM public key works."""
    from cryptography.hazmat.primitives import serialization

    d, server = audit_dir
    missing = runner.invoke(app, ["verify", str(d), "--trusted-key", str(tmp_path / "keys" / "server.pub")])
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    server.save(tmp_path / "server.ed25519.pem")
    private = runner.invoke(app, ["verify", str(d), "--trusted-key", str(tmp_path / "server.ed25519.pem")])
    assert private.exit_code == 2 and "PEM *private* key" in private.stderr
    (tmp_path / "junk.pub").write_text("hello world\n")
    junk = runner.invoke(app, ["verify", str(d), "--trusted-key", str(tmp_path / "junk.pub")])
    assert junk.exit_code == 2 and "is not base64" in junk.stderr
    (tmp_path / "short.pub").write_text("c2hvcnQ=\n")
    short = runner.invoke(app, ["verify", str(d), "--trusted-key", str(tmp_path / "short.pub")])
    assert short.exit_code == 2 and "decodes to 5 byte(s)" in short.stderr
    assert len({missing.stderr, private.stderr, junk.stderr, short.stderr}) == 4
    other = tmp_path / "other.pub"
    other.write_text(Identity.generate("server").public.b64() + "\n")
    wrong = runner.invoke(app, ["verify", str(d), "--trusted-key", str(other)])
    assert wrong.exit_code == 1 and wrong.stderr.startswith("WRONG KEY")
    raw_pem = serialization.load_pem_private_key((tmp_path / "server.ed25519.pem").read_bytes(), None)
    (tmp_path / "server_pub.pem").write_bytes(raw_pem.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    ok = runner.invoke(app, ["verify", str(d), "--trusted-key", str(tmp_path / "server_pub.pem")])
    assert ok.exit_code == 0 and "signer checked" in ok.stdout


def test_report_says_whether_the_signer_was_checked(audit_dir, tmp_path):
    d, server = audit_dir
    out = tmp_path / "r.html"
    plain = runner.invoke(app, ["report", str(d), "--out", str(out)])
    assert plain.exit_code == 0 and "signer NOT checked" in plain.stdout
    assert 'id="signer-unchecked"' in out.read_text()
    key = tmp_path / "server.pub"
    key.write_text(server.public.b64() + "\n")
    pinned = runner.invoke(app, ["report", str(d), "--out", str(out), "--trusted-key", str(key)])
    assert pinned.exit_code == 0 and "signer checked" in pinned.stdout
    html = out.read_text()
    assert 'id="signer-trusted"' in html and server.public.fingerprint in html
    assert "SHA-256 of its 32 raw Ed25519 public-key bytes" in html
    key.write_text(Identity.generate("x").public.b64() + "\n")
    wrong = runner.invoke(app, ["report", str(d), "--out", str(out), "--trusted-key", str(key)])
    assert wrong.exit_code == 1 and 'id="signer-wrong"' in out.read_text()
    # the terminal said "signer NOT checked: no --trusted-key given" while one was given and did not match
    assert "signer check FAILED: the log is not signed by the --trusted-key given" in wrong.stdout
    assert "no --trusted-key given" not in wrong.stdout


def test_expect_head_detects_a_directory_rolled_back_to_an_earlier_valid_state(tmp_path):
    """A copy of the directory taken earlier verifies on its own; with the head noted later it fails."""
    import re
    import shutil

    server = Identity.generate("server")
    d = tmp_path / "audit"
    with AuditTrail(d, identity=server) as trail:
        trail.record("ledger", {"client": "hosp-a", "round": 0, "epsilon": 1.5, "delta": 1e-5,
                                "budget_epsilon": 4.0, "noise_multiplier": 1.1})
    shutil.copytree(d, tmp_path / "earlier")
    with AuditTrail(d, identity=server) as trail:  # the run goes on
        trail.record("ledger", {"client": "hosp-a", "round": 1, "epsilon": 2.5, "delta": 1e-5,
                                "budget_epsilon": 4.0, "noise_multiplier": 1.1})
    later = runner.invoke(app, ["verify", str(d)])
    head = re.search(r"head hash: ([0-9a-f]{64})", later.stdout).group(1)
    assert runner.invoke(app, ["verify", str(d), "--expect-head", head]).exit_code == 0
    shutil.rmtree(d)
    shutil.copytree(tmp_path / "earlier", d)  # the server rolls the directory back
    assert runner.invoke(app, ["verify", str(d)]).exit_code == 0  # valid on its own
    rolled = runner.invoke(app, ["verify", str(d), "--expect-head", head])
    assert rolled.exit_code == 1 and "Rolled back" in rolled.stderr and "Traceback" not in rolled.output
    bad = runner.invoke(app, ["verify", str(d), "--expect-head", "xyz"])
    assert bad.exit_code == 1 and "64-hex-digit" in bad.stderr


def test_verify_a_deeply_nested_line_is_a_failed_verification_not_an_internal_error(audit_dir):
    d, _ = audit_dir
    log = d / "audit.jsonl"
    log.write_bytes(log.read_bytes() + b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    result = runner.invoke(app, ["verify", str(d)])
    assert result.exit_code != 0 and "Internal error" not in result.output, result.output
    assert "entry 3 nests JSON arrays or objects too deeply to parse" in result.output


def test_a_failure_tied_to_no_entry_does_not_print_first_bad_entry_none(audit_dir, tmp_path):
    d, _ = audit_dir
    (d / "notes.txt").write_text("x")
    result = runner.invoke(app, ["verify", str(d)])
    assert result.exit_code == 1 and "first bad entry" not in result.stderr, result.stderr
    assert f"FAILED: {d} does not verify (1 problem(s)):" in result.stderr
    result = runner.invoke(app, ["verify", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "first bad entry" not in result.stderr
    assert "is not a directory: pass the audit directory" in result.stderr


def test_report_out_that_is_a_folder_or_under_a_file_is_named_with_the_fix(audit_dir, tmp_path):
    """`--out runs/` was 'Cannot render the report for ...: [Errno 21] Is a directory' with no fix."""
    d, _ = audit_dir
    (tmp_path / "export.csv").write_text("x\n")
    folder = runner.invoke(app, ["report", str(d), "--out", str(tmp_path)])
    assert folder.exit_code == 1 and f"is a folder; give a file path such as {tmp_path / 'report.html'}" in \
        " ".join(folder.stderr.split()), folder.stderr
    under = runner.invoke(app, ["report", str(d), "--out", str(tmp_path / "export.csv" / "r.html")])
    assert under.exit_code == 1 and "export.csv is a file, not a folder" in " ".join(under.stderr.split()), under.stderr


def test_a_report_of_a_folder_with_no_signed_entry_does_not_print_fingerprint_none(tmp_path):
    """hops4 (left): a folder that is not an audit directory printed '(fingerprint None)' in the
    trust line, as if a key had been named."""
    (tmp_path / "empty").mkdir()
    out = tmp_path / "r.html"
    got = runner.invoke(app, ["report", str(tmp_path / "empty"), "--out", str(out)])
    assert "signer NOT checked: the log names no server key" in got.stdout and "None" not in got.stdout


def test_an_empty_a_dangling_or_a_doubled_trusted_key_says_what_it_is(audit_dir, tmp_path):
    """Found by fuzzing --trusted-key: "" said ' is not a regular file' (Path('') is the working
    directory), a symlink loop was read as an inline key ('the value given is not base64'), and a
    PEM file with two public keys silently trusted the first."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d, _ = audit_dir
    empty = runner.invoke(app, ["verify", str(d), "--trusted-key", ""])
    assert empty.exit_code == 2 and "the value is empty" in empty.stderr
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    loop = runner.invoke(app, ["verify", str(d), "--trusted-key", str(tmp_path / "loop1")])
    assert loop.exit_code == 2 and "symbolic link to no file" in loop.stderr
    pems = b"".join(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo) for _ in range(2))
    (tmp_path / "two.pem").write_bytes(pems)
    two = runner.invoke(app, ["verify", str(d), "--trusted-key", str(tmp_path / "two.pem")])
    assert two.exit_code == 2 and "holds 2 PEM blocks" in two.stderr
