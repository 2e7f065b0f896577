"""ClinicalGraph: a hospital's PatientTable as a typed PyG ``HeteroData`` (NS-FL "Symbolic Data Modelling").

Node types ``patient`` and ``feature`` (feature nodes carry their dictionary index, so every
hospital indexes the shared embedding table alike); edge types
``(patient, has_feature, feature)`` and ``(feature, of_patient, patient)`` weighted by the
public-range standardised value, and ``(patient, similar_to, patient)`` from kNN over the
observed standardised features with similarity weights. Time-series tables give one graph per
snapshot (NS-FL "Extension to Time-Series Data").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch_geometric.data import HeteroData

from clinograph.core.errors import ConfigError

from ..ingest.table import PatientTable

HAS_FEATURE = ("patient", "has_feature", "feature")
OF_PATIENT = ("feature", "of_patient", "patient")
SIMILAR_TO = ("patient", "similar_to", "patient")


#: Bytes of float64 distances held at once while ranking neighbours: rows are ranked in blocks,
#: so memory grows as n · block, not n² (n = 50 000 patients would need 20 GB per n×n matrix).
KNN_BLOCK_BYTES = 1 << 27


def nearest_in_blocks(n: int, k: int, distances: Callable[[int, int], torch.Tensor], *, temporaries: int,
                      block_bytes: int = KNN_BLOCK_BYTES, stable: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest entries of each row of an n × n distance matrix, the diagonal (a patient
    itself) excluded, computed ``distances(a, b)`` -> rows a..b-1 ([b − a, n] float64) at a time, so
    that about ``temporaries`` such blocks fit in ``block_bytes``. ``stable``: equal distances go to
    the lower index (a stable sort); else ``torch.topk``'s order, unspecified among ties.

    The results are allocated before the loop: small tensors kept between the blocks' large
    temporaries fragment the heap (it grew to 1.4 GB at n = 8000 with 4 MB blocks).

    Shapes:
        -> distances [n, k], indices [n, k]
    """
    rows = max(1, block_bytes // (8 * temporaries * n))
    d_all = torch.empty(n, k, dtype=torch.float64)
    idx_all = torch.empty(n, k, dtype=torch.long)
    for a in range(0, n, rows):
        b = min(n, a + rows)
        dist = distances(a, b)
        dist[torch.arange(b - a), torch.arange(a, b)] = float("inf")
        if stable:
            d_sorted, order = torch.sort(dist, dim=1, stable=True)
            d_all[a:b], idx_all[a:b] = d_sorted[:, :k], order[:, :k]
        else:
            torch.topk(dist, k, dim=1, largest=False, out=(d_all[a:b], idx_all[a:b]))
    return d_all, idx_all


def knn_similarity(values: np.ndarray, observed: np.ndarray, *, k: int,
                   block_bytes: int = KNN_BLOCK_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """kNN over co-observed standardised features, with ``torch.cdist``-style masked distances.

    The distance between two patients is the mean squared difference over the features both
    have (no imputation); patients sharing no feature are never neighbours. Similarity weight
    ``s = 1 / (1 + d)``. Rows are ranked ``block_bytes`` of distances at a time; the block size
    changes no neighbour (tested against a pairwise loop), short of distances equal to the last
    bits, whose order ``torch.topk`` leaves unspecified.

    Shapes:
        values, observed: [n, F] -> edge_index [2, n*k'] (src neighbour -> dst patient), weight [n*k'].
    """
    n = values.shape[0]
    if k < 1 or n < 2:
        return torch.zeros(2, 0, dtype=torch.long), torch.zeros(0)
    x = torch.tensor(np.where(observed, values, 0.0), dtype=torch.float64)
    m = torch.tensor(observed, dtype=torch.float64)
    x2 = x * x
    kk = min(k, n - 1)

    def distances(a: int, b: int) -> torch.Tensor:
        sq = x2[a:b] @ m.T + m[a:b] @ x2.T - 2.0 * x[a:b] @ x.T
        count = m[a:b] @ m.T
        return torch.where(count > 0, sq.clamp_min(0) / count.clamp_min(1), torch.full_like(sq, float("inf")))

    d_all, idx_all = nearest_in_blocks(n, kk, distances, temporaries=8, block_bytes=block_bytes)
    dst = torch.arange(n).repeat_interleave(kk)
    src = idx_all.reshape(-1)
    d = d_all.reshape(-1)
    keep = torch.isfinite(d)
    return torch.stack([src[keep], dst[keep]]), (1.0 / (1.0 + d[keep])).float()


def build_graph(table: PatientTable, *, k_similar: int, snapshot: int | None = None,
                complete_schema: bool = False) -> HeteroData:
    """The hospital's typed knowledge graph.

    Args:
        k_similar: neighbours per patient for ``similar_to`` (0 = no ``similar_to`` edges).
        snapshot: for time series, observations at this snapshot only (None: all, wide tables).
        complete_schema: add isolated feature nodes for unobserved dictionary features
            (the schema-completed graph of NS-FL Theorem 1; it changes nothing).
    """
    if k_similar < 0:
        raise ConfigError(f"k_similar must be >= 0, got {k_similar}.")
    sel = np.ones(table.patient.shape, bool) if snapshot is None else table.time == snapshot
    n_nodes_total = len(table.dictionary.node_ids())
    feat_index = np.arange(n_nodes_total) if complete_schema else table.observed_nodes()
    local = -np.ones(n_nodes_total, dtype=np.int64)
    local[feat_index] = np.arange(len(feat_index))
    p = torch.tensor(table.patient[sel], dtype=torch.long)
    f = torch.tensor(local[table.node[sel]], dtype=torch.long)
    w = torch.tensor(table.std_value[sel], dtype=torch.float32)
    data = HeteroData()
    data["patient"].num_nodes = table.n_patients
    data["patient"].y = torch.tensor(table.labels, dtype=torch.float32)
    data["feature"].num_nodes = len(feat_index)
    data["feature"].feature_index = torch.tensor(feat_index, dtype=torch.long)
    data[HAS_FEATURE].edge_index = torch.stack([p, f])
    data[HAS_FEATURE].edge_weight = w
    data[OF_PATIENT].edge_index = torch.stack([f, p])
    data[OF_PATIENT].edge_weight = w
    if k_similar > 0:
        dense, observed = table.dense(snapshot)
        ei, ew = knn_similarity(dense, observed, k=k_similar)
    else:
        ei, ew = torch.zeros(2, 0, dtype=torch.long), torch.zeros(0)
    data[SIMILAR_TO].edge_index = ei
    data[SIMILAR_TO].edge_weight = ew
    return data


def build_snapshots(table: PatientTable, *, k_similar: int) -> list[HeteroData]:
    """One graph per time snapshot (a wide table has exactly one)."""
    return [build_graph(table, k_similar=k_similar, snapshot=t if table.n_snapshots > 1 else None)
            for t in range(table.n_snapshots)]
