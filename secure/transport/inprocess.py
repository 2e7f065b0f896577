"""One secure-aggregation round of a mode alone, in process -- the mode-level harness.

Tests and benchmarks of a secure mode need its two halves without a federation server (no
strategy, no audit). :func:`run_aggregation` runs them over the runtime's own pieces: the
first messages, then :func:`clinograph.secure.runtime.loop.relay_stages` over an
:class:`~clinograph.secure.runtime.InProcessTransport`, so the stage relay is the one the
federation's round loop uses. A client listed in ``drop`` with stage index s stops answering
from stage s on (0 = the answer to the plan); a client half that raises while handling a
message is treated as dropped, with the reason prefixed ``client:``.
"""

from __future__ import annotations

from collections.abc import Mapping

from clinograph.core.errors import ClinographError, ConfigError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity

from ..aggregation import ModuleSums, create_mode
from ..aggregation.base import AggregationClient, AggregationServer, LocalUpdate
from ..messages import MAX_MESSAGE_BYTES, RoundPlan
from ..runtime.loop import relay_stages
from ..runtime.transport import InProcessTransport
from ..wire import parse_envelope


class _ModeHalf:
    """A client half as a runtime participant (only later stages go through the transport)."""

    def __init__(self, name: str, client: AggregationClient, traffic: dict[str, int] | None):
        self.name, self.client, self.traffic = name, client, traffic

    def on_stage(self, data: bytes) -> bytes | None:
        try:
            reply = self.client.handle(data)
        except ClinographError as exc:
            raise ProtocolError(f"client: {exc}") from None
        if reply is not None and self.traffic is not None:
            self.traffic[self.name] = self.traffic.get(self.name, 0) + len(reply)
        return reply


def _deliver(server: AggregationServer, sender: str, data: bytes, transport_rejected: dict[str, str]) -> None:
    receive_bytes = getattr(server, "receive_bytes", None)
    try:
        if receive_bytes is not None:
            receive_bytes(sender, data)
            return
        env = parse_envelope(data, max_bytes=MAX_MESSAGE_BYTES)
        if env.sender != sender:
            raise ProtocolError(f"Envelope claims sender {env.sender!r} but arrived from {sender!r}.")
        server.receive(env)
    except (ProtocolError, IntegrityError) as exc:
        if receive_bytes is None:
            transport_rejected.setdefault(sender, str(exc))


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
    dropped: dict[str, str] = {}
    transport_rejected: dict[str, str] = {}
    for c, client in clients.items():  # stage 0: the answer to the plan
        if drop.get(c, 1) <= 0:
            dropped[c] = "silent from stage 0"
            continue
        try:
            data = client.first_message()
        except (ProtocolError, IntegrityError) as exc:
            dropped[c] = f"client: {exc}"
            continue
        if traffic is not None:
            traffic[c] = traffic.get(c, 0) + len(data)
        _deliver(server, c, data, transport_rejected)
    transport = InProcessTransport({c: _ModeHalf(c, cl, traffic) for c, cl in clients.items()})
    transport.drop_at(plan.round, {c: s - 1 for c, s in drop.items() if s >= 1})  # exchange k = stage k + 1
    relay_stages(server.next_stage, lambda data, name: _deliver(server, name, data, transport_rejected), transport,
                 round_=plan.round, dropped=dropped)
    failed = {c: r.split("ProtocolError: ", 1)[1] for c, r in dropped.items() if "ProtocolError: client: " in r}
    failed.update({c: r for c, r in dropped.items() if r.startswith("client: ")})
    return server.result(), {**failed, **transport_rejected, **server.rejected()}
