"""Certificates and keys for a deployment: a private CA, the SuperLink's TLS certificate and
each SuperNode's Flower node-authentication key pair.

What it guarantees: the CA signs only what this module issues; the TLS server certificate
carries the exact DNS names and IP addresses given (subjectAltName), is marked for server
authentication only, and chains to the CA (:func:`verify_server_certificate` checks the
signature, validity window, key usage and the names). Private keys are written once, with
file mode 0600, never overwritten, and never appear in errors or reprs.

What it does not guarantee: revocation (there is no CRL/OCSP; rotate the CA to revoke), or
protection of the key files beyond file permissions. The CA key should leave the operator's
machine never; hospitals receive only ``ca.pem``.

Key types: ECDSA P-384 for the CA and the TLS key (accepted by gRPC, uvicorn and every
browser stack); ECDSA P-384 for Flower node authentication, in OpenSSH format, which is what
``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register`` (flwr 1.41)
load (they accept any NIST curve; P-384 is the one Flower's documentation uses).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from clinograph.core.errors import ConfigError, IntegrityError

CURVE = ec.SECP384R1
_HASH = hashes.SHA384


@dataclass(frozen=True, repr=False)
class IssuedKey:
    """A certificate and its private key (repr shows the subject only)."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        """The certificate, PEM."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The private key, PKCS#8 PEM, unencrypted (write it with :func:`write_private`)."""
        return self.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())

    def __repr__(self) -> str:
        return f"IssuedKey(subject={self.certificate.subject.rfc4514_string()!r}, private_key=<redacted>)"


@dataclass(frozen=True, repr=False)
class NodeAuthKeyPair:
    """A Flower SuperNode authentication key pair (ECDSA P-384), OpenSSH encodings."""

    private_openssh: bytes
    public_openssh: bytes

    def __repr__(self) -> str:
        return f"NodeAuthKeyPair(public={self.public_openssh[:40]!r}..., private=<redacted>)"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def create_ca(*, common_name: str, valid_days: int) -> IssuedKey:
    """A self-signed CA allowed to sign end-entity certificates only (path length 0)."""
    key = ec.generate_private_key(CURVE())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Clinograph federation")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, _HASH()))
    return IssuedKey(cert, key)


#: a DNS name: dot-separated labels of letters, digits, '-' (and '_', which private networks use), at
#: most 63 characters each, not starting or ending with '-'; an optional leading '*.' wildcard
_DNS_NAME = re.compile(r"(\*\.)?[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                       r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


def _san(hostnames: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hostnames:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not _DNS_NAME.fullmatch(host) or len(host) > 253:  # '', 'a"b', a space: only labels and dots
                raise ConfigError(f"Host name {host!r} is not a DNS name or an IP address. "
                                  "Pass names like 'superlink.example.org' or '10.0.0.5'.") from None
            names.append(x509.DNSName(host))
    return names


def issue_server_certificate(*, ca: IssuedKey, hostnames: Sequence[str], valid_days: int) -> IssuedKey:
    """A TLS server certificate for the SuperLink, valid for exactly ``hostnames`` (DNS or IP)."""
    if not hostnames:
        raise ConfigError("The SuperLink certificate needs at least one host name or IP address "
                          "(the address hospitals connect to), e.g. --host 10.0.0.5.")
    san = _san(hostnames)  # every name checked before any is used (an empty one was a ValueError below)
    key = ec.generate_private_key(CURVE())
    now = _now()
    # the CN is informative (TLS checks the SAN) and at most 64 characters; a longer DNS name is in the SAN only
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0] if len(hostnames[0]) <= 64
                                            else "superlink")])
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca.private_key, _HASH()))
    return IssuedKey(cert, key)


def create_node_auth_keypair() -> NodeAuthKeyPair:
    """A fresh Flower node-authentication key pair (ECDSA P-384, OpenSSH format)."""
    key = ec.generate_private_key(CURVE())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return NodeAuthKeyPair(private_openssh=private, public_openssh=public)


def verify_server_certificate(cert: x509.Certificate, *, ca: x509.Certificate, hostname: str,
                              at: dt.datetime | None = None) -> None:
    """Check that ``cert`` was issued by ``ca``, is valid now, is for TLS server use and names
    ``hostname`` (DNS or IP) in its subjectAltName. Raises :class:`IntegrityError` otherwise."""
    when = at or _now()
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise IntegrityError(f"Certificate {cert.subject.rfc4514_string()!r} was not issued by CA "
                             f"{ca.subject.rfc4514_string()!r}. Re-run `clinograph keys init` or "
                             "distribute the matching ca.pem.") from None
    if not (cert.not_valid_before_utc <= when <= cert.not_valid_after_utc):
        raise IntegrityError(f"Certificate {cert.subject.rfc4514_string()!r} is not valid at {when:%Y-%m-%d %H:%M} UTC "
                             f"(valid {cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d}).")
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        names = certificate_hostnames(cert)
    except x509.ExtensionNotFound as exc:
        raise IntegrityError(f"Certificate lacks a required extension: {exc}.") from None
    if ExtendedKeyUsageOID.SERVER_AUTH not in eku:
        raise IntegrityError("Certificate is not allowed for TLS server authentication.")
    if hostname not in names:
        raise IntegrityError(f"Certificate is for {names}, not {hostname!r}. Re-issue it with "
                             f"`clinograph keys init --host {hostname}`.")


def certificate_hostnames(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses in the certificate's subjectAltName."""
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]


def load_certificate(path: Path) -> x509.Certificate:
    """Load a PEM certificate (ConfigError naming the file if it is missing or malformed)."""
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot load certificate {path}: {type(exc).__name__}. "
                          "Create it with `clinograph keys init`.") from None


def write_private(path: Path, data: bytes) -> None:
    """Write a secret with mode 0600; refuses to overwrite an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; refusing to overwrite a key. Move it away or choose "
                          "another output directory.") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def write_public(path: Path, data: bytes) -> None:
    """Write a public file (certificate, public key) with mode 0644; refuses to overwrite."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; refusing to overwrite it.") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
