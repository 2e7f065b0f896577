"""One round, driven over any transport: the relay between the server and the hospitals.

The in-process transport calls :func:`run_round` directly; the Flower adapter performs the
same steps with each hop carried by a Flower message. A hospital is anything that satisfies
:class:`RoundParticipant` (the SDK's ``HospitalClient`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from .aggregation import ModuleSums
from .errors import ClinographError, ProtocolError
from .messages import RoundResult
from .server import FederationServer


class RoundParticipant(Protocol):
    """The hospital side of a round, as bytes in and bytes out."""

    name: str

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        """Verify the plan, train, and return (signed report, the mode's first message)."""

    def on_stage(self, data: bytes) -> bytes | None:
        """Answer one later-stage message of the secure-aggregation mode."""

    def decrypted_result(self) -> ModuleSums | None:
        """In modes where the server does not see the sum, the aggregate this hospital decrypted."""

    def on_round_end(self, global_model: bytes | None) -> None:
        """Load the new global model (None in modes where the server holds none)."""


@dataclass(frozen=True)
class RoundOutcome:
    """The round result plus who was dropped where (for logs and tests)."""

    result: RoundResult
    dropped: dict[str, str]


def run_round(server: FederationServer, hospitals: Mapping[str, RoundParticipant], *,
              participants: tuple[str, ...], drop_at: Mapping[str, int] | None = None,
              on_event: Callable[[str, str], None] | None = None) -> RoundOutcome:
    """Run one full round in process.

    ``drop_at[name] = s`` makes hospital ``name`` go silent from stage ``s`` on (stage 0 is the
    answer to the plan), which is how tests exercise dropouts.
    """
    drop_at = dict(drop_at or {})
    dropped: dict[str, str] = {}
    event = on_event or (lambda stage, name: None)
    plan = server.open_round(participants)
    for name in participants:
        if drop_at.get(name, 1 << 30) <= 0:
            dropped[name] = "silent at stage 0"
            continue
        try:
            report, first = hospitals[name].on_plan(plan)
        except ClinographError as exc:
            dropped[name] = f"refused the plan: {exc}"
            continue
        event("plan", name)
        if server.receive_report(report):
            server.receive(first)
    stage = 1
    while (outgoing := server.next_stage()) is not None:
        for name, data in sorted(outgoing.items()):
            if name in dropped or drop_at.get(name, 1 << 30) <= stage:
                dropped.setdefault(name, f"silent at stage {stage}")
                continue
            try:
                reply = hospitals[name].on_stage(data)
            except ProtocolError as exc:
                dropped[name] = f"refused stage {stage}: {exc}"
                continue
            if reply is not None:
                server.receive(reply)
        stage += 1
    decrypted = None
    if not server.mode.server_sees_sum:
        results = [hospitals[n].decrypted_result() for n in participants if n not in dropped]
        decrypted = next((r for r in results if r is not None), None)
    result = server.close_round(decrypted=decrypted)
    model = server.global_model_bytes() if server.state is not None else None
    for name in participants:
        if name not in dropped:
            hospitals[name].on_round_end(model)
    return RoundOutcome(result=result, dropped=dropped)
