"""``clinograph keys``: create every key and certificate a Flower deployment needs.

Mount with ``app.add_typer(keys.app, name="keys")``. See
:mod:`clinograph.secure.transport.flower.keyset` for what goes where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Create and inspect federation keys (CA, TLS, node authentication, signing identities).",
                  no_args_is_help=True)


@app.callback()
def _keys() -> None:
    """Create and inspect federation keys."""


@app.command("init")
def init(
    out: Annotated[Path, typer.Option("--out", help="Empty directory to write the keys into.")],
    federation_id: Annotated[str, typer.Option("--federation-id", help="Federation identifier.")],
    hospital: Annotated[list[str], typer.Option("--hospital", help="Hospital name; repeat once per hospital.")],
    host: Annotated[list[str], typer.Option(
        "--host", help="DNS name or IP hospitals use to reach the SuperLink; repeat for several (TLS SAN).")],
    port: Annotated[int, typer.Option("--port", help="SuperLink port hospitals connect to.")] = 9092,
    server_name: Annotated[str, typer.Option("--server-name", help="Name of the server's signing identity.")] = "server",
    valid_days: Annotated[int, typer.Option("--valid-days", help="Certificate validity in days.")] = 365,
) -> None:
    """Create the CA, the SuperLink TLS certificate, node-auth keys, signing keys and federation.toml."""
    from clinograph.secure.transport.flower.keyset import KeySet, init_keyset

    from .guard import guarded

    def make() -> KeySet:
        _check_names(federation_id=federation_id, server_name=server_name, hospitals=hospital)
        return init_keyset(out, federation_id=federation_id, hospitals=hospital, superlink_hosts=host,
                           superlink_port=port, server_name=server_name, valid_days=valid_days)

    ks = guarded(make)()  # a ClinographError: its message, exit 2; anything else: no traceback, exit 3
    typer.echo(f"Wrote keys for federation {federation_id!r} to {ks.root}")
    typer.echo(f"  SuperLink machine : copy {ks.superlink_dir}/ (TLS cert+key, server signing key, ca.pem, federation.toml)")
    for name, d in ks.hospital_dirs.items():
        typer.echo(f"  hospital {name:<8} : copy {d}/ (signing key, node-auth key pair, ca.pem, federation.toml)")
    typer.echo(f"  keep offline      : {ks.root / 'ca' / 'ca.key'}")
    typer.echo(f"  auditors          : {ks.server_pub} (the server's audit-signing public key; fingerprint "
               f"{ks.server_fingerprint} = SHA-256 of its 32 bytes)")
    typer.echo(f"                      clinograph audit verify AUDIT_DIR --trusted-key {ks.server_pub}")
    typer.echo("Register each hospital's node-auth key with the SuperLink (<connection>: your flwr config's name for it):")
    for name, d in ks.hospital_dirs.items():
        typer.echo(f"  flwr supernode register {d / f'{name}.node-auth.pub'} <connection> --name {name}")


def _check_names(*, federation_id: str, server_name: str, hospitals: list[str]) -> None:
    """Every name federation.toml must hold, checked before anything is written, all problems at
    once (a bad federation id or server name used to fail after the CA was written)."""
    import re

    from clinograph.core.errors import ConfigError
    from clinograph.secure.messages import ID_PATTERN

    problems = [f"{flag} {value!r} must match {ID_PATTERN}" for flag, value in (("--federation-id", federation_id),
                                                                             ("--server-name", server_name))
                if not re.fullmatch(ID_PATTERN, value)]
    problems += [f"hospital name {h!r} must match {ID_PATTERN}" for h in hospitals if not re.fullmatch(ID_PATTERN, h)]
    rule = ". A name is letters, digits, '_', '.' and '-', starting with a letter or digit, at most 64 characters" \
        if problems else ""
    repeated = sorted({h for h in hospitals if hospitals.count(h) > 1})
    if repeated:
        problems.append(f"hospital names repeat: {', '.join(repeated)} (give each --hospital once)")
    if problems:
        raise ConfigError("Cannot create keys: " + "; ".join(problems) + rule + "; nothing was written.")


if __name__ == "__main__":  # python -m clinograph.commands.keys init ...
    app()
