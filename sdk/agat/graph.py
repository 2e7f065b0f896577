"""The kNN patient graph over the augmented features (AGAT section 3.3.1, "Constructing Graph").

Each patient is a node; P_i and P_j are joined when either is among the other's k nearest
neighbours in Euclidean distance over the n-dimensional augmented features (Dong et al. 2011
build the same graph approximately; exact here). Built with ``torch.cdist`` and ``topk``:
PyG's ``knn_graph`` needs torch-cluster, which does not install here.
"""

from __future__ import annotations

import torch

from ..graph.build import KNN_BLOCK_BYTES


def knn_neighbours(x: torch.Tensor, *, k: int, block_bytes: int = KNN_BLOCK_BYTES) -> torch.Tensor:
    """The k nearest other patients of every patient (never itself, ties by index).

    Shapes:
        x: [N, n] -> [N, min(k, N − 1)] patient indices
    """
    n = x.shape[0]
    k = min(int(k), n - 1)
    if k < 1:
        return torch.zeros((n, 0), dtype=torch.long)
    xd = x.double()
    rows = max(1, block_bytes // (8 * 2 * n))  # distances ranked a block of rows at a time
    out = torch.empty(n, k, dtype=torch.long)  # before the loop: small tensors kept between large
    for a in range(0, n, rows):  # temporaries fragment the heap
        d = torch.cdist(xd[a:a + rows], xd)
        d[torch.arange(d.shape[0]), torch.arange(a, a + d.shape[0])] = float("inf")
        # a stable sort, not topk (which promises no order among ties): equal distances go to the lower index
        out[a:a + rows] = torch.sort(d, dim=1, stable=True).indices[:, :k]
    return out


def knn_graph(x: torch.Tensor, *, k: int) -> torch.Tensor:
    """Edges of the symmetric kNN graph (both directions, no self-loops, no duplicates).

    Shapes:
        x: [N, n] -> edge_index: [2, E] (source, target), every node with ≥ min(k, N − 1) neighbours
    """
    nbr = knn_neighbours(x, k=k)
    n, kk = nbr.shape
    src = nbr.reshape(-1)
    dst = torch.arange(n).repeat_interleave(kk)
    both = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    return torch.unique(both, dim=1)
