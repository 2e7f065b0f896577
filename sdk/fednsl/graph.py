"""A hospital's knowledge graph G_i and the fuzzy value of a rule body along its paths.

Nodes are the hospital's patients and the vocabulary's predicate nodes; typed edges are
``(patient, has_feature, predicate)`` with weight ``x ∈ [0, 1]`` (:mod:`.predicates`), their
inverse ``(predicate, of_patient, patient)`` (weight 1) and ``(patient, similar_to, patient)``
between each patient and its ``k`` nearest neighbours on the public-range standardised values
(weight ``exp(−d / d_median)``). Everything stays at the hospital.

A body ``r_1 ∧ … ∧ r_l`` asked about patient ``p`` is the path
``p -has_feature-> r_1 -of_patient-> p -has_feature-> r_2 …``, whose value is the product of
its edge weights, ``∏_k x(r_k)``. FedNSL eq. (8) takes the best such path in G_i
(``max_{G_i} ∏_k x(r_kj)``): here the path may also start with one ``similar_to`` hop, so a
patient inherits (discounted by the similarity) a body that holds for a close neighbour.
Fast-FedNSL's path-based score (eq. 21, Algorithm 2) drops the search: the product along
the patient's own path only.

Shapes:
    x: (n_patients, n_predicates); body_values(...) -> (n_patients, n_bodies)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..ingest.table import PatientTable
from .predicates import fuzzy_values


@dataclass(frozen=True, repr=False)
class HospitalGraph:
    """``x``: has_feature weights; ``neighbours``/``similarity``: the similar_to edges (k per patient)."""

    predicates: tuple[str, ...]
    x: np.ndarray
    neighbours: np.ndarray
    similarity: np.ndarray

    def __repr__(self) -> str:
        return f"HospitalGraph(patients={self.x.shape[0]}, predicates={len(self.predicates)}, k={self.neighbours.shape[1]})"

    @classmethod
    def build(cls, table: PatientTable, predicates: tuple[str, ...], *, k: int = 5) -> HospitalGraph:
        """The hospital's graph over every patient of ``table`` (labels are not used)."""
        x = fuzzy_values(table, predicates)
        return cls.from_values(x, table.dense()[0], predicates=predicates, k=k)

    @classmethod
    def from_values(cls, x: np.ndarray, features: np.ndarray, *, predicates: tuple[str, ...], k: int) -> HospitalGraph:
        """From fuzzy values and the (n, d) standardised features the similar_to edges use."""
        feats = np.nan_to_num(np.asarray(features, dtype=np.float64), nan=0.0)
        n = feats.shape[0]
        k = int(min(k, max(n - 1, 0)))
        if k == 0:
            return cls(predicates, x, np.zeros((n, 0), dtype=np.int64), np.zeros((n, 0)))
        nb, dist = _knn(feats, k)
        scale = float(np.median(dist)) or 1.0
        return cls(predicates, np.asarray(x, dtype=np.float64), nb, np.exp(-dist / scale))

    def body_values(self, bodies: Sequence[tuple[str, ...]], *, graph_search: bool = True,
                    rows: np.ndarray | None = None) -> np.ndarray:
        """The fuzzy value of each body for each patient (eq. 8 with ``graph_search``, eq. 21 without)."""
        own = self._own(bodies)
        rows = np.arange(own.shape[0]) if rows is None else np.asarray(rows)
        if not graph_search or self.neighbours.shape[1] == 0:
            return own[rows]
        via = (self.similarity[rows, :, None] * own[self.neighbours[rows]]).max(axis=1)
        return np.maximum(own[rows], via)

    def _own(self, bodies: Sequence[tuple[str, ...]]) -> np.ndarray:
        col = {p: i for i, p in enumerate(self.predicates)}
        width = max((len(b) for b in bodies), default=1)
        idx = np.full((len(bodies), width), len(self.predicates), dtype=np.int64)  # pad -> a column of ones
        for j, b in enumerate(bodies):
            idx[j, :len(b)] = [col[p] for p in b]
        padded = np.concatenate([self.x, np.ones((self.x.shape[0], 1))], axis=1)
        out = np.ones((self.x.shape[0], len(bodies)))
        for c in range(width):
            out *= padded[:, idx[:, c]]
        return out


def _knn(feats: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    n = feats.shape[0]
    sq = (feats ** 2).sum(1)
    nb = np.zeros((n, k), dtype=np.int64)
    dist = np.zeros((n, k))
    for s in range(0, n, 1024):
        d2 = np.maximum(sq[s:s + 1024, None] + sq[None, :] - 2 * feats[s:s + 1024] @ feats.T, 0.0)
        d2[np.arange(d2.shape[0]), np.arange(s, s + d2.shape[0])] = np.inf
        part = np.argpartition(d2, k, axis=1)[:, :k]
        nb[s:s + 1024] = part
        dist[s:s + 1024] = np.sqrt(np.take_along_axis(d2, part, axis=1))
    return nb, dist
