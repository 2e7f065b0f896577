"""Everything ``clinograph keys init`` writes, laid out by where each file must go.

::

    OUT/federation.toml                      public; to the SuperLink machine and every hospital
    OUT/server.pub                           public; the server's audit-signing key for auditors
                                             (``clinograph audit verify|report --trusted-key``)
    OUT/ca/ca.pem, ca.key                    the CA; ca.key stays offline with the operator
    OUT/superlink/server.pem, server.key     the SuperLink's TLS certificate and key
    OUT/superlink/server.ed25519.pem         the ServerApp's signing key (plans, global models)
    OUT/superlink/ca.pem, federation.toml
    OUT/hospitals/<h>/<h>.ed25519.pem        hospital h's protocol signing key
    OUT/hospitals/<h>/<h>.node-auth(.pub)    its Flower node-authentication key pair
    OUT/hospitals/<h>/ca.pem, federation.toml

Each ``superlink/`` and ``hospitals/<h>/`` folder is self-contained: copy it, and only it, to
that machine. Private keys are written with mode 0600 and never overwritten.

``server.pub`` is one line: the base64 of the server's 32-byte Ed25519 public key (the key
that signs plans, global models and every audit entry). Its *fingerprint* is the SHA-256 of
those 32 raw bytes in hex (:attr:`clinograph.core.identity.PublicIdentity.fingerprint`),
the value ``clinograph audit verify`` and the report print. Hand the file to auditors through
a channel the server operator does not control alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clinograph.secure.enrolment import (
    EnrolledHospital,
    EnrolledServer,
    FederationFile,
    render_federation,
)

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

from ...messages import ID_PATTERN
from ...pki import (
    create_ca,
    create_node_auth_keypair,
    issue_server_certificate,
    write_private,
    write_public,
)


@dataclass(frozen=True)
class KeySet:
    """Paths of what :func:`init_keyset` wrote."""

    root: Path
    federation_file: Path
    superlink_dir: Path
    hospital_dirs: dict[str, Path]
    server_pub: Path
    server_fingerprint: str


def init_keyset(out: Path, *, federation_id: str, hospitals: Sequence[str], superlink_hosts: Sequence[str],
                superlink_port: int, server_name: str = "server", valid_days: int = 365) -> KeySet:
    """Create the CA, TLS and node-auth keys, every Ed25519 identity and ``federation.toml``."""
    import re

    problems = [f"hospital name {h!r} must match {ID_PATTERN}" for h in hospitals if not re.fullmatch(ID_PATTERN, h)]
    if len(set(hospitals)) != len(hospitals):
        problems.append("hospital names repeat")
    if not hospitals:
        problems.append("no hospital given (use --hospital NAME, once per hospital)")
    if server_name in hospitals:
        problems.append(f"server name {server_name!r} is also a hospital name")
    if not 0 < superlink_port < 65536:
        problems.append(f"port {superlink_port} is not in 1..65535")
    if not 1 <= valid_days <= 3650:
        problems.append(f"valid_days = {valid_days} must be in 1..3650")
    if problems:
        raise ConfigError("Cannot create keys: " + "; ".join(problems) + ".")
    out = Path(out)
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"Cannot create keys in {out}: {existing} is a file, not a directory. "
                          "Give --out a new or empty directory; nothing was written.")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty; refusing to mix new keys with old ones. Choose an empty directory.")
    ca = create_ca(common_name=f"{federation_id} CA", valid_days=valid_days)
    tls = issue_server_certificate(ca=ca, hostnames=list(superlink_hosts), valid_days=valid_days)
    write_public(out / "ca" / "ca.pem", ca.cert_pem())
    write_private(out / "ca" / "ca.key", ca.key_pem())
    link = out / "superlink"
    write_public(link / "ca.pem", ca.cert_pem())
    write_public(link / "server.pem", tls.cert_pem())
    write_private(link / "server.key", tls.key_pem())
    server = Identity.generate(server_name)
    server.save(link / "server.ed25519.pem")
    write_public(out / "server.pub", (server.public.b64() + "\n").encode())
    enrolled: dict[str, EnrolledHospital] = {}
    dirs: dict[str, Path] = {}
    for name in hospitals:
        d = out / "hospitals" / name
        ident = Identity.generate(name)
        ident.save(d / f"{name}.ed25519.pem")
        node = create_node_auth_keypair()
        write_private(d / f"{name}.node-auth", node.private_openssh)
        write_public(d / f"{name}.node-auth.pub", node.public_openssh)
        write_public(d / "ca.pem", ca.cert_pem())
        enrolled[name] = EnrolledHospital(public_key=ident.public.b64(),
                                          node_auth_public_key=node.public_openssh.decode().strip())
        dirs[name] = d
    host = superlink_hosts[0]
    address = f"[{host}]:{superlink_port}" if ":" in host else f"{host}:{superlink_port}"
    fed = FederationFile(federation_id=federation_id, superlink_address=address,
                         server=EnrolledServer(name=server_name, public_key=server.public.b64()), hospitals=enrolled)
    text = render_federation(fed).encode()
    write_public(out / "federation.toml", text)
    write_public(link / "federation.toml", text)
    for d in dirs.values():
        write_public(d / "federation.toml", text)
    return KeySet(root=out, federation_file=out / "federation.toml", superlink_dir=link, hospital_dirs=dirs,
                  server_pub=out / "server.pub", server_fingerprint=server.public.fingerprint)
