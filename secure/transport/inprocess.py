"""In-process transport: run one secure-aggregation round with every party in this process.

Used by tests and simulations. It relays each stage's sealed messages between the server half
and the client halves of a registered mode, and models dropouts and deadlines: a client listed
in ``drop`` with stage index s stops answering from stage s on (0 = the answer to the plan),
and each stage closes as soon as every live client has answered (the deadline has then passed
for the silent ones, who count as dropped). A client half that raises ProtocolError or
IntegrityError while handling a message is treated as dropped, and so is one whose first
message cannot be built.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..aggregation import ModuleSums, create_mode
from ..aggregation.base import AggregationServer, LocalUpdate
from ..errors import ConfigError, IntegrityError, ProtocolError
from ..identity import Identity
from ..messages import MAX_MESSAGE_BYTES, RoundPlan
from ..wire import parse_envelope


def _deliver(server: AggregationServer, sender: str, data: bytes, transport_rejected: dict[str, str]) -> None:
    receive_bytes = getattr(server, "receive_bytes", None)
    try:
        if receive_bytes is not None:
            receive_bytes(sender, data)
            return
        env = parse_envelope(data, max_bytes=MAX_MESSAGE_BYTES)
        if env.sender != sender:
            raise ProtocolError(f"Envelope claims sender {env.sender!r} but arrived from {sender!r}.")
    except (ProtocolError, IntegrityError) as exc:
        if receive_bytes is None:
            transport_rejected.setdefault(sender, str(exc))
        return
    try:
        server.receive(env)
    except (ProtocolError, IntegrityError):
        return  # the server records the reason; the client is dropped for this round


def run_aggregation(*, mode: str, plan: RoundPlan, server_identity: Identity,
                    client_identities: dict[str, Identity], updates: dict[str, LocalUpdate],
                    drop: Mapping[str, int] | None = None,
                    traffic: dict[str, int] | None = None) -> tuple[ModuleSums, dict[str, str]]:
    """Run one round of ``mode`` over ``updates`` and return ``(server result, rejected reasons)``.

    Args:
        mode: a registered secure mode (``"masked"``, ``"insecure_plaintext"``, ...).
        plan: the signed round plan (its ``options`` carry the mode's parameters).
        server_identity: the server's signing identity.
        client_identities: every participant's identity (the server knows their public halves).
        updates: each taking part client's LocalUpdate; participants without one stay silent.
        drop: client -> stage index from which it stops answering (0: it never answers).
        traffic: if given, filled with the bytes each client uploaded (all stages).

    Returns:
        The :class:`ModuleSums` the mode reveals to the server, and client -> reason for every
        message refused (server side, plus client halves that stopped with an error, prefixed
        ``client:``).

    Raises:
        ProtocolError: the round aborted (e.g. fewer survivors than the threshold).
        ConfigError: updates or identities do not match the plan's participants.
    """
    stray = sorted(set(updates) - set(plan.participants))
    missing = sorted(set(plan.participants) - set(client_identities))
    if stray or missing:
        raise ConfigError(f"Updates for non-participants {stray} or participants without identity {missing}.")
    drop = dict(drop or {})
    secure_mode = create_mode(mode)
    peers = {c: client_identities[c].public for c in plan.participants}
    server = secure_mode.server(plan=plan, peers=peers, identity=server_identity)
    clients = {c: secure_mode.client(plan=plan, identity=client_identities[c], server=server_identity.public,
                                     peers=peers, update=u) for c, u in updates.items()}
    failed: dict[str, str] = {}
    transport_rejected: dict[str, str] = {}

    def live(c: str, stage: int) -> bool:
        return c in clients and c not in failed and drop.get(c, stage + 1) > stage

    def upload(c: str, data: bytes | None) -> None:
        # Delivered at once: no more than one client message is in flight (memory O(P)).
        if data is None:
            return
        if traffic is not None:
            traffic[c] = traffic.get(c, 0) + len(data)
        _deliver(server, c, data, transport_rejected)

    for c, client in clients.items():
        if live(c, 0):
            try:
                data = client.first_message()
            except (ProtocolError, IntegrityError) as exc:
                failed[c] = f"client: {exc}"
                continue
            upload(c, data)
    stage = 0
    while (messages := server.next_stage()) is not None:
        stage += 1
        for c in list(messages):
            data = messages.pop(c)
            if not live(c, stage):
                continue
            try:
                reply = clients[c].handle(data)
            except (ProtocolError, IntegrityError) as exc:
                failed[c] = f"client: {exc}"
                continue
            upload(c, reply)
    rejected = {**failed, **transport_rejected, **server.rejected()}
    return server.result(), rejected
