"""A simulated federation in one process: N hospitals, R rounds, the real protocol in between.

Everything a deployment does happens here too -- signed plans, the secure-aggregation mode,
module-wise strategy, audit trail -- only the transport is a function call
(:func:`clinograph.secure.rounds.run_round`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.audit import AuditTrail
from clinograph.secure.identity import Identity
from clinograph.secure.messages import DPPolicy
from clinograph.secure.rounds import run_round
from clinograph.secure.server import FederationServer
from clinograph.secure.spec import ModuleKind
from clinograph.secure.strategies import create_strategy

from ..ingest.table import PatientTable
from ..model.nsfl import NSFLModel
from ..model.nsfl_modules import nsfl_modules
from ..ontology.dictionary import FeatureDictionary
from ..training.metrics import binary_metrics
from .client import HospitalClient
from .config import SimulationConfig
from .trainer import GraphTrainer


def stratified_split(labels: np.ndarray, *, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices with the class balance kept in both."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        k = int(round(len(idx) * test_fraction))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


@dataclass
class Hospital:
    """A simulated hospital: its table, split, client and evaluation."""

    site: str
    table: PatientTable
    train_idx: np.ndarray
    test_idx: np.ndarray
    client: HospitalClient
    trainer: object

    def evaluate(self) -> dict[str, float]:
        """AUROC/AUPRC on the held-out patients with the current (global + personal) model."""
        p = self.trainer.predict(self.client.model)  # type: ignore[attr-defined]
        return binary_metrics(self.table.labels[self.test_idx], p[self.test_idx])


@dataclass
class SimulationResult:
    """Per-round metrics per hospital, final metrics, stage timings, where the audit is."""

    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)
    final: dict[str, dict[str, float]] = field(default_factory=dict)
    timings: dict[str, list[float]] = field(default_factory=dict)
    dropped: list[dict[str, str]] = field(default_factory=list)
    audit_dir: Path | None = None
    epsilons: dict[str, list[float]] = field(default_factory=dict)


def mode_options(config: SimulationConfig, n: int, max_weight: float) -> dict[str, float | int | str | bool]:
    """Public parameters of the chosen secure mode for the round plan."""
    fed = config.federation
    if fed.secure_mode == "masked":
        from clinograph.secure.masking.params import masked_plan_options, neighbour_count

        k = neighbour_count(n)
        t = fed.masked_threshold or (k + 1) // 2 + 1
        return masked_plan_options(n_clients=n, threshold=t, clip=max_weight * fed.masked_clip, max_weight=max_weight)
    return {}


def build_federation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                     audit_dir: Path, trainer_factory: Callable[..., object] | None = None
                     ) -> tuple[FederationServer, dict[str, Hospital], AuditTrail]:
    """Identities, server, hospitals (with their graphs built) and the audit trail."""
    fed = config.federation
    torch.manual_seed(fed.seed)
    server_id = Identity.generate("server")
    ids = {t.site: Identity.generate(t.site) for t in tables}
    publics = {n: i.public for n, i in ids.items()}
    node_ids = dictionary.node_ids()
    hospitals: dict[str, Hospital] = {}
    for i, table in enumerate(tables):
        model = NSFLModel(len(node_ids), config.model)
        modules = nsfl_modules(model, node_ids)
        train_idx, test_idx = stratified_split(table.labels, test_fraction=config.test_fraction, seed=fed.seed + i)
        if trainer_factory is not None:
            trainer = trainer_factory(table=table, train_idx=train_idx, config=config, site=table.site)
        else:
            trainer = GraphTrainer(table, train_idx=train_idx, k_similar=config.graph.k_similar, config=config.training)
        hosp: Hospital
        client = HospitalClient(
            identity=ids[table.site], server=server_id.public, peers=publics, dictionary=dictionary, model=model,
            modules=modules, trainer=trainer, num_samples=len(train_idx), observed_nodes=table.observed_nodes(),
            release_metrics=config.privacy.release_metrics or not config.privacy.enabled,
            publish_feature_relevance=config.publish_feature_relevance,
        )
        hosp = Hospital(table.site, table, train_idx, test_idx, client, trainer)
        client._evaluate = hosp.evaluate
        hospitals[table.site] = hosp
    mode_server = None
    if fed.secure_mode == "ckks":
        mode_server, ckks_options = _ckks_ceremony(fed.id, ids, hospitals)
    first = next(iter(hospitals.values())).client
    spec = first.modules.spec(version=0)
    initial = first.modules.state(ModuleKind.SHARED)
    audit = AuditTrail(audit_dir, identity=server_id)
    dp_policy = None
    if config.privacy.enabled:
        dp_policy = DPPolicy(required=True, max_epsilon=config.privacy.epsilon_budget, delta=config.privacy.delta,
                             min_noise_multiplier=0.3, max_clip_norm=config.privacy.clip_norm)
    strategy_opts = {"server_lr": fed.server_lr} if fed.strategy == "fedsgd" else {}
    strategy = create_strategy(fed.strategy, **strategy_opts)
    # Weights fixed by the strategy sum to 1; otherwise a hospital weighs by its sample count.
    max_weight = 1.0 if strategy.normalised_weights else float(max(len(h.train_idx) for h in hospitals.values()))
    server = FederationServer(
        federation_id=fed.id, spec=spec, initial_state=initial, dictionary_hash=dictionary.digest(),
        identity=server_id, enrolled=publics, secure_mode=fed.secure_mode,
        strategy=strategy, min_clients=min(fed.min_clients, len(tables)),
        local_epochs=fed.local_epochs, dp_policy=dp_policy, audit=audit, environment=fed.environment,
        mode_options=mode_options(config, len(tables), max_weight) if mode_server is None else ckks_options,
        mode_server=mode_server,
    )
    return server, hospitals, audit


def _ckks_ceremony(federation_id: str, ids: dict[str, Identity], hospitals: dict[str, Hospital]):
    """The CKKS key ceremony: the first hospital generates the key and wraps it for the others;
    the server gets a context without any secret key."""
    from clinograph.secure.ckks import CkksClient, CkksPreset, CkksServer, ckks_plan_options
    from clinograph.secure.ckks.ceremony import in_process_ceremony

    cer = in_process_ceremony(identities=ids, dealer=sorted(ids)[0], federation_id=federation_id,
                              preset=CkksPreset.ADD_ONLY_128)
    for n, h in hospitals.items():
        h.client.mode_clients["ckks"] = CkksClient.with_keyring(cer.keyrings[n])
    return CkksServer.with_context(cer.context), ckks_plan_options(cer.context)


def run_simulation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                   audit_dir: Path, on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
                   trainer_factory: Callable[..., object] | None = None,
                   drop_at: dict[int, dict[str, int]] | None = None) -> SimulationResult:
    """Run ``config.federation.rounds`` rounds; evaluate every hospital after each."""
    server, hospitals, audit = build_federation(tables, dictionary, config, audit_dir=audit_dir,
                                                trainer_factory=trainer_factory)
    result = SimulationResult(audit_dir=audit_dir)
    participants = tuple(sorted(hospitals))
    clients = {n: h.client for n, h in hospitals.items()}
    try:
        for r in range(config.federation.rounds):
            t0 = time.perf_counter()
            outcome = run_round(server, {n: _Timed(c) for n, c in clients.items()}, participants=participants,
                                drop_at=(drop_at or {}).get(r))
            train_time = sum(_Timed.last.pop(n, 0.0) for n in clients)
            total = time.perf_counter() - t0
            result.timings.setdefault("round_seconds", []).append(total)
            result.timings.setdefault("local_training_seconds", []).append(train_time)
            result.timings.setdefault("protocol_and_aggregation_seconds", []).append(total - train_time)
            result.dropped.append(outcome.dropped)
            for n, h in hospitals.items():
                if h.client.last_ledger is not None and n not in outcome.dropped:
                    result.epsilons.setdefault(n, []).append(h.client.last_ledger.epsilon)
            metrics = {n: h.evaluate() for n, h in hospitals.items()}
            result.rounds.append(metrics)
            if on_round is not None:
                on_round(r, metrics)
        result.final = result.rounds[-1] if result.rounds else {}
    finally:
        audit.close()
    return result


class _Timed:
    """Wraps a hospital to time its plan handling (local training + encoding)."""

    last: dict[str, float] = {}

    def __init__(self, client: HospitalClient):
        self._c = client
        self.name = client.name

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        t = time.perf_counter()
        try:
            return self._c.on_plan(plan)
        finally:
            _Timed.last[self.name] = _Timed.last.get(self.name, 0.0) + time.perf_counter() - t

    def __getattr__(self, item: str):
        return getattr(self._c, item)
