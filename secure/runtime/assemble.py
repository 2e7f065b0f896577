"""The server side of a federation run, assembled in one place for every caller.

``simulate()`` and the Flower ServerApp both hand a :class:`ServerSide` to
:func:`.run.run_federation`; it opens each candidate's audit run, runs the secure mode's set-up
over the run's transport (CKKS: the key ceremony; the run goes on with the hospitals that hold
the key) and builds the candidate's server with :func:`.build.build_server`, which decides every
parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clinograph.core.identity import Identity, PublicIdentity

from ..audit import AuditTrail
from ..messages import DPPolicy
from ..server import FederationServer
from .build import build_server
from .config import FederationSection
from .loop import EventSink, _quiet
from .models import CandidateModel
from .transport import Restricted, Transport


@dataclass
class ServerSide:
    """What builds each candidate's server (see the module docstring).

    ``audit``: an audit run already open (the ServerApp records the greeting there); the first
    candidate's run continues it, later ones open their own. ``first_round``: the first training
    round's number (after set-up rounds recorded in the same audit run).
    """

    federation: FederationSection
    identity: Identity
    enrolled: Mapping[str, PublicIdentity]
    dp_policy: DPPolicy | None
    audit_dir: Path
    audit: AuditTrail | None = None
    first_round: int = 0
    #: called with each candidate's server once built (e.g. FedNSL attaches its M-step to the
    #: strategy): what a caller adds to a server, never a second way to build one
    configure: Callable[[FederationServer], None] | None = None

    @property
    def federation_id(self) -> str:
        return self.federation.id

    def open_audit(self) -> AuditTrail:
        """A new run of the federation's audit trail (signed by the server's key)."""
        return AuditTrail(self.audit_dir, identity=self.identity)

    def open_run(self, candidate: CandidateModel, *, run_id: str, transport: Transport,
                 on_event: EventSink = _quiet) -> tuple[FederationServer, Transport]:
        """The candidate's server (federation id ``run_id``) and the transport its rounds use."""
        audit = self.audit or self.open_audit()
        self.audit = None
        first_round, self.first_round = self.first_round, 0
        fed = self.federation.model_copy(update={"id": run_id})
        try:
            from ..aggregation import create_mode
            from .build import build_strategy, check_reads_sum, weight_bound

            strategy = build_strategy(fed)
            check_reads_sum(strategy, fed)  # before the mode's set-up (the CKKS ceremony) runs for nothing
            mode_run = create_mode(fed.secure_mode).open_run(
                federation=fed, transport=transport, run_id=run_id, enrolled=self.enrolled,
                max_weight=weight_bound(strategy, fed), on_event=on_event)
            if mode_run.hospitals is not None:  # e.g. the CKKS key holders
                transport = Restricted(transport, mode_run.hospitals)
            server = build_server(federation=fed, identity=self.identity, enrolled=self.enrolled,
                                  initial=candidate.initial, audit=audit, dp_policy=self.dp_policy, mode_run=mode_run)
        except BaseException:
            audit.close()
            raise
        server.round = first_round
        if self.configure is not None:
            self.configure(server)
        from ..strategies.attention import InsecureAttention, PlaintextUpdateTap

        if isinstance(server.strategy, InsecureAttention):  # AGAT's server-side attention reads plaintext updates
            transport = PlaintextUpdateTap(transport, strategy=server.strategy, secure_mode=server.mode.name,
                                           server=server.identity.public, enrolled=server.enrolled)
        return server, transport

    @staticmethod
    def close_run(server: FederationServer) -> None:
        """Close the candidate's audit run."""
        close = getattr(server.audit, "close", None)
        if callable(close):
            close()

