"""NS-FL as a task: the relation-aware attention GNN over one hospital's knowledge graph.

Personal layers, local fine-tuning (PFGL-Net Alg. 2), patient-level DP (Opacus) and the DQ
quality metrics are configuration of this one task (:class:`~clinograph.sdk.config.HospitalConfig`),
not separate loops.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.errors import ConfigError
from clinograph.secure.spec import ModuleKind

from ..config import HospitalConfig
from ..ingest.table import PatientTable
from ..model.nsfl import NSFLModel
from ..ontology.dictionary import FeatureDictionary
from ..training.metrics import binary_metrics
from ..training.personal import fine_tune_personal, personal_module_map
from ..training.quality import quality_evaluator
from ..training.trainer import GraphTrainer, TrainOutcome
from .split import Split


class NSFLTask:
    """NS-FL at one hospital (implements :class:`~clinograph.sdk.federation.task.Task`)."""

    name = "nsfl"

    def __init__(self, table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                 state_dir: Path | None = None):
        if config.privacy.enabled and config.personal.fine_tune_epochs:
            raise ConfigError("[personal] fine_tune_epochs > 0 with [privacy] enabled: fine-tuning would train on "
                              "patients outside the DP accountant. Set fine_tune_epochs = 0 under DP.")
        self.table, self.config, self.split = table, config, split
        node_ids = dictionary.node_ids()
        torch.manual_seed(config.model.init_seed)  # identical initial weights at every hospital
        self.model = NSFLModel(len(node_ids), config.model)
        self.modules = personal_module_map(self.model, node_ids, personal=config.personal.modules)
        self._node_ids = node_ids
        self.observed = {node_ids[i] for i in np.asarray(table.observed_nodes())}
        if config.privacy.enabled:
            from ..privacy import dp_trainer_factory

            if state_dir is None and config.privacy.state_dir is None:
                raise ConfigError(f"Hospital {table.site!r} trains with DP but has no state directory for its privacy "
                                  "ledger: set [privacy] state_dir (or pass state_dir).")
            root = Path(config.privacy.state_dir) / table.site if config.privacy.state_dir else Path(state_dir)  # type: ignore[arg-type]
            self.trainer = dp_trainer_factory(table=table, train_idx=split.train, config=config, site=table.site,
                                              state_dir=root)
        else:
            self.trainer = GraphTrainer(table, train_idx=split.train, k_similar=config.graph.k_similar,
                                        config=config.training)
        self._rounds_done = 0
        self._quality = None
        if config.release.metrics == "quality":
            if len(split.validation) == 0:
                raise ConfigError("[release] metrics = 'quality' needs a validation split: set [split] "
                                  "validation_fraction > 0.")
            self._quality = quality_evaluator(model=self.model, table=table, val_idx=split.validation,
                                              metric=config.release.quality_metric, predict=self.predict)

    def __repr__(self) -> str:
        return f"NSFLTask(site={self.table.site!r}, {self.split!r})"

    @property
    def num_samples(self) -> int:
        return int(len(self.split.train))

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        return self.trainer.train(self.model, round_=round_, epochs=epochs, plan_options=dict(plan_options))

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        out = []
        for n in self.modules.names(ModuleKind.SHARED):
            if n.startswith("feature_embedding/") and n.split("/", 1)[1] not in self.observed:
                continue  # NS-FL Theorem 1: zero gradient; the hospital does not touch it
            if n.endswith("/similar_to") and not outcome.used_similar_to:
                continue
            out.append(n)
        return out

    def after_round(self) -> None:
        epochs = self.config.personal.fine_tune_epochs
        if epochs and self.modules.names(ModuleKind.PERSONAL):
            fine_tune_personal(self.model, self.modules, stars=self.trainer.stars, train_idx=self.split.train,
                               epochs=epochs, config=self.config.training, round_=self._rounds_done)
        self._rounds_done += 1

    def predict(self) -> np.ndarray:
        return self.trainer.predict(self.model)

    def evaluate(self, split: str) -> dict[str, float]:
        idx = {"test": self.split.test, "validation": self.split.validation}.get(split)
        if idx is None:
            raise ConfigError(f"Unknown split {split!r}; expected 'validation' or 'test'.")
        if len(idx) == 0:
            raise ConfigError(f"Hospital {self.table.site!r} has no {split} patients.")
        return binary_metrics(self.table.labels[idx], self.predict()[idx])

    def quality(self) -> dict[str, float]:
        if self._quality is None:
            raise ConfigError("Quality metrics need [release] metrics = 'quality'.")
        return self._quality()

    def feature_relevance(self) -> dict[str, float]:
        with torch.no_grad():
            m = self.model.feature_mask(torch.arange(len(self._node_ids))).numpy()
        return {nid: float(m[i]) for i, nid in enumerate(self._node_ids) if nid in self.observed}
