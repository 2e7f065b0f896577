"""An F-CMs federation over the runtime: DAG voting rounds, then the concept model's rounds.

Each phase is the one run (:func:`clinograph.secure.runtime.run.run_federation`, one candidate:
the phase's model), with real signed plans, the configured secure mode (``masked`` by default)
and one audit trail -- the vote its first run, the training the next:

1. **Voting** (spec = the vote module only, strategy ``dag_voting``): each hospital's
   weighted vote is summed by the secure mode; the server decides the DAG on the tally and
   records a ``dag_outcome`` entry (and artefact) per round.
2. **Training** (spec = the concept model, strategy from the config, fedavg/fedsgd): every
   hospital builds the same initial model from the voted DAG -- read from the tally in the
   signed global model of phase 1, decided with the same public rule the server used -- and
   trains only the modules it supervises (F-CMs eq. 2, 4.2.3).

What of F-CMs Algorithm 1 this does **not** run inside the protocol: the server's ModelSpec
is fixed per federation, so the architecture is decided once, after the vote; late joiners,
re-voting during training and E1/E2 adaptation with warm start mid-run stay in the research
loop (:mod:`research.fcm_bnlearn.fcm_federation`, the bnlearn benchmark). A concept that
no voter supervises is not in the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from clinograph.secure.audit import AuditTrail
from clinograph.secure.dag_voting import VOTE_MODULE, DagOutcome, decide_from_sum
from clinograph.secure.runtime import InProcessTransport
from clinograph.secure.runtime.assemble import ServerSide
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.runtime.config import DPPolicySection, FederationSection
from clinograph.secure.runtime.models import RunModels
from clinograph.secure.runtime.run import run_federation
from clinograph.secure.server import FederationServer
from torch import nn

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

from ..config import PrivacySection, ReleaseSection
from ..federation.client import HospitalClient
from .dp_training import concept_dp_trainer
from .graph import ConceptGraph
from .model import ConceptModel
from .modules import GRAPH_BASED, ConceptHParams
from .task import ConceptTask, ConceptTraining, ConceptVote


@dataclass(frozen=True, repr=False)
class ConceptSite:
    """One hospital's data for a concept federation.

    ``labels`` holds only the nodes this hospital has (its concept columns and the task),
    ``-1`` where a patient's label is missing; ``nodes``/``edges`` are its DAG proposal.
    """

    name: str
    inputs: torch.Tensor | Callable[[torch.Tensor], Any]
    labels: Mapping[str, torch.Tensor]
    split: Any
    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        return f"ConceptSite(name={self.name!r}, nodes={len(self.nodes)}, edges={len(self.edges)})"


@dataclass
class ConceptFederation:
    """What a run leaves: the voted DAG, the graph the model was built on, both servers and the
    trained hospitals (each holds the final global model)."""

    outcome: DagOutcome
    graph: ConceptGraph
    vote_server: FederationServer
    server: FederationServer
    hospitals: dict[str, HospitalClient]
    round_losses: list[dict[str, float]] = field(default_factory=list)


def graph_from_outcome(outcome: DagOutcome, *, kind: str, cards: Mapping[str, int]) -> ConceptGraph:
    """The model's graph for the voted DAG: the DAG itself for graph-based kinds (cgm, c2bm),
    the bipartite concepts -> task graph for cbm/cem, over the active (supervised) nodes."""
    task = outcome.task or ""
    active = [c for c, a in zip(outcome.concepts, outcome.active, strict=True) if a]
    if kind in GRAPH_BASED:
        return ConceptGraph.from_edges(nodes=active, edges=outcome.edges(), task=task, cards=cards)
    return ConceptGraph.bipartite(concepts=[c for c in active if c != task], task=task, cards=cards,
                                  with_task=task in active)


def _phase(federation: FederationSection, **update: Any) -> FederationSection:
    return federation.model_copy(update=update)


def _clients(tasks: Mapping[str, ConceptTask], ids: Mapping[str, Identity], server: Identity, *,
             dictionary_hash: str, federation_id: str, release: ReleaseSection) -> dict[str, HospitalClient]:
    publics = {n: i.public for n, i in ids.items()}
    return {n: HospitalClient(task=t, identity=ids[n], server=server.public, peers=publics,
                              dictionary_hash=dictionary_hash, federation_id=federation_id, release=release)
            for n, t in tasks.items()}


def _run(federation: FederationSection, *, identity: Identity, ids: Mapping[str, Identity], task: ConceptTask,
         dictionary_hash: str, audit: AuditTrail, first_round: int, clients: Mapping[str, HospitalClient],
         rounds: int, dp_policy: DPPolicySection | None = None,
         on_round: Callable[[int, Any], None] | None = None) -> FederationServer:
    """One phase as the one run (:func:`clinograph.secure.runtime.run.run_federation`, one
    candidate: the phase's model) over the in-process transport; returns the phase's server.
    ``audit``: the run continues this audit run (the vote) or, once it is closed, opens the
    next run of the same trail (the training)."""
    initial = InitialModel.create(task=task.name, dictionary_hash=dictionary_hash, spec=task.modules.spec(version=0),
                                  state=task.modules.state(ModuleKind.SHARED))
    built: list[FederationServer] = []
    side = ServerSide(federation=federation, identity=identity, enrolled={n: i.public for n, i in ids.items()},
                      dp_policy=dp_policy.policy() if dp_policy else None, audit_dir=audit.directory,
                      audit=None if audit.closed else audit, first_round=first_round, configure=built.append)
    run_federation(RunModels.single(initial), side=side, transport=InProcessTransport(dict(clients)), rounds=rounds,
                   on_round=None if on_round is None else (lambda _run, r, outcome: on_round(r, outcome)))
    return built[0]


def run_concept_federation(*, sites: Sequence[ConceptSite], concepts: Sequence[str], task: str,
                           cards: Mapping[str, int], kind: str, encoder: Callable[[], nn.Module], z_dim: int,
                           federation: FederationSection, audit: AuditTrail, server_identity: Identity,
                           dictionary_hash: str, vote_rounds: int = 1, hp: ConceptHParams | None = None,
                           training: ConceptTraining | None = None, release: ReleaseSection | None = None,
                           on_round: Callable[[int, dict[str, HospitalClient]], None] | None = None,
                           privacy: PrivacySection | None = None, state_dir: Path | None = None,
                           ) -> ConceptFederation:
    """Vote, decide, build, train (see the module docstring); ``federation.rounds`` training rounds.

    With ``privacy`` enabled every hospital trains with patient-level DP-SGD
    (:mod:`.dp_training`; its ledger in ``state_dir/<site>``) and the training server requires a
    ledger entry within ``[dp_policy]`` (max ε = ``epsilon_budget``, δ, max clip = ``clip_norm``)
    in every report, as NS-FL's simulation does. The vote is not covered by the accountant.

    ``encoder()`` builds the encoder (called once per hospital after ``torch.manual_seed
    (federation.seed)``, so every hospital starts from the same weights).

    Raises:
        ConfigError: ``ckks`` (the audited DAG needs a server that sees the tally), an unknown
            concept in a site's proposal, a site name used twice, or DP without ``state_dir``.
    """
    dp = privacy if privacy is not None and privacy.enabled else None
    if dp is not None and state_dir is None and dp.state_dir is None:
        raise ConfigError("A concept federation with [privacy] enabled needs a state directory for the hospitals' "
                          "privacy ledgers: set [privacy] state_dir (or pass state_dir).")
    from clinograph.secure.aggregation import create_mode

    if not create_mode(federation.secure_mode).server_sees_sum:
        raise ConfigError(f"A concept federation with DAG voting runs in 'masked' (or insecure_plaintext) mode: "
                          f"under {federation.secure_mode} the server never sees the tally it must audit.")
    names = [s.name for s in sites]
    if len(set(names)) != len(names):
        raise ConfigError(f"Two concept sites share a name: {sorted({n for n in names if names.count(n) > 1})}.")
    concepts = tuple(concepts)
    release = release or ReleaseSection()
    ids = {s.name: Identity.generate(s.name) for s in sites}
    votes = {s.name: ConceptVote(concepts=concepts, nodes=tuple(s.nodes), edges=tuple(s.edges)) for s in sites}

    # Phase 1: voting rounds, spec = the vote module alone.
    vote_fed = _phase(federation, rounds=vote_rounds, strategy="dag_voting",
                      strategy_options={"concepts": ",".join(concepts), "task": task, "seed": federation.seed})
    vote_tasks = {s.name: ConceptTask(model=None, inputs=s.inputs, labels=s.labels, task=task, split=s.split,
                                      vote=votes[s.name]) for s in sites}
    voters = _clients(vote_tasks, ids, server_identity, dictionary_hash=dictionary_hash, federation_id=federation.id,
                      release=release)
    vote_server = _run(vote_fed, identity=server_identity, ids=ids, task=next(iter(vote_tasks.values())),
                       dictionary_hash=dictionary_hash, audit=audit, first_round=0, clients=voters, rounds=vote_rounds)

    # Each hospital decides the DAG from the tally in the signed global model it loaded.
    decided = {}
    for name, client in voters.items():
        if client.plan is None:
            raise ConfigError(f"Hospital {name!r} took part in no voting round; it cannot build the model.")
        decided[name] = decide_from_sum(concepts=concepts, summed=client.task.modules.get(VOTE_MODULE), task=task,
                                        seed=federation.seed, round_=client.plan.round)
    outcome = next(iter(decided.values()))
    if any(o.adjacency != outcome.adjacency for o in decided.values()):
        raise ConfigError("Hospitals decided different DAGs from the same tally; the federation is inconsistent.")
    graph = graph_from_outcome(outcome, kind=kind, cards=cards)

    # Phase 2: the concept model built from the voted DAG, trained module-wise over the runtime.
    tasks = {}
    for s in sites:
        torch.manual_seed(federation.seed)  # identical initial weights at every hospital
        model = ConceptModel(kind=kind, encoder=encoder(), graph=graph, z_dim=z_dim, hp=hp)
        trainer = None
        if dp is not None:
            root = Path(dp.state_dir or state_dir) / s.name  # type: ignore[arg-type]
            trainer = concept_dp_trainer(privacy=dp, n_train=len(s.split.train), site=s.name, state_dir=root,
                                         signer=ids[s.name])
        tasks[s.name] = ConceptTask(model=model, inputs=s.inputs, labels=s.labels, task=task, split=s.split,
                                    training=training, privacy=trainer)
    hospitals = _clients(tasks, ids, server_identity, dictionary_hash=dictionary_hash, federation_id=federation.id,
                         release=release)
    result = ConceptFederation(outcome=outcome, graph=graph, vote_server=vote_server, server=None,  # type: ignore[arg-type]
                               hospitals=hospitals)

    def after(r: int, _outcome: Any) -> None:
        result.round_losses.append({n: float(h.last.loss) for n, h in hospitals.items() if h.last is not None})
        if on_round is not None:
            on_round(r, hospitals)

    result.server = _run(federation, identity=server_identity, ids=ids, task=next(iter(tasks.values())),
                         dictionary_hash=dictionary_hash, audit=audit, first_round=vote_server.round, clients=hospitals,
                         rounds=federation.rounds, on_round=after,
                         dp_policy=DPPolicySection(max_epsilon=dp.epsilon_budget, delta=dp.delta,
                                                   max_clip_norm=dp.clip_norm) if dp is not None else None)
    return result

