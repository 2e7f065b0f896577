"""A voted run (F-CMs, Algorithm 1 / section 4.2.1): the DAG vote, the model every hospital derives
from it, then the training -- torch-free, over the run's transport, the same in process and over
Flower (:func:`run_voted`, for a :class:`~.models.RunModels` with a :class:`~.models.VotePhase`).

1. **Vote**: :func:`.run.run_federation` of the vote model (its one candidate, ``vote``) under the
   ``dag_voting`` strategy for ``VotePhase.rounds`` rounds. Each hospital's weighted vote is summed
   by the secure mode; the server decides the DAG on the tally with the public rule and audits a
   ``dag_outcome`` per round. The vote is not covered by a DP accountant (no ``dp_policy``).
2. **Derive** (step ``vote/derive``, a signed :class:`~.models.DeriveRequest`): every hospital
   decides the DAG from the tally in the signed global model it loaded -- the same public rule --
   and builds the concept model on it from the federation's public seed; it answers with a signed
   :class:`~.models.DerivedModel` (the DAG, the model's SHA-256) and the model itself. The model is
   derived from public values only (the voted DAG, the public seed, the public settings), so
   sending it reveals nothing of a hospital's patients. The server takes the model the largest
   group of hospitals derived on its own DAG -- at least ``min_clients`` of them and no other group
   as large (else a ProtocolError: an inconsistent federation) -- audits ``model_derived`` with that
   group and names every other answering hospital (``hospital_refused``: it derived nothing,
   another model, or on another DAG). A server never builds the model (it holds no training
   code), and one misconfigured or hostile hospital can neither choose the model nor void the run.
3. **Train**: :func:`.run.run_federation` of the derived model with the hospitals that derived it,
   under the federation's own strategy, DP policy and round count, round numbers continuing.

Refused before anything runs: a crash journal (a resumed run would repeat the vote).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clinograph.core.errors import ConfigError, ProtocolError

from ..dag_voting import DagOutcome
from ..server import FederationServer
from ..wire import open_envelope, parse_envelope, seal
from .build import InitialModel, initial_model_from_bytes
from .candidate import reachable as _reachable
from .journal import Journal
from .loop import EventSink, RoundOutcome, _quiet
from .models import DerivedModel, DeriveRequest, RunModels
from .run import CandidateRun, FederationRun, run_federation
from .transport import Restricted, Transport

#: the parts of a hospital's answer to ``vote/derive``
RESULT_PART, MODEL_PART = "result", "model"


@dataclass
class VotedRun:
    """What a voted run leaves: both runs, the agreed DAG, the derived initial model and the two
    servers."""

    vote: FederationRun
    training: FederationRun
    outcome: DagOutcome
    initial: InitialModel
    vote_server: FederationServer
    server: FederationServer

    @property
    def kept(self) -> CandidateRun:
        return self.training.kept


def canonical(payload: Any) -> str:
    """Canonical JSON (sorted keys, no spaces): what both sides compare and hash."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def run_voted(models: RunModels, *, side: Any, transport: Transport, rounds: int, on_event: EventSink | None = None,
              on_round: Callable[[CandidateRun, int, RoundOutcome], None] | None = None,
              journal: Journal | None = None) -> VotedRun:
    """Vote, derive, train (module docstring); ``rounds`` training rounds. ``side``: the run's
    :class:`~.assemble.ServerSide` (its federation's strategy, DP policy and ``configure`` apply
    to the training run).

    Raises:
        ConfigError: ``models`` is not a voted run, or a crash journal is given.
        ProtocolError: a run aborted; no hospital derived a model; hospitals derived different
            models, or another DAG than the server decided.
    """
    vote = models.vote
    if vote is None:
        raise ConfigError("run_voted needs a voted run (RunModels.vote); use run_federation for the others.")
    if journal is not None:
        raise ConfigError("A voted run (concepts) is not journalled: a resumed run would repeat the DAG vote. Run "
                          "without a journal.")
    event = on_event or _quiet
    base, policy, configure = side.federation, side.dp_policy, side.configure
    servers: list[FederationServer] = []

    def keep(server: FederationServer) -> None:
        servers.append(server)
        if configure is not None:
            configure(server)

    side.federation = base.model_copy(update={"strategy": "dag_voting", "strategy_options": vote.strategy_options(),
                                              "rounds": vote.rounds})
    side.dp_policy, side.configure = None, keep
    try:
        voting = run_federation(models.model_copy(update={"vote": None}), side=side, transport=transport,
                                rounds=vote.rounds, on_event=event)
    finally:
        side.federation, side.dp_policy = base, policy
    vote_server = servers[-1]
    outcome = getattr(vote_server.strategy, "outcome", None)
    if outcome is None:
        side.configure = configure
        raise ProtocolError("The DAG vote aggregated no round, so there is no DAG to build the model on (see the "
                            "vote run's run_ended entry).")
    decided = outcome.model_dump(mode="json")
    try:
        initial, derived = _derive(models, decided, last=vote_server.round - 1, side=side, transport=transport,
                                   event=event)
        side.first_round = vote_server.round
        training = run_federation(RunModels.single(initial), side=side, transport=Restricted(transport, derived),
                                  rounds=rounds, on_event=event, on_round=on_round)
    finally:
        side.configure = configure
    return VotedRun(vote=voting, training=training, outcome=outcome, initial=initial, vote_server=vote_server,
                    server=servers[-1])


