"""Patient-level DP for the modality model (``[model] modalities``; :mod:`clinograph.sdk.model.modalities`).

A patient's row is its star plus, per modality, its signal and whether it has it; the logit
reads only that row (the waveform encoder's convolutions and pooling run along one patient's
signal), so the BCE is a sum of per-patient terms and one patient is one DP-SGD example, as for
the static star model. The encoder's leaves are ``nn.Conv1d`` and ``nn.Linear``, both with part
rules in the one per-patient engine (:mod:`.part_rules`); this module only supplies the
objective, a synthetic probe with signals (no patient data) and the rows:

- :func:`modal_objective`: Σ_i BCE_i of :meth:`ModalityNSFL.forward_modal` over the row
  (feature index, values, mask, signal_1..k, has_1..k);
- :func:`modal_probe`: the star probe plus a ramp signal per modality, present for every other
  synthetic patient, so the construction check covers the encoders and the modality relations;
- :class:`ModalDPTrainer` (local DP): the DP trainer with those rows; sampling, clipping, noise
  and accounting are :class:`~.trainer.DPTrainer`'s, unchanged.

A hospital without a modality has δ_m = 0 for every patient: its patients' gradients of that
modality's modules are exactly zero (their clip and sensitivity are unaffected).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import TensorDataset

from ..model.modalities import ModalityNSFL, ModalStarBatch
from .per_patient import PerPatientClipper, star_loss_sum
from .trainer import DPTrainer

#: the synthetic probe's signal length (any length the encoder accepts)
PROBE_LENGTH = 16


def modal_objective(model: ModalityNSFL, inputs: Sequence[Any], labels: torch.Tensor) -> torch.Tensor:
    """Σ_i BCE_i with ``inputs`` = (feature index, values, mask, signal_1..k, has_1..k)."""
    k = len(model.modalities)
    fi, x, m = inputs[:3]
    logits = model.forward_modal(fi, x, m, list(inputs[3:3 + k]), list(inputs[3 + k:3 + 2 * k]))
    return star_loss_sum(logits, labels.to(logits.dtype))


def modal_probe(model: ModalityNSFL, star: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The synthetic star probe ``star`` with a signal and a flag per modality (no patient data)."""
    b = int(star[0].shape[0])
    ramp = torch.linspace(-1.0, 1.0, PROBE_LENGTH) * torch.arange(1, b + 1, dtype=torch.float32).unsqueeze(1) / b
    signal = (ramp + torch.sin(torch.arange(PROBE_LENGTH, dtype=torch.float32))).to(star[1].dtype)
    has = torch.arange(b) % 2 == 0
    k = len(model.modalities)
    return (*star, *([signal] * k), *([has] * k))


def modal_engine(model: ModalityNSFL, *, probe: Sequence[torch.Tensor]) -> PerPatientClipper:
    """The per-patient engine on :func:`modal_objective`, self-checked on :func:`modal_probe`."""
    return PerPatientClipper(model, objective=modal_objective, probe=modal_probe(model, probe))


def modal_rows(stars: ModalStarBatch, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows of patients ``idx``: (feature index, values, mask, signal_1..k, has_1..k)."""
    return (stars.feature_index[idx], stars.values[idx], stars.mask[idx], *(s[idx] for s in stars.signals),
            *(h[idx] for h in stars.has))


class ModalDPTrainer(DPTrainer):
    """:class:`~.trainer.DPTrainer` on the modality model (module docstring). Same guarantee:
    (ε, δ)-DP with respect to adding or removing one patient's star and signals at this hospital.

    Args: as :class:`DPTrainer`, plus ``stars``: every patient's :class:`ModalStarBatch`."""

    def __init__(self, table, *, stars: ModalStarBatch, **kwargs):  # noqa: ANN001 - a PatientTable
        super().__init__(table, **kwargs)
        self.stars = stars
        idx = torch.as_tensor(self.train_idx, dtype=torch.long)
        self.dataset = TensorDataset(*modal_rows(stars, idx), stars.labels[idx])

    def _engine(self, model, probe) -> PerPatientClipper:  # noqa: ANN001
        return modal_engine(model, probe=probe)
