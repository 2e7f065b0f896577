"""HospitalClient: the SDK's side of a round (satisfies ``clinograph.secure.rounds.RoundParticipant``).

On a plan it verifies the server's signature, the dictionary and the model version, loads the
global shared modules, trains locally, and hands *only* the deltas of the shared modules it
trained to the plan's secure-aggregation mode. Personal modules (feature masks, a personal
head) never leave: they are not in any outgoing message (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from clinograph.secure.aggregation import AggregationClient, LocalUpdate, ModuleSums, create_mode
from clinograph.secure.errors import ProtocolError
from clinograph.secure.identity import Identity, PublicIdentity
from clinograph.secure.messages import ClientReport, GlobalModel, RoundPlan
from clinograph.secure.spec import ModuleKind
from clinograph.secure.state import UNKNOWN_STATE, state_digest
from clinograph.secure.strategies import create_strategy
from clinograph.secure.wire import open_envelope, parse_envelope, seal

from ..model.modules import ModuleMap
from ..model.nsfl import NSFLModel
from ..ontology.dictionary import FeatureDictionary
from .trainer import Trainer


class HospitalClient:
    """One hospital in a federation."""

    def __init__(self, *, identity: Identity, server: PublicIdentity, peers: Mapping[str, PublicIdentity],
                 dictionary: FeatureDictionary, model: NSFLModel, modules: ModuleMap, trainer: Trainer,
                 num_samples: int, observed_nodes: np.ndarray, release_metrics: bool,
                 publish_feature_relevance: bool, evaluate: Callable[[], Mapping[str, float]] | None = None,
                 after_round: Callable[[HospitalClient], None] | None = None,
                 mode_clients: Mapping[str, Callable[..., AggregationClient]] | None = None):
        self.name = identity.name
        self.identity = identity
        self.server = server
        self.peers = dict(peers)
        self.dictionary = dictionary
        self.dictionary_hash = dictionary.digest()
        self.model = model
        self.modules = modules
        self.trainer = trainer
        self.num_samples = int(num_samples)
        node_ids = dictionary.node_ids()
        self.observed = {node_ids[i] for i in np.asarray(observed_nodes)}
        self.release_metrics = release_metrics
        self.publish_feature_relevance = publish_feature_relevance
        self._evaluate = evaluate
        self.after_round = after_round  # e.g. local fine-tuning of personal modules (PFGL-Net Alg. 2)
        # Modes that need key material (ckks: the hospital's keyring) are built by a factory.
        self.mode_clients = dict(mode_clients or {})
        self._plan: RoundPlan | None = None
        self._mode_client = None
        self._global: dict[str, np.ndarray] = modules.state(ModuleKind.SHARED)
        self.outgoing: list[bytes] = []  # every byte this hospital sent (for audits and tests)
        self.last_loss: float | None = None
        self.last_ledger = None  # this hospital's latest privacy-ledger entry (DP runs)

    # -- RoundParticipant ------------------------------------------------------------------
    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        env = parse_envelope(plan)
        p = open_envelope(env, sender=self.server, model=RoundPlan)
        if self.name not in p.participants:
            raise ProtocolError(f"Plan for round {p.round} does not list {self.name!r}.")
        if p.dictionary_hash != self.dictionary_hash:
            raise ProtocolError(f"Plan uses feature dictionary {p.dictionary_hash[:12]}…, this hospital has "
                                f"{self.dictionary.name} v{self.dictionary.version} ({self.dictionary_hash[:12]}…).")
        local_spec = self.modules.spec(version=p.spec.version)
        if local_spec.digest() != p.spec.digest():
            raise ProtocolError(f"Plan's ModelSpec v{p.spec.version} differs from this hospital's model; update the SDK.")
        server_blind = p.global_state_digest == UNKNOWN_STATE and not create_mode(p.secure_mode).server_sees_sum
        if not server_blind and state_digest(self._global) != p.global_state_digest:
            raise ProtocolError(f"Round {p.round}: this hospital's global model does not match the plan's "
                                "(missed a round?). Fetch the current global model before joining.")
        self._plan = p
        self.modules.load(self._global)
        outcome = self.trainer.train(self.model, round_=p.round, epochs=p.local_epochs, plan_options=dict(p.options))
        self.last_loss = outcome.loss
        self.last_ledger = outcome.ledger
        trained = self._trained_modules(outcome.used_similar_to)
        weight = float(p.options.get(f"weight/{self.name}", self.num_samples))
        deltas = {n: weight * (self._global[n] - self.modules.get(n)) for n in trained}
        metrics = self.local_metrics() if self.release_metrics else {}
        update = LocalUpdate(modules=deltas, weight=weight, metrics=metrics)
        mode = create_mode(p.secure_mode)
        factory = self.mode_clients.get(p.secure_mode, mode.client)
        self._mode_client = factory(plan=p, identity=self.identity, server=self.server, peers=self.peers,
                                        update=update)
        report = ClientReport(federation_id=p.federation_id, round=p.round, client=self.name,
                              dictionary_hash=self.dictionary_hash, ledger=outcome.ledger, metrics=metrics,
                              feature_relevance=self.feature_relevance() if self.publish_feature_relevance else None)
        out = (seal(report, self.identity), self._mode_client.first_message())
        self.outgoing.extend(out)
        return out

    def on_stage(self, data: bytes) -> bytes | None:
        if self._mode_client is None:
            raise ProtocolError("Stage message before any plan.")
        reply = self._mode_client.handle(data)
        if reply is not None:
            self.outgoing.append(reply)
        return reply

    def decrypted_result(self) -> ModuleSums | None:
        return self._mode_client.decrypted_result() if self._mode_client is not None else None

    def on_round_end(self, global_model: bytes | None) -> None:
        """Load the new global shared modules; personal modules keep this hospital's values."""
        if global_model is not None:
            msg = open_envelope(parse_envelope(global_model), sender=self.server, model=GlobalModel)
            from clinograph.secure.aggregation.checks import decode_modules

            plan = self._plan
            if plan is None or msg.round != plan.round + 1:
                raise ProtocolError("Global model is not the one following this hospital's last round.")
            self._global = {n: v.astype(np.float64) for n, v in decode_modules(plan, msg.modules, sender="server").items()}
        else:
            sums = self.decrypted_result()
            if sums is None or self._plan is None:
                raise ProtocolError("No global model and no decrypted aggregate at the end of the round.")
            self._global = self._strategy_for(self._plan).apply(self._global, sums)
        self.modules.load(self._global)
        if self.after_round is not None:
            self.after_round(self)

    # -- helpers -----------------------------------------------------------------------------
    def _strategy_for(self, plan: RoundPlan):
        """One strategy instance for the whole run (FedOpt keeps its moments across rounds),
        built from the options the signed plan carries."""
        opts = {k.removeprefix("strategy."): v for k, v in plan.options.items() if k.startswith("strategy.")}
        key = (plan.strategy, tuple(sorted(opts.items())))
        if getattr(self, "_strategy_key", None) != key:
            self._strategy = create_strategy(plan.strategy, **opts)
            self._strategy_key = key
        return self._strategy

    def _trained_modules(self, used_similar: bool) -> list[str]:
        out = []
        for n in self.modules.names(ModuleKind.SHARED):
            if n.startswith("feature_embedding/") and n.split("/", 1)[1] not in self.observed:
                continue  # Theorem 1: zero gradient; the hospital does not touch it
            if n.endswith("/similar_to") and not used_similar:
                continue
            out.append(n)
        return out

    def feature_relevance(self) -> dict[str, float]:
        """m_f for each observed feature (NS-FL Fig. 4): the site's learned feature relevance."""
        import torch

        node_ids = self.dictionary.node_ids()
        with torch.no_grad():
            m = self.model.feature_mask(torch.arange(len(node_ids))).numpy()
        return {nid: float(m[i]) for i, nid in enumerate(node_ids) if nid in self.observed}

    def local_metrics(self) -> dict[str, float]:
        """This hospital's own evaluation of the current model (stays local unless released)."""
        return dict(self._evaluate()) if self._evaluate is not None else {}
