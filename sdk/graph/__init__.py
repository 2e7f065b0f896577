"""Typed knowledge graphs (PyG HeteroData) and per-patient star batches."""

from .build import HAS_FEATURE, OF_PATIENT, SIMILAR_TO, build_graph, build_snapshots, knn_similarity
from .star import StarBatch, star_batch

__all__ = ["HAS_FEATURE", "OF_PATIENT", "SIMILAR_TO", "StarBatch", "build_graph", "build_snapshots",
           "knn_similarity", "star_batch"]
