"""A simulated PFGL-Net federation: quality-released metrics, personal layers, local fine-tuning.

The same protocol as :mod:`clinograph.sdk.federation.simulation` (signed plans, the chosen
secure mode, the audit trail); what differs is how hospitals are built: the declared
personal modules, a validation split carved from each hospital's training patients for the
quality metrics (:mod:`clinograph.sdk.quality`), the fine-tuning ``after_round`` hook
(:mod:`clinograph.sdk.personalization`) and strategy options (μ, β1, β2, ...).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from clinograph.secure.audit import AuditTrail
from clinograph.secure.errors import ConfigError
from clinograph.secure.identity import Identity
from clinograph.secure.rounds import run_round
from clinograph.secure.server import FederationServer
from clinograph.secure.spec import ModuleKind
from clinograph.secure.strategies import Strategy, create_strategy
from pydantic import BaseModel, ConfigDict, Field

from ..ingest.table import PatientTable
from ..model.nsfl import NSFLModel
from ..ontology.dictionary import FeatureDictionary
from ..personalization import DEFAULT_PERSONAL, personal_fine_tuner, personal_module_map
from ..quality import f1_positive, micro_f1, quality_evaluator
from ..training.metrics import binary_metrics
from .client import HospitalClient
from .config import SimulationConfig
from .simulation import Hospital, mode_options, stratified_split
from .trainer import GraphTrainer


class PFGLSection(BaseModel):
    """[pfgl]: the PFGL-Net parts of a run (defaults documented in docs/strategies.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy_options: dict[str, float | int | str | bool] = Field(default_factory=dict)
    personal: tuple[str, ...] = DEFAULT_PERSONAL
    fine_tune_epochs: int = Field(default=1, ge=0, le=100)
    validation_fraction: float = Field(default=0.2, gt=0, lt=1)
    quality_metric: Literal["f1", "micro_f1", "auroc"] = "f1"
    release_quality: bool = True


def score_test_split(hosp: Hospital, *, threshold: float = 0.5) -> dict[str, float]:
    """AUROC/AUPRC plus Micro-F1 (= accuracy) and positive-class F1 on the hospital's test split."""
    p = hosp.trainer.predict(hosp.client.model)  # type: ignore[attr-defined]
    y = hosp.table.labels[hosp.test_idx]
    out = binary_metrics(y, p[hosp.test_idx])
    out["micro_f1"] = micro_f1(y, p[hosp.test_idx], threshold=threshold)
    out["f1"] = f1_positive(y, p[hosp.test_idx], threshold=threshold)
    return out


def pooled_test_metrics(hospitals: dict[str, Hospital], *, threshold: float = 0.5) -> dict[str, float]:
    """Every hospital's test predictions (each with its own model) pooled, as PFGL-Net §4.1.4
    aggregates the clients' confusion matrices: Micro-F1, positive-class F1, AUROC, AUPRC."""
    ys, ps = [], []
    for h in hospitals.values():
        ys.append(h.table.labels[h.test_idx])
        ps.append(h.trainer.predict(h.client.model)[h.test_idx])  # type: ignore[attr-defined]
    y, p = np.concatenate(ys), np.concatenate(ps)
    out = binary_metrics(y, p)
    out["micro_f1"] = micro_f1(y, p, threshold=threshold)
    out["f1"] = f1_positive(y, p, threshold=threshold)
    return out


@dataclass
class PFGLFederation:
    """What :func:`build_pfgl_federation` builds; ``released`` holds each hospital's last released metrics."""

    server: FederationServer
    hospitals: dict[str, Hospital]
    audit: AuditTrail
    released: dict[str, dict[str, float]]


def _recording(site: str, evaluate: Callable[[], dict[str, float]],
               log: dict[str, dict[str, float]]) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        log[site] = evaluate()
        return log[site]

    return run


def build_pfgl_federation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig,
                          pfgl: PFGLSection, *, audit_dir: Path) -> PFGLFederation:
    """Identities, server (strategy ``config.federation.strategy`` with ``pfgl.strategy_options``),
    hospitals with personal modules, quality metrics and fine-tuning, and the audit trail."""
    fed = config.federation
    if config.privacy.enabled:
        raise ConfigError("The PFGL simulation trains without DP (its fine-tuning step has no accountant). "
                          "Set [privacy] enabled = false, or use run_simulation for DP runs.")
    strategy = create_strategy(fed.strategy, **pfgl.strategy_options)
    torch.manual_seed(fed.seed)
    server_id = Identity.generate("server")
    ids = {t.site: Identity.generate(t.site) for t in tables}
    publics = {n: i.public for n, i in ids.items()}
    node_ids = dictionary.node_ids()
    hospitals: dict[str, Hospital] = {}
    released: dict[str, dict[str, float]] = {}
    for i, table in enumerate(tables):
        model = NSFLModel(len(node_ids), config.model)
        modules = personal_module_map(model, node_ids, personal=pfgl.personal)
        train_idx, test_idx = stratified_split(table.labels, test_fraction=config.test_fraction, seed=fed.seed + i)
        fit_pos, val_pos = stratified_split(table.labels[train_idx], test_fraction=pfgl.validation_fraction,
                                            seed=fed.seed + 1000 + i)
        fit_idx, val_idx = train_idx[fit_pos], train_idx[val_pos]
        trainer = GraphTrainer(table, train_idx=fit_idx, k_similar=config.graph.k_similar, config=config.training)
        evaluate = quality_evaluator(model=model, table=table, val_idx=val_idx, metric=pfgl.quality_metric,
                                     predict=lambda t=trainer, m=model: t.predict(m))
        client = HospitalClient(
            identity=ids[table.site], server=server_id.public, peers=publics, dictionary=dictionary, model=model,
            modules=modules, trainer=trainer, num_samples=len(fit_idx), observed_nodes=table.observed_nodes(),
            release_metrics=pfgl.release_quality, publish_feature_relevance=config.publish_feature_relevance,
            evaluate=_recording(table.site, evaluate, released),
            after_round=personal_fine_tuner(stars=trainer.stars, train_idx=fit_idx, epochs=pfgl.fine_tune_epochs,
                                            config=config.training),
        )
        hospitals[table.site] = Hospital(table.site, table, fit_idx, test_idx, client, trainer)
    first = next(iter(hospitals.values())).client
    spec = first.modules.spec(version=0)
    audit = AuditTrail(audit_dir, identity=server_id)
    # Strategies that fix weights in the plan (DQ: normalised, <= 1) get a tight fixed-point
    # bound in masked mode; the others weight by sample count.
    uses_counts = type(strategy).client_weights is Strategy.client_weights
    max_weight = float(max(len(h.train_idx) for h in hospitals.values())) if uses_counts else 1.0
    server = FederationServer(
        federation_id=fed.id, spec=spec, initial_state=first.modules.state(ModuleKind.SHARED),
        dictionary_hash=dictionary.digest(), identity=server_id, enrolled=publics, secure_mode=fed.secure_mode,
        strategy=strategy, min_clients=min(fed.min_clients, len(tables)), local_epochs=fed.local_epochs,
        dp_policy=None, audit=audit, environment=fed.environment,
        mode_options=mode_options(config, len(tables), max_weight),
    )
    return PFGLFederation(server, hospitals, audit, released)


