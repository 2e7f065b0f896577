"""An Ed25519 public key given on the command line (``--trusted-key``, ``--server-key``): the one
reader of every command that takes one (``clinograph audit``, ``clinograph predict``).

Accepted: the path of a file holding one line of base64 (``server.pub`` / a hospital's ``.pub``, as
``clinograph keys init`` writes them) or one PEM public key, or the base64 itself. Everything else is a
:class:`~clinograph.core.errors.ConfigError` that starts with the flag and says what was found: an empty
value, a dangling link or a loop of links, a directory or another non-regular file, a binary file, a
PEM *private* key, several PEM blocks (which key is trusted is never a guess), a PEM key of another
type, text that is not base64, the wrong number of bytes, a small-order point
(:func:`~clinograph.core.identity.small_order`: it verifies forged signatures). Never more than
:data:`MAX_KEY_FILE` bytes of a file are read.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from .errors import ConfigError
from .identity import small_order

#: a key file is one line or one PEM block: nothing larger is read
MAX_KEY_FILE = 65536
#: endings that make a value a path, not an inline key, when no such file exists
PATHLIKE = (".pub", ".pem", ".txt", ".key", ".b64")


def read_public_key(value: str, *, flag: str, fix: str) -> bytes:
    """The 32 raw bytes of the Ed25519 public key ``value`` names or is (module docstring).

    Args:
        value: the argument as given. flag: the option's name, first in every message. fix: the
            sentence that ends every message (where the right key is found).

    Raises:
        ConfigError: the value is no Ed25519 public key, saying what it is.
    """
    def bad(what: str) -> ConfigError:
        return ConfigError(f"{flag}: {what} {fix}")

    if not value.strip():  # Path("") is the working directory
        raise bad("the value is empty.")
    path = Path(value)
    if path.is_symlink() and not path.exists():  # it would be read as an inline key: 'is not base64'
        raise bad(f"{value} is a symbolic link to no file (dangling, or a loop of links).")
    if path.exists() and not path.is_file():  # a folder, a FIFO, /dev/zero: never read as a key
        raise bad(f"{value} is {'a directory' if path.is_dir() else 'not a regular file'}, not a key file.")
    if path.is_file():
        with path.open("rb") as fh:
            data = fh.read(MAX_KEY_FILE).lstrip()
        if data.startswith(b"-----BEGIN"):
            return _checked(_from_pem(data, source=f"file {value}", bad=bad), bad=bad)
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise bad(f"file {value} is binary, not base64 text.") from None
        return _checked(_from_text(text, source=f"file {value}", bad=bad), bad=bad)
    try:  # base64 may contain '/', so a 32-byte key given inline wins over a path-like look
        inline = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        inline = b""
    if len(inline) == 32:
        return _checked(inline, bad=bad)
    if "/" in value or value.endswith(PATHLIKE):
        raise bad(f"no such file: {value}.")
    return _checked(_from_text(value, source="the value given", bad=bad), bad=bad)


def _checked(raw: bytes, *, bad) -> bytes:  # noqa: ANN001 - the caller's error maker
    if small_order(raw):
        raise bad("the key is a small-order Ed25519 point (e.g. all zeros), which verifies forged signatures.")
    return raw


def _from_text(text: str, *, source: str, bad) -> bytes:  # noqa: ANN001
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{source} is not base64 (nor a PEM file): expected one line of base64 of an Ed25519 public key "
                  "(32 bytes).") from None
    if len(raw) != 32:
        raise bad(f"{source} decodes to {len(raw)} byte(s); an Ed25519 public key is 32 bytes.")
    return raw


def _from_pem(data: bytes, *, source: str, bad) -> bytes:  # noqa: ANN001
    if data.count(b"-----BEGIN") > 1:
        raise bad(f"{source} holds {data.count(b'-----BEGIN')} PEM blocks; a key file holds one public key.")
    if b"PRIVATE KEY" in data.split(b"\n", 1)[0]:
        raise bad(f"{source} is a PEM *private* key: never hand a private key to a verifier; pass its public key.")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise bad(f"{source} is a PEM file but not a public key.") from None
    if not isinstance(key, Ed25519PublicKey):
        raise bad(f"{source} holds a {type(key).__name__.lstrip('_')}, not an Ed25519 public key.")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
