"""What a hospital trains: the task interface the one :class:`HospitalClient` runs.

A task owns a model and its named modules (:class:`~clinograph.sdk.model.modules.ModuleMap`,
shared and personal), trains it locally for a round, says which shared modules that round
touched, and evaluates it on the hospital's own splits. Everything protocol-related -- plans,
secure modes, signatures, release policy -- is the client's, never the task's, so every task
runs under every secure mode and transport.

Implementations: :class:`~clinograph.sdk.federation.nsfl_task.NSFLTask` (NS-FL, with personal
layers, fine-tuning and DP as configuration) and
:class:`~clinograph.sdk.concepts.task.ConceptTask` (CBM, CEM, CGM, C2BM over any encoder).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from ..model.modules import ModuleMap
from ..training.trainer import TrainOutcome


class Task(Protocol):
    """One hospital's learning task (see the module docstring)."""

    #: the task's registered name (``"nsfl"``, ``"concepts"``); travels in the initial model file
    name: str
    modules: ModuleMap

    @property
    def num_samples(self) -> int:
        """Training examples this round would use (the aggregation weight before the plan's cap)."""

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        """Train locally from the current (loaded) global state; the model is updated in place."""

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        """The shared modules this round's training touched (the others are not sent)."""

    def after_round(self) -> None:
        """Called once the new global state is loaded (e.g. fine-tune personal modules)."""

    def evaluate(self, split: str) -> dict[str, float]:
        """Metrics on this hospital's ``"validation"`` or ``"test"`` patients (stay local)."""

    def quality(self) -> dict[str, float]:
        """The data-quality metrics a DQ-weighted federation asks for (PFGL-Net eqs. 9-11)."""

    def feature_relevance(self) -> dict[str, float]:
        """Per observed feature, the learned relevance (NS-FL Fig. 4)."""

    def predict(self) -> np.ndarray:
        """Risk for every patient of this hospital's table."""
