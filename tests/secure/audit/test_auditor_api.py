"""The auditor's library path (docs/audit.md, "API"): the key as the auditor holds it, and the report
kept out of the directory it reports on -- every misuse a ConfigError saying what and the fix."""

from __future__ import annotations

import base64

import pytest
from clinograph.secure.audit import AuditTrail, render_report, verify_audit_dir

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity


@pytest.fixture
def signed(tmp_path):
    server = Identity.generate("server")
    with AuditTrail(tmp_path / "audit", identity=server) as trail:
        trail.publish("round-0000/model.bin", b"weights", kind="global_model")
    return tmp_path / "audit", server


def test_the_trusted_key_as_server_pub_holds_it_or_as_a_public_identity_is_checked(signed):
    d, server = signed
    pub = base64.b64encode(server.public.raw).decode() + "\n"  # server.pub's text, newline included
    for key in (pub, server.public, server.public.raw):
        report = verify_audit_dir(str(d), trusted_server_key=key)
        assert report.ok and report.trusted, key


@pytest.mark.parametrize(("key", "said"), [
    (b"abc", "got 3 byte(s), not the 32 bytes of an Ed25519 public key"),  # was a 'WRONG KEY' verdict
    ("not base64!", "the text given is not base64"),  # was TypeError: Strings must be encoded before hashing
    (base64.b64encode(b"x" * 16).decode(), "got base64 text decoding to 16 byte(s)"),
    (42, "got a int"),
    (bytes(32), "got a small-order Ed25519 point"),  # all zeros: a key under which signatures can be forged
])
def test_a_key_that_is_no_ed25519_public_key_is_a_config_error_with_the_fix(signed, key, said):
    d, _ = signed
    with pytest.raises(ConfigError, match="server.pub") as err:
        verify_audit_dir(d, trusted_server_key=key)
    assert said in str(err.value) and str(err.value).startswith("trusted_server_key: ")


def test_the_report_is_not_written_into_the_audit_directory(signed, tmp_path, monkeypatch):
    d, _ = signed
    with pytest.raises(ConfigError, match=r"is inside the audit directory .* Fix: write the report elsewhere"):
        render_report(d, out=d / "report.html")  # the directory would no longer verify (extra file)
    assert verify_audit_dir(d).ok
    monkeypatch.chdir(tmp_path)
    assert render_report(str(d), out="report.html").is_file()  # str paths, as verify_audit_dir takes them


def test_the_public_render_report_checks_the_signer_with_the_pinned_key(signed, tmp_path):
    """``clinograph.render_report`` (= clinograph.secure.audit's) dropped ``trusted_server_key``: an
    auditor's report through the API always said the signer was not checked."""
    import clinograph as cg

    d, server = signed
    html = cg.render_report(d, out=tmp_path / "r.html", trusted_server_key=server.public).read_text()
    assert 'id="signer-trusted"' in html and 'id="signer-unchecked"' not in html


def test_a_log_still_being_written_verifies_so_far_and_says_so(tmp_path):
    """An auditor verifying a live run got a plain "OK: N entries verified", as for a finished one."""
    from typer.testing import CliRunner

    from clinograph.cli import app

    d = tmp_path / "audit"
    trail = AuditTrail(d, identity=Identity.generate("server"))
    trail.record("note", {"x": 1})
    live = verify_audit_dir(d)
    assert live.ok and live.being_written
    out = CliRunner().invoke(app, ["audit", "verify", str(d)]).output
    assert "note: a run is still writing this log (its writer holds the lock): the verdict covers the 2 entries" in out
    trail.close()
    assert not verify_audit_dir(d).being_written
    assert "still writing" not in CliRunner().invoke(app, ["audit", "verify", str(d)]).output
