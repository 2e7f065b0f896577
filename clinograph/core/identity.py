"""Long-term signing identities (Ed25519) of hospitals and of the server.

Guarantees: the private key never appears in ``repr``/``str``, and an :class:`Identity`
refuses to be pickled, so it cannot leak through logs or serialised objects. Keys are
written to disk only by :meth:`Identity.save` with file mode 0600.
Does not guarantee: protection of the key file at rest beyond file permissions.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .arguments import checked_arguments
from .errors import ConfigError, IntegrityError
from .fileio import NotRegularFile, TooLarge, read_regular

#: Bound on a signing key file (an Ed25519 PEM private key is 119 bytes): nothing larger is read.
MAX_KEY_BYTES = 64 * 1024
#: a signing identity's name: a hospital's site name or the server's (secure.messages.ID_PATTERN)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"


#: the field prime of Curve25519 / edwards25519
_P = 2 ** 255 - 19
#: any fixed X25519 scalar does (it is clamped to a multiple of 8 below the group order L times 8)
_PROBE = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


def small_order(raw: bytes) -> bool:
    """True when the 32-byte Ed25519 public key ``raw`` encodes a point whose order divides 8
    (the identity, the all-zero key, ...). Such a key verifies forged signatures: with the
    identity, R = the identity and S = 0 sign every message under OpenSSL's verification
    (tests/clinograph/core/test_identity.py shows it). Checked without a point table: the
    birational map u = (1 + y)/(1 − y) (RFC 7748 sec. 4.1) takes the point to Curve25519, and an
    X25519 exchange, whose clamped scalar is a multiple of 8 and not of the group order, gives the
    all-zero output (which ``cryptography`` refuses) exactly for a point of order dividing 8; y is
    reduced mod p first, so non-canonical encodings are caught too."""
    y = (int.from_bytes(raw, "little") & ((1 << 255) - 1)) % _P
    if y == 1:  # the identity (x = 0, y = 1): 1 - y has no inverse
        return True
    u = (1 + y) * pow(1 - y, _P - 2, _P) % _P
    try:
        _PROBE.exchange(X25519PublicKey.from_public_bytes(u.to_bytes(32, "little")))
    except ValueError:  # "Error computing shared key": the all-zero output of a small-order point
        return True
    return False


class PublicIdentity:
    """A verifying key with the name it is enrolled under."""

    __slots__ = ("name", "_key", "_raw")

    def __init__(self, name: str, raw: bytes):
        if len(raw) != 32:
            raise IntegrityError(f"Public key of {name!r} must be 32 bytes (Ed25519), got {len(raw)}.")
        if small_order(raw):
            raise IntegrityError(f"Public key of {name!r} is a small-order Ed25519 point (e.g. all zeros), which "
                                 "would verify forged signatures. Use the key `clinograph keys init` wrote for it.")
        self.name = name
        self._raw = raw
        self._key = Ed25519PublicKey.from_public_bytes(raw)

    @property
    def raw(self) -> bytes:
        """The 32 public-key bytes."""
        return self._raw

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the public key, hex (first 16 chars are enough to show a human)."""
        return hashlib.sha256(self._raw).hexdigest()

    def b64(self) -> str:
        """The public key, base64."""
        return base64.b64encode(self._raw).decode()

    def verify(self, signature: bytes, data: bytes, *, context: bytes) -> None:
        """Raise :class:`IntegrityError` unless ``signature`` signs ``context || data``."""
        try:
            self._key.verify(signature, context + b"\x00" + data)
        except InvalidSignature:
            raise IntegrityError(f"Signature by {self.name!r} does not verify.") from None

    def __repr__(self) -> str:
        return f"PublicIdentity(name={self.name!r}, fingerprint={self.fingerprint[:16]})"


class Identity:
    """A named Ed25519 signing key. Redacted repr; refuses to pickle."""

    __slots__ = ("name", "_key", "public")

    def __init__(self, name: str, key: Ed25519PrivateKey):
        import re

        if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
            raise ConfigError(f"Identity name {name!r} must match {NAME_PATTERN} (letters, digits, '_', '.', '-'; at "
                              "most 64): a hospital's site name or the server's name, as federation.toml spells it.")
        self.name = name
        self._key = key
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public = PublicIdentity(name, raw)

    @classmethod
    def generate(cls, name: str) -> Identity:
        """A fresh key from the OS's cryptographic random source."""
        return cls(name, Ed25519PrivateKey.generate())

    def sign(self, data: bytes, *, context: bytes) -> bytes:
        """Sign ``context || 0x00 || data``."""
        return self._key.sign(context + b"\x00" + data)

    def derive_key(self, *, purpose: bytes) -> bytes:
        """A 32-byte symmetric key for this identity's own use (never sent): HKDF-SHA256 (RFC 5869)
        of the private key's 32 raw bytes, no salt, ``info`` = ``purpose``, one of the labels in
        :mod:`clinograph.core.labels`. Keys of different purposes are independent, and
        none reveals the signing key; whoever holds the signing key can derive them all.
        """
        if not purpose.startswith(b"clinograph/"):
            raise ConfigError(f"Key purpose {purpose!r} is not a Clinograph label; use one from hazmat/labels.py.")
        raw = self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(raw)

    def save(self, path: Path) -> None:
        """Write the private key as PKCS#8 PEM with mode 0600 (refuses to overwrite)."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)

    @classmethod
    @checked_arguments
    def load(cls, name: str, path: Path) -> Identity:
        """Load a key written by :meth:`save` (a regular file of at most MAX_KEY_BYTES)."""
        fix = "Create one with `clinograph keys init`."
        try:
            key = serialization.load_pem_private_key(read_regular(path, limit=MAX_KEY_BYTES), password=None)
        except NotRegularFile as exc:
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: it is {exc.kind}, not a regular "
                              f"file. Give the path of the key file itself. {fix}") from None
        except TooLarge:
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: it is over the limit of "
                              f"{MAX_KEY_BYTES} bytes for a key file (an Ed25519 PEM key is about 120). {fix}") from None
        except TypeError:  # cryptography: "Password was not given but private key is encrypted"
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: it is encrypted with a password. "
                              "Clinograph's key files are unencrypted PEM, protected by their file mode (0600): "
                              "write an unencrypted copy (openssl pkey -in KEY -out NEW) or make one with "
                              "`clinograph keys init`.") from None
        except FileNotFoundError:
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: the file does not exist. Check the "
                              f"path ({name}.ed25519.pem, next to federation.toml from `clinograph keys init`).") from None
        except PermissionError:
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: permission denied (the key is mode "
                              "0600). Run as the user that owns it.") from None
        except OSError as exc:
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: "  # ELOOP said only 'OSError'
                              f"{exc.strerror or type(exc).__name__}. {fix}") from None
        except ValueError:
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: it is not a PEM private key "
                              f"(a *.node-auth file is Flower's node-auth key, not the signing key). Give "
                              f"{name}.ed25519.pem from `clinograph keys init`.") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"Cannot load signing key for {name!r} from {path}: it is a private key of another "
                              f"kind, not Ed25519 (a TLS key such as server.key is not the signing key). Give "
                              f"{name}.ed25519.pem from `clinograph keys init`.")
        return cls(name, key)

    def __repr__(self) -> str:
        return f"Identity(name={self.name!r}, public={self.public.fingerprint[:16]}, private=<redacted>)"

    def __reduce__(self):  # noqa: D105
        raise TypeError("Identity holds a private key and refuses to be pickled.")
