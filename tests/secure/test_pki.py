"""secure/pki.py: the CA, the SuperLink's TLS certificate, node-auth keys, private files."""

from __future__ import annotations

import datetime as dt
import os
import socket
import ssl
import stat
import threading

import pytest
from clinograph.secure.pki import (
    certificate_hostnames,
    create_ca,
    create_node_auth_keypair,
    issue_server_certificate,
    verify_server_certificate,
    write_private,
    write_public,
)
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clinograph.core.errors import ConfigError, IntegrityError


@pytest.fixture(scope="module")
def ca():
    return create_ca(common_name="test CA", valid_days=3)


@pytest.fixture(scope="module")
def server(ca):
    return issue_server_certificate(ca=ca, hostnames=["superlink.example.org", "127.0.0.1", "::1"], valid_days=3)


def test_chain_and_names_verify(ca, server):
    for host in ("superlink.example.org", "127.0.0.1", "::1"):
        verify_server_certificate(server.certificate, ca=ca.certificate, hostname=host)
    assert sorted(certificate_hostnames(server.certificate)) == ["127.0.0.1", "::1", "superlink.example.org"]
    bc = server.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc.ca is False
    assert ca.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0


def test_wrong_ca_fails(server):
    other = create_ca(common_name="test CA", valid_days=3)  # same name, different key
    with pytest.raises(IntegrityError, match="was not issued by CA"):
        verify_server_certificate(server.certificate, ca=other.certificate, hostname="127.0.0.1")


def test_wrong_hostname_and_expired_fail(ca, server):
    with pytest.raises(IntegrityError, match=r"not '10\.0\.0\.9'"):
        verify_server_certificate(server.certificate, ca=ca.certificate, hostname="10.0.0.9")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=10)
    with pytest.raises(IntegrityError, match="is not valid at"):
        verify_server_certificate(server.certificate, ca=ca.certificate, hostname="127.0.0.1", at=later)


def test_ca_certificate_is_not_a_server_certificate(ca):
    with pytest.raises(IntegrityError):
        verify_server_certificate(ca.certificate, ca=ca.certificate, hostname="127.0.0.1")


def test_bad_hostnames_refused(ca):
    with pytest.raises(ConfigError, match="at least one host"):
        issue_server_certificate(ca=ca, hostnames=[], valid_days=1)
    with pytest.raises(ConfigError, match="not a DNS name"):
        issue_server_certificate(ca=ca, hostnames=["bad host"], valid_days=1)


def test_real_tls_handshake_with_python_ssl(ca, server, tmp_path):
    """The files work with a real TLS stack: a client trusting ca.pem connects to 127.0.0.1;
    a client trusting another CA is refused."""
    write_public(tmp_path / "ca.pem", ca.cert_pem())
    write_public(tmp_path / "server.pem", server.cert_pem())
    write_private(tmp_path / "server.key", server.key_pem())
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    listener.settimeout(10)
    port = listener.getsockname()[1]

    def serve():
        for _ in range(2):
            try:
                conn, _ = listener.accept()
                with sctx.wrap_socket(conn, server_side=True) as s:
                    s.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            cctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        assert s.recv(2) == b"ok"
    other = create_ca(common_name="other", valid_days=1)
    write_public(tmp_path / "other.pem", other.cert_pem())
    bad = ssl.create_default_context(cafile=str(tmp_path / "other.pem"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
        bad.wrap_socket(raw, server_hostname="127.0.0.1")
    t.join(timeout=10)
    listener.close()


def test_node_auth_keypair_is_what_flower_loads():
    from flwr.supercore.primitives.asymmetric import uses_nist_ec_curve

    kp = create_node_auth_keypair()
    priv = serialization.load_ssh_private_key(kp.private_openssh, None)
    pub = serialization.load_ssh_public_key(kp.public_openssh)
    assert isinstance(priv, ec.EllipticCurvePrivateKey) and isinstance(pub, ec.EllipticCurvePublicKey)
    assert uses_nist_ec_curve(pub) and pub.curve.name == "secp384r1"
    assert priv.public_key().public_numbers() == pub.public_numbers()
    assert b"PRIVATE" not in repr(kp).encode() and "redacted" in repr(kp)


def test_private_files_are_0600_and_never_overwritten(tmp_path):
    write_private(tmp_path / "k", b"secret")
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o600
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        write_private(tmp_path / "k", b"other")
    assert (tmp_path / "k").read_bytes() == b"secret"


def test_reprs_redact_private_keys(server):
    assert "redacted" in repr(server) and "BEGIN" not in repr(server)


@pytest.mark.parametrize("host", ["", 'a"b', "-bad", "a..b", "a b", "host/path"])
def test_a_host_that_is_no_dns_name_is_refused_by_name(ca, host):
    """Found by fuzzing `clinograph keys init --host`: '' ended in 'internal error (ValueError)' (an
    empty common name), 'a"b' was written into the certificate's SAN."""
    with pytest.raises(ConfigError, match="is not a DNS name or an IP address"):
        issue_server_certificate(ca=ca, hostnames=[host], valid_days=3)


def test_a_dns_name_longer_than_a_common_name_is_in_the_san():
    """A valid DNS name of more than 64 characters (the CN's limit) was a ValueError from cryptography."""
    long = "a" * 63 + "." + "b" * 63 + ".example.org"
    cert = issue_server_certificate(ca=create_ca(common_name="test CA", valid_days=3), hostnames=[long, "*.example.org"],
                                    valid_days=3).certificate
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == [long, "*.example.org"]
