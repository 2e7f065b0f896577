"""What an NS-FL hospital does with the model it keeps: risk (or survival curves) for new
patients and the signed export that ``clinograph predict`` loads.

A mixin of :class:`~.nsfl_task.NSFLTask` (split out of it: the rounds live there, the use of
their result here). It reads the task's ``model``, ``table``, ``config``, ``calibration``,
``selection``, ``global_origin`` and ``survival_target`` and calls its ``finish()``
(:class:`~.task_base.SelectedCalibrated`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

from ..ingest.table import PatientTable
from .task_base import SelectedCalibrated

if TYPE_CHECKING:
    from ..config import HospitalConfig
    from ..model.nsfl import NSFLModel
    from ..training.selection import ModelSelection


class NSFLPrediction(SelectedCalibrated):
    """Prediction for new patients and export of the kept model (module docstring)."""

    model: NSFLModel
    table: PatientTable
    config: HospitalConfig
    selection: ModelSelection | None
    global_origin: tuple[str, int] | None

    # -- survival target ([target] kind = "survival"; sdk/training/survival.py) ---------------
    # evaluate() and finish(): .task_base.SelectedCalibrated (survival metrics, no Platt scaling)

    @torch.no_grad()
    def predict_survival_table(self, table: PatientTable) -> np.ndarray:
        """Survival curves S(b_k) of new patients (survival target only), star path, personal layers.
        Shapes: -> [table.n_patients, K], columns at ``[target] breaks``.

        Raises:
            ConfigError: the task predicts a binary label.
            SchemaError: ``table`` is mapped onto another dictionary than the model's.
        """
        from ..training.survival import survival_curves

        if self.survival_target is None:
            raise ConfigError("predict_survival_table needs [target] kind = 'survival'; use predict_table.")
        return survival_curves(self._hazard_logits_table(table))

    @torch.no_grad()
    def _hazard_logits_table(self, table: PatientTable) -> np.ndarray:
        from ..model.export import _check_dictionary, star_inputs

        _check_dictionary(table, self.table.dictionary.digest())
        self.model.eval()
        return self.model.forward_star(*star_inputs(table)).double().numpy()

    def predict_table(self, table: PatientTable) -> np.ndarray:
        """Risk for each patient of ``table`` -- new patients of this hospital, ingested with
        its schema onto the same dictionary -- from the star path (no ``similar_to``: new
        patients are not in the training graph), with the personal layers and the hospital's
        calibration. Shapes: -> [table.n_patients], in ``table.patient_ids`` order.

        Raises:
            SchemaError: ``table`` is mapped onto another dictionary than the model's.
        """
        from ..model.export import star_risk
        from .coverage import restrict

        table = restrict(table, self.config.model.features)  # the features the model reads ([model] features)
        if self.survival_target is not None:  # risk 1 − S(t) at the horizon
            from ..training.survival import risk_at

            return risk_at(self._hazard_logits_table(table), *self.survival_target)
        if self.config.model.temporal != "none":  # each new patient's sequence of snapshot stars
            from ..model.temporal import sequence_risk

            return sequence_risk(self.model, table, dictionary=self.table.dictionary, calibration=self.calibration)
        return star_risk(self.model, table, dictionary=self.table.dictionary, calibration=self.calibration)

    def export(self, path: str | Path, *, signer: Identity, horizons: list[float] | None = None,
               torchscript: bool = False) -> tuple[Path, Path]:
        """Write this hospital's model (global + personal, calibrated): the star path's weights as
        safetensors and a description (architecture, dictionary hash, features, kept round, the
        weights' SHA-256) signed by ``signer``, the hospital's identity; see
        :func:`clinograph.sdk.model.export.export_model`. A survival model exports hazards,
        S(b_k) and the risk at ``horizons`` (``[target] time_unit``; default every break and
        the configured horizon): :func:`clinograph.sdk.model.export.export_survival_model`.
        ``torchscript``: also an unsigned TorchScript file for other runtimes (never loaded here).

        Raises:
            ConfigError: a temporal model (scored through :meth:`predict_table` only)."""
        from ..model.export import export_model

        if self.survival_target is not None:
            from ..model.export import export_survival_model

            tgt = self.config.target
            hs = sorted({*tgt.breaks, float(tgt.horizon or tgt.breaks[-1])}) if horizons is None else list(horizons)
            kept = self.selection.best_round if self.selection is not None else None
            return export_survival_model(self.model, path, dictionary=self.table.dictionary, signer=signer,
                                         breaks=list(tgt.breaks), horizons=hs, time_unit=tgt.time_unit,
                                         features=self.config.model.features, torchscript=torchscript,
                                         meta={"site": self.table.site, "selected_round": kept,
                                               "horizon": float(tgt.horizon or tgt.breaks[-1]),
                                               "release": self._release()})
        if self.config.model.temporal != "none":
            raise ConfigError("Model export writes the star path (one snapshot); a temporal model ([model] temporal) "
                              "is used through predict_table for now.")
        kept = self.selection.best_round if self.selection is not None else None
        return export_model(self.model, path, dictionary=self.table.dictionary, calibration=self.calibration,
                            signer=signer, meta={"site": self.table.site, "selected_round": kept,
                                                 "release": self._release()},
                            features=self.config.model.features, torchscript=torchscript)

    def _release(self) -> dict | None:
        """The description's ``release`` (:class:`~clinograph.sdk.model.description.ReleaseBinding`):
        the federation round whose global model the kept shared modules hold, and the personal ones."""
        tag = self.selection.best_tag if self.selection is not None else self.global_origin
        if tag is None:
            return None
        return {"federation_id": tag[0], "round": int(tag[1]), "personal_modules": list(self.config.personal.modules)}

    @property
    def exportable(self) -> bool:
        """Whether :meth:`export` can write this model (a temporal or modality model is scored in the SDK)."""
        return self.config.model.temporal == "none" and not self.config.model.modalities

    def export_kept(self, path: str | Path, *, signer: Identity) -> tuple[Path, Path] | None:
        """Export the model this hospital would keep if the run ended now -- :meth:`finish`'s
        choice: the round selected on validation so far, calibrated on validation -- signed by
        ``signer``, and put the training state back, so the next round trains on exactly what it
        would have. What a deployed hospital writes after every round
        (:class:`~.client.HospitalClient`); returns None without writing when the kept round has
        not changed since the last export to ``path`` (the file already holds it)."""
        kept = self.selection.best_round if self.selection is not None else None
        key = (str(path), kept)
        if kept is not None and key == getattr(self, "_exported", None) and Path(path).exists():
            return None
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        calibration = self.calibration
        try:
            self.finish()
            written = self.export(path, signer=signer)
            self._exported = key
            return written
        finally:
            self.model.load_state_dict(state)
            self.calibration = calibration
