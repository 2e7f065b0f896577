"""clinograph/core/keyarg.py: the one reader of a public key given on the command line (audit's
--trusted-key, predict's --trusted-key / --server-key). Each thing that is not a key says what it is."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from clinograph.core.errors import ConfigError
from clinograph.core.keyarg import read_public_key


def _read(value: str) -> bytes:
    return read_public_key(value, flag="--trusted-key", fix="FIX.")


def test_a_key_inline_in_a_pub_file_or_in_a_pem_file_is_read(tmp_path):
    key = Ed25519PrivateKey.generate().public_key()
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (tmp_path / "server.pub").write_text(base64.b64encode(raw).decode() + "\n")
    (tmp_path / "server.pem").write_bytes(key.public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    assert _read(base64.b64encode(raw).decode()) == raw
    assert _read(str(tmp_path / "server.pub")) == raw == _read(str(tmp_path / "server.pem"))


def test_every_thing_that_is_not_a_key_says_what_it_is(tmp_path):
    priv = Ed25519PrivateKey.generate()
    (tmp_path / "priv.pem").write_bytes(priv.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    pem = priv.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "two.pem").write_bytes(pem + pem)
    (tmp_path / "x25519.pem").write_bytes(X25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp_path / "binary.pub").write_bytes(b"\xff\xfe\x00key")
    (tmp_path / "junk.pub").write_text("hello world\n")
    (tmp_path / "short.pub").write_text("c2hvcnQ=\n")
    (tmp_path / "zero.pub").write_text(base64.b64encode(bytes(32)).decode())
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    os.mkfifo(tmp_path / "fifo")
    cases = {
        "": "the value is empty", str(tmp_path / "loop1"): "is a symbolic link to no file",
        str(tmp_path): "is a directory", str(tmp_path / "fifo"): "is not a regular file",
        str(tmp_path / "priv.pem"): "is a PEM *private* key", str(tmp_path / "two.pem"): "holds 2 PEM blocks",
        str(tmp_path / "x25519.pem"): "not an Ed25519 public key", str(tmp_path / "binary.pub"): "is binary",
        str(tmp_path / "junk.pub"): "is not base64", str(tmp_path / "short.pub"): "decodes to 5 byte(s)",
        str(tmp_path / "zero.pub"): "small-order", str(tmp_path / "missing.pub"): "no such file",
        "not-a-key!": "the value given is not base64",
    }
    said = set()
    for value, what in cases.items():
        with pytest.raises(ConfigError) as err:
            _read(value)
        assert str(err.value).startswith("--trusted-key: ") and what in str(err.value), value
        assert str(err.value).endswith("FIX.")
        said.add(str(err.value))
    assert len(said) == len(cases)
