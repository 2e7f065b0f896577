"""An F-CMs federation in process: the voted run of :mod:`clinograph.secure.runtime.voted`
(the DAG vote, the model every hospital derives from it, its training) over the in-process
transport, with each hospital a :class:`~.member.ConceptMember` -- the same run and the same
hospital the Flower ServerApp and the SuperNode factory (:mod:`.registration`) use.

1. **Voting** (spec = the vote module only, strategy ``dag_voting``): each hospital's weighted
   vote is summed by the secure mode; the server decides the DAG on the tally and records a
   ``dag_outcome`` entry (and artefact) per round.
2. **Derive**: every hospital decides the DAG from the tally in the signed global model it
   loaded (the same public rule) and builds the concept model on it from the federation's seed;
   the server requires all of them to agree with each other and with its decision and audits
   ``model_derived``.
3. **Training** (spec = the concept model, strategy from the config, fedavg/fedsgd): every
   hospital trains only the modules it supervises (F-CMs eq. 2, 4.2.3).

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
from clinograph.secure.dag_voting import DagOutcome
from clinograph.secure.runtime import InProcessTransport
from clinograph.secure.runtime.assemble import ServerSide
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.runtime.config import DPPolicySection, FederationSection
from clinograph.secure.runtime.models import CandidateModel, RunModels, VotePhase
from clinograph.secure.runtime.voted import run_voted
from clinograph.secure.server import FederationServer
from torch import nn

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModuleKind

from ..config import PrivacySection, ReleaseSection
from ..federation.client import HospitalClient
from ..seeding import torch_seeded
from .dp_training import concept_dp_trainer
from .graph import ConceptGraph
from .member import ConceptMember
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


@dataclass(frozen=True)
class ConceptSettings:
    """What every hospital of a concept federation shares: the vote's concepts and task node, the
    states per node, the model (``encoder()`` is called with torch's generator seeded with ``seed``, so every
    hospital derives the same initial weights), local training and DP."""

    concepts: tuple[str, ...]
    task: str
    cards: Mapping[str, int]
    kind: str
    encoder: Callable[[], nn.Module]
    z_dim: int
    seed: int
    hp: ConceptHParams | None = None
    training: ConceptTraining | None = None
    privacy: PrivacySection | None = None


def concept_member(site: ConceptSite, settings: ConceptSettings, *, identity: Identity, server: PublicIdentity,
                   peers: Mapping[str, PublicIdentity], federation_id: str, dictionary_hash: str,
                   release: ReleaseSection, ledger_dir: Path | None = None,
                   state_dir: Path | None = None) -> ConceptMember:
    """The hospital of ``site`` for a voted run: its vote now, its concept model once the DAG is voted
    (in process and, from its files, over Flower: :mod:`.registration`). ``ledger_dir``: its DP
    ledger (required with ``settings.privacy``); ``state_dir``: its anchor and last global model."""
    def client(task_: ConceptTask, where: Path | None) -> HospitalClient:
        return HospitalClient(task=task_, identity=identity, server=server, peers=peers,
                              dictionary_hash=dictionary_hash, federation_id=federation_id, release=release,
                              state_dir=where)

    def build(outcome: DagOutcome) -> HospitalClient:
        with torch_seeded(settings.seed):  # identical initial weights at every hospital
            model = ConceptModel(kind=settings.kind, encoder=settings.encoder(), z_dim=settings.z_dim, hp=settings.hp,
                                 graph=graph_from_outcome(outcome, kind=settings.kind, cards=settings.cards))
        trainer = None
        if settings.privacy is not None:
            if ledger_dir is None:
                raise ConfigError(f"Hospital {site.name!r} trains its concept model with DP but has no ledger "
                                  "directory: set [privacy] state_dir.")
            trainer = concept_dp_trainer(privacy=settings.privacy, n_train=len(site.split.train), site=site.name,
                                         state_dir=ledger_dir, signer=identity)
        return client(ConceptTask(model=model, inputs=site.inputs, labels=site.labels, task=settings.task,
                                  split=site.split, training=settings.training, privacy=trainer), state_dir)

    vote = ConceptVote(concepts=settings.concepts, nodes=tuple(site.nodes), edges=tuple(site.edges))
    return ConceptMember(identity=identity, server=server, federation_id=federation_id,
                         vote_client=client(ConceptTask(model=None, inputs=site.inputs, labels=site.labels,
                                                        task=settings.task, split=site.split, vote=vote),
                                             # the vote model's anchor and kept tally apart from the trained model's
                                             None if state_dir is None else Path(state_dir) / "vote"),
                         concepts=settings.concepts, task=settings.task, seed=settings.seed, build=build,
                         dictionary_hash=dictionary_hash)


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
    in every report, as NS-FL's simulation does. Under ``mode = "distributed"``
    (:mod:`.distributed_training`; ``planned_rounds`` defaults to ``federation.rounds``) the policy
    is distributed (:func:`dp_policy_section`): the server checks it against the derived model's
    dimension when it builds the training run, every share at its published scale and the
    aggregate's noise each round. The vote is not covered by the accountant.

    ``encoder()`` builds the encoder (called once per hospital with torch's generator seeded
    with ``federation.seed``, so every hospital starts from the same weights).

    Raises:
        ConfigError: ``ckks`` (the audited DAG needs a server that sees the tally), an unknown
            concept in a site's proposal, a site name used twice, or DP without ``state_dir``.
    """
    dp = privacy if privacy is not None and privacy.enabled else None
    if dp is not None and dp.planned_rounds is None:  # as simulate() fills it in
        dp = dp.model_copy(update={"planned_rounds": federation.rounds})
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
    if federation.secure_mode == "insecure_plaintext":  # an in-process run: its caller chose the mode for every party
        release = release.model_copy(update={"insecure_accept_plaintext": True})
    elif federation.secure_mode not in release.secure_modes:
        release = release.model_copy(update={"secure_modes": (*release.secure_modes, federation.secure_mode)})
    if federation.masked_threshold is not None and release.masked_threshold is None:  # its t, for every party too
        release = release.model_copy(update={"masked_threshold": federation.masked_threshold})
    ids = {s.name: Identity.generate(s.name) for s in sites}
    publics = {n: i.public for n, i in ids.items()}
    settings = ConceptSettings(concepts=concepts, task=task, cards=dict(cards), kind=kind, encoder=encoder, z_dim=z_dim,
                               seed=federation.seed, hp=hp, training=training, privacy=dp)
    members = {s.name: concept_member(s, settings, identity=ids[s.name], server=server_identity.public, peers=publics,
                                      federation_id=federation.id, dictionary_hash=dictionary_hash, release=release,
                                      ledger_dir=Path(dp.state_dir or state_dir) / s.name if dp else None)  # type: ignore[arg-type]
               for s in sites}
    policy = dp_policy_section(dp).policy() if dp is not None else None
    side = ServerSide(federation=federation, identity=server_identity, enrolled=publics, dp_policy=policy,
                      audit_dir=audit.directory, audit=None if audit.closed else audit)
    losses: list[dict[str, float]] = []

    def after(_run: Any, r: int, _outcome: Any) -> None:
        trained = {n: m.trained for n, m in members.items() if m.trained is not None}
        losses.append({n: float(h.last.loss) for n, h in trained.items() if h.last is not None})
        if on_round is not None:
            on_round(r, trained)

    run = run_voted(vote_models(next(iter(members.values())).vote_client.task, dictionary_hash=dictionary_hash,
                                vote_rounds=vote_rounds, seed=federation.seed),
                    side=side, transport=InProcessTransport(dict(members)), rounds=federation.rounds, on_round=after)
    outcome = run.outcome
    return ConceptFederation(outcome=outcome, graph=graph_from_outcome(outcome, kind=kind, cards=cards),
                             vote_server=run.vote_server, server=run.server,
                             hospitals={n: m.trained for n, m in members.items() if m.trained is not None},
                             round_losses=losses)


