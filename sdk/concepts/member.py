"""One hospital across a voted run (:mod:`clinograph.secure.runtime.voted`): its vote, the model it
derives from the voted DAG, then that model's training -- the hospital's
:class:`~clinograph.secure.runtime.RoundParticipant` in process and over Flower alike.

``run/start`` names ``vote`` (the vote model, first) or ``model`` (only once derived); ``vote/derive``
makes the hospital decide the DAG from the tally in the signed global model it loaded (the public
rule the server uses, :func:`~clinograph.secure.dag_voting.decide_from_sum`), build its concept
model on it from the federation's public seed, and answer with the signed
:class:`~clinograph.secure.runtime.models.DerivedModel` and the model: public values only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clinograph.secure.dag_voting import VOTE_MODULE, DagOutcome, decide_from_sum
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.runtime.models import DerivedModel, DeriveRequest, RunStart, run_id
from clinograph.secure.runtime.participant import part
from clinograph.secure.runtime.voted import MODEL_PART, RESULT_PART, canonical
from clinograph.secure.wire import open_envelope, parse_envelope, seal

from clinograph.core.errors import ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModuleKind

from ..federation.client import HospitalClient
from ..federation.member import ActiveClient

#: builds the hospital's training client on the voted DAG
BuildTraining = Callable[[DagOutcome], HospitalClient]


class ConceptMember(ActiveClient):
    """The hospital's participant for a voted run (see the module docstring).

    Args:
        vote_client: the client of the vote model (its :class:`~.task.ConceptTask` holds the vote).
        concepts, task, seed: the public vote settings (the ``dag_voting`` strategy's).
        build: ``build(outcome)`` -> the client of the concept model on the voted DAG, with the
            federation's initial weights (seeded).
    """

    def __init__(self, *, identity: Identity, server: PublicIdentity, federation_id: str,
                 vote_client: HospitalClient, concepts: Sequence[str], task: str, seed: int,
                 build: BuildTraining, dictionary_hash: str):
        self.name = identity.name
        self.identity, self.server, self.federation_id = identity, server, federation_id
        self.vote_client = vote_client
        self.concepts, self.task_node, self.seed = tuple(concepts), task, int(seed)
        self._build, self.dictionary_hash = build, dictionary_hash
        #: the concept model's client, once derived
        self.trained: HospitalClient | None = None
        #: the DAG this hospital decided from the vote
        self.outcome: DagOutcome | None = None
        self._training = False

    def __repr__(self) -> str:
        return f"ConceptMember(name={self.name!r}, derived={self.trained is not None})"

    @property
    def active(self) -> HospitalClient:
        """The client the current run's messages go to."""
        return self.trained if self._training and self.trained is not None else self.vote_client

    @property
    def client(self) -> HospitalClient:
        """The concept model's client once derived, else the vote's."""
        return self.trained or self.vote_client

    @property
    def plan(self) -> Any:
        return self.active.plan

    @property
    def last_planned_round(self) -> int | None:
        return self.active.last_planned_round

    @property
    def outgoing(self) -> list[bytes]:
        return [b for c in (self.vote_client, self.trained) if c is not None for b in c.outgoing]

    # -- RoundParticipant ------------------------------------------------------------------
    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        return self.active.on_plan(plan)

    def on_stage(self, data: bytes) -> bytes | None:
        return self.active.on_stage(data)

    def on_round_end(self, global_model: bytes | None) -> bytes | None:
        return self.active.on_round_end(global_model)

    def on_setup(self, step: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        if step == "run/start":
            return self._start(part(parts, "data", "setup"))
        if step == "vote/derive":
            return self._derive(part(parts, "data", "setup"))
        if step in ("run/chosen", "setup/sum", "setup/result"):
            raise ProtocolError(f"{step}: a voted run (concepts) has no candidates to choose and no set-up sums.")
        return self.active.on_setup(step, parts)

    # -- helpers -----------------------------------------------------------------------------
    def _start(self, data: bytes) -> dict[str, bytes]:
        msg = open_envelope(parse_envelope(data), sender=self.server, model=RunStart)
        if msg.federation_id != self.federation_id or msg.count != 1 or \
                msg.run_id != run_id(self.federation_id, msg.candidate, count=1):
            raise ProtocolError(f"run/start names run {msg.run_id!r} ({msg.count} candidate(s)) of federation "
                                f"{msg.federation_id!r}; this hospital votes and trains one concept model in "
                                f"{self.federation_id!r}.")
        if msg.candidate == "vote":
            self._training = False
        elif msg.candidate == "model" and self.trained is not None:
            self._training = True
        else:
            why = "before it derived the model from the vote" if msg.candidate == "model" else "which is not 'vote' " \
                  "or 'model'"
            raise ProtocolError(f"run/start names {msg.candidate!r} {why}; refused.")
        return {"ok": b"1"}

    def _derive(self, data: bytes) -> dict[str, bytes]:
        msg = open_envelope(parse_envelope(data), sender=self.server, model=DeriveRequest)
        voted = self.vote_client.plan
        if msg.federation_id != self.federation_id or voted is None or voted.round != msg.round:
            seen = "no vote round" if voted is None else f"round {voted.round}"
            raise ProtocolError(f"vote/derive for round {msg.round} of {msg.federation_id!r}; this hospital's last "
                                f"vote was {seen} of {self.federation_id!r}, so it cannot derive that vote's model.")
        summed = self.vote_client.task.modules.get(VOTE_MODULE)
        self.outcome = decide_from_sum(concepts=self.concepts, summed=summed, task=self.task_node, seed=self.seed,
                                       round_=msg.round)
        self.trained = self._build(self.outcome)
        modules = self.trained.task.modules
        initial = InitialModel.create(task=self.trained.task.name, dictionary_hash=self.dictionary_hash,
                                      spec=modules.spec(version=0), state=modules.state(ModuleKind.SHARED))
        body = initial.to_bytes()
        answer = DerivedModel(federation_id=self.federation_id, client=self.name, round=msg.round,
                              dag=canonical(self.outcome.model_dump(mode="json")),
                              initial_sha256=hashlib.sha256(body).hexdigest())
        return {RESULT_PART: seal(answer, self.identity), MODEL_PART: body}
