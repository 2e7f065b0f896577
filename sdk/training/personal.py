"""Personal layers and local fine-tuning (PFGL-Net §3.3, Algorithm 2's K_personal).

A declared set of modules is personal: it never leaves the hospital (``ModuleKind.PERSONAL``
modules are not in any upload), is not aggregated, and after each round -- once the new
global shared modules are loaded -- is fine-tuned on the hospital's own training patients
with every shared module frozen. Default set: the task head (``head/task``); the NS-FL
feature masks (``mask/<f>``) are always personal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModuleKind

from ..graph.star import StarBatch
from ..model.modules import ModuleMap, Piece
from ..model.nsfl import NSFLModel
from ..model.nsfl_modules import SELECTION_MODULE, nsfl_modules
from .local import TrainConfig, train_epochs

DEFAULT_PERSONAL = ("head/task",)


def personal_module_map(model: NSFLModel, node_ids: Sequence[str], *,
                        personal: Sequence[str] = DEFAULT_PERSONAL) -> ModuleMap:
    """The NS-FL module map with ``personal`` (exact names, or prefixes ending in ``/``) made
    personal, plus the masks, plus the shared ``metric/validation`` module when
    ``[model] selection_module`` (model selection, :class:`~clinograph.sdk.config.SelectionSection`). Unknown names raise ConfigError listing the modules."""
    base = nsfl_modules(model, node_ids, personal_head=False)
    if getattr(model, "hazard_baseline", None) is not None:  # survival head (sdk/model/heads.py)
        base.add_submodule("head/hazard_baseline", ModuleKind.SHARED, model.hazard_baseline)
    names = base.names()
    unknown = [p for p in personal if not any(n == p or (p.endswith("/") and n.startswith(p)) for n in names)]
    if unknown:
        shown = sorted({n.split("/")[0] + "/" for n in names} | {n for n in names if not n.startswith(
            ("feature_embedding/", "mask/"))})
        raise ConfigError(f"Personal modules {unknown} are not in the model. Known: {', '.join(shown)}.")

    def is_personal(n: str) -> bool:
        return base.kind(n) == ModuleKind.PERSONAL or any(n == p or (p.endswith("/") and n.startswith(p))
                                                          for p in personal)

    out = base.with_kinds(lambda n, k: ModuleKind.PERSONAL if is_personal(n) else ModuleKind.SHARED)
    if model.config.selection_module:
        out.add(SELECTION_MODULE, ModuleKind.SHARED, [Piece(selection_parameter())])
    return out


def selection_parameter() -> torch.nn.Parameter:
    """The 2 values of ``metric/validation`` (Σ loss·n_val, Σ n_val): float64, outside the
    model (no optimiser, DP engine or encoder ever sees it), never trained."""
    return torch.nn.Parameter(torch.zeros(2, dtype=torch.float64), requires_grad=False)


def fine_tune_personal(model: NSFLModel, modules: ModuleMap, *, stars: StarBatch, train_idx: np.ndarray,
                       epochs: int, config: TrainConfig, round_: int = 0) -> float:
    """Train only the personal modules for ``epochs`` epochs; every shared value is unchanged.

    Parameters with no personal piece are frozen; rows of a parameter that belong to shared
    modules get a zero gradient; and the shared modules are written back afterwards, so the
    guarantee holds exactly (tested). Returns the last epoch's mean loss.
    """
    shared_before = modules.state(ModuleKind.SHARED)
    row_mask: dict[int, torch.Tensor] = {}
    whole: set[int] = set()
    params = {id(p): p for p in model.parameters()}
    for n in modules.names(ModuleKind.PERSONAL):
        for piece in modules.pieces(n):
            if piece.row is None:
                whole.add(id(piece.param))
            else:
                mask = row_mask.setdefault(id(piece.param), torch.zeros(piece.param.shape[0], 1))
                mask[piece.row] = 1.0
    saved = {k: p.requires_grad for k, p in params.items()}
    hooks = []
    try:
        for k, p in params.items():
            p.requires_grad_(k in whole or k in row_mask)
            if k in row_mask and k not in whole:
                m = row_mask[k].reshape((-1,) + (1,) * (p.dim() - 1))
                hooks.append(p.register_hook(lambda g, m=m: g * m))
        loss = train_epochs(model, epochs=epochs, train_idx=train_idx, config=config, stars=stars,
                            round_=10_000 + round_)
    finally:
        for h in hooks:
            h.remove()
        for k, p in params.items():
            p.requires_grad_(saved[k])
        modules.load(shared_before)
    return loss
