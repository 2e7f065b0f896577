"""The federation file: who is enrolled, with which keys (written by ``clinograph keys init``).

It holds public material only -- each hospital's Ed25519 protocol key (what the server checks
every signed message against) and its Flower node-authentication public key (what the
operator registers with ``flwr supernode register``) -- and the server's Ed25519 key (what
hospitals check plans and global models against). Strict: unknown keys are refused.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from clinograph.core.errors import ConfigError, IntegrityError
from clinograph.core.identity import PublicIdentity

from .messages import ID_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class EnrolledServer(_Strict):
    """The aggregation server's signing identity."""

    name: str = Field(pattern=ID_PATTERN)
    public_key: str = Field(description="Ed25519 public key, base64")


class EnrolledHospital(_Strict):
    """One hospital: its protocol key and its Flower node-authentication key."""

    public_key: str = Field(description="Ed25519 public key, base64")
    node_auth_public_key: str = Field(pattern=r"^ecdsa-sha2-nistp(256|384|521) [A-Za-z0-9+/=]+$")


class FederationFile(_Strict):
    """``federation.toml``."""

    federation_id: str = Field(pattern=ID_PATTERN)
    superlink_address: str = Field(max_length=300)
    server: EnrolledServer
    hospitals: dict[str, EnrolledHospital] = Field(min_length=1)

    def enrolled(self) -> dict[str, PublicIdentity]:
        """Hospital name -> its verifying key."""
        return {name: _public(name, h.public_key) for name, h in sorted(self.hospitals.items())}

    def server_public(self) -> PublicIdentity:
        """The server's verifying key."""
        return _public(self.server.name, self.server.public_key)


def _public(name: str, b64: str) -> PublicIdentity:
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"Public key of {name!r} in the federation file is not base64.") from None
    try:
        return PublicIdentity(name, raw)
    except IntegrityError as e:  # wrong length, or a small-order point
        raise ConfigError(f"{e} (in the federation file)") from None


def load_federation(path: Path) -> FederationFile:
    """Parse and validate ``federation.toml``; ConfigError naming the key and the fix."""
    from clinograph.core.tomlio import load_toml_model

    fed = load_toml_model(FederationFile, path, what="federation file")  # regular, bounded, UTF-8; every problem
    for name in fed.hospitals:
        if not re.fullmatch(ID_PATTERN, name):
            raise ConfigError(f"Hospital name {name!r} in {path} must match {ID_PATTERN}.")
    fed.enrolled()
    fed.server_public()
    return fed


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_federation(fed: FederationFile) -> str:
    """``federation.toml`` text (public keys only)."""
    lines = ["# Written by `clinograph keys init`. Public keys only: copy it to the SuperLink and every hospital.",
             f"federation_id = {_toml_str(fed.federation_id)}",
             f"superlink_address = {_toml_str(fed.superlink_address)}", "", "[server]",
             f"name = {_toml_str(fed.server.name)}", f"public_key = {_toml_str(fed.server.public_key)}"]
    for name, h in sorted(fed.hospitals.items()):
        lines += ["", f"[hospitals.{name}]", f"public_key = {_toml_str(h.public_key)}",
                  f"node_auth_public_key = {_toml_str(h.node_auth_public_key)}"]
    return "\n".join(lines) + "\n"
