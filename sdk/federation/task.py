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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from clinograph.core.errors import ConfigError

from ..model.modules import ModuleMap
from ..training.trainer import TrainOutcome

if TYPE_CHECKING:
    from ..ingest.table import PatientTable
    from ..training.selection import ModelSelection


class Task(Protocol):
    """One hospital's learning task (see the module docstring). :class:`TaskBase` gives every
    member a run uses but a task may not need its default."""

    #: the task's registered name (``"nsfl"``, ``"concepts"``); travels in the initial model file
    name: str
    modules: ModuleMap
    #: the federation's model selection as this hospital decodes it (None: this task does not select)
    selection: ModelSelection | None
    #: set by the client for the run's evaluation-only round (``run.phase = "score"``): score, train nothing
    evaluate_only: bool
    #: whether :meth:`export_kept` can write this task's model for ``clinograph predict``
    exportable: bool

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

    def finish(self) -> dict[str, float | int | None]:
        """After the run's last round (``run/finish``): keep the selected model, fit the
        calibration; returns at least ``{"round": kept round or None}``."""

    def export_kept(self, path: str | Path) -> object:
        """Write the model this hospital would keep if the run ended now (``exportable`` tasks)."""

    def checkpoint(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """What a restarted hospital needs beyond the global model it keeps (its personal layers,
        the rounds it completed, its record of the selection): ``(meta, tensors)``; None: nothing."""

    def restore(self, meta: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
        """Take back a :meth:`checkpoint` after a restart."""

    def predict_table(self, table: PatientTable) -> np.ndarray:
        """Risk for new patients of this hospital (nothing leaves it)."""


class TaskBase:
    """The defaults of :class:`Task`'s optional members: no selection, no export, no scoring of
    new patients, nothing after a round, and ``finish`` keeps the last model."""

    selection: ModelSelection | None = None
    evaluate_only: bool = False
    exportable: bool = False

    def after_round(self) -> None:
        return None

    def finish(self) -> dict[str, float | int | None]:
        return {"round": None}

    def export_kept(self, path: str | Path) -> object:
        raise ConfigError(f"Task {getattr(self, 'name', '?')!r} cannot export its model (exportable is false).")

    def predict_table(self, table: PatientTable) -> np.ndarray:
        raise ConfigError(f"Task {getattr(self, 'name', '?')!r} cannot score new patients (no predict_table); "
                          "use task = 'nsfl'.")

    def quality(self) -> dict[str, float]:
        raise ConfigError(f"Task {getattr(self, 'name', '?')!r} has no quality metrics; use [release] metrics = "
                          "'none' or 'validation'.")

    def feature_relevance(self) -> dict[str, float]:
        return {}

    def checkpoint(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        return None

    def restore(self, meta: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
        raise ConfigError(f"Task {getattr(self, 'name', '?')!r} keeps no checkpoint to restore.")
