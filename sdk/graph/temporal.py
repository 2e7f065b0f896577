"""Per-snapshot stars: a patient's sequence of symbolic graphs (NS-FL "Extension to Time-Series Data").

"Treating each time step as a separate snapshot yields a sequence of symbolic graphs ... at each
step, a graph is constructed from observed feature-patient relations." Snapshot t's graph G_t
is :func:`clinograph.sdk.graph.build.build_graph` at ``snapshot=t``; without ``similar_to`` it
decomposes into per-patient stars exactly as the static graph does (tested), so a patient's
training example is its sequence of stars -- one unit for patient-level DP.

Which relations G_t holds (``carry_forward``):

- True (default): every feature's last observation at or before t (last observation carried
  forward). Labs drawn every few hours and static variables recorded once stay in every later
  snapshot, and the last snapshot equals the static star (``star_batch(snapshot=None)``), so
  the temporal model sees everything the static one does.
- False: only what was measured at step t (the paper's sentence read literally).

The sequence is the last ``window`` snapshots of the hospital's table, aligned at the end
(position 0 = the prediction time); hospitals with fewer snapshots (coarser sampling) are
padded at the front with empty snapshots (``present`` False).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from clinograph.core.errors import ConfigError

from ..ingest.table import PatientTable
from .star import StarBatch, star_batch


@dataclass(frozen=True, repr=False)
class SnapshotBatch:
    """Shapes: feature_index, values, mask [n, T, K] (snapshot T-1 is the latest), labels [n].

    ``present[n, T]``: the patient has at least one relation in that snapshot. Duck-types the
    parts of :class:`~clinograph.sdk.graph.star.StarBatch` the trainers use (``labels``,
    ``select``, ``has_neighbours``, ``len``)."""

    feature_index: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor

    neighbours = None
    neighbour_weight = None
    neighbour_mask = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def present(self) -> torch.Tensor:
        return self.mask.any(-1)

    @property
    def has_neighbours(self) -> bool:
        """Never: per-snapshot ``similar_to`` is not built (the temporal model runs on stars)."""
        return False

    def select(self, idx: torch.Tensor) -> SnapshotBatch:
        return SnapshotBatch(self.feature_index[idx], self.values[idx], self.mask[idx], self.labels[idx])

    def last(self) -> StarBatch:
        """The latest snapshot's stars (with carry-forward: the static stars)."""
        return StarBatch(self.feature_index[:, -1], self.values[:, -1], self.mask[:, -1], self.labels)

    def __repr__(self) -> str:
        n, t, k = self.values.shape
        return f"SnapshotBatch(patients={n}, snapshots={t}, max_features={k})"


def _at_step(table: PatientTable, t: int) -> PatientTable:
    keep = table.time == t
    return replace(table, patient=table.patient[keep], node=table.node[keep], value=table.value[keep],
                   std_value=table.std_value[keep], time=table.time[keep])


def snapshot_stars(table: PatientTable, *, window: int, carry_forward: bool = True) -> list[StarBatch]:
    """The stars of the last ``window`` snapshots' graphs, oldest first (fewer if the table has fewer)."""
    if window < 1:
        raise ConfigError(f"The temporal window must be >= 1 snapshot, got {window}. Set [model] temporal_window.")
    steps = range(max(0, table.n_snapshots - window), table.n_snapshots)
    if carry_forward:
        return [star_batch(table, snapshot=t) for t in steps]
    return [star_batch(_at_step(table, t)) for t in steps]


def snapshot_batch(table: PatientTable, *, window: int, carry_forward: bool = True) -> SnapshotBatch:
    """A patient's sequence of stars as one padded tensor set (see the module docstring)."""
    stars = snapshot_stars(table, window=window, carry_forward=carry_forward)
    n, k = table.n_patients, max(s.values.shape[1] for s in stars)
    fi = torch.zeros(n, window, k, dtype=torch.long)
    vv = torch.zeros(n, window, k, dtype=torch.float32)
    mm = torch.zeros(n, window, k, dtype=torch.bool)
    off = window - len(stars)
    for j, s in enumerate(stars):
        kk = s.values.shape[1]
        fi[:, off + j, :kk], vv[:, off + j, :kk], mm[:, off + j, :kk] = s.feature_index, s.values, s.mask
    return SnapshotBatch(fi, vv, mm, torch.tensor(table.labels, dtype=torch.float32))


def observed_feature_nodes(batch: SnapshotBatch) -> np.ndarray:
    """Sorted dictionary node indices present anywhere in the batch (F_k of Theorem 1)."""
    return np.unique(batch.feature_index[batch.mask].numpy())
