"""clinograph/core/identity.py: a signing key file that is not what `clinograph keys init` wrote is a
ConfigError naming the file and the fix -- never a traceback, a hang or a read without end."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity


def test_a_password_protected_key_is_named_with_the_fix(tmp_path):
    """load_pem_private_key raised TypeError ('Password was not given ...'), which nothing caught."""
    path = tmp_path / "server.ed25519.pem"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(ConfigError) as err:
        Identity.load("server", path)
    assert str(path) in str(err.value) and "password" in str(err.value) and "secret" not in str(err.value)


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_fifo_or_a_huge_file_is_refused_before_it_is_read(tmp_path, kind):
    """A FIFO (or /dev/zero behind a symlink) was read until it ended: a hang, or memory to exhaustion."""
    path = tmp_path / "key.pem"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with path.open("wb") as fh:
            fh.truncate(10 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(ConfigError) as err:
        Identity.load("h1", path)
    assert str(path) in str(err.value)
    assert ("a FIFO" if kind == "fifo" else "over the limit of 65536 bytes") in str(err.value)


@pytest.mark.parametrize("given", ["missing", "node_auth", "tls"])
def test_the_wrong_key_file_is_named_with_the_right_one(tmp_path, given):
    """A missing file and an OpenSSH node-auth key (its neighbour in keys/hospitals/NAME/) were
    'FileNotFoundError' / 'ValueError. Create one with `clinograph keys init`' -- a new key is not
    the fix; a TLS key (ECDSA) was 'not an Ed25519 private key' with no fix."""
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "h1.key"
    if given == "node_auth":
        path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    elif given == "tls":
        path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(ConfigError) as err:
        Identity.load("h1", path)
    said = str(err.value)
    want = {"missing": "the file does not exist", "node_auth": "node-auth key, not the signing key",
            "tls": "not Ed25519"}[given]
    assert str(path) in said and want in said and "h1.ed25519.pem" in said, said


def test_a_symlink_loop_says_why_it_cannot_be_read(tmp_path):
    """A loop of symbolic links in place of the key said only 'OSError' (found by fuzzing key files)."""
    (tmp_path / "a.ed25519.pem").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a.ed25519.pem")
    with pytest.raises(ConfigError, match="Too many levels of symbolic links"):
        Identity.load("a", tmp_path / "a.ed25519.pem")
