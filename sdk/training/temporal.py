"""Local training over snapshot sequences: the trainers' stars become each patient's sequence.

Both trainers take their examples from ``trainer.stars``; the DP trainer also from
``trainer.dataset`` (one row a patient). Replacing them with a
:class:`~clinograph.sdk.graph.temporal.SnapshotBatch` makes a patient's whole sequence one
example: one minibatch row without DP, one per-patient row of the DP engine -- so per-patient clipping
clips the gradient of the whole sequence (tests/sdk/model/test_temporal.py checks it against a
per-patient loop) and the accountant's unit is the patient, as in the static model.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..config import NSFLConfig
from ..graph.temporal import snapshot_batch
from ..ingest.table import PatientTable


def use_snapshots(trainer, table: PatientTable, *, train_idx: np.ndarray, config: NSFLConfig):
    """Point ``trainer`` (GraphTrainer or DPTrainer) at the patients' snapshot sequences."""
    batch = snapshot_batch(table, window=config.temporal_window, carry_forward=config.temporal_carry_forward)
    trainer.stars = batch
    if hasattr(trainer, "dataset"):  # the DP trainer: one DP example = one patient's sequence
        idx = torch.as_tensor(np.asarray(train_idx), dtype=torch.long)
        trainer.dataset = TensorDataset(batch.feature_index[idx], batch.values[idx], batch.mask[idx],
                                        batch.labels[idx])
    return trainer
