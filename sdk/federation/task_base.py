"""What every task's hospital-side evaluation shares: splits, the selected model, calibration.

A task that keeps ``self.table``, ``self.split`` and ``self.config`` and implements
``_predict_raw()`` (uncalibrated risk for every patient) gets, from :class:`SplitEvaluation`,
``evaluate(split)``; from :class:`SelectedCalibrated` also ``predict()`` (calibrated once
:meth:`SelectedCalibrated.finish` ran) and ``finish()``: keep the model the federation selected
by validation loss (``self.selection``) and fit this hospital's Platt scaling on its
validation split. A task with a survival head sets ``survival_target``: survival metrics, no
Platt scaling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from clinograph.core.errors import ConfigError, IntegrityError

from ..training.calibration import Platt, fit_platt_cv, logit
from ..training.metrics import binary_metrics
from .task import TaskBase


class SplitEvaluation(TaskBase):
    """``evaluate(split)`` on this hospital's own validation or test patients (stays local)."""

    def predict(self) -> np.ndarray:  # pragma: no cover - implemented by every task
        raise NotImplementedError

    def evaluate(self, split: str) -> dict[str, float]:
        idx = {"test": self.split.test, "validation": self.split.validation}.get(split)  # type: ignore[attr-defined]
        if idx is None:
            raise ConfigError(f"Unknown split {split!r}; expected 'validation' or 'test'.")
        if len(idx) == 0:
            raise ConfigError(f"Hospital {self.table.site!r} has no {split} patients.")  # type: ignore[attr-defined]
        return binary_metrics(self.table.labels[idx], self.predict()[idx])  # type: ignore[attr-defined]


class SelectedCalibrated(SplitEvaluation):
    """The selected model and the hospital's calibration (module docstring)."""

    calibration: Platt | None = None
    #: a survival head's (interval ends, horizon) in days, set by the task; None: a binary label
    survival_target: tuple[np.ndarray, float] | None = None

    def _predict_raw(self) -> np.ndarray:  # pragma: no cover - implemented by every task
        raise NotImplementedError

    def evaluate(self, split: str) -> dict[str, float]:
        """As :class:`SplitEvaluation`; with a survival target the survival metrics at the horizon
        (C-index, horizon AUROC/AUPRC/Brier; ``auroc`` is the horizon AUROC)."""
        idx = {"test": self.split.test, "validation": self.split.validation}.get(split)  # type: ignore[attr-defined]
        if self.survival_target is None or idx is None or len(idx) == 0:
            return super().evaluate(split)  # the same errors
        from ..training.survival import survival_metrics

        sv = self.table.survival  # type: ignore[attr-defined]
        return survival_metrics(sv.time[idx], sv.event[idx], self.predict()[idx], horizon=self.survival_target[1])

    def predict(self) -> np.ndarray:
        """Risk for every patient of this hospital's table (calibrated once :meth:`finish` ran)."""
        p = self._predict_raw()
        return self.calibration.apply_to_probabilities(p) if self.calibration is not None else p

    def finish(self) -> dict[str, float | int | None]:
        """After the last round: keep the selected model (global + this hospital's personal
        modules) and fit this hospital's Platt scaling on its validation split (its pull towards
        the identity chosen by cross-validation there: ``fit_platt_cv``). Returns the kept round
        (None: no selection, the last model is kept) and the calibration."""
        kept = None
        selection = getattr(self, "selection", None)
        if selection is not None and selection.best_state is not None:
            self.model.load_state_dict(selection.best_state)  # type: ignore[attr-defined]
            kept = selection.best_round
        self.calibration = None
        idx = self.split.validation  # type: ignore[attr-defined]
        platt = self.config.calibration.method == "platt" and self.survival_target is None  # type: ignore[attr-defined]
        if platt and len(idx):  # a survival head is not Platt-scaled (its risk is a survival curve)
            self.calibration = fit_platt_cv(logit(self._predict_raw()[idx]), self.table.labels[idx])  # type: ignore[attr-defined]
        cal = self.calibration or Platt()
        return {"round": kept, "platt_a": cal.a, "platt_b": cal.b}

    def checkpoint(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The whole model (global and personal modules), the rounds completed and the selection's
        record (:meth:`ModelSelection.record`): what a restarted hospital takes back."""
        tensors = {f"model/{k}": v for k, v in self.model.state_dict().items()}  # type: ignore[attr-defined]
        origin = getattr(self, "global_origin", None)
        meta: dict[str, Any] = {"rounds_done": int(getattr(self, "_rounds_done", 0)), "selection": None,
                                "global_origin": None if origin is None else list(origin)}
        selection = getattr(self, "selection", None)
        if selection is not None:
            meta["selection"], kept = selection.record()
            tensors.update({f"selection/{k}": v for k, v in kept.items()})
        return meta, tensors

    def restore(self, meta: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
        """Take back :meth:`checkpoint` (same model settings: a changed architecture is refused)."""
        model = {k[6:]: v for k, v in tensors.items() if k.startswith("model/")}
        try:
            self.model.load_state_dict(model)  # type: ignore[attr-defined]
        except RuntimeError:
            raise IntegrityError("The hospital's restart checkpoint holds another model than its config builds; the "
                                 "state directory belongs to another model version.") from None
        if hasattr(self, "_rounds_done"):
            self._rounds_done = int(meta["rounds_done"])
        if hasattr(self, "global_origin") and meta.get("global_origin") is not None:
            self.global_origin = (str(meta["global_origin"][0]), int(meta["global_origin"][1]))
        selection = getattr(self, "selection", None)
        if selection is not None and meta.get("selection") is not None:
            selection.take_back(meta["selection"], {k[10:]: v for k, v in tensors.items()
                                                    if k.startswith("selection/")})