@dataclass
class PFGLResult:
    """Per-round test metrics per hospital, the weights each round's plan fixed, timings."""

    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)
    pooled: list[dict[str, float]] = field(default_factory=list)
    weights: list[dict[str, float]] = field(default_factory=list)
    released: list[dict[str, dict[str, float]]] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)


def run_pfgl(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig,
             pfgl: PFGLSection, *, audit_dir: Path,
             on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None) -> PFGLResult:
    """Run ``config.federation.rounds`` rounds; after each, score every hospital's test split
    with its current model (global shared modules + its personal modules)."""
    fed = build_pfgl_federation(tables, dictionary, config, pfgl, audit_dir=audit_dir)
    server, hospitals, audit = fed.server, fed.hospitals, fed.audit
    participants = tuple(sorted(hospitals))
    clients = {n: h.client for n, h in hospitals.items()}
    result = PFGLResult()
    try:
        for r in range(config.federation.rounds):
            t0 = time.perf_counter()
            outcome = run_round(server, clients, participants=participants)
            result.round_seconds.append(time.perf_counter() - t0)
            plan = clients[participants[0]]._plan  # the signed plan every participant verified
            opts = plan.options if plan is not None else {}
            result.weights.append({k.split("/", 1)[1]: float(v) for k, v in opts.items() if k.startswith("weight/")})
            result.released.append({n: dict(fed.released.get(n, {})) for n in participants})
            result.dropped.append(outcome.dropped)
            metrics = {n: score_test_split(h) for n, h in hospitals.items()}
            result.rounds.append(metrics)
            result.pooled.append(pooled_test_metrics(hospitals))
            if on_round is not None:
                on_round(r, metrics)
    finally:
        audit.close()
    return result