def _derive(models: RunModels, decided: dict[str, Any], *, last: int, side: Any, transport: Transport,
            event: EventSink) -> tuple[InitialModel, tuple[str, ...]]:
    """``vote/derive`` to every reachable hospital; the model the largest group derived on the
    server's DAG (at least ``min_clients``, no tie) and that group (audited; the others named)."""
    msg = seal(DeriveRequest(federation_id=side.federation_id, round=last), side.identity)
    names = _reachable(transport, side.enrolled)
    answers, failed = transport.exchange("setup", {n: {"step": b"vote/derive", "data": msg} for n in names},
                                         round_=last)
    failed = dict(failed)
    groups: dict[tuple[str, str], list[str]] = {}
    bodies: dict[str, bytes] = {}
    for name in sorted(answers):
        try:
            got = open_envelope(parse_envelope(answers[name][RESULT_PART]), sender=side.enrolled[name],
                                model=DerivedModel)
            if (got.federation_id, got.client, got.round) != (side.federation_id, name, last):
                raise ProtocolError(f"a derived model for round {got.round} of {got.federation_id!r} from "
                                    f"{got.client!r}")
            body = answers[name][MODEL_PART]
            if hashlib.sha256(body).hexdigest() != got.initial_sha256:
                raise ProtocolError("the model sent is not the one its signed answer names")
        except (KeyError, ProtocolError, ValueError) as exc:
            failed[name] = f"its derived model was not accepted: {exc}"[:4000]
            continue
        groups.setdefault((got.dag, got.initial_sha256), []).append(name)
        bodies[got.initial_sha256] = body
    for name, why in sorted(failed.items()):
        event("refused", {"round": last, "hospital": name, "stage": "vote/derive", "reason": why[:300],
                          "final": False})
    if not groups:
        raise ProtocolError("No hospital derived the model from the voted DAG: "
                            + "; ".join(f"{n}: {why[:300]}" for n, why in sorted(failed.items())))
    # the model the largest group derived on the server's DAG; every other answer is refused and named
    ours = sorted(((who, sha) for (dag, sha), who in groups.items() if json.loads(dag) == decided),
                  key=lambda g: -len(g[0]))
    need = min(side.federation.min_clients, len(side.enrolled))
    listed = "; ".join(f"{', '.join(who)}: model {sha[:12]}…" + ("" if json.loads(dag) == decided else
                                                                 " on another DAG") for (dag, sha), who in groups.items())
    if not ours or len(ours[0][0]) < need or (len(ours) > 1 and len(ours[1][0]) == len(ours[0][0])):
        raise ProtocolError(f"Hospitals derived different models from the voted DAG, and no {need} of them agree with "
                            f"each other and with the server's DAG ({listed}); the federation is inconsistent. Use "
                            "the same hospital.toml [concepts] settings and SDK version everywhere.")
    who, sha = ours[0]
    for (dag, other), names_ in groups.items():
        for name in names_ if other != sha else ():
            why = "another DAG than the server decided" if json.loads(dag) != decided else \
                f"another model ({other[:12]}…) than the {len(who)} hospital(s) that agree ({sha[:12]}…)"
            failed[name] = f"derived {why}: it is left out of the training"
            event("refused", {"round": last, "hospital": name, "stage": "vote/derive", "reason": failed[name],
                              "final": False})
    initial = initial_model_from_bytes(bodies[sha])
    if initial.dictionary_hash != models.dictionary_hash:
        raise ProtocolError("The derived model is built on another feature dictionary than the vote's.")
    audit = side.audit or side.open_audit()
    side.audit = None
    try:
        for name, why in sorted(failed.items()):  # named: a hospital that derived nothing, or something else
            audit.record("hospital_refused", {"round": last, "stage": "setup", "client": name,
                                              "reason": f"vote/derive: {why}"[:4000], "signed": False, "final": False})
        audit.record("model_derived", {"round": last, "dag_sha256": hashlib.sha256(canonical(decided).encode())
                                       .hexdigest(), "initial_sha256": sha, "spec_digest": initial.spec.digest(),
                                       "parameters": sum(m.size for m in initial.spec.shared), "hospitals": who})
    finally:
        audit.close()
    event("model_derived", {"round": last, "hospitals": who})
    return initial, tuple(who)
