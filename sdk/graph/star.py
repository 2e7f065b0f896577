"""Per-patient star subgraphs as padded dense tensors (the DP training unit, privacy.md).

A patient's star is the patient plus its own copies of the feature nodes it has, with the
standardised values on the edges. Without ``similar_to`` the 2-layer NS-FL model on the full
graph equals the model on isolated stars (tested), so one star is one training example.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..ingest.table import PatientTable


@dataclass(frozen=True, repr=False)
class StarBatch:
    """Shapes: feature_index [n, K] (dictionary node index, 0 where padded), values [n, K],
    mask [n, K] (True where observed), labels [n]; optionally the ``similar_to`` neighbours as
    neighbours [n, k] (patient index), neighbour_weight [n, k], neighbour_mask [n, k]."""

    feature_index: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor
    neighbours: torch.Tensor | None = None
    neighbour_weight: torch.Tensor | None = None
    neighbour_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def select(self, idx: torch.Tensor) -> StarBatch:
        """Rows ``idx`` of the star tensors (neighbour indices would dangle, so they are dropped)."""
        return StarBatch(self.feature_index[idx], self.values[idx], self.mask[idx], self.labels[idx])

    @property
    def has_neighbours(self) -> bool:
        """Whether ``similar_to`` neighbours are attached."""
        return self.neighbours is not None

    def __repr__(self) -> str:
        return f"StarBatch(patients={len(self)}, max_features={self.values.shape[1]})"


def star_batch(table: PatientTable, *, snapshot: int | None = None, k_similar: int = 0) -> StarBatch:
    """All patients' stars, padded to the largest star (the last value per node if repeated);
    with ``k_similar > 0`` also each patient's kNN ``similar_to`` neighbours (same edges as
    :func:`clinograph.sdk.graph.build.build_graph`)."""
    sel = np.ones(table.patient.shape, bool) if snapshot is None else table.time <= snapshot
    order = np.lexsort((table.time[sel], table.node[sel], table.patient[sel]))
    pat, node, val = table.patient[sel][order], table.node[sel][order], table.std_value[sel][order]
    last = np.ones(len(pat), bool)
    if len(pat) > 1:
        last[:-1] = (pat[1:] != pat[:-1]) | (node[1:] != node[:-1])
    pat, node, val = pat[last], node[last], val[last]
    counts = np.bincount(pat, minlength=table.n_patients)
    k = max(int(counts.max()) if counts.size else 0, 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(pat)) - starts[pat]
    fi = np.zeros((table.n_patients, k), np.int64)
    vv = np.zeros((table.n_patients, k), np.float32)
    mm = np.zeros((table.n_patients, k), bool)
    fi[pat, slot], vv[pat, slot], mm[pat, slot] = node, val, True
    labels = torch.tensor(table.labels, dtype=torch.float32)
    if k_similar <= 0:
        return StarBatch(torch.from_numpy(fi), torch.from_numpy(vv), torch.from_numpy(mm), labels)
    from .build import knn_similarity

    dense, observed = table.dense(snapshot)
    ei, ew = knn_similarity(dense, observed, k=k_similar)
    n = table.n_patients
    src, dst = ei
    counts_nb = torch.bincount(dst, minlength=n)
    kk = max(int(counts_nb.max()) if counts_nb.numel() else 0, 1)
    starts_nb = torch.cumsum(counts_nb, 0) - counts_nb
    order_nb = torch.argsort(dst, stable=True)
    src, dst, ew = src[order_nb], dst[order_nb], ew[order_nb]
    slot_nb = torch.arange(len(dst)) - starts_nb[dst]
    nb = torch.zeros(n, kk, dtype=torch.long)
    nw = torch.zeros(n, kk, dtype=ew.dtype)
    nm = torch.zeros(n, kk, dtype=torch.bool)
    nb[dst, slot_nb], nw[dst, slot_nb], nm[dst, slot_nb] = src, ew, True
    return StarBatch(torch.from_numpy(fi), torch.from_numpy(vv), torch.from_numpy(mm), labels, nb, nw, nm)