def dp_policy_section(privacy: PrivacySection) -> DPPolicySection:
    """The training server's ``[dp_policy]`` for hospitals that share ``privacy``: its bounds (max ε =
    ``epsilon_budget``, δ, max clip = ``clip_norm``) and, under ``mode = "distributed"``, the
    mechanism (σ, q, h, the rounds of the promise = ``planned_rounds``), as NS-FL's simulation."""
    if privacy.mode != "distributed":
        return DPPolicySection(max_epsilon=privacy.epsilon_budget, delta=privacy.delta,
                               max_clip_norm=privacy.clip_norm)
    return DPPolicySection(max_epsilon=privacy.epsilon_budget, delta=privacy.delta, max_clip_norm=privacy.clip_norm,
                           min_noise_multiplier=0.0, mode="distributed", mechanism=privacy.mechanism,
                           noise_multiplier=privacy.noise_multiplier, sample_rate=privacy.sample_rate,
                           min_honest=privacy.min_honest, rounds=privacy.planned_rounds)


def vote_models(vote_task: ConceptTask, *, dictionary_hash: str, vote_rounds: int, seed: int) -> RunModels:
    """A voted run's models: the vote model of ``vote_task`` (its one candidate, ``vote``) and the
    public vote settings (what ``clinograph model init`` writes for ``task = "concepts"``)."""
    vote = vote_task.vote
    if vote is None:
        raise ConfigError("vote_models needs a vote task (ConceptTask(vote=...)).")
    initial = InitialModel.create(task=vote_task.name, dictionary_hash=dictionary_hash,
                                  spec=vote_task.modules.spec(version=0),
                                  state=vote_task.modules.state(ModuleKind.SHARED))
    return RunModels(task=vote_task.name, selection=None,
                     candidates=(CandidateModel(name="vote", overrides="{}", initial=initial),),
                     vote=VotePhase(concepts=vote.concepts, task=vote_task.task, seed=int(seed), rounds=vote_rounds))
