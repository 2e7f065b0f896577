"""How a hospital trains in a round: the non-DP trainer (full graph, with ``similar_to``).

A trainer is anything with ``train(model, *, round_, epochs, plan_options) -> TrainOutcome``;
the DP trainer (:mod:`clinograph.sdk.privacy`) is the other one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from clinograph.secure.messages import LedgerEntry

from ..graph.star import star_batch
from ..ingest.table import PatientTable
from ..model.nsfl import NSFLModel
from .local import TrainConfig, predict, train_epochs


@dataclass(frozen=True)
class TrainOutcome:
    """What a round of local training produced besides the weights."""

    loss: float
    used_similar_to: bool
    ledger: LedgerEntry | None = None
    extras: dict[str, float] = field(default_factory=dict)


class Trainer(Protocol):
    """Local training step of a round."""

    def train(self, model: NSFLModel, *, round_: int, epochs: int,
              plan_options: dict[str, float | int | str | bool]) -> TrainOutcome: ...

    def predict(self, model: NSFLModel) -> np.ndarray: ...


class GraphTrainer:
    """Non-DP: minibatches of patients on the hospital's graph, each computed exactly from its
    star and its ``similar_to`` neighbours (``k_similar = 0``: stars only)."""

    def __init__(self, table: PatientTable, *, train_idx: np.ndarray, k_similar: int, config: TrainConfig):
        self.table = table
        self.train_idx = np.asarray(train_idx)
        self.k_similar = k_similar
        self.config = config
        self.stars = star_batch(table, k_similar=k_similar)

    def train(self, model: NSFLModel, *, round_: int, epochs: int,
              plan_options: dict[str, float | int | str | bool]) -> TrainOutcome:
        mu = float(plan_options.get("fedprox.mu", 0.0))
        prox = None
        if mu > 0:
            prox = (mu, {k: v.detach().clone() for k, v in model.named_parameters()})
        loss = train_epochs(model, epochs=epochs, train_idx=self.train_idx, config=self.config,
                            stars=self.stars, round_=round_, proximal=prox)
        return TrainOutcome(loss=loss, used_similar_to=self.stars.has_neighbours)

    def predict(self, model: NSFLModel) -> np.ndarray:
        return predict(model, self.stars)
