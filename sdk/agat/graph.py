"""The kNN patient graph over the augmented features (AGAT section 3.3.1, "Constructing Graph").

Each patient is a node; P_i and P_j are joined when either is among the other's k nearest
neighbours in Euclidean distance over the n-dimensional augmented features (Dong et al. 2011
build the same graph approximately; exact here). Built with ``torch.cdist`` and ``topk``:
PyG's ``knn_graph`` needs torch-cluster, which does not install here.
"""

from __future__ import annotations

import torch

from ..graph.build import KNN_BLOCK_BYTES, nearest_in_blocks


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
    return nearest_in_blocks(n, k, lambda a, b: torch.cdist(xd[a:b], xd), temporaries=2, block_bytes=block_bytes,
                             stable=True)[1]


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
