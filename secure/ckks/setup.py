"""The ckks mode's server side for a run (the key ceremony) and how a hospital joins a round.

Called through :meth:`clinograph.secure.aggregation.SecureMode.open_run` /
:meth:`~clinograph.secure.aggregation.SecureMode.make_client`: nothing outside this package
branches on the mode's name.

- **Set-up**: the key ceremony relayed over the run's transport
  (:func:`clinograph.secure.ckks.relayed.run_ckks_ceremony`: one hospital deals, the server
  keeps only the public context); the run goes on with the hospitals that hold the key. A
  caller that already ran the ceremony passes its ``context``.
- **Plan options**: the context's public parameters (:func:`.keys.ckks_plan_options`).
- **Joining a round**: the hospital's :class:`~.client.CkksClient` over the keyring its key
  holder unwrapped in the ceremony.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clinograph.core.errors import ConfigError, ProtocolError

from ..aggregation import AggregationClient, LocalUpdate, ModeRun


def prepare_ckks(*, federation: Any, transport: Any, run_id: str, enrolled: Mapping[str, Any], max_weight: float,
                 context: object | None, on_event: Callable[[str, Mapping[str, Any]], None]) -> ModeRun:
    """The ceremony (unless ``context`` is given), then the server's context-bound factory."""
    from .keys import CkksServerContext, ckks_plan_options
    from .presets import CkksPreset
    from .server import CkksServer

    holders: tuple[str, ...] | None = None
    if context is None:
        if transport is None:
            raise ConfigError("secure_mode = 'ckks' needs the key ceremony's public context: run the ceremony over "
                              "the run's transport (clinograph.secure.runtime.assemble.ServerSide does).")
        from .relayed import run_ckks_ceremony

        names = tuple(sorted(set(transport.hospitals()) & set(enrolled)))
        context, holders = run_ckks_ceremony(transport, federation_id=run_id, participants=names, enrolled=enrolled,
                                             preset=CkksPreset(federation.ckks_preset),
                                             min_holders=min(federation.min_clients, len(names)))
        on_event("ckks_keys", {"holders": list(holders)})
    if not isinstance(context, CkksServerContext):
        raise ConfigError("secure_mode = 'ckks' needs the key ceremony's public context (a CkksServerContext).")
    options = ckks_plan_options(context)
    audit = () if holders is None else (("ckks_key_holders", {  # who holds the secret key
        "holders": list(holders), "preset": str(options.get("ckks.preset")),
        "context_digest": str(options.get("ckks.context_digest"))}),)
    return ModeRun(server=CkksServer.with_context(context), options=lambda participants: dict(options),
                   hospitals=holders, audit=audit)


def join_ckks(*, plan: Any, identity: Any, server: Any, peers: Mapping[str, Any], update: LocalUpdate,
              keys: Any) -> AggregationClient:
    """The hospital's CKKS client over the keyring its key holder holds."""
    from .client import CkksClient

    keyring = getattr(keys, "keyring", None)
    if keyring is None:
        raise ProtocolError(f"Hospital {identity.name!r} holds no CKKS key: the key ceremony did not reach it.")
    return CkksClient(keyring=keyring, plan=plan, identity=identity, server=server, peers=peers, update=update)
