"""The NS-FL model's module map: names from the paper and the architecture notes."""

from __future__ import annotations

from collections.abc import Sequence

from clinograph.core.spec import ModuleKind

from .modules import ModuleMap, Piece
from .nsfl import NSFLModel

#: the shared module through which hospitals sum (Σ loss, n_val) for model selection
SELECTION_MODULE = "metric/validation"


def nsfl_modules(model: NSFLModel, node_ids: Sequence[str], *, personal_head: bool = False) -> ModuleMap:
    """``feature_embedding/<f>`` (shared), ``mask/<f>`` (personal: never leaves the hospital),
    ``gnn/layer<l>/<relation>`` (shared), ``head/task`` (shared unless ``personal_head``),
    ``linear/<f>`` (shared, with the linear path)."""
    if len(node_ids) != model.n_features:
        raise ValueError(f"model has {model.n_features} feature nodes, dictionary has {len(node_ids)}")
    mm = ModuleMap()
    for i, nid in enumerate(node_ids):
        mm.add(f"feature_embedding/{nid}", ModuleKind.SHARED, [Piece(model.embedding.weight, i)])
    for layer, rel, sub in (
        (1, "of_patient", model.l1_of_patient), (1, "has_feature", model.l1_has_feature),
        (1, "similar_to", model.l1_similar_to), (1, "self_patient", model.l1_self_patient),
        (1, "self_feature", model.l1_self_feature), (2, "of_patient", model.l2_of_patient),
        (2, "similar_to", model.l2_similar_to), (2, "self_patient", model.l2_self_patient),
    ):
        mm.add_submodule(f"gnn/layer{layer}/{rel}", ModuleKind.SHARED, sub)
    mm.add_submodule("head/task", ModuleKind.PERSONAL if personal_head else ModuleKind.SHARED, model.head)
    if model.linear is not None:  # wide & deep: per feature, so Theorem 1 holds for it too
        for i, nid in enumerate(node_ids):
            mm.add(f"linear/{nid}", ModuleKind.SHARED, [Piece(model.linear.weight, i)])

    for i, nid in enumerate(node_ids):
        mm.add(f"mask/{nid}", ModuleKind.PERSONAL, [Piece(model.mask_logit.weight, i)])
    return mm
